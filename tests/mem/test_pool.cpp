// DevicePool behaviour: rounding, split/coalesce, best fit, caching, out of
// memory, expandable segments, fragmentation; and the two segment sources. Most tests run over
// VirtualSegmentSource (fake addresses, never dereferenced); the ones that check data use
// CpuSegmentSource (real memory).
#include "u3m/mem/pool.hpp"

#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "u3m/util/error.hpp"

namespace u3m::mem {
namespace {

std::uintptr_t addr(const PoolAllocation& a) {
  return reinterpret_cast<std::uintptr_t>(a.ptr);
}

// Allocates or fails the test.
PoolAllocation must_alloc(DevicePool& pool, std::uint64_t bytes) {
  PoolAllocation a;
  Status s = pool.allocate(bytes, &a);
  EXPECT_EQ(s, Status::ok) << "allocate(" << bytes << "): " << to_string(s);
  return a;
}

TEST(PoolConfigTest, ParsesAndRejects) {
  PoolConfig c = PoolConfig::parse("expandable_segments:True,alignment:4096,capacity:64MiB");
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c.alignment, 4096u);
  EXPECT_EQ(c.capacity, 64 * MiB);
  EXPECT_EQ(PoolConfig::parse(c.describe()).describe(), c.describe());
  EXPECT_THROW(PoolConfig::parse("alignment:1000"), InputError);  // not a power of two
  EXPECT_THROW(PoolConfig::parse("colour:blue"), InputError);
  EXPECT_THROW(PoolConfig::parse("capacity:lots"), InputError);
  try {
    PoolConfig::parse("expandable_segments:maybe", "--pool-config");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--pool-config: expandable_segments"), std::string::npos)
        << e.what();
  }
}

TEST(PoolTest, RoundsAndAligns) {
  VirtualSegmentSource src;
  DevicePool pool(src);
  for (std::uint64_t bytes : {1u, 511u, 512u, 513u, 1000u, 70000u}) {
    PoolAllocation a = must_alloc(pool, bytes);
    EXPECT_EQ(addr(a) % 512, 0u);
    EXPECT_EQ(a.size, (bytes + 511) / 512 * 512) << bytes;
    EXPECT_EQ(a.requested, bytes);
  }
  PoolConfig c;
  c.alignment = 4096;
  DevicePool pool4k(src, c);
  PoolAllocation a = must_alloc(pool4k, 100), b = must_alloc(pool4k, 100);
  EXPECT_EQ(addr(a) % 4096, 0u);
  EXPECT_EQ(addr(b) - addr(a), 4096u);
  EXPECT_EQ(pool.stats().requested_bytes, 1u + 511 + 512 + 513 + 1000 + 70000);
}

// With and without the fast-path cache (Note [Fast path]): the layout the
// pool shows, and reuses, is the coalesced one either way.
class SplitCoalesceTest : public ::testing::TestWithParam<std::uint64_t> {};

TEST_P(SplitCoalesceTest, SplitsAndCoalesces) {
  VirtualSegmentSource src;
  PoolConfig config;
  config.fast_cache_blocks = GetParam();
  DevicePool pool(src, config);
  PoolAllocation a = must_alloc(pool, 256 * KiB), b = must_alloc(pool, 256 * KiB),
                 c = must_alloc(pool, 256 * KiB);
  // One 2 MiB small segment, split into a, b, c and a free remainder.
  EXPECT_EQ(pool.stats().segments, 1u);
  EXPECT_EQ(addr(b), addr(a) + 256 * KiB);
  EXPECT_EQ(addr(c), addr(b) + 256 * KiB);
  std::vector<BlockInfo> layout = pool.snapshot();
  ASSERT_EQ(layout.size(), 4u);
  EXPECT_FALSE(layout[3].allocated);
  EXPECT_EQ(layout[3].size, 2 * MiB - 768 * KiB);

  ASSERT_EQ(pool.free(b), Status::ok);
  EXPECT_EQ(pool.snapshot().size(), 4u);  // a hole between a and c
  EXPECT_EQ(pool.stats().free_blocks, 2u);
  ASSERT_EQ(pool.free(a), Status::ok);  // merges with the hole after it
  layout = pool.snapshot();
  ASSERT_EQ(layout.size(), 3u);
  EXPECT_FALSE(layout[0].allocated);
  EXPECT_EQ(layout[0].size, 512 * KiB);
  ASSERT_EQ(pool.free(c), Status::ok);  // merges both sides: one free block again
  layout = pool.snapshot();
  ASSERT_EQ(layout.size(), 1u);
  EXPECT_EQ(layout[0].size, 2 * MiB);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.free_blocks, 1u);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.active_blocks, 0u);
  EXPECT_EQ(s.alloc_count, 3u);
  EXPECT_EQ(s.free_count, 3u);
  // A request larger than the three together fits the segment: no growth.
  PoolAllocation big = must_alloc(pool, 1 * MiB);
  EXPECT_GE(addr(big), addr(a));
  EXPECT_LE(addr(big) + big.size, addr(a) + 2 * MiB);
  EXPECT_EQ(src.counters().calls(), 1u);
}
INSTANTIATE_TEST_SUITE_P(FastCache, SplitCoalesceTest, ::testing::Values(0, 32));

