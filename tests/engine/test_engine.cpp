// The runtime's behaviour: residency, eviction under a budget, the three
// tiers, priorities, upper copies kept until the lower one is confirmed, OOM.
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "engine/rig.hpp"

namespace u3m::engine {
namespace {

using mem::KiB;
using mem::MiB;
using testing::ManualRig;
using testing::Rig;
using testing::RigOptions;

TEST(Engine, FreshWriteThenReadOnDevice) {
  Rig rig;
  ASSERT_EQ(rig.engine->add(1, 64 * KiB), Status::ok);
  EXPECT_EQ(rig.engine->add(1, 64 * KiB), Status::invalid_argument);  // already registered
  EXPECT_EQ(rig.engine->add(2, 0), Status::invalid_argument);
  ASSERT_EQ(rig.write(1, 7), Status::ok);
  EXPECT_TRUE(rig.holds(1, 7));
  auto r = rig.engine->residency(1);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->valid[0]);
  EXPECT_FALSE(r->valid[1]);
  EXPECT_EQ(rig.engine->stats().used[0], 64 * KiB);
  Lease l;
  EXPECT_EQ(rig.engine->acquire(99, Tier::device, Access::read, &l), Status::not_found);
  EXPECT_EQ(rig.engine->acquire(1, Tier::ssd, Access::read, &l), Status::invalid_argument);
}

TEST(Engine, DeviceBudgetSmallerThanDataEvictsAndKeepsEveryByte) {
  RigOptions o;
  o.device = 1 * MiB;
  Rig rig(o);
  constexpr int kN = 24;  // 24 x 128 KiB = 3 MiB through a 1 MiB device
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(rig.engine->add(i, 128 * KiB), Status::ok);
    ASSERT_EQ(rig.write(i, 1), Status::ok) << i;
  }
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kN; ++i) ASSERT_TRUE(rig.holds(i, 1)) << i;
  }
  EngineStats st = rig.engine->stats();
  EXPECT_LE(st.peak[0], 1 * MiB);
  EXPECT_GT(st.evictions, 0u);
  EXPECT_GT(st.links[static_cast<int>(Link::d2h)].bytes, 0u);
  EXPECT_GT(st.links[static_cast<int>(Link::h2d)].bytes, 0u);
  EXPECT_GT(st.misses, 0u);
  EXPECT_EQ(st.lost_tensors, 0u);
  // The second round re-read clean copies, so some drops needed no write-back.
  EXPECT_GT(st.clean_drops, 0u);
}

TEST(Engine, ThreeTiersSpillToSsdAndComeBack) {
  RigOptions o;
  o.device = 512 * KiB;
  o.host = 1 * MiB;
  o.ssd = 16 * MiB;
  Rig rig(o);
  constexpr int kN = 32;  // 4 MiB of data: most of it must live on SSD
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(rig.engine->add(100 + i, 128 * KiB), Status::ok);
    ASSERT_EQ(rig.write(100 + i, i), Status::ok) << i;
  }
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(rig.holds(100 + i, i)) << i;
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(rig.holds(100 + i, i, Tier::host)) << i;
  EngineStats st = rig.engine->stats();
  EXPECT_LE(st.peak[0], 512 * KiB);
  EXPECT_LE(st.peak[1], 1 * MiB);
  EXPECT_GT(st.links[static_cast<int>(Link::h2s)].bytes, 0u);
  EXPECT_GT(st.links[static_cast<int>(Link::s2h)].bytes, 0u);
  // SSD use is counted like the other tiers: each tensor with a valid SSD
  // copy once (the rest of the 4 MiB cannot fit in HBM + DRAM).
  std::uint64_t on_ssd = 0;
  for (int i = 0; i < kN; ++i) {
    auto r = rig.engine->residency(100 + i);
    ASSERT_TRUE(r.has_value());
    if (r->valid[static_cast<int>(Tier::ssd)]) on_ssd += 128 * KiB;
  }
  EXPECT_GT(on_ssd, 0u);
  EXPECT_EQ(st.used[2], on_ssd);
  EXPECT_GE(st.peak[2], st.used[2]);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(rig.engine->remove(100 + i), Status::ok);
  EXPECT_EQ(rig.engine->stats().used[2], 0u);
}

