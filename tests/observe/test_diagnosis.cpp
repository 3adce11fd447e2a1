// observe::Diagnosis on a hand-made run whose answers are worked out by hand:
// link use against a limit, ops charged with the transfers that ended in
// their window, and hidden/exposed transfer time of the steady-state steps.
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
  d.op(0, 0, 0, "A", 1.0, 2.0);
  d.transfer({.card = 0, .link = Link::h2d, .bytes = 100, .start_s = 0.0, .end_s = 1.0});
  // Step 1: A waits 0.5 s, runs 1 s; B runs 0.5 s.
  d.stall(0, 1, 0, 2.0, 2.5);
  d.op(0, 1, 0, "A", 2.5, 3.5);
  d.op(0, 1, 1, "B", 3.5, 4.0);
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

  ASSERT_EQ(r.top_by_bytes.size(), 2u);
  EXPECT_EQ(r.top_by_bytes[0].name, "A");
  EXPECT_EQ(r.top_by_bytes[0].bytes, 300u);
  EXPECT_EQ(r.top_by_bytes[1].name, "B");
  EXPECT_EQ(r.top_by_bytes[1].bytes, 50u);
  ASSERT_EQ(r.top_by_stall.size(), 1u);  // B never waited
  EXPECT_DOUBLE_EQ(r.top_by_stall[0].stall_s, 1.5);

  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].step, 1);
  EXPECT_DOUBLE_EQ(r.steps[0].transfer_s, 1.2);
  EXPECT_DOUBLE_EQ(r.steps[0].hidden_s, 0.7);
  EXPECT_DOUBLE_EQ(r.steps[0].exposed_s, 0.5);

  const nlohmann::json j = Diagnosis::to_json(r);
  EXPECT_EQ(j["links"]["h2d"]["bytes"], 300);
  EXPECT_EQ(j["top_ops_by_bytes"][0]["op"], "A");
  EXPECT_EQ(j["steady_steps"].size(), 1u);
}

TEST(Diagnosis, AnEmptyRunReportsNothing) {
  const DiagnosisReport r = Diagnosis().report({});
  EXPECT_EQ(r.span_s, 0);
  EXPECT_TRUE(r.steps.empty());
  EXPECT_TRUE(r.top_by_bytes.empty());
}

}  // namespace
}  // namespace u3m::observe