TEST(PoolTest, FastPathReusesTheSameBlockAndNeverCostsMemory) {
  VirtualSegmentSource src;
  DevicePool pool(src);
  PoolAllocation keep = must_alloc(pool, 1 * MiB), a = must_alloc(pool, 512 * KiB);
  ASSERT_EQ(pool.free(a), Status::ok);  // cached whole, next to the 512 KiB free tail
  PoolAllocation b = must_alloc(pool, 512 * KiB);
  EXPECT_EQ(addr(b), addr(a));
  ASSERT_EQ(pool.free(b), Status::ok);
  // A request that no cached size matches: the cache merges first, so the
  // 512 KiB block plus the 512 KiB tail serve it without a new segment.
  PoolAllocation c = must_alloc(pool, 640 * KiB);
  EXPECT_EQ(addr(c), addr(a));
  EXPECT_EQ(pool.stats().segments, 1u);
  EXPECT_EQ(src.counters().calls(), 1u);
  (void)keep;
}

TEST(PoolTest, BestFitPicksTheSmallestHoleThatFits) {
  VirtualSegmentSource src;
  DevicePool pool(src);
  // Holes of 1024, 256 and 512 KiB in address order, separated by live
  // blocks; 253 KiB stay free at the end of the 2 MiB segment.
  PoolAllocation h1 = must_alloc(pool, 1024 * KiB), s1 = must_alloc(pool, 1 * KiB),
                 h2 = must_alloc(pool, 256 * KiB), s2 = must_alloc(pool, 1 * KiB),
                 h3 = must_alloc(pool, 512 * KiB), s3 = must_alloc(pool, 1 * KiB);
  ASSERT_EQ(pool.stats().segments, 1u);
  for (auto* h : {&h1, &h2, &h3}) ASSERT_EQ(pool.free(*h), Status::ok);
  EXPECT_EQ(addr(must_alloc(pool, 300 * KiB)), addr(h3));  // 512 KiB hole, not the first
  EXPECT_EQ(addr(must_alloc(pool, 256 * KiB)), addr(h2));  // the exact fit
  EXPECT_EQ(addr(must_alloc(pool, 700 * KiB)), addr(h1));
  (void)s1, (void)s2, (void)s3;
}

