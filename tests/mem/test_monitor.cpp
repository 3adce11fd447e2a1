// The memory monitor: levels with alerts, and the time-to-OOM estimate.
#include <cmath>

#include <gtest/gtest.h>

#include "u3m/mem/monitor.hpp"

namespace u3m::mem {
namespace {

constexpr std::uint64_t kSec = 1'000'000'000;

TEST(Monitor, LevelsRiseAndFallWithAlerts) {
  Monitor m;
  std::vector<std::pair<Level, Level>> alerts;  // (from, to)
  m.on_alert([&](const TierReport& r, Level from) { alerts.emplace_back(from, r.level); });
  m.record(Tier::device, 50, 100, 0);
  EXPECT_EQ(m.report(Tier::device).level, Level::ok);
  m.record(Tier::device, 85, 100, 1);
  EXPECT_EQ(m.report(Tier::device).level, Level::warning);
  m.record(Tier::device, 96, 100, 2);
  EXPECT_EQ(m.report(Tier::device).level, Level::critical);
  m.record(Tier::device, 10, 100, 3);
  ASSERT_EQ(alerts.size(), 3u);
  EXPECT_EQ(alerts[0], std::make_pair(Level::ok, Level::warning));
  EXPECT_EQ(alerts[1], std::make_pair(Level::warning, Level::critical));
  EXPECT_EQ(alerts[2], std::make_pair(Level::critical, Level::ok));
  TierReport r = m.report(Tier::device);
  EXPECT_EQ(r.warnings, 1u);
  EXPECT_EQ(r.criticals, 1u);
  EXPECT_EQ(r.peak, 96u);
  EXPECT_EQ(m.report(Tier::host).level, Level::ok);  // tiers are independent
}

TEST(Monitor, TimeToOomFromSteadyGrowth) {
  Monitor m;
  constexpr std::uint64_t cap = 10'000'000;
  for (int s = 0; s <= 5; ++s) m.record(Tier::host, 1'000'000ull * s, cap, s * kSec);
  TierReport r = m.report(Tier::host);
  EXPECT_NEAR(r.growth_bytes_per_s, 1e6, 1);
  EXPECT_NEAR(r.time_to_oom_s, 5.0, 1e-6);  // 5 MB left at 1 MB/s
  // Shrinking: no OOM in sight.
  for (int s = 6; s <= 30; ++s)
    m.record(Tier::host, 4'000'000 - 100'000ull * (s - 6), cap, s * kSec);
  r = m.report(Tier::host);
  EXPECT_LT(r.growth_bytes_per_s, 0);
  EXPECT_TRUE(std::isinf(r.time_to_oom_s));
  EXPECT_LE(r.min_time_to_oom_s, 5.0 + 1e-6);  // the worst moment is remembered
}

TEST(Monitor, OneBurstDoesNotSwingTheEstimate) {
  MonitorConfig c;
  c.window_ns = 100 * kSec;
  Monitor m(c);
  constexpr std::uint64_t cap = 1'000'000'000;
  for (int s = 0; s < 50; ++s) m.record(Tier::device, 100'000'000, cap, s * kSec);  // flat
  m.record(Tier::device, 110'000'000, cap, 50 * kSec);                              // one burst
  TierReport r = m.report(Tier::device);
  // A two-point slope would say 10 MB/s; least squares over the window says
  // well under a tenth of that.
  EXPECT_LT(r.growth_bytes_per_s, 1e6);
  EXPECT_GT(r.time_to_oom_s, 800.0);
}

TEST(Monitor, UnboundedTierHasNoLevelOrOom) {
  Monitor m;
  m.record(Tier::ssd, 1, 0, 0);
  m.record(Tier::ssd, 1'000'000, 0, kSec);
  TierReport r = m.report(Tier::ssd);
  EXPECT_EQ(r.fraction, 0);
  EXPECT_EQ(r.level, Level::ok);
  EXPECT_TRUE(std::isinf(r.time_to_oom_s));
  EXPECT_GT(r.growth_bytes_per_s, 0);
}

}  // namespace
}  // namespace u3m::mem
