// Heat, thresholds, calibration and the placement rules.
#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "u3m/policy/heat.hpp"
#include "u3m/policy/placement.hpp"

namespace u3m::policy {
namespace {

constexpr std::uint64_t kSec = 1'000'000'000;

TEST(Heat, SteadyRateGivesTheDesignFormula) {
  HeatTracker h(HeatConfig{.window_s = 5.0});
  h.set_tensor(0, 2'000'000, /*refcount=*/3);  // 2 MB, fan-out 3
  // 10 accesses per second for a minute: accesses/window -> about 10/s.
  for (int i = 0; i < 600; ++i) h.access(0, static_cast<std::uint64_t>(i) * kSec / 10);
  const double expect = 10.0 * std::log2(4.0) / 2.0;  // rate * log2(1+3) / 2 MB
  EXPECT_NEAR(h.heat(0, 60 * kSec), expect, 0.05 * expect);
}

TEST(Heat, DecaysWhenUntouchedAndOrdersBySizeAndFanOut) {
  HeatTracker h;
  h.set_tensor(0, 1'000'000, 1);
  h.set_tensor(1, 4'000'000, 1);  // bigger: cooler per access
  h.set_tensor(2, 1'000'000, 7);  // wider fan-out: hotter
  for (std::uint32_t t = 0; t < 3; ++t) h.access(t, 0);
  EXPECT_GT(h.heat(0, 0), h.heat(1, 0));
  EXPECT_GT(h.heat(2, 0), h.heat(0, 0));
  const double now = h.heat(0, 0);
  EXPECT_NEAR(h.heat(0, 5 * kSec), now * std::exp(-1.0), 1e-9 * now);  // one window later
  EXPECT_EQ(h.heat(99, 0), 0.0);                                       // never seen
}

// Note [Heat memo]: repeated queries at one instant, accesses at the instant
// of the last one and the decay table (thousands of distinct dts, so its
// slots are overwritten) must give the very bits of the plain formula:
// c <- c * exp(-dt / window) + 1 and heat = c * exp(-dt / window) / window * scale.
TEST(Heat, MemoAndDecayTableGiveThePlainFormulasBits) {
  constexpr double kWindow = 5.0;
  constexpr std::uint32_t kTensors = 8;
  HeatTracker h(HeatConfig{.window_s = kWindow});
  struct Ref {
    double count = 0, scale = 0;
    std::uint64_t last = 0;
  };
  std::vector<Ref> ref(kTensors);
  for (std::uint32_t t = 0; t < kTensors; ++t) {
    const std::uint64_t bytes = 1'000 + 3'777'777ull * t;
    h.set_tensor(t, bytes, t + 1);
    ref[t].scale = std::log2(1.0 + double(t + 1)) / (double(bytes) / 1e6);
  }
  auto decayed = [&](const Ref& r, std::uint64_t now) {
    const double dt = now > r.last ? double(now - r.last) * 1e-9 : 0.0;
    return r.count * std::exp(-dt / kWindow);
  };
  // Instants mostly advance by odd amounts, sometimes repeat (several ops
  // at one virtual time) or go back (a late query).
  std::uint64_t now = 0, rng = 12345;
  std::size_t accesses = 0;
  for (int round = 0; round < 3000; ++round) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    const std::uint64_t r = rng >> 33;
    if (r % 7 == 0 && now > 5'000'000) {
      now -= r % 5'000'000;
    } else if (r % 5 != 0) {
      now += 1 + r % 400'000'000;
    }
    const std::uint32_t t = static_cast<std::uint32_t>((r >> 8) % kTensors);
    if ((r >> 4) % 3 != 0) {
      h.access(t, now);
      Ref& x = ref[t];
      x.count = decayed(x, now) + 1.0;
      x.last = std::max(x.last, now);
      ++accesses;
    }
    for (std::uint32_t u = 0; u < kTensors; u += 3) {  // others too, twice
      for (int again = 0; again < 2; ++again)
        ASSERT_EQ(h.heat(u, now), decayed(ref[u], now) / kWindow * ref[u].scale)
            << "tensor " << u << " at " << now << " ns, round " << round << ", query " << again;
      // The bound recalibration relies on, and it is the heat at the last access.
      ASSERT_LE(h.heat(u, now), h.peak(u)) << "tensor " << u << ", round " << round;
      ASSERT_EQ(h.peak(u), ref[u].count / kWindow * ref[u].scale);
    }
  }
  EXPECT_GT(accesses, 1500u);
}

TEST(Thresholds, DesignDefaultsMapHeatToTiers) {
  Thresholds th;
  EXPECT_EQ(th.tier_for(0.9), mem::Tier::device);
  EXPECT_EQ(th.tier_for(0.5), mem::Tier::host);
  EXPECT_EQ(th.tier_for(0.3), mem::Tier::host);
  EXPECT_EQ(th.tier_for(0.1), mem::Tier::ssd);
}

TEST(Thresholds, CalibrationFillsTheTargetShareOfEachTier) {
  // Ten 10-byte tensors with heats 1..10; HBM 40 bytes, DRAM 40 bytes, target 100%.
  std::vector<HeatSample> p;
  for (int i = 1; i <= 10; ++i) p.push_back({double(i), 10});
  Thresholds th = calibrate(p, 40, 40, 1.0);
  // The four hottest (10, 9, 8, 7) fit HBM: hot = 6 (strictly hotter qualify).
  EXPECT_DOUBLE_EQ(th.hot, 6.0);
  EXPECT_DOUBLE_EQ(th.warm, 2.0);  // eight fit HBM + DRAM
  std::uint64_t hbm = 0;
  for (auto& s : p) hbm += th.tier_for(s.heat) == mem::Tier::device ? s.bytes : 0;
  EXPECT_EQ(hbm, 40u);
  // Everything fits: thresholds at 0.
  th = calibrate(p, 1000, 0, 1.0);
  EXPECT_EQ(th.hot, 0.0);
}

TEST(Thresholds, RecalibrationKeepsHbmInsideTheBand) {
  Thresholds th{.hot = 1.0, .warm = 0.1};
  Recalibrator r;
  EXPECT_FALSE(r.maybe_adjust(th, 0.95, 0));  // the first period has not passed
  EXPECT_TRUE(r.maybe_adjust(th, 0.95, 30 * kSec));
  EXPECT_DOUBLE_EQ(th.hot, 1.25);                     // too full: fewer tensors qualify
  EXPECT_FALSE(r.maybe_adjust(th, 0.80, 60 * kSec));  // inside the band
  EXPECT_TRUE(r.maybe_adjust(th, 0.50, 90 * kSec));
  EXPECT_DOUBLE_EQ(th.hot, 1.0);
}

TEST(Placement, SeedRulesAreZero3AndLayerAware) {
  PlacementRules r = PlacementRules::named("design-seed");
  using trace::Role;
  EXPECT_EQ(r.home(Role::param, 3, 3), mem::Tier::device);
  EXPECT_EQ(r.home(Role::param, 5, 3), mem::Tier::host);
  EXPECT_EQ(r.home(Role::optim_m, 3, 3), mem::Tier::host);
  EXPECT_EQ(r.home(Role::optim_v, 3, 3), mem::Tier::ssd);
  EXPECT_EQ(r.home(Role::activation, 1, 3), mem::Tier::device);
  PlacementRules so = PlacementRules::named("static-offload");
  EXPECT_EQ(so.home(Role::param, 5, 3), mem::Tier::device);
  EXPECT_EQ(so.home(Role::optim_v, 3, 3), mem::Tier::host);
  EXPECT_EQ(PlacementRules::named("hbm-only").home(Role::optim_v, 0, 0), mem::Tier::device);
  EXPECT_THROW(PlacementRules::named("fastest"), std::exception);
}

}  // namespace
}  // namespace u3m::policy