TEST(PoolTest, LargePoolKeepsOnlyWorthwhileRemainders) {
  VirtualSegmentSource src;
  DevicePool pool(src);
  PoolAllocation a = must_alloc(pool, 3 * MiB);  // from a 20 MiB large segment
  EXPECT_EQ(a.size, 3 * MiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 20 * MiB);
  // 16.5 MiB fits the 17 MiB remainder; the 0.5 MiB left is not worth a block.
  PoolAllocation b = must_alloc(pool, 16 * MiB + 512 * KiB);
  EXPECT_EQ(b.size, 17 * MiB);
  EXPECT_EQ(pool.stats().segments, 1u);
  // >= min_large_alloc: a segment of its own, rounded to 2 MiB; the 1 MiB
  // remainder is not more than large_split_min, so the block keeps it.
  PoolAllocation c = must_alloc(pool, 11 * MiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 20 * MiB + 12 * MiB);
  EXPECT_EQ(c.size, 12 * MiB);
}

TEST(PoolTest, CachedBlocksAreReusedWithoutSourceCalls) {
  VirtualSegmentSource src;
  DevicePool pool(src);
  PoolAllocation warm = must_alloc(pool, 64 * KiB);
  ASSERT_EQ(pool.free(warm), Status::ok);
  std::uint64_t calls = src.counters().calls();
  EXPECT_EQ(calls, 1u);  // one segment
  for (int i = 0; i < 1000; ++i) {
    PoolAllocation a = must_alloc(pool, 64 * KiB), b = must_alloc(pool, 512);
    ASSERT_EQ(pool.free(a), Status::ok);
    ASSERT_EQ(pool.free(b), Status::ok);
  }
  EXPECT_EQ(src.counters().calls(), calls);
  EXPECT_EQ(pool.stats().source_calls, calls);
  EXPECT_EQ(pool.empty_cache(), 2 * MiB);
  EXPECT_EQ(src.counters().free_segment.load(), 1u);
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
}

TEST(PoolTest, RejectsBadHandles) {
  VirtualSegmentSource src;
  DevicePool pool(src), other(src);
  PoolAllocation a;
  EXPECT_EQ(pool.allocate(0, &a), Status::invalid_argument);
  EXPECT_EQ(pool.allocate(10, nullptr), Status::invalid_argument);
  a = must_alloc(pool, 1000);
  EXPECT_EQ(other.free(a), Status::invalid_argument);  // not this pool's
  ASSERT_EQ(pool.free(a), Status::ok);
  EXPECT_EQ(pool.free(a), Status::invalid_argument);  // double free
  PoolAllocation b = must_alloc(pool, 1000);          // same address, new generation
  EXPECT_EQ(addr(b), addr(a));
  EXPECT_EQ(pool.free(a), Status::invalid_argument);  // stale handle
  EXPECT_EQ(pool.stats().active_blocks, 1u);
  EXPECT_EQ(pool.free(b), Status::ok);
}

TEST(PoolTest, OutOfMemoryAndRecovery) {
  VirtualSegmentSource src;
  PoolConfig c;
  c.capacity = 4 * MiB;
  DevicePool pool(src, c);
  std::vector<PoolAllocation> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(must_alloc(pool, 1 * MiB));
  PoolAllocation x;
  EXPECT_EQ(pool.allocate(1 * MiB, &x), Status::out_of_memory);
  EXPECT_FALSE(x);
  EXPECT_EQ(pool.stats().oom_count, 1u);
  EXPECT_EQ(pool.stats().reserved_bytes, 4 * MiB);
  ASSERT_EQ(pool.free(blocks[1]), Status::ok);
  EXPECT_EQ(pool.allocate(1 * MiB, &x), Status::ok);
  EXPECT_EQ(addr(x), addr(blocks[1]));
}

TEST(PoolTest, FlushesCachedSegmentsBeforeGivingUp) {
  VirtualSegmentSource src;
  PoolConfig c;
  c.capacity = 20 * MiB;
  DevicePool pool(src, c);
  ASSERT_EQ(pool.free(must_alloc(pool, 4 * KiB)), Status::ok);  // a cached 2 MiB small segment
  PoolAllocation big = must_alloc(pool, 20 * MiB);  // needs all 20: the cache must go first
  EXPECT_TRUE(big);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.cache_flushes, 1u);
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.peak_reserved_bytes, 20 * MiB);
}