TEST(Engine, WriteMakesOtherCopiesStale) {
  Rig rig;
  ASSERT_EQ(rig.engine->add(5, 32 * KiB), Status::ok);
  ASSERT_EQ(rig.write(5, 1, Tier::device), Status::ok);
  ASSERT_TRUE(rig.holds(5, 1, Tier::host));  // now on both
  auto r = rig.engine->residency(5);
  EXPECT_TRUE(r->valid[0] && r->valid[1]);
  ASSERT_EQ(rig.write(5, 2, Tier::host), Status::ok);
  r = rig.engine->residency(5);
  EXPECT_FALSE(r->valid[0]);
  EXPECT_TRUE(r->valid[1]);
  EXPECT_TRUE(rig.holds(5, 2, Tier::device));
}

TEST(Engine, LeasesExcludeWritersAndRemoveWhileLeasedIsBusy) {
  Rig rig;
  ASSERT_EQ(rig.engine->add(1, 4 * KiB), Status::ok);
  ASSERT_EQ(rig.write(1, 3), Status::ok);
  Lease r1, r2, w;
  ASSERT_EQ(rig.engine->acquire(1, Tier::device, Access::read, &r1), Status::ok);
  ASSERT_EQ(rig.engine->acquire(1, Tier::device, Access::read, &r2), Status::ok);
  EXPECT_EQ(rig.engine->try_acquire(1, Tier::device, Access::write, &w), Status::busy);
  EXPECT_EQ(rig.engine->remove(1), Status::busy);
  EXPECT_EQ(rig.engine->evict(1, Tier::device), Status::busy);
  EXPECT_EQ(rig.engine->release(r1), Status::ok);
  EXPECT_EQ(rig.engine->release(r2), Status::ok);
  EXPECT_EQ(rig.engine->release(r2), Status::invalid_argument);  // not held any more
  EXPECT_EQ(rig.engine->try_acquire(1, Tier::device, Access::write, &w), Status::ok);
  EXPECT_EQ(rig.engine->release(w), Status::ok);
  EXPECT_EQ(rig.engine->remove(1), Status::ok);
  EXPECT_EQ(rig.engine->stats().used[0], 0u);
}

TEST(Engine, PrefetchBringsTheCopyAheadAndCountsAHit) {
  Rig rig;
  ASSERT_EQ(rig.engine->add(1, 256 * KiB), Status::ok);
  ASSERT_EQ(rig.write(1, 9), Status::ok);
  ASSERT_EQ(rig.engine->evict(1, Tier::device), Status::ok);
  rig.engine->drain();
  auto r = rig.engine->residency(1);
  EXPECT_FALSE(r->valid[0]);
  EXPECT_TRUE(r->valid[1]);
  ASSERT_EQ(rig.engine->prefetch(1, Tier::device), Status::ok);
  rig.engine->drain();
  EngineStats before = rig.engine->stats();
  EXPECT_TRUE(rig.holds(1, 9));
  EngineStats after = rig.engine->stats();
  EXPECT_EQ(after.prefetch_hits, before.prefetch_hits + 1);
  EXPECT_EQ(after.hits, before.hits + 1);
  EXPECT_EQ(after.misses, before.misses);
}

TEST(Engine, OutOfMemoryWhenNothingCanBeEvicted) {
  RigOptions o;
  o.device = 512 * KiB;
  Rig rig(o);
  ASSERT_EQ(rig.engine->add(1, 1 * MiB), Status::ok);  // bigger than the device
  Lease l;
  EXPECT_EQ(rig.engine->acquire(1, Tier::device, Access::write, &l), Status::out_of_memory);
  ASSERT_EQ(rig.engine->add(2, 384 * KiB), Status::ok);
  ASSERT_EQ(rig.engine->add(3, 384 * KiB), Status::ok);
  Lease a, b;
  ASSERT_EQ(rig.engine->acquire(2, Tier::device, Access::write, &a), Status::ok);
  // 2 is pinned; 3 cannot fit beside it, and this thread holds the pin.
  EXPECT_EQ(rig.engine->acquire(3, Tier::device, Access::write, &b), Status::out_of_memory);
  ASSERT_EQ(rig.engine->release(a), Status::ok);
  EXPECT_EQ(rig.engine->acquire(3, Tier::device, Access::write, &b), Status::ok);
  EXPECT_EQ(rig.engine->release(b), Status::ok);
  EXPECT_GE(rig.engine->stats().oom, 2u);
}

