// The simulated side of the PyTorch sim-versus-real check: the offload's view
// of a captured trace (Note [Offload view]) on a hand-built training step.
#include <gtest/gtest.h>

#include <string>

#include "u3m/experiments/offload_check.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/util/error.hpp"

namespace u3m::experiments {
namespace {

using trace::EventKind;
using trace::Phase;
using trace::Role;

// One training step per iteration, as u3m.torch.capture names it: a param p,
// a saved activation a (forward writes, backward reads), a transient x
// (forward only), a gradient g and Adam's m.
trace::Trace step_trace(std::uint32_t iterations) {
  trace::Trace t;
  t.job("train-0");
  t.tensor(trace::make_tensor("train-0.param.w", 1000, trace::DType::f32, Role::param));
  t.tensor(trace::make_tensor("train-0.fwd.mm#0.out0", 400, trace::DType::f32, Role::activation));
  t.tensor(trace::make_tensor("train-0.fwd.relu#0.out0", 300, trace::DType::f32, Role::activation));
  t.tensor(trace::make_tensor("train-0.grad.w", 1000, trace::DType::f32, Role::grad));
  t.tensor(trace::make_tensor("train-0.optim.w.exp_avg", 1000, trace::DType::f32, Role::optim_m));
  enum { p, a, x, g, m };
  std::uint64_t now = 0;
  for (std::uint32_t it = 0; it < iterations; ++it) {
    auto op = [&](const char* name, Phase ph, double flops,
                  std::initializer_list<std::pair<int, EventKind>> evs) {
      trace::Op o;
      o.name = name;
      o.phase = ph;
      o.iteration = it;
      o.flops = flops;
      o.bytes = 1000;
      t.op(o);
      for (auto [tensor, kind] : evs)
        t.event({now += 10, static_cast<std::uint32_t>(t.ops.size() - 1),
                 static_cast<std::uint32_t>(tensor), kind});
    };
    op("aten::mm", Phase::forward, 1e6, {{p, EventKind::read}, {a, EventKind::write}});
    op("aten::relu", Phase::forward, 0, {{a, EventKind::read}, {x, EventKind::write}});
    op("aten::sum", Phase::forward, 0, {{x, EventKind::read}, {x, EventKind::free}});
    op("aten::mm_backward", Phase::backward, 2e6,
       {{a, EventKind::read}, {p, EventKind::read}, {g, EventKind::write}, {a, EventKind::free}});
    op("aten::mul_", Phase::optimizer, 0, {{g, EventKind::read}, {m, EventKind::write}});
    op("aten::addcdiv_", Phase::optimizer, 0,
       {{m, EventKind::read}, {p, EventKind::write}, {g, EventKind::free}});
  }
  return t;
}

std::size_t count_ops(const trace::Trace& t, std::string_view prefix) {
  std::size_t n = 0;
  for (const trace::Op& o : t.ops) n += o.name.rfind(prefix, 0) == 0;
  return n;
}

TEST(OffloadView, KeepsStateAndSavedActivationsAndDropsTransients) {
  const trace::Trace v = offload_view(step_trace(2));
  std::vector<std::string> names;
  for (const trace::Tensor& t : v.tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"train-0.param.w", "train-0.fwd.mm#0.out0",
                                             "train-0.grad.w", "train-0.optim.w.exp_avg",
                                             "train-0.u3m.compute-scratch"}));
  EXPECT_EQ(v.tensors.back().bytes, 1u);
  // Every captured op is there, with its compute.
  EXPECT_EQ(count_ops(v, "aten::"), 12u);
  double flops = 0;
  for (const trace::Op& o : v.ops) flops += o.flops;
  EXPECT_DOUBLE_EQ(flops, 2 * 3e6);
}

// An op the capture saw touch nothing still computes in the view, in its place.
TEST(OffloadView, KeepsAnOpWithoutEvents) {
  trace::Trace t = step_trace(1);
  trace::Op bare;
  bare.name = "aten::bare";
  bare.phase = Phase::optimizer;
  bare.flops = 5e6;
  t.op(bare);
  const trace::Trace v = offload_view(t);
  ASSERT_EQ(v.ops.back().name, "aten::bare");
  EXPECT_DOUBLE_EQ(v.ops.back().flops, 5e6);
  ASSERT_FALSE(v.events.empty());
  EXPECT_EQ(v.events.back().op, v.ops.size() - 1);  // it is a step of the view
}