TEST(PoolTest, SourceFailureLeavesThePoolIntact) {
  VirtualSegmentSource src(2 * MiB, /*physical_capacity=*/4 * MiB);
  DevicePool pool(src);
  PoolAllocation a = must_alloc(pool, 1 * MiB), b;
  src.fail_after(0);
  EXPECT_EQ(pool.allocate(2 * MiB, &b), Status::out_of_memory);
  EXPECT_EQ(pool.stats().reserved_bytes, 2 * MiB);
  EXPECT_EQ(pool.allocate(30 * MiB, &b), Status::out_of_memory);  // device full
  EXPECT_EQ(src.counters().physical_bytes.load(), 2 * MiB);
  b = must_alloc(pool, 1 * MiB);  // the cached segment still serves
  EXPECT_EQ(pool.stats().segments, 1u);
  (void)a;
}

TEST(PoolTest, FragmentationOfHandMadeLayouts) {
  EXPECT_EQ(fragmentation(0, 0), 0.0);
  EXPECT_DOUBLE_EQ(fragmentation(5, 10), 0.5);
  VirtualSegmentSource src;
  DevicePool pool(src);
  std::vector<PoolAllocation> q;
  for (int i = 0; i < 8; ++i) q.push_back(must_alloc(pool, 256 * KiB));  // fills 2 MiB exactly
  EXPECT_EQ(pool.stats().fragmentation, 0.0);                            // nothing free
  for (int i : {0, 2, 4}) ASSERT_EQ(pool.free(q[i]), Status::ok);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.free_bytes, 768 * KiB);
  EXPECT_EQ(s.largest_free_bytes, 256 * KiB);
  EXPECT_NEAR(s.fragmentation, 1 - 1.0 / 3, 1e-12);
  ASSERT_EQ(pool.free(q[6]), Status::ok);
  EXPECT_NEAR(pool.stats().fragmentation, 0.75, 1e-12);
  ASSERT_EQ(pool.free(q[1]), Status::ok);  // 0..2 merge: 768 of 1280 KiB in one piece
  EXPECT_NEAR(pool.stats().fragmentation, 1 - 768.0 / 1280, 1e-12);
}

TEST(PoolTest, ExpandableSegmentsGrowAndShrinkWithUse) {
  VirtualSegmentSource src(2 * MiB);
  PoolConfig c;
  c.expandable_segments = true;
  DevicePool pool(src, c);
  PoolAllocation a = must_alloc(pool, 3 * MiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 4 * MiB);  // two 2 MiB chunks
  PoolAllocation b = must_alloc(pool, 3 * MiB);     // 1 MiB tail + one more chunk
  EXPECT_EQ(addr(b), addr(a) + 3 * MiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 6 * MiB);
  EXPECT_EQ(src.counters().physical_bytes.load(), 6 * MiB);
  EXPECT_EQ(src.counters().reserve.load(), 1u);
  ASSERT_EQ(pool.free(b), Status::ok);  // the trailing chunk goes back at once
  EXPECT_EQ(pool.stats().reserved_bytes, 4 * MiB);
  EXPECT_EQ(src.counters().physical_bytes.load(), 4 * MiB);
  PoolAllocation c2 = must_alloc(pool, 9 * MiB);
  EXPECT_EQ(addr(c2), addr(a) + 3 * MiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 12 * MiB);
  ASSERT_EQ(pool.free(a), Status::ok);  // a hole below a live block stays mapped
  EXPECT_EQ(pool.stats().reserved_bytes, 12 * MiB);
  ASSERT_EQ(pool.free(c2), Status::ok);
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
  EXPECT_EQ(src.counters().physical_bytes.load(), 0u);
  EXPECT_EQ(pool.stats().peak_reserved_bytes, 12 * MiB);
}

