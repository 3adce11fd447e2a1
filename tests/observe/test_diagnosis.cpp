// observe::Diagnosis on a hand-made run whose answers are worked out by hand:
// link use against a limit, op families charged with the transfers that ended
// in their window (steady-state steps only), hidden/exposed transfer time of
// the steady-state steps, and the ops' roofline bound.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "u3m/observe/diagnosis.hpp"

namespace u3m::observe {
namespace {

using engine::Link;

TEST(Diagnosis, ChargesTransfersToOpsAndSplitsHiddenFromExposedAfterTheColdStep) {
  Diagnosis d;
  // Step 0 (cold, left out of the steady steps): A waits 1 s, runs 1 s.
  d.stall(0, 0, 0, 0.0, 1.0);
  d.op(0, 0, 0, "A", {}, 1.0, 2.0);
  d.transfer({.card = 0, .link = Link::h2d, .bytes = 100, .start_s = 0.0, .end_s = 1.0});
  // Step 1: A waits 0.5 s, runs 1 s; B runs 0.5 s.
  d.stall(0, 1, 0, 2.0, 2.5);
  d.op(0, 1, 0, "A", {}, 2.5, 3.5);
  d.op(0, 1, 1, "B", {}, 3.5, 4.0);
  d.transfer({.card = 0, .link = Link::h2d, .bytes = 200, .start_s = 2.0, .end_s = 3.0});
  d.transfer({.card = 0, .link = Link::d2h, .bytes = 50, .start_s = 3.6, .end_s = 3.8});
  d.transfer({.card = 0, .link = Link::d2h, .bytes = 999, .start_s = 3.6, .end_s = 3.7, .ok = false});
  d.transfer({.card = 1, .link = Link::d2h, .bytes = 999, .start_s = 3.6, .end_s = 3.7});  // another card

  std::array<double, engine::kNumLinks> limit{};
  limit[static_cast<int>(Link::h2d)] = 100;  // bytes/s
  const DiagnosisReport r = d.report(limit);
  EXPECT_DOUBLE_EQ(r.span_s, 4.0);
  const LinkUse& h2d = r.links[static_cast<int>(Link::h2d)];
  EXPECT_EQ(h2d.bytes, 300u);
  EXPECT_DOUBLE_EQ(h2d.busy_s, 2.0);
  EXPECT_DOUBLE_EQ(h2d.achieved_bps, 75.0);
  EXPECT_DOUBLE_EQ(h2d.utilisation, 0.75);
  EXPECT_EQ(r.links[static_cast<int>(Link::d2h)].bytes, 50u);
  EXPECT_EQ(r.links[static_cast<int>(Link::d2h)].utilisation, 0.0);  // no limit known

  // The cold step's 100 bytes and 1 s stall are A's, but left out.
  EXPECT_FALSE(r.cold_step_included);
  ASSERT_EQ(r.top_by_bytes.size(), 2u);
  EXPECT_EQ(r.top_by_bytes[0].name, "A");
  EXPECT_EQ(r.top_by_bytes[0].bytes, 200u);
  EXPECT_EQ(r.top_by_bytes[1].name, "B");
  EXPECT_EQ(r.top_by_bytes[1].bytes, 50u);
  ASSERT_EQ(r.top_by_stall.size(), 1u);  // B never waited
  EXPECT_DOUBLE_EQ(r.top_by_stall[0].stall_s, 0.5);
  EXPECT_FALSE(r.bound.known);  // no roofline given

  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].step, 1);
  EXPECT_DOUBLE_EQ(r.steps[0].transfer_s, 1.2);
  EXPECT_DOUBLE_EQ(r.steps[0].hidden_s, 0.7);
  EXPECT_DOUBLE_EQ(r.steps[0].exposed_s, 0.5);

  const nlohmann::json j = Diagnosis::to_json(r);
  EXPECT_EQ(j["links"]["h2d"]["bytes"], 300);
  EXPECT_EQ(j["top_ops_by_bytes"][0]["op"], "A");
  EXPECT_EQ(j["steady_steps"].size(), 1u);
  EXPECT_TRUE(j["roofline"].is_null());
}

