// Engine::set_observer: every transfer and every change of a tier's use
// reaches the observer, in agreement with the engine's own counters, and
// attached()/detached() bracket the time the observer may read the engine.
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include "engine/rig.hpp"

namespace u3m::engine {
namespace {

using mem::KiB;
using mem::MiB;
using testing::Rig;
using testing::RigOptions;

struct Recorder final : RunObserver {
  std::mutex mu;
  std::vector<TransferRecord> transfers;
  std::uint64_t last_used[mem::kNumTiers] = {};
  std::uint64_t occupancy_calls = 0;
  double last_t[mem::kNumTiers] = {};
  bool time_went_back = false;
  int attached_calls = 0, detached_calls = 0, card = -1;
  EngineStats at_detach{};

  void transfer(const TransferRecord& t) override {
    std::lock_guard g(mu);
    transfers.push_back(t);
  }
  void occupancy(int c, mem::Tier tier, std::uint64_t used, double t_s) override {
    std::lock_guard g(mu);
    const int i = static_cast<int>(tier);
    last_used[i] = used;
    ++occupancy_calls;
    if (t_s < last_t[i]) time_went_back = true;  // reported under the lock: in order
    last_t[i] = t_s;
    card = c;
  }
  void attached(int c, const Engine& e) override {
    ++attached_calls;
    card = c;
    e.stats();  // may read the engine: must not deadlock
  }
  void detached(int, const Engine& e) override {
    ++detached_calls;
    at_detach = e.stats();
  }
};

TEST(EngineObserver, ReportsEveryTransferAndTheUseOfEachTier) {
  Recorder rec;
  EngineStats st;
  {
    RigOptions o;
    o.device = 512 * KiB;
    o.host = 1 * MiB;
    o.ssd = 16 * MiB;
    Rig rig(o);
    rig.engine->set_observer(&rec, 3);
    EXPECT_EQ(rec.attached_calls, 1);
    constexpr int kN = 32;  // 4 MiB through 1.5 MiB of memory tiers: all four links move
    for (int i = 0; i < kN; ++i) {
      ASSERT_EQ(rig.engine->add(100 + i, 128 * KiB), Status::ok);
      ASSERT_EQ(rig.write(100 + i, i), Status::ok) << i;
    }
    for (int i = 0; i < kN; ++i) ASSERT_TRUE(rig.holds(100 + i, i)) << i;
    rig.engine->drain();
    st = rig.engine->stats();
    std::lock_guard g(rec.mu);
    std::uint64_t ok[kNumLinks] = {}, bytes[kNumLinks] = {}, failed[kNumLinks] = {};
    for (const TransferRecord& t : rec.transfers) {
      EXPECT_EQ(t.card, 3);
      EXPECT_LE(t.start_s, t.end_s);
      EXPECT_LT(t.priority, kNumPriorities);
      const int l = static_cast<int>(t.link);
      if (t.ok) {
        ++ok[l];
        bytes[l] += t.bytes;
      } else {
        ++failed[l];
      }
    }
    for (int l = 0; l < kNumLinks; ++l) {
      EXPECT_GT(ok[l], 0u) << to_string(Link(l));
      EXPECT_EQ(ok[l], st.links[l].transfers) << to_string(Link(l));
      EXPECT_EQ(bytes[l], st.links[l].bytes) << to_string(Link(l));
      EXPECT_EQ(failed[l], st.links[l].failures) << to_string(Link(l));
    }
    for (int t = 0; t < mem::kNumTiers; ++t) EXPECT_EQ(rec.last_used[t], st.used[t]) << t;
    EXPECT_FALSE(rec.time_went_back);
    EXPECT_EQ(rec.card, 3);
    EXPECT_EQ(st.hits_by_tier[0] + st.hits_by_tier[1], st.hits);
    EXPECT_EQ(st.misses_by_tier[0] + st.misses_by_tier[1], st.misses);
    EXPECT_GT(st.misses_by_tier[0], 0u);  // the re-reads on the device waited
    EXPECT_EQ(st.hits_by_tier[2] + st.misses_by_tier[2], 0u);
    EXPECT_EQ(rec.detached_calls, 0);
  }
  // The engine's destructor detached the observer, which could still read
  // the final counters then.
  EXPECT_EQ(rec.detached_calls, 1);
  EXPECT_EQ(rec.at_detach.links[0].transfers, st.links[0].transfers);
}

TEST(EngineObserver, ReplacingTheObserverDetachesTheOldOneAndStopsItsReports) {
  Recorder a, b;
  Rig rig;
  rig.engine->set_observer(&a);
  ASSERT_EQ(rig.engine->add(1, 64 * KiB), Status::ok);
  ASSERT_EQ(rig.write(1, 7), Status::ok);
  const std::uint64_t seen = a.occupancy_calls;
  EXPECT_GT(seen, 0u);
  rig.engine->set_observer(&b);
  EXPECT_EQ(a.detached_calls, 1);
  EXPECT_EQ(b.attached_calls, 1);
  ASSERT_TRUE(rig.holds(1, 7, Tier::host));
  EXPECT_EQ(a.occupancy_calls, seen);
  EXPECT_GT(b.occupancy_calls, 0u);
  rig.engine->set_observer(nullptr);
  EXPECT_EQ(b.detached_calls, 1);
}

TEST(EngineObserver, TimesCountFromTheOriginGiven) {
  Recorder rec;
  Rig rig;
  const std::uint64_t origin = SteadyClock().now_ns();  // the rig's engine runs on steady time
  rig.engine->set_observer(&rec, 0, origin);
  ASSERT_EQ(rig.engine->add(1, 64 * KiB), Status::ok);
  ASSERT_EQ(rig.write(1, 7), Status::ok);
  ASSERT_TRUE(rig.holds(1, 7, Tier::host));  // a d2h transfer
  rig.engine->drain();
  std::lock_guard g(rec.mu);
  ASSERT_FALSE(rec.transfers.empty());
  for (const TransferRecord& t : rec.transfers) {
    EXPECT_GE(t.start_s, 0.0);
    EXPECT_LT(t.end_s, 60.0);  // seconds since the origin, not since the clock's epoch
  }
  EXPECT_GE(rec.last_t[0], 0.0);
  EXPECT_LT(rec.last_t[0], 60.0);
}

}  // namespace
}  // namespace u3m::engine