TEST(PoolTest, ExpandableKeepHoldsATailMapped) {
  VirtualSegmentSource src(2 * MiB);
  PoolConfig c;
  c.expandable_segments = true;
  c.expandable_keep = 2 * MiB;
  DevicePool pool(src, c);
  PoolAllocation a = must_alloc(pool, 8 * MiB);
  ASSERT_EQ(pool.free(a), Status::ok);
  EXPECT_EQ(pool.stats().reserved_bytes, 2 * MiB);
  std::uint64_t maps = src.counters().map;
  ASSERT_EQ(pool.free(must_alloc(pool, 2 * MiB)), Status::ok);  // served by the kept chunk
  EXPECT_EQ(src.counters().map.load(), maps);
  EXPECT_EQ(pool.empty_cache(), 2 * MiB);
  EXPECT_EQ(src.counters().physical_bytes.load(), 0u);
}

// Note [Expandable segments]: batch size N, then N+1. Plain segments keep the
// old N-sized segments and add N+1-sized ones; one expandable range reuses
// the same addresses.
TEST(PoolTest, ExpandableSegmentsAvoidGrowingBatchSlivers) {
  auto run = [](bool expandable) {
    VirtualSegmentSource src(2 * MiB);
    PoolConfig c;
    c.expandable_segments = expandable;
    DevicePool pool(src, c);
    for (std::uint64_t batch = 10; batch <= 14; ++batch) {
      std::vector<PoolAllocation> layer;
      for (int i = 0; i < 6; ++i) layer.push_back(must_alloc(pool, batch * MiB + 300 * KiB));
      for (auto& a : layer) EXPECT_EQ(pool.free(a), Status::ok);
    }
    return pool.stats().peak_reserved_bytes;
  };
  std::uint64_t plain = run(false), expandable = run(true);
  EXPECT_LT(expandable, plain);
  EXPECT_LE(expandable, 6 * (15 * MiB));  // the largest batch's blocks, chunk-rounded
}

// Data survives growth of an expandable range: chunks map after the live ones.
TEST(CpuSourceTest, ExpandableKeepsDataWhileGrowing) {
  CpuSegmentSource src(2 * MiB);
  PoolConfig c;
  c.expandable_segments = true;
  c.expandable_reserve = 256 * MiB;
  DevicePool pool(src, c);
  PoolAllocation a = must_alloc(pool, 3 * MiB);
  std::memset(a.ptr, 0xA5, a.requested);
  std::vector<PoolAllocation> more;
  for (int i = 0; i < 5; ++i) {
    more.push_back(must_alloc(pool, 5 * MiB));
    std::memset(more.back().ptr, i, more.back().requested);
  }
  EXPECT_EQ(src.counters().physical_bytes.load(), pool.stats().reserved_bytes);
  const auto* p = static_cast<const unsigned char*>(a.ptr);
  for (std::uint64_t i = 0; i < a.requested; i += 4093) ASSERT_EQ(p[i], 0xA5) << i;
  for (auto& m : more) ASSERT_EQ(pool.free(m), Status::ok);
  EXPECT_EQ(src.counters().physical_bytes.load(), 4 * MiB);
  ASSERT_EQ(pool.free(a), Status::ok);
  EXPECT_EQ(src.counters().physical_bytes.load(), 0u);
  // A chunk mapped again starts from zero: the old pages were really dropped.
  PoolAllocation b = must_alloc(pool, 1 * MiB + 1);
  EXPECT_EQ(static_cast<const unsigned char*>(b.ptr)[0], 0);
}