// Op names that differ by layer number are one family; a run of one step
// keeps its only (cold) step and says so.
TEST(Diagnosis, FoldsLayersIntoFamiliesAndKeepsTheOnlyStep) {
  Diagnosis d;
  d.stall(0, 0, 0, 0.0, 1.0);
  d.op(0, 0, 0, "layer_1.fc", {}, 1.0, 2.0);
  d.stall(0, 0, 1, 2.0, 2.5);
  d.op(0, 0, 1, "layer_2.fc", {}, 2.5, 3.0);
  d.op(0, 0, 2, "head", {}, 3.0, 3.5);
  d.transfer({.card = 0, .link = Link::h2d, .bytes = 10, .start_s = 0.0, .end_s = 1.0});
  d.transfer({.card = 0, .link = Link::h2d, .bytes = 20, .start_s = 2.0, .end_s = 2.5});
  const DiagnosisReport r = d.report({});
  EXPECT_TRUE(r.cold_step_included);
  ASSERT_EQ(r.top_by_bytes.size(), 1u);
  EXPECT_EQ(r.top_by_bytes[0].name, "layer_*.fc");
  EXPECT_EQ(r.top_by_bytes[0].bytes, 30u);
  ASSERT_EQ(r.top_by_stall.size(), 1u);
  EXPECT_DOUBLE_EQ(r.top_by_stall[0].stall_s, 1.5);
  EXPECT_TRUE(r.steps.empty());
}

// The roofline given decides each steady-state op run's bound: the memory
// term above the compute term is HBM-bound; an op with neither flops nor
// bytes known is unknown. Times are the runs' spans.
TEST(Diagnosis, SplitsSteadyOpsByTheirRooflineBound) {
  Diagnosis d;
  const engine::OpWork gemm{1e12, 1e6}, norm{1e6, 1e9}, none{};
  for (std::int64_t step = 0; step < 3; ++step) {
    const double t = 10.0 * double(step);
    d.op(0, step, 0, "gemm", gemm, t, t + 2.0);
    d.op(0, step, 1, "norm", norm, t + 2.0, t + 2.5);
    d.op(0, step, 2, "copy", none, t + 2.5, t + 2.75);
  }
  int calls = 0;
  // 1 TFLOP/s and 1 GB/s: the gemm's compute term wins, the norm's memory term.
  const Roofline roofline = [&calls](double flops, double bytes) {
    ++calls;
    return RooflineTime{flops / 1e12, bytes / 1e9};
  };
  const DiagnosisReport r = d.report({}, 0, roofline, "toy");
  ASSERT_TRUE(r.bound.known);
  EXPECT_EQ(r.bound.profile, "toy");
  EXPECT_EQ(calls, 4);  // steps 1 and 2, the two ops with known work
  EXPECT_EQ(r.bound.ops_compute, 2u);
  EXPECT_EQ(r.bound.ops_hbm, 2u);
  EXPECT_EQ(r.bound.ops_unknown, 2u);
  EXPECT_DOUBLE_EQ(r.bound.compute_s, 4.0);
  EXPECT_DOUBLE_EQ(r.bound.hbm_s, 1.0);
  EXPECT_DOUBLE_EQ(r.bound.unknown_s, 0.5);
  const nlohmann::json j = Diagnosis::to_json(r);
  EXPECT_DOUBLE_EQ(j["roofline"]["hbm_bound_share_of_ops"].get<double>(), 2.0 / 6.0);
  EXPECT_DOUBLE_EQ(j["roofline"]["hbm_bound_share_of_time"].get<double>(), 1.0 / 5.5);
  EXPECT_NE(Diagnosis::to_text(r, "test").find("HBM-bound 2 ops"), std::string::npos);
}

TEST(Diagnosis, AnEmptyRunReportsNothing) {
  const DiagnosisReport r = Diagnosis().report({});
  EXPECT_EQ(r.span_s, 0);
  EXPECT_TRUE(r.steps.empty());
  EXPECT_TRUE(r.top_by_bytes.empty());
}

}  // namespace
}  // namespace u3m::observe
