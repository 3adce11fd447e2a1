// simulate_trace: the real engine on virtual time. Traces are built by hand
// so every expected figure follows from the numbers here. All figures are
// simulated with the links given in each test, never measured.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "u3m/sim/cost.hpp"
#include "u3m/sim/runner.hpp"
#include "u3m/util/error.hpp"

namespace u3m::sim {
namespace {

using engine::Link;
using trace::EventKind;
constexpr std::uint64_t MB = 1'000'000;

// Appends tensors and ops with their events to a Trace.
struct Builder {
  trace::Trace t;
  std::uint64_t now = 0;
  std::uint32_t tensor(const std::string& name, std::uint64_t bytes) {
    t.tensor(trace::make_tensor(name, bytes, trace::DType::f16, trace::Role::param));
    return static_cast<std::uint32_t>(t.tensors.size() - 1);
  }
  void op(const std::string& name, std::vector<std::pair<std::uint32_t, EventKind>> touches,
          double flops = 0) {
    trace::Op o;
    o.name = name;
    o.flops = flops;
    t.op(o);
    const auto idx = static_cast<std::uint32_t>(t.ops.size() - 1);
    for (auto [tensor, kind] : touches) t.event(trace::Event{now += 1000, idx, tensor, kind});
  }
};

// n weights of `bytes`: one op writes each (initialisation), then `passes`
// passes read them in order, as forward passes over the layers do.
trace::Trace layers(int n, std::uint64_t bytes, int passes) {
  Builder b;
  std::vector<std::uint32_t> w;
  for (int i = 0; i < n; ++i) w.push_back(b.tensor("w" + std::to_string(i), bytes));
  for (int i = 0; i < n; ++i) b.op("init" + std::to_string(i), {{w[i], EventKind::write}});
  for (int p = 0; p < passes; ++p) {
    for (int i = 0; i < n; ++i) b.op("fwd" + std::to_string(i), {{w[i], EventKind::read}});
  }
  return b.t;
}

// 1 GB/s + 10 us each way on the host link; no SSD.
SimOptions options(std::uint64_t device_budget, double op_seconds) {
  SimOptions o;
  o.device_budget = device_budget;
  o.links.links[static_cast<int>(Link::d2h)] = {1e9, 10e-6};
  o.links.links[static_cast<int>(Link::h2d)] = {1e9, 10e-6};
  o.op_time = [op_seconds](const trace::Op&) { return op_seconds; };
  return o;
}

TEST(SimRunner, BuildStepsGroupsRunsOfOneOpAndMergesTouches) {
  Builder b;
  auto x = b.tensor("x", 10), y = b.tensor("y", 10);
  b.op("a", {{x, EventKind::alloc},
             {x, EventKind::read},
             {y, EventKind::read},
             {x, EventKind::write},
             {y, EventKind::free}});
  b.op("b", {{y, EventKind::write}});
  auto steps = build_steps(b.t);
  ASSERT_EQ(steps.size(), 2u);
  ASSERT_EQ(steps[0].touches.size(), 2u);
  EXPECT_EQ(steps[0].touches[0].tensor, x);
  EXPECT_TRUE(steps[0].touches[0].writes);  // read, then written: a write lease
  EXPECT_FALSE(steps[0].touches[1].writes);
  EXPECT_EQ(steps[0].frees, std::vector<std::uint32_t>{y});
  EXPECT_EQ(steps[1].op, 1u);

  b.t.events.push_back(trace::Event{0, 7, x, EventKind::read});
  EXPECT_THROW(build_steps(b.t), InputError);  // op 7 does not exist
}

TEST(SimRunner, EverythingFitsSoTimeIsComputeAlone) {
  const trace::Trace t = layers(4, 1 * MB, 2);
  const SimReport r = simulate_trace(t, options(16 * MB, 1e-3));
  ASSERT_TRUE(r.ok()) << r.first_error;
  EXPECT_EQ(r.steps, 12u);
  EXPECT_EQ(r.compute_ns, 12'000'000u);
  EXPECT_EQ(r.stall_ns, 0u);
  EXPECT_EQ(r.total_ns, r.compute_ns);
  EXPECT_EQ(r.throughput_loss(), 0.0);
  for (const SimLinkReport& l : r.links) EXPECT_EQ(l.bytes, 0u);
  EXPECT_EQ(r.engine.evictions, 0u);
  EXPECT_EQ(r.peak_device, 4 * MB);
  EXPECT_EQ(r.footprint, 4 * MB);
}

TEST(SimRunner, BudgetBelowFootprintStallsAndMovesBytes) {
  const trace::Trace t = layers(8, 1 * MB, 2);
  SimOptions o = options(3 * MB, 1e-3);
  o.lookahead = 0;
  const SimReport r = simulate_trace(t, o);
  ASSERT_TRUE(r.ok()) << r.first_error;
  EXPECT_EQ(r.steps, 24u);
  EXPECT_GT(r.stall_ns, 0u);
  EXPECT_GT(r.links[static_cast<int>(Link::d2h)].bytes, 0u);  // dirty weights written back
  EXPECT_GT(r.links[static_cast<int>(Link::h2d)].bytes, 0u);  // and fetched again
  EXPECT_GT(r.engine.evictions, 0u);
  EXPECT_LE(r.peak_device, 3 * MB);
  // Time moves only for compute or for stalls.
  EXPECT_EQ(r.total_ns, r.compute_ns + r.stall_ns);
  EXPECT_GT(r.throughput_loss(), 0.0);
  // Every read of a weight not on the device waited for a whole 1 MB fetch
  // (1 ms + 10 us): at least the 16 reads of the passes, minus what fit.
  EXPECT_GE(r.stall_ns, (16 - 3) * 1'010'000u);
  EXPECT_EQ(r.links[static_cast<int>(Link::h2d)].busy_ns,
            r.links[static_cast<int>(Link::h2d)].bytes);  // 1 GB/s: a byte per ns
}

TEST(SimRunner, NeverTouchesTheBytesItModels) {
  // 48 GB of weights through a 16 GB device and 64 GB of host: nothing is
  // materialised, so this runs in milliseconds on a machine far smaller.
  const std::uint64_t GB = 1000 * MB;
  const trace::Trace t = layers(48, 1 * GB, 1);
  SimOptions o = options(16 * GB, 1e-3);
  o.host_budget = 64 * GB;
  o.links.links[static_cast<int>(Link::d2h)] = {25e9, 10e-6};
  o.links.links[static_cast<int>(Link::h2d)] = {25e9, 10e-6};
  const SimReport r = simulate_trace(t, o);
  ASSERT_TRUE(r.ok()) << r.first_error;
  EXPECT_GT(r.links[static_cast<int>(Link::d2h)].bytes, 16 * GB);
  EXPECT_LE(r.peak_device, 16 * GB);
  EXPECT_GT(r.peak_host, 16 * GB);
}

TEST(SimRunner, LookaheadPrefetchHidesTransfersBehindCompute) {
  const trace::Trace t = layers(8, 1 * MB, 3);
  SimOptions none = options(4 * MB, 2e-3);  // 2 ms per op vs ~1 ms per fetch
  none.prefetch = no_prefetch();
  SimOptions ahead = options(4 * MB, 2e-3);
  ahead.prefetch = lookahead_prefetch(1);
  const SimReport a = simulate_trace(t, none);
  const SimReport b = simulate_trace(t, ahead);
  ASSERT_TRUE(a.ok()) << a.first_error;
  ASSERT_TRUE(b.ok()) << b.first_error;
  EXPECT_EQ(a.compute_ns, b.compute_ns);
  EXPECT_GT(a.stall_ns, 0u);
  EXPECT_LT(b.stall_ns, a.stall_ns / 2) << "none " << a.stall_ns << " ns, lookahead " << b.stall_ns;
  EXPECT_GT(b.engine.prefetch_hits, 0u);
  EXPECT_EQ(a.engine.prefetches, 0u);
  // Two ahead needs room for two landed copies above the one in use; at
  // 6 MB (watermarks 5.4 / 4.8 MB) it has it and hides every fetch after
  // the first pass's warm-up.
  SimOptions two = options(6 * MB, 2e-3);
  two.prefetch = lookahead_prefetch(2);
  const SimReport c = simulate_trace(t, two);
  ASSERT_TRUE(c.ok()) << c.first_error;
  EXPECT_LT(c.stall_ns, a.stall_ns / 2);
  EXPECT_EQ(c.engine.prefetch_hits, c.engine.prefetches);
}

TEST(SimRunner, TwoRunsGiveIdenticalResults) {
  const trace::Trace t = layers(8, 1 * MB, 3);
  const SimOptions o = options(3 * MB, 0.7e-3);
  const SimReport a = simulate_trace(t, o), b = simulate_trace(t, o);
  EXPECT_GT(a.stall_ns, 0u);
  EXPECT_EQ(a.total_ns, b.total_ns);
  EXPECT_EQ(a.stall_ns, b.stall_ns);
  EXPECT_EQ(a.drain_ns, b.drain_ns);
  EXPECT_EQ(a.events, b.events);
  EXPECT_EQ(a.engine.evictions, b.engine.evictions);
  EXPECT_EQ(a.engine.prefetch_hits, b.engine.prefetch_hits);
  for (int l = 0; l < kNumLinks; ++l) {
    EXPECT_EQ(a.links[l].bytes, b.links[l].bytes);
    EXPECT_EQ(a.links[l].busy_ns, b.links[l].busy_ns);
  }
}

// The overload for callers that built the steps already gives the same run.
TEST(SimRunner, PrebuiltStepsGiveTheSameRun) {
  const trace::Trace t = layers(8, 1 * MB, 3);
  const SimOptions o = options(3 * MB, 0.7e-3);
  const SimReport a = simulate_trace(t, o), b = simulate_trace(t, build_steps(t), o);
  EXPECT_GT(a.engine.evictions, 0u);
  EXPECT_EQ(a.total_ns, b.total_ns);
  EXPECT_EQ(a.stall_ns, b.stall_ns);
  EXPECT_EQ(a.events, b.events);
  EXPECT_EQ(a.engine.evictions, b.engine.evictions);
  for (int l = 0; l < kNumLinks; ++l) EXPECT_EQ(a.links[l].bytes, b.links[l].bytes);
}

// Layer numbers after an underscore fold into one family per op kind.
TEST(SimRunner, OpFamiliesFoldLayerNumbers) {
  Builder b;
  auto x = b.tensor("x", 1 * MB);
  for (const char* name : {"layer_12.attn_out", "layer_3.attn_out", "head", "x_", "l_7"})
    b.op(name, {{x, EventKind::write}});
  const SimReport r = simulate_trace(b.t, options(16 * MB, 1e-3));
  ASSERT_TRUE(r.ok()) << r.first_error;
  std::vector<std::pair<std::string, std::uint64_t>> got;
  for (const OpFamilyReport& f : r.op_families) got.emplace_back(f.name, f.steps);
  // Nothing missed: sorted by name.
  const std::vector<std::pair<std::string, std::uint64_t>> want = {
      {"head", 1}, {"l_*", 1}, {"layer_*.attn_out", 2}, {"x_", 1}};
  EXPECT_EQ(got, want);
}

TEST(SimRunner, ThreeTiersSpillToTheSsd) {
  const trace::Trace t = layers(8, 1 * MB, 2);
  SimOptions o = options(2 * MB, 1e-3);
  o.host_budget = 3 * MB;
  o.links.ssd_capacity = 64 * MB;
  o.links.links[static_cast<int>(Link::h2s)] = {1e9, 20e-6};
  o.links.links[static_cast<int>(Link::s2h)] = {2e9, 80e-6};
  const SimReport r = simulate_trace(t, o);
  ASSERT_TRUE(r.ok()) << r.first_error;
  EXPECT_GT(r.links[static_cast<int>(Link::h2s)].bytes, 0u);
  EXPECT_GT(r.links[static_cast<int>(Link::s2h)].bytes, 0u);
  EXPECT_GT(r.peak_ssd, 0u);
  EXPECT_LE(r.peak_host, 3 * MB);
}

TEST(SimRunner, AStepThatCannotFitStopsTheRunAndSaysWhy) {
  Builder b;
  auto x = b.tensor("big_x", 2 * MB), y = b.tensor("big_y", 2 * MB);
  b.op("needs_both", {{x, EventKind::write}, {y, EventKind::write}});
  b.op("after", {{x, EventKind::read}});
  const SimReport r = simulate_trace(b.t, options(3 * MB, 1e-3));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.steps, 0u);
  EXPECT_NE(r.first_error.find("needs_both"), std::string::npos) << r.first_error;
  EXPECT_NE(r.first_error.find("together they exceed the budget"), std::string::npos)
      << r.first_error;
}

TEST(SimRunner, RooflineFromTheProfileIsTheDefaultComputeModel) {
  Builder b;
  auto x = b.tensor("x", 1 * MB);
  b.op("mm", {{x, EventKind::write}}, /*flops=*/1e12);
  b.op("mm2", {{x, EventKind::read}}, /*flops=*/3e12);
  SimOptions o = options(16 * MB, 0);
  o.op_time = nullptr;
  o.hw = load_profile("ascend-910b-32g");
  const SimReport r = simulate_trace(b.t, o);
  ASSERT_TRUE(r.ok()) << r.first_error;
  const double want = op_cost(*o.hw, b.t.ops[0]).total_s + op_cost(*o.hw, b.t.ops[1]).total_s;
  EXPECT_NEAR(static_cast<double>(r.compute_ns), want * 1e9, 2.0);
  EXPECT_GT(r.compute_ns, 10'000'000u);  // 4e12 FLOP at ~212 TFLOP/s: ~19 ms

  o.hw.reset();
  EXPECT_THROW(simulate_trace(b.t, o), InputError);  // no compute model at all
  o.flop_rate = 1e12;
  EXPECT_EQ(simulate_trace(b.t, o).compute_ns, 4'000'000'000u);
}

TEST(SimRunner, ZeroByteTensorIsRefused) {
  Builder b;
  auto x = b.tensor("empty", 0);
  b.op("a", {{x, EventKind::write}});
  EXPECT_THROW(simulate_trace(b.t, options(MB, 1e-3)), InputError);
}

}  // namespace
}  // namespace u3m::sim