TEST(CpuSourceTest, SegmentsAreAlignedAndCapacityBounded) {
  CpuSegmentSource src(2 * MiB, /*physical_capacity=*/8 * MiB);
  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(src.allocate_segment(6 * MiB, &a), Status::ok);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % (2 * MiB), 0u);
  EXPECT_EQ(src.allocate_segment(4 * MiB, &b), Status::out_of_memory);
  EXPECT_EQ(src.allocate_segment(3 * MiB, &b), Status::invalid_argument);  // not granular
  std::memset(a, 1, 6 * MiB);
  EXPECT_EQ(src.free_segment(a, 6 * MiB), Status::ok);
  void* r = nullptr;
  ASSERT_EQ(src.reserve(64 * MiB, &r), Status::ok);
  EXPECT_EQ(src.map(static_cast<char*>(r) + 64 * MiB, 2 * MiB), Status::invalid_argument);
  ASSERT_EQ(src.map(static_cast<char*>(r) + 4 * MiB, 8 * MiB), Status::ok);
  EXPECT_EQ(src.map(r, 2 * MiB), Status::out_of_memory);  // 8 MiB of 8 in use
  std::memset(static_cast<char*>(r) + 4 * MiB, 7, 8 * MiB);
  EXPECT_EQ(src.unmap(static_cast<char*>(r) + 4 * MiB, 8 * MiB), Status::ok);
  EXPECT_EQ(src.release(r, 64 * MiB), Status::ok);
  EXPECT_EQ(src.counters().physical_bytes.load(), 0u);
}

// Note [Free index] in free_index.cpp: the size-class bins must choose exactly what
// an ordered (size, address) set would. A random mix of sizes across many
// classes (and both pools), each allocation checked against the layout just
// before it: when a free block fits, the pool must take the smallest one, the
// lowest-addressed among equals. The cache is off so every free block sits in
// the index (the layout is the index's content).
class BestFitRuleTest : public ::testing::TestWithParam<bool> {};

TEST_P(BestFitRuleTest, TakesTheSmallestFittingBlockLowestAddressFirst) {
  VirtualSegmentSource src;
  PoolConfig cfg = PoolConfig::parse("fast_cache_blocks:0");
  cfg.expandable_segments = GetParam();
  DevicePool pool(src, cfg);
  std::mt19937_64 rng(20261129);
  std::vector<PoolAllocation> live;
  int checked = 0;
  for (int op = 0; op < 3000; ++op) {
    if (!live.empty() && rng() % 100 < 45) {
      std::size_t i = rng() % live.size();
      ASSERT_EQ(pool.free(live[i]), Status::ok);
      live[i] = live.back();
      live.pop_back();
      continue;
    }
    // Log-uniform from 512 B to 32 MiB, a few sizes repeated for ties.
    std::uint64_t bytes = rng() % 4 == 0 ? 64 * KiB : std::uint64_t{512} << (rng() % 16);
    bytes += (rng() % 8) * (bytes / 8);
    const std::uint64_t size = (bytes + cfg.alignment - 1) / cfg.alignment * cfg.alignment;
    const bool small = size <= cfg.small_size;
    std::optional<BlockInfo> best;
    for (const BlockInfo& b : pool.snapshot()) {
      if (b.allocated || b.small_pool != small || b.size < size) continue;
      if (!best || b.size < best->size || (b.size == best->size && b.ptr < best->ptr)) best = b;
    }
    PoolAllocation a = must_alloc(pool, bytes);
    ASSERT_TRUE(a);
    if (best) {
      ASSERT_EQ(addr(a), best->ptr) << "op " << op << ": " << bytes << " bytes";
      ++checked;
    }
    live.push_back(a);
  }
  EXPECT_GT(checked, 1000);  // most allocations were served from free blocks
  for (const PoolAllocation& a : live) ASSERT_EQ(pool.free(a), Status::ok);
  PoolStats st = pool.stats();
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.free_bytes, st.reserved_bytes);
}

INSTANTIATE_TEST_SUITE_P(Segments, BestFitRuleTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "expandable" : "plain"; });

}  // namespace
}  // namespace u3m::mem