// ---- deterministic ordering and failures (manual transport) ----------------

EngineConfig small(std::uint64_t device, std::uint64_t host, double high = 0.90,
                   double low = 0.80) {
  EngineConfig c;
  c.device.capacity = device;
  c.host.capacity = host;
  c.device.high_watermark = high;
  c.device.low_watermark = low;
  return c;
}

TEST(EngineManual, DemandOvertakesQueuedPrefetchesAndWritebacks) {
  EngineConfig c = small(4 * MiB, 16 * MiB);
  c.link_slots = {1, 1, 1, 1};
  ManualRig rig(c);
  Engine& e = *rig.engine;
  for (TensorId id : {1, 2, 3}) {
    ASSERT_EQ(e.add(id, 64 * KiB), Status::ok);
    ASSERT_EQ(testing::write_version(e, id, 0, Tier::host), Status::ok);
  }
  ASSERT_EQ(e.prefetch(1, Tier::device), Status::ok);  // starts: the link is free
  ASSERT_EQ(e.prefetch(2, Tier::device), Status::ok);  // queued behind it
  Lease l;
  ASSERT_EQ(e.try_acquire(3, Tier::device, Access::read, &l), Status::busy);  // demand, queued
  ASSERT_EQ(rig.transport.pending(), 1u);
  EXPECT_EQ(rig.transport.complete().tensor, 1u);
  ASSERT_EQ(rig.transport.pending(), 1u);
  EXPECT_EQ(rig.transport.started.front().tensor, 3u);  // the demand went first
  rig.transport.complete();
  EXPECT_EQ(rig.transport.started.front().tensor, 2u);
  rig.transport.complete();
  ASSERT_EQ(e.try_acquire(3, Tier::device, Access::read, &l), Status::ok);
  EXPECT_EQ(testing::first_mismatch(l.ptr, l.bytes, 3, 0), -1);
  ASSERT_EQ(e.release(l), Status::ok);
  EngineStats st = e.stats();
  EXPECT_EQ(st.links[static_cast<int>(Link::h2d)].by_priority[0], 1u);
  EXPECT_EQ(st.links[static_cast<int>(Link::h2d)].by_priority[1], 2u);
}

