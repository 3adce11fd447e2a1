// Recompute or fetch (include/u3m/kv/recompute.hpp): the choice against costs the test sets,
// over a fake FIFO link whose backlog grows as the "driver" books the fetches chosen.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "u3m/kv/recompute.hpp"

using namespace u3m;
using namespace u3m::kv;

namespace {

// One fake link per source tier: bandwidth, latency and the seconds already booked on it.
struct FakeLinks {
  double bw = 1e9, lat = 1e-5;
  double backlog[kTiers] = {};
  double recompute = 1e-3;  // seconds per block, any block
  RecomputeCosts costs() {
    return {.recompute_s = [this](std::uint32_t) { return recompute; },
            .fetch_s = [this](Tier f, Tier, std::uint64_t b) {
              return backlog[int(f)] + double(b) / bw + lat;
            },
            .hold_s = [this](Tier, std::uint64_t b) { return double(b) / bw; }};
  }
  void book(const std::vector<const Action*>& moves) {
    for (const Action* m : moves) backlog[int(m->from)] += double(m->bytes) / bw;
  }
};

Action promote(Tier from, std::uint64_t bytes) {
  Action a;
  a.kind = Action::Kind::move;
  a.reason = Action::Reason::promote;
  a.from = from;
  a.to = Tier::device;
  a.bytes = bytes;
  return a;
}

}  // namespace

TEST(KvRecompute, FetchesOverAnIdleLinkAndRecomputesBehindABacklog) {
  FakeLinks l;  // 1 MB fetch: 1.01 ms; recompute 1 ms... make fetch clearly cheaper first
  l.recompute = 5e-3;
  const Action a = promote(Tier::ssd, 1'000'000);
  const std::vector<const Action*> m = {&a};
  const RecomputeCosts c = l.costs();
  EXPECT_EQ(RecomputeOrFetch(c, true).choose(0, m), KvSource::fetch);
  l.backlog[int(Tier::ssd)] = 10e-3;  // someone else's 10 ms on the SSD link
  EXPECT_EQ(RecomputeOrFetch(c, true).choose(0, m), KvSource::recompute);
  // A backlog on the other source does not count.
  l.backlog[int(Tier::ssd)] = 0;
  l.backlog[int(Tier::host)] = 10e-3;
  EXPECT_EQ(RecomputeOrFetch(c, true).choose(0, m), KvSource::fetch);
}

TEST(KvRecompute, WithoutTheChoiceEveryBlockIsFetched) {
  FakeLinks l;
  l.recompute = 1e-9;  // nearly free
  l.backlog[int(Tier::ssd)] = 1.0;
  const Action a = promote(Tier::ssd, 1'000'000);
  const std::vector<const Action*> m = {&a};
  const RecomputeCosts c = l.costs();
  EXPECT_EQ(RecomputeOrFetch(c, false).choose(0, m), KvSource::fetch);
  EXPECT_EQ(RecomputeOrFetch(c, true).choose(0, m), KvSource::recompute);
}

TEST(KvRecompute, TheRequestsOwnFetchesAreNotBacklog) {
  // 8 blocks of 4 ms each over an idle link against 5 ms of recompute: each block's fetch
  // costs its own 4 ms (plus latency), so all are fetched, although by the last one the
  // link holds 28 ms of this request's fetches. A chooser that took those as backlog would
  // recompute from the second block on.
  FakeLinks l;
  l.recompute = 5e-3;
  const Action a = promote(Tier::ssd, 4'000'000);
  const std::vector<const Action*> m = {&a};
  const RecomputeCosts c = l.costs();
  RecomputeOrFetch choice(c, true);
  for (std::uint32_t i = 0; i < 8; ++i) {
    ASSERT_EQ(choice.choose(i, m), KvSource::fetch) << "block " << i;
    l.book(m);
  }
  EXPECT_NEAR(l.backlog[int(Tier::ssd)], 32e-3, 1e-12);
  // A new admission sees all of it as backlog.
  EXPECT_EQ(RecomputeOrFetch(c, true).choose(0, m), KvSource::recompute);
}

TEST(KvRecompute, ABlockFromTwoSourcesWaitsForTheSlower) {
  FakeLinks l;
  l.recompute = 3e-3;
  const Action h = promote(Tier::host, 1'000'000), s = promote(Tier::ssd, 1'000'000);
  const std::vector<const Action*> both = {&h, &s}, host_only = {&h};
  const RecomputeCosts c = l.costs();
  l.backlog[int(Tier::ssd)] = 5e-3;  // the SSD group makes the block dearer than recompute
  EXPECT_EQ(RecomputeOrFetch(c, true).choose(0, host_only), KvSource::fetch);
  EXPECT_EQ(RecomputeOrFetch(c, true).choose(0, both), KvSource::recompute);
  // Bytes of one source add up: two host groups of 1 MB cost 2 ms of link time.
  const std::vector<const Action*> two_host = {&h, &h};
  l.recompute = 1.5e-3;
  EXPECT_EQ(RecomputeOrFetch(c, true).choose(0, host_only), KvSource::fetch);
  EXPECT_EQ(RecomputeOrFetch(c, true).choose(0, two_host), KvSource::recompute);
}

TEST(KvRecompute, TiesFetch) {
  FakeLinks l;
  l.lat = 0;
  l.recompute = 1e-3;
  const Action a = promote(Tier::ssd, 1'000'000);  // exactly 1 ms
  const std::vector<const Action*> m = {&a};
  const RecomputeCosts c = l.costs();
  EXPECT_EQ(RecomputeOrFetch(c, true).choose(0, m), KvSource::fetch);
  EXPECT_EQ(to_string(KvSource::recompute), "recompute");
}

// Note [Blend cost]: the recomputed share rounded up, plus one selection layer of the block.
TEST(KvBlendCost, RecomputedShareRoundedUpPlusTheSelectionLayer) {
  EXPECT_EQ(blend_recompute_tokens(128, 0.15, 32), 20u + 4u);  // ceil(19.2) + 128 / 32
  EXPECT_EQ(blend_recompute_tokens(20, 0.15, 32), 3u + 1u);    // 0.15 x 20 is 3, not 4, +1
  EXPECT_EQ(blend_recompute_tokens(32, 0.15, 40), 5u + 1u);    // ceil(32 / 40) = 1
  EXPECT_EQ(blend_recompute_tokens(128, 0.0, 32), 0u);         // pure reuse: nothing selected
  EXPECT_EQ(blend_recompute_tokens(10, 1.0, 32), 10u);         // capped at the block
  EXPECT_EQ(blend_recompute_tokens(0, 0.15, 32), 0u);
  EXPECT_THROW(blend_recompute_tokens(8, 1.5, 32), std::invalid_argument);
  EXPECT_THROW(blend_recompute_tokens(8, -0.1, 32), std::invalid_argument);
}
