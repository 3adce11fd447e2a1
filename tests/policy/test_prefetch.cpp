// Just-in-time prefetch math (policy/prefetch.hpp): transfer times, the due
// rule, the predictor window, the link backlog and the op clock.
#include <gtest/gtest.h>

#include "u3m/policy/prefetch.hpp"

namespace u3m::policy {
namespace {

constexpr LinkCost kH2d{.bandwidth = 25e9, .latency_s = 10e-6};
constexpr LinkCost kS2h{.bandwidth = 6.5e9, .latency_s = 80e-6};

TEST(Prefetch, FetchTimeFollowsThePathFromEachTier) {
  const std::uint64_t b = 100'000'000;  // 100 MB
  EXPECT_DOUBLE_EQ(kH2d.seconds(b), 0.004 + 10e-6);
  EXPECT_EQ(fetch_seconds(b, mem::Tier::device, kH2d, kS2h), 0.0);
  EXPECT_DOUBLE_EQ(fetch_seconds(b, mem::Tier::host, kH2d, kS2h), 0.004 + 10e-6);
  // From the SSD: staged through DRAM, both hops.
  EXPECT_DOUBLE_EQ(fetch_seconds(b, mem::Tier::ssd, kH2d, kS2h), b / 6.5e9 + 80e-6 + 0.004 + 10e-6);
}

TEST(Prefetch, DueOnceTheUseIsWithinTransferPlusQueuePlusMargin) {
  const JitConfig c{.factor = 1.5, .slack_ops = 1};
  const double op = 0.001;
  // transfer 4 ms, 2 ms queued ahead, 1 ms ops: due within (4 + 2) * 1.5 + 1 = 10 ms.
  EXPECT_TRUE(prefetch_due(0.0099, 0.004, 0.002, op, c));
  EXPECT_TRUE(prefetch_due(0.0100, 0.004, 0.002, op, c));
  EXPECT_FALSE(prefetch_due(0.0101, 0.004, 0.002, op, c));
  // The queue ahead moves the decision earlier.
  EXPECT_FALSE(prefetch_due(0.0095, 0.004, 0.0, op, c));
  EXPECT_TRUE(prefetch_due(0.0, 0.004, 0.0, op, c));  // late: fetch at once
}

TEST(Prefetch, HorizonCoversTheSlowestFetchClamped) {
  const JitConfig c{.factor = 1.5, .slack_ops = 1, .min_ops = 8, .max_ops = 256};
  // 40 ms fetch * 1.5 over 1 ms ops: 60 ops, +1 slack, +1 for the op that runs meanwhile.
  EXPECT_EQ(horizon_ops(0.040, 0.001, c), 62u);
  EXPECT_EQ(horizon_ops(0.001, 0.001, c), 8u);   // short fetches: the floor
  EXPECT_EQ(horizon_ops(10.0, 0.001, c), 256u);  // very slow fetches: the ceiling
  EXPECT_EQ(horizon_ops(0.040, 0.0, c), 256u);   // no op time measured yet
}

TEST(Prefetch, BacklogIsAFifoOfBookedBytes) {
  LinkBacklog l(kH2d);
  EXPECT_EQ(l.ahead_s(0), 0.0);
  l.book(25'000'000, 0);  // 1 ms of bytes
  l.book(25'000'000, 0);  // behind it: 2 ms in all; latency overlaps
  EXPECT_NEAR(l.ahead_s(0), 0.002, 1e-12);
  EXPECT_NEAR(l.ahead_s(500'000), 0.0015, 1e-12);  // 0.5 ms later
  EXPECT_EQ(l.ahead_s(3'000'000), 0.0);            // drained
  l.book(25'000'000, 5'000'000);                   // an idle link starts at once
  EXPECT_NEAR(l.ahead_s(5'000'000), 0.001, 1e-12);
}

TEST(Prefetch, OpClockAveragesTheSpacingOfDecisionPoints) {
  OpClock c(0.5);
  c.tick(0);
  EXPECT_EQ(c.mean_s(), 0.0);  // one tick: no spacing yet
  c.tick(10'000'000);
  EXPECT_NEAR(c.mean_s(), 0.010, 1e-12);
  c.tick(40'000'000);  // 30 ms: halfway with weight 0.5
  EXPECT_NEAR(c.mean_s(), 0.020, 1e-12);
}

// Ops of 10, 1, 1, 1 ms (an all-gather, then three Adam steps), twice.
IterationProfile two_iterations() {
  IterationProfile p;
  const std::uint64_t ms = 1'000'000;
  const std::uint64_t gaps[] = {10, 1, 1, 1};
  std::uint64_t t = 0;
  for (std::uint32_t it = 0; it < 2; ++it) {
    for (std::uint64_t g : gaps) {
      p.tick(it, t);
      t += g * ms;
    }
  }
  return p;
}

TEST(Prefetch, IterationProfileReadsTimeOffThePreviousIteration) {
  IterationProfile p = two_iterations();
  // The current op is iteration 1's last (offset 3); iteration 0 had 4 ops.
  EXPECT_EQ(p.previous_ops(), 4u);
  const double mean = 0.005;
  EXPECT_EQ(p.until_s(0, mean), 0.0);
  // One op ahead is across the boundary: the mean op stands in for the gap.
  EXPECT_NEAR(p.until_s(1, mean), 0.005, 1e-12);
  // Two ahead: the boundary, then iteration 0's first op (10 ms).
  EXPECT_NEAR(p.until_s(2, mean), 0.015, 1e-12);
  // Before a full iteration: k mean ops.
  IterationProfile fresh;
  fresh.tick(0, 0);
  EXPECT_NEAR(fresh.until_s(3, mean), 0.015, 1e-12);
}

TEST(Prefetch, IterationProfileWithinAnIteration) {
  IterationProfile p = two_iterations();
  p.tick(2, 100'000'000);  // iteration 2, offset 0: iteration 1 becomes the profile
  EXPECT_NEAR(p.until_s(1, 0.005), 0.010, 1e-12);  // the all-gather
  EXPECT_NEAR(p.until_s(3, 0.005), 0.012, 1e-12);
}

TEST(Prefetch, IterationProfileHorizonCoversTheFastestStretch) {
  const IterationProfile p = two_iterations();
  const JitConfig c{.factor = 1.0, .slack_ops = 1, .min_ops = 1, .max_ops = 256};
  // A 2 ms fetch: the Adam ops take 1 ms each, so 2 ops from offset 1 (and
  // 2 ops are all that is left from offset 2): window 2 + 1 + 1.
  EXPECT_EQ(p.horizon_ops(0.002, 0.005, c), 4u);
  // A 0.5 ms fetch: one op anywhere.
  EXPECT_EQ(p.horizon_ops(0.0005, 0.005, c), 3u);
  // The mean op alone would say ceil(2 / 5) + 2 = 3: too short for the Adam phase.
  EXPECT_EQ(horizon_ops(0.002, 0.005, c), 3u);
}

}  // namespace
}  // namespace u3m::policy
