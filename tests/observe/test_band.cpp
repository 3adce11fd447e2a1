// TierBand (observe/band.hpp): time below, inside and above the design's HBM
// band, and the bounded series of Note [Band series].
#include <gtest/gtest.h>

#include "u3m/observe/band.hpp"

namespace u3m::observe {
namespace {

TEST(TierBand, SplitsTheRunAtTheBandsEdges) {
  TierBand b;
  b.set_capacity(0, 100);
  b.occupancy(0, mem::Tier::device, 50, 10.0);  // below for 1 s
  b.occupancy(0, mem::Tier::host, 99, 10.5);    // another tier: ignored
  b.occupancy(0, mem::Tier::device, 80, 11.0);  // in for 2 s
  b.occupancy(0, mem::Tier::device, 95, 13.0);  // above for 1 s
  b.occupancy(0, mem::Tier::device, 10, 14.0);  // the end
  const BandReport r = b.report(0);
  EXPECT_DOUBLE_EQ(r.below_s, 1.0);
  EXPECT_DOUBLE_EQ(r.in_s, 2.0);
  EXPECT_DOUBLE_EQ(r.above_s, 1.0);
  EXPECT_DOUBLE_EQ(r.in_fraction(), 0.5);
  EXPECT_NEAR(r.mean, (0.5 * 1 + 0.8 * 2 + 0.95 * 1) / 4, 1e-12);
  EXPECT_DOUBLE_EQ(r.peak, 0.95);
  ASSERT_FALSE(r.series.empty());
  EXPECT_LE(r.series.size(), TierBand::kMaxPoints);
  // The series integrates to the same mean, and its maxima reach the peak.
  const double w = r.series.size() > 1 ? r.series[1].t_s - r.series[0].t_s : 4.0;
  double integral = 0, top = 0;
  for (const BandPoint& p : r.series) {
    integral += p.mean * std::min(w, 4.0 - p.t_s);
    top = std::max(top, p.max);
  }
  EXPECT_NEAR(integral / 4, r.mean, 1e-9);
  EXPECT_DOUBLE_EQ(top, 0.95);
  // Another card, never sampled, reports nothing.
  EXPECT_EQ(b.report(1).span_s(), 0.0);
}

TEST(TierBand, ManySamplesStayBoundedAndKeepTheShape) {
  TierBand b;
  b.set_capacity(3, 1000);
  // 100 s: the first half at 20%, the second at 85%, sampled every 1 ms.
  for (int i = 0; i <= 100000; ++i)
    b.occupancy(3, mem::Tier::device, i < 50000 ? 200 : 850, i * 1e-3);
  const BandReport r = b.report(3);
  EXPECT_LE(r.series.size(), TierBand::kMaxPoints);
  EXPECT_GE(r.series.size(), TierBand::kMaxPoints / 2);
  EXPECT_NEAR(r.below_s, 50.0, 1e-6);
  EXPECT_NEAR(r.in_s, 50.0, 1e-6);
  EXPECT_NEAR(r.series.front().mean, 0.2, 1e-9);
  EXPECT_NEAR(r.series.back().mean, 0.85, 1e-9);
}

TEST(TierBand, WithoutACapacityItRecordsNothing) {
  TierBand b;
  b.occupancy(0, mem::Tier::device, 50, 1.0);
  b.occupancy(0, mem::Tier::device, 60, 2.0);
  EXPECT_EQ(b.report(0).span_s(), 0.0);
}

}  // namespace
}  // namespace u3m::observe