TEST(EngineManual, UpperCopyStaysUntilTheLowerIsConfirmed) {
  ManualRig rig(small(4 * MiB, 16 * MiB));
  Engine& e = *rig.engine;
  ASSERT_EQ(e.add(1, 64 * KiB), Status::ok);
  ASSERT_EQ(testing::write_version(e, 1, 4, Tier::device), Status::ok);
  Lease l;

  ASSERT_EQ(e.evict(1, Tier::device), Status::ok);
  ASSERT_EQ(rig.transport.pending(), 1u);
  auto r = e.residency(1);
  EXPECT_TRUE(r->valid[0]);  // still the only copy while d2h runs
  EXPECT_FALSE(r->valid[1]);
  EXPECT_TRUE(r->in_flight);
  // A reader may still use the source during the copy.
  ASSERT_EQ(e.try_acquire(1, Tier::device, Access::read, &l), Status::ok);
  ASSERT_EQ(e.release(l), Status::ok);
  // A writer may not.
  EXPECT_EQ(e.try_acquire(1, Tier::device, Access::write, &l), Status::busy);

  rig.transport.complete(Status::io_error);
  r = e.residency(1);
  EXPECT_TRUE(r->valid[0]);  // kept: the write-back failed
  EXPECT_FALSE(r->valid[1]);
  EXPECT_FALSE(r->lost);
  EXPECT_EQ(e.stats().io_errors, 1u);
  EXPECT_EQ(e.stats().used[1], 0u);  // the failed destination was freed
  // The pending write acquire above asked for a demand; serve it, then evict again.
  rig.clock.advance(1'000'000'000);
  ASSERT_EQ(e.evict(1, Tier::device), Status::ok);
  rig.transport.complete(Status::ok);
  r = e.residency(1);
  EXPECT_FALSE(r->valid[0]);
  EXPECT_TRUE(r->valid[1]);
  ASSERT_EQ(e.try_acquire(1, Tier::host, Access::read, &l), Status::ok);
  EXPECT_EQ(testing::first_mismatch(l.ptr, l.bytes, 1, 4), -1);
  ASSERT_EQ(e.release(l), Status::ok);
}

TEST(EngineManual, FailedDemandFetchIsReportedAndTheTensorIsLostOnlyWithoutACopy) {
  ManualRig rig(small(4 * MiB, 16 * MiB));
  Engine& e = *rig.engine;
  ASSERT_EQ(e.add(1, 64 * KiB), Status::ok);
  ASSERT_EQ(testing::write_version(e, 1, 0, Tier::host), Status::ok);
  Lease l;
  ASSERT_EQ(e.try_acquire(1, Tier::device, Access::read, &l), Status::busy);
  rig.transport.complete(Status::device_failed);
  EXPECT_EQ(e.try_acquire(1, Tier::device, Access::read, &l), Status::device_failed);
  auto r = e.residency(1);
  EXPECT_FALSE(r->lost);  // the host copy is intact
  EXPECT_TRUE(r->valid[1]);
  EXPECT_EQ(e.stats().device_errors, 1u);
}

TEST(EngineManual, SsdReadRetriesThenReportsCorruptAndLost) {
  EngineConfig c = small(4 * MiB, 256 * KiB);
  c.read_retries = 2;
  ManualRig rig(c);
  Engine& e = *rig.engine;
  ASSERT_EQ(e.add(1, 64 * KiB), Status::ok);
  ASSERT_EQ(testing::write_version(e, 1, 1, Tier::host), Status::ok);
  Lease l;
  ASSERT_EQ(e.evict(1, Tier::host), Status::ok);
  EXPECT_EQ(rig.transport.complete().link, Link::h2s);
  EXPECT_FALSE(e.residency(1)->valid[1]);
  EXPECT_TRUE(e.residency(1)->valid[2]);
  ASSERT_EQ(e.try_acquire(1, Tier::host, Access::read, &l), Status::busy);
  rig.transport.complete(Status::corrupt);  // first read fails its checksum
  rig.transport.complete(Status::corrupt);  // retry 1
  ASSERT_EQ(rig.transport.pending(), 1u);   // retry 2 is running
  rig.transport.complete(Status::corrupt);
  EXPECT_EQ(e.try_acquire(1, Tier::host, Access::read, &l), Status::corrupt);
  EngineStats st = e.stats();
  EXPECT_EQ(st.corrupt_reads, 3u);
  EXPECT_EQ(st.links[static_cast<int>(Link::s2h)].retries, 2u);
  EXPECT_EQ(st.lost_tensors, 1u);
  EXPECT_TRUE(e.residency(1)->lost);
}

TEST(EngineManual, WatermarkEvictionStartsAboveHighAndStopsAtLow) {
  EngineConfig c = small(1 * MiB, 16 * MiB, 0.75, 0.5);
  ManualRig rig(c);
  Engine& e = *rig.engine;
  for (TensorId id = 1; id <= 6; ++id) {
    ASSERT_EQ(e.add(id, 128 * KiB), Status::ok);
    ASSERT_EQ(testing::write_version(e, id, 0, Tier::device), Status::ok);
  }
  // 768 KiB = 75%: not above the high watermark yet.
  EXPECT_EQ(rig.transport.pending(), 0u);
  ASSERT_EQ(e.add(7, 128 * KiB), Status::ok);
  ASSERT_EQ(testing::write_version(e, 7, 0, Tier::device), Status::ok);
  Lease l;
  // 896 KiB > 768 KiB: evict least recently used down to 512 KiB (3 tensors).
  EXPECT_EQ(rig.transport.pending(), 2u);  // d2h has two slots; the third is queued
  EXPECT_EQ(rig.transport.started[0].tensor, 1u);
  EXPECT_EQ(rig.transport.started[1].tensor, 2u);
  rig.transport.complete();
  rig.transport.complete();
  rig.transport.complete();
  EXPECT_EQ(e.stats().used[0], 512 * KiB);
  EXPECT_FALSE(e.residency(3)->valid[0]);
  EXPECT_TRUE(e.residency(4)->valid[0]);
}

TEST(EngineManual, VictimScoreOrdersEvictionAndInfinityPins) {
  EngineConfig c = small(1 * MiB, 16 * MiB, 0.75, 0.5);
  c.link_slots = {8, 8, 8, 8};
  ManualRig rig(c);
  Engine& e = *rig.engine;
  e.set_victim_order(Engine::VictimOrder::scores);
  // Highest id first, except tensor 7, which the policy pins.
  for (TensorId id = 1; id <= 7; ++id) {
    const double s = id == 7 ? std::numeric_limits<double>::infinity() : -static_cast<double>(id);
    ASSERT_EQ(e.add(id, 128 * KiB, {s, s}), Status::ok);
    ASSERT_EQ(testing::write_version(e, id, 0, Tier::device), Status::ok);
  }
  ASSERT_EQ(rig.transport.pending(), 3u);
  EXPECT_EQ(rig.transport.started[0].tensor, 6u);
  EXPECT_EQ(rig.transport.started[1].tensor, 5u);
  EXPECT_EQ(rig.transport.started[2].tensor, 4u);
}

// Equal scores: the least recently used goes first, as before the heap
// (Note [Victim selection]); touching a tensor moves it to the back.
TEST(EngineManual, VictimScoreTiesGoToTheLeastRecentlyUsed) {
  EngineConfig c = small(1 * MiB, 16 * MiB, 0.75, 0.5);
  c.link_slots = {8, 8, 8, 8};
  ManualRig rig(c);
  Engine& e = *rig.engine;
  e.set_victim_order(Engine::VictimOrder::scores);
  // Tensors 1-3 score alike and lower than 4-6, so they go first, in LRU order.
  for (TensorId id = 1; id <= 6; ++id) {
    const double s = id <= 3 ? 0.0 : 1.0;
    ASSERT_EQ(e.add(id, 128 * KiB, {s, s}), Status::ok);
    ASSERT_EQ(testing::write_version(e, id, 0, Tier::device), Status::ok);
  }
  Lease l;  // 1 becomes the most recently used of the three
  ASSERT_EQ(e.acquire(1, Tier::device, Access::read, &l), Status::ok);
  ASSERT_EQ(e.release(l), Status::ok);
  ASSERT_EQ(rig.transport.pending(), 0u);
  ASSERT_EQ(e.add(7, 128 * KiB, {1.0, 1.0}), Status::ok);
  ASSERT_EQ(testing::write_version(e, 7, 0, Tier::device), Status::ok);
  // 896 KiB > 768 KiB: down to 512 KiB takes three, 2, 3, then 1.
  ASSERT_EQ(rig.transport.pending(), 3u);
  EXPECT_EQ(rig.transport.started[0].tensor, 2u);
  EXPECT_EQ(rig.transport.started[1].tensor, 3u);
  EXPECT_EQ(rig.transport.started[2].tensor, 1u);
}

// Note [Published victim scores]: the order is what was published last; a
// score lowered from +inf makes a pinned copy a victim at the next scan, and under
// the owner order the engine evicts nothing by itself.
TEST(EngineManual, PublishedScoresReorderAndUnpinVictims) {
  EngineConfig c = small(1 * MiB, 16 * MiB, 0.75, 0.5);
  c.link_slots = {8, 8, 8, 8};
  ManualRig rig(c);
  Engine& e = *rig.engine;
  e.set_victim_order(Engine::VictimOrder::scores);
  const double inf = std::numeric_limits<double>::infinity();
  for (TensorId id = 1; id <= 7; ++id) {
    ASSERT_EQ(e.add(id, 128 * KiB, {inf, inf}), Status::ok);
    ASSERT_EQ(testing::write_version(e, id, 0, Tier::device), Status::ok);
  }
  EXPECT_EQ(rig.transport.pending(), 0u);  // 896 KiB, above the watermark, all pinned
  const Engine::ScoreUpdate u[] = {{5, {2.0, 2.0}}, {2, {1.0, 1.0}}, {6, {3.0, 3.0}},
                                   {99, {0.0, 0.0}}};  // 99: not registered, skipped
  e.publish_scores(u);
  EXPECT_EQ(rig.transport.pending(), 0u);  // at the next scan, not at once
  Lease l;
  ASSERT_EQ(e.acquire(1, Tier::device, Access::read, &l), Status::ok);
  ASSERT_EQ(e.release(l), Status::ok);
  // Down to 512 KiB: three go, lowest score first.
  ASSERT_EQ(rig.transport.pending(), 3u);
  EXPECT_EQ(rig.transport.started[0].tensor, 2u);
  EXPECT_EQ(rig.transport.started[1].tensor, 5u);
  EXPECT_EQ(rig.transport.started[2].tensor, 6u);

  ManualRig owned(c);
  Engine& o = *owned.engine;
  o.set_victim_order(Engine::VictimOrder::owner);
  for (TensorId id = 1; id <= 7; ++id) {
    ASSERT_EQ(o.add(id, 128 * KiB), Status::ok);
    ASSERT_EQ(testing::write_version(o, id, 0, Tier::device), Status::ok);
  }
  EXPECT_EQ(owned.transport.pending(), 0u);
  ASSERT_EQ(o.evict(3, Tier::device), Status::ok);  // the owner's own eviction still runs
  EXPECT_EQ(owned.transport.pending(), 1u);
}

// Ids far apart and in strides (as pointers or hashes would be) in the flat
// id table (Note [Entry table]): every one is found until removed, removing
// some in the middle of probe runs loses none of the others, and a removed
// id can be added again.
TEST(EngineManual, ManyTensorIdsAddRemoveAndAddAgain) {
  ManualRig rig(small(4 * MiB, 16 * MiB));
  Engine& e = *rig.engine;
  std::vector<TensorId> ids;
  for (std::uint64_t i = 0; i < 3000; ++i) ids.push_back(i * 4096 + (i % 3) * (1ull << 40) + 1);
  for (TensorId id : ids) ASSERT_EQ(e.add(id, 64), Status::ok);
  EXPECT_EQ(e.add(ids[17], 64), Status::invalid_argument);  // already there
  for (std::size_t i = 0; i < ids.size(); i += 3) ASSERT_EQ(e.remove(ids[i]), Status::ok);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(e.residency(ids[i]).has_value(), i % 3 != 0) << i;
  }
  EXPECT_EQ(e.stats().tensors, 2000u);
  for (std::size_t i = 0; i < ids.size(); i += 3) ASSERT_EQ(e.add(ids[i], 64), Status::ok);
  for (TensorId id : ids) ASSERT_TRUE(e.residency(id).has_value()) << id;
  EXPECT_EQ(e.remove(12345), Status::not_found);
  EXPECT_EQ(e.stats().tensors, 3000u);
}