TEST(OffloadView, CopiesOutsideTheOptimizerAndLeasesInIt) {
  const trace::Trace v = offload_view(step_trace(1));
  // Forward: gather p; store a. Backward: gather a and p (a pass gathers
  // again), store g. Optimizer: one lease each of g, m, p.
  EXPECT_EQ(count_ops(v, "u3m.offload.gather "), 3u);
  EXPECT_EQ(count_ops(v, "u3m.offload.store "), 2u);
  EXPECT_EQ(count_ops(v, "u3m.offload.lease "), 3u);
  for (const trace::Op& o : v.ops) {
    if (o.name.rfind("u3m.offload.gather ", 0) == 0 || o.name.rfind("u3m.offload.store ", 0) == 0) {
      EXPECT_EQ(o.cls, trace::OpClass::copy) << o.name;
      EXPECT_EQ(o.bytes % 2, 0u) << o.name;  // 2 x the tensor: a memcpy reads and writes
      EXPECT_GT(o.bytes, 0u) << o.name;
    }
    if (o.name.rfind("u3m.offload.lease ", 0) == 0) EXPECT_EQ(o.bytes, 0u) << o.name;
  }
  // Forward and backward ops compute on torch's memory: they touch only the
  // scratch tensor (and free what they freed).
  const std::uint32_t scratch = static_cast<std::uint32_t>(v.tensors.size() - 1);
  for (const trace::Event& e : v.events) {
    const trace::Op& o = v.ops[e.op];
    if (o.name.rfind("aten::", 0) != 0 || o.phase == Phase::optimizer) continue;
    if (e.kind != EventKind::free) EXPECT_EQ(e.tensor, scratch) << o.name;
  }
  // The gather of p comes before the forward matmul; the store of a after it.
  std::vector<std::string> order;
  for (const trace::Op& o : v.ops) order.push_back(o.name);
  EXPECT_EQ(order[0], "u3m.offload.gather train-0.param.w");
  EXPECT_EQ(order[1], "aten::mm");
  EXPECT_EQ(order[2], "u3m.offload.store train-0.fwd.mm#0.out0");
}

TEST(SimulateOffload, ChargesCopiesAndStallsAtASmallBudget) {
  const sim::HwProfile hw = sim::load_profile("ascend-910b-32g");
  const trace::Trace t = step_trace(3);
  OffloadSimOptions o;
  o.budget_bytes = 1 << 20;
  o.access_overhead_s = 1e-3;
  const OffloadSim all = simulate_offload(t, hw, o);
  ASSERT_TRUE(all.report.ok()) << all.report.first_error;
  EXPECT_EQ(all.copy_ops, 3u * 8u);
  // The copies' overhead (8 a step at 1 ms) is compute on top of the captured ops.
  EXPECT_NEAR(all.compute_step_s - all.captured_compute_step_s, 8e-3, 1e-4);
  EXPECT_GE(all.step_s, all.compute_step_s * 0.999);
  // Room for two of the 1000-byte tensors only: state must move, and time grows.
  o.budget_bytes = 2100;
  const OffloadSim tight = simulate_offload(t, hw, o);
  ASSERT_TRUE(tight.report.ok()) << tight.report.first_error;
  EXPECT_GT(tight.report.engine.evictions, all.report.engine.evictions);
  EXPECT_LE(tight.report.peak_device, 2100u);
}

// A captured op of class copy (aten::clone) costs a torch op, not an offload access.
TEST(SimulateOffload, ChargesCapturedCopiesAsTorchOps) {
  const sim::HwProfile hw = sim::load_profile("ascend-910b-32g");
  trace::Trace t = step_trace(3);
  for (trace::Op& op : t.ops)
    if (op.name == "aten::relu") op.cls = trace::OpClass::copy;
  OffloadSimOptions o;
  o.budget_bytes = 1 << 20;
  o.access_overhead_s = 0;
  const double zero = simulate_offload(t, hw, o).captured_compute_step_s;
  o.access_overhead_s = 1;  // a second per offload copy: the captured ops must not see it
  EXPECT_DOUBLE_EQ(simulate_offload(t, hw, o).captured_compute_step_s, zero);
}

TEST(SimulateOffload, RefusesWhatItCannotMeasure) {
  const sim::HwProfile hw = sim::load_profile("ascend-910b-32g");
  OffloadSimOptions o;
  EXPECT_THROW(simulate_offload(step_trace(3), hw, o), InputError);  // no budget
  o.budget_bytes = 1 << 20;
  EXPECT_THROW(simulate_offload(step_trace(1), hw, o), InputError);  // one iteration
  o.policy = "no-such-policy";
  EXPECT_THROW(simulate_offload(step_trace(3), hw, o), InputError);
}

}  // namespace
}  // namespace u3m::experiments