// Small ids are indexed directly, others hashed (Note [Entry table]): an id
// added while out of the direct range moves into it when the range grows,
// and is still found once, duplicates refused, removal complete.
TEST(EngineManual, HashedIdsMoveIntoTheDirectRangeAsItGrows) {
  ManualRig rig(small(4 * MiB, 16 * MiB));
  Engine& e = *rig.engine;
  constexpr TensorId kLate = 5000;       // beyond the direct range while the table is small
  constexpr TensorId kFar = 1ull << 50;  // always hashed
  ASSERT_EQ(e.add(kLate, 64), Status::ok);
  ASSERT_EQ(e.add(kFar, 64), Status::ok);
  for (TensorId id = 0; id < kLate; ++id) ASSERT_EQ(e.add(id, 64), Status::ok) << id;
  EXPECT_EQ(e.add(kLate, 64), Status::invalid_argument);  // found where it moved
  EXPECT_EQ(e.add(kFar, 64), Status::invalid_argument);
  EXPECT_EQ(e.stats().tensors, kLate + 2);
  for (TensorId id : {TensorId{0}, TensorId{4999}, kLate, kFar})
    EXPECT_TRUE(e.residency(id).has_value()) << id;
  ASSERT_EQ(e.remove(kLate), Status::ok);
  EXPECT_FALSE(e.residency(kLate).has_value());
  EXPECT_EQ(e.remove(kLate), Status::not_found);
  ASSERT_EQ(e.remove(kFar), Status::ok);
  EXPECT_EQ(e.stats().tensors, kLate);
  ASSERT_EQ(e.add(kLate, 64), Status::ok);  // and comes back
  EXPECT_TRUE(e.residency(kLate).has_value());
}

// The monitor's growth is the least-squares slope of the device use over one
// sample per interval, the last use of an interval winning, however many
// allocations and frees come within it (the running sums update the newest
// sample in place). Checked against a direct fit of the samples.
TEST(EngineManual, MonitorGrowthIsTheLeastSquaresFitOfTheSamples) {
  ManualRig rig(small(64 * MiB, 64 * MiB));
  Engine& e = *rig.engine;
  const std::uint64_t interval = e.config().monitor.sample_interval_ns;
  std::vector<double> xs, ys;
  TensorId next = 1;
  std::uint64_t used = 0;
  for (int k = 0; k < 12; ++k) {
    rig.clock.set(static_cast<std::uint64_t>(k) * 3 * interval);
    // Within one instant: three allocations of growing size, and one free.
    for (int a = 0; a < 3; ++a) {
      const std::uint64_t bytes = (64 + 16 * k + a) * KiB;
      ASSERT_EQ(e.add(next, bytes), Status::ok);
      ASSERT_EQ(testing::write_version(e, next, 0, Tier::device), Status::ok);
      used += bytes;
      ++next;
    }
    ASSERT_EQ(e.remove(next - 2), Status::ok);  // the second of the three
    used -= (64 + 16 * k + 1) * KiB;
    xs.push_back(static_cast<double>(k) * 3 * static_cast<double>(interval) * 1e-9);
    ys.push_back(static_cast<double>(used));
  }
  ASSERT_EQ(e.stats().used[0], used);
  const double n = static_cast<double>(xs.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    sx += xs[i], sy += ys[i], sxx += xs[i] * xs[i], sxy += xs[i] * ys[i];
  }
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  const mem::TierReport r = e.monitor(Tier::device);
  ASSERT_GT(slope, 0);
  EXPECT_NEAR(r.growth_bytes_per_s, slope, 1e-9 * slope);
  const double headroom = static_cast<double>(64 * MiB - used);
  EXPECT_NEAR(r.time_to_oom_s, headroom / r.growth_bytes_per_s, 1e-12 * r.time_to_oom_s);
  EXPECT_LE(r.min_time_to_oom_s, r.time_to_oom_s);
  EXPECT_EQ(r.used, used);
}

// A queued eviction found stale while a demand copy of the same tensor runs
// must not leave the tensor marked as leaving (found in review: it then could
// never be evicted again).
TEST(EngineManual, EvictionDroppedWhileADemandCopyRunsLeavesNoStuckFlag) {
  EngineConfig c = small(256 * KiB, 16 * MiB, 0.75, 0.5);
  c.link_slots = {2, 2, 2, 2};
  ManualRig rig(c);
  Engine& e = *rig.engine;
  for (TensorId id : {1, 2, 3}) {
    ASSERT_EQ(e.add(id, 64 * KiB), Status::ok);
    ASSERT_EQ(testing::write_version(e, id, 1, Tier::device), Status::ok);
  }
  ASSERT_EQ(e.evict(1, Tier::device), Status::ok);  // two write-backs fill the d2h slots
  ASSERT_EQ(e.evict(2, Tier::device), Status::ok);
  ASSERT_EQ(e.evict(3, Tier::device), Status::ok);  // queued
  Lease l;
  ASSERT_EQ(e.try_acquire(3, Tier::host, Access::read, &l), Status::busy);  // demand, queued first
  rig.transport.complete();  // frees a slot: the demand copy of 3 starts
  EXPECT_EQ(rig.transport.started.back().tensor, 3u);
  rig.transport.complete();  // the eviction of 3 is popped while 3 moves: stale
  rig.transport.complete();  // the demand copy lands; 3 is clean on the device
  ASSERT_EQ(rig.transport.pending(), 0u);
  auto r = e.residency(3);
  ASSERT_TRUE(r->valid[0] && r->valid[1]);
  // Pressure now must drop 3 (least recently used, clean) rather than skip it.
  for (TensorId id : {4, 5, 6}) {
    ASSERT_EQ(e.add(id, 64 * KiB), Status::ok);
    ASSERT_EQ(testing::write_version(e, id, 1, Tier::device), Status::ok);
  }
  EXPECT_FALSE(e.residency(3)->valid[0]);
  EXPECT_TRUE(e.residency(3)->valid[1]);
}

TEST(EngineConfigTest, ValidateNamesTheField) {
  EngineConfig c;
  c.device.low_watermark = 0.95;
  try {
    c.validate();
    FAIL() << "expected InputError";
  } catch (const std::exception& ex) {
    EXPECT_NE(std::string(ex.what()).find("device"), std::string::npos) << ex.what();
  }
}

}  // namespace
}  // namespace u3m::engine
