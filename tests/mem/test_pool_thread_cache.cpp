// The pool's per-thread cache (Note [Thread cache] in src/mem/pool.cpp):
// lock-free reuse by one thread, frees from another thread, draining for
// growth, out of memory and empty_cache(), thread exit, and destruction of a
// pool while other threads still hold caches for it. Runs under ASan+UBSan
// and TSan with the rest of test_pool.
#include <atomic>
#include <chrono>
#include <deque>
#include <latch>
#include <mutex>
#include <optional>
#include <ostream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "u3m/mem/pool.hpp"

namespace u3m::mem {
namespace {

// Where the kernel refuses membarrier(2) no pool has a thread cache (Note
// [Thread cache]): these tests have nothing to test there.
class ThreadCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!DevicePool::thread_caches_supported())
      GTEST_SKIP() << "membarrier(2) refused here: pools have no thread cache";
  }
};

PoolAllocation must_alloc(DevicePool& pool, std::uint64_t bytes, bool movable = false) {
  PoolAllocation a;
  Status s = pool.allocate(bytes, &a, movable);
  EXPECT_EQ(s, Status::ok) << "allocate(" << bytes << "): " << to_string(s);
  return a;
}

// Runs `work` on a thread that then stays alive (its caches with it) until
// release(); join() waits for it to exit.
class Parked {
 public:
  template <typename F>
  explicit Parked(F work)
      : thread_([this, work] {
          work();
          done_.count_down();
          go_.wait();
        }) {
    done_.wait();
  }
  void release_and_join() {
    go_.count_down();
    thread_.join();
  }
  ~Parked() {
    if (thread_.joinable()) release_and_join();
  }

 private:
  std::latch done_{1}, go_{1};
  std::thread thread_;
};

TEST_F(ThreadCacheTest, SameThreadReusesWithoutTheLockAndCountsCachedAsFree) {
  VirtualSegmentSource src;
  DevicePool pool(src);
  PoolAllocation keep = must_alloc(pool, 100 * KiB);
  PoolAllocation a = must_alloc(pool, 4 * KiB);
  ASSERT_EQ(pool.free(a), Status::ok);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.thread_caches, 1u);
  EXPECT_EQ(s.thread_cached_bytes, 4 * KiB);
  EXPECT_EQ(s.allocated_bytes, 100 * KiB);
  EXPECT_EQ(s.active_blocks, 1u);
  EXPECT_EQ(s.free_bytes, 2 * MiB - 100 * KiB);          // the cached block counts as free
  EXPECT_EQ(s.largest_free_bytes, 2 * MiB - 100 * KiB);  // and merges with the tail logically
  EXPECT_EQ(s.free_blocks, 1u);
  std::uint64_t calls = src.counters().calls();
  PoolAllocation b = must_alloc(pool, 4 * KiB);  // popped from the thread cache
  EXPECT_EQ(b.ptr, a.ptr);
  EXPECT_NE(b.generation, a.generation);
  EXPECT_EQ(pool.free(a), Status::invalid_argument);  // stale handle, checked lock-free
  ASSERT_EQ(pool.free(b), Status::ok);
  EXPECT_EQ(pool.free(b), Status::invalid_argument);  // double free of a thread-cached block
  s = pool.stats();
  EXPECT_EQ(s.alloc_count, 3u);
  EXPECT_EQ(s.free_count, 2u);
  EXPECT_EQ(s.requested_bytes, 100 * KiB);
  EXPECT_EQ(src.counters().calls(), calls);
  // The snapshot shows the cached block as free, merged with its neighbour.
  std::vector<BlockInfo> layout = pool.snapshot();
  ASSERT_EQ(layout.size(), 2u);
  EXPECT_TRUE(layout[0].allocated);
  EXPECT_FALSE(layout[1].allocated);
  EXPECT_EQ(layout[1].size, 2 * MiB - 100 * KiB);
  ASSERT_EQ(pool.free(keep), Status::ok);
  EXPECT_EQ(pool.empty_cache(), 2 * MiB);  // drains the thread cache first
  EXPECT_EQ(pool.stats().thread_cached_bytes, 0u);
  EXPECT_EQ(src.counters().physical_bytes.load(), 0u);
}

// Requested bytes, active blocks and the free count are counted from the
// blocks at stats() time (Note [Thread cache], "Figures"), not tracked by the
// lock-free calls: a block popped for a different request of the same
// rounded size, drains, and blocks held in another live thread's cache must
// all come out exact.
struct Counts {
  std::uint64_t requested, active, allocs, frees;
  bool operator==(const Counts&) const = default;
};
Counts counts(const DevicePool& pool) {
  PoolStats s = pool.stats();
  return {s.requested_bytes, s.active_blocks, s.alloc_count, s.free_count};
}
std::ostream& operator<<(std::ostream& o, const Counts& c) {
  return o << "{requested " << c.requested << ", active " << c.active << ", allocs " << c.allocs
           << ", frees " << c.frees << "}";
}

TEST_F(ThreadCacheTest, FiguresCountReusedDrainedAndRemoteCachedBlocks) {
  VirtualSegmentSource src;
  DevicePool pool(src);
  PoolAllocation a = must_alloc(pool, 1000);  // 1 KiB rounded
  ASSERT_EQ(pool.free(a), Status::ok);
  PoolAllocation b = must_alloc(pool, 600);  // the same block, popped for 600 bytes
  ASSERT_EQ(b.ptr, a.ptr);
  EXPECT_EQ(counts(pool), (Counts{600, 1, 2, 1}));
  EXPECT_EQ(pool.stats().allocated_bytes, 1 * KiB);
  // Another thread allocates three, frees two into its cache and stays alive.
  PoolAllocation held;
  Parked other([&] {
    PoolAllocation x = must_alloc(pool, 3000), y = must_alloc(pool, 5000);
    held = must_alloc(pool, 7000);
    EXPECT_EQ(pool.free(x), Status::ok);
    EXPECT_EQ(pool.free(y), Status::ok);
  });
  EXPECT_EQ(counts(pool), (Counts{600 + 7000, 2, 5, 3}));
  EXPECT_EQ(pool.stats().thread_cached_bytes, 3 * KiB + 5 * KiB);
  // Draining the other thread's cache moves nothing between the counts.
  ASSERT_EQ(pool.free(b), Status::ok);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().thread_cached_bytes, 0u);
  EXPECT_EQ(counts(pool), (Counts{7000, 1, 5, 4}));
  // Nor does its thread exiting, nor the last free.
  other.release_and_join();
  ASSERT_EQ(pool.free(held), Status::ok);
  EXPECT_EQ(counts(pool), (Counts{0, 0, 5, 5}));
}

TEST_F(ThreadCacheTest, MovableBlocksAndExpandablePoolsBypassIt) {
  VirtualSegmentSource src;
  DevicePool pool(src);
  ASSERT_EQ(pool.free(must_alloc(pool, 4 * KiB, /*movable=*/true)), Status::ok);
  EXPECT_EQ(pool.stats().thread_cached_bytes, 0u);
  PoolConfig c;
  c.expandable_segments = true;
  DevicePool expandable(src, c);
  ASSERT_EQ(expandable.free(must_alloc(expandable, 4 * KiB)), Status::ok);
  EXPECT_EQ(expandable.stats().thread_caches, 0u);
  EXPECT_EQ(expandable.stats().reserved_bytes, 0u);  // the tail went back at once
  c = PoolConfig{};
  c.thread_cache_blocks = 0;
  DevicePool off(src, c);
  ASSERT_EQ(off.free(must_alloc(off, 4 * KiB)), Status::ok);
  EXPECT_EQ(off.stats().thread_caches, 0u);
}

TEST_F(ThreadCacheTest, BinsAreBoundedByCountAndBytes) {
  VirtualSegmentSource src;
  PoolConfig c;
  c.thread_cache_blocks = 2;
  c.thread_cache_bytes = 8 * KiB;
  DevicePool pool(src, c);
  std::vector<PoolAllocation> v;
  for (int i = 0; i < 4; ++i) v.push_back(must_alloc(pool, 1 * KiB));
  v.push_back(must_alloc(pool, 8 * KiB));
  for (auto& a : v) ASSERT_EQ(pool.free(a), Status::ok);
  // Two 1 KiB blocks fit the bin; the 8 KiB one would pass the byte bound.
  EXPECT_EQ(pool.stats().thread_cached_bytes, 2 * KiB);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
}

TEST_F(ThreadCacheTest, CrossThreadFreeLandsInTheFreeingThreadsCache) {
  VirtualSegmentSource src;
  DevicePool pool(src);
  std::vector<PoolAllocation> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(must_alloc(pool, 64 * KiB));
  Status frees[4];
  Parked freer([&] {
    for (int i = 0; i < 4; ++i) frees[i] = pool.free(blocks[i]);
  });
  for (Status s : frees) EXPECT_EQ(s, Status::ok);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.thread_caches, 2u);
  EXPECT_EQ(s.thread_cached_bytes, 256 * KiB);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.active_blocks, 0u);
  EXPECT_EQ(s.free_count, 4u);
  EXPECT_EQ(pool.free(blocks[0]), Status::invalid_argument);  // freed by the other thread
  // The other thread is alive and idle: empty_cache() drains its cache.
  EXPECT_EQ(pool.empty_cache(), 2 * MiB);
  s = pool.stats();
  EXPECT_EQ(s.thread_cached_bytes, 0u);
  EXPECT_GE(s.thread_cache_drains, 1u);
  EXPECT_EQ(s.reserved_bytes, 0u);
  // A thread exiting after its cache was drained, and a new one, leave the
  // counts right.
  Status again = Status::invalid_argument;
  freer.release_and_join();
  Parked user([&] {
    PoolAllocation a;
    again = pool.allocate(64 * KiB, &a);
    if (ok(again)) again = pool.free(a);
  });
  EXPECT_EQ(again, Status::ok);
  user.release_and_join();
  s = pool.stats();
  EXPECT_EQ(s.thread_caches, 1u);  // the two threads exited and returned theirs
  EXPECT_EQ(s.alloc_count, s.free_count);
  EXPECT_EQ(s.active_blocks, 0u);
}

TEST_F(ThreadCacheTest, GrowthAndOutOfMemoryDrainOtherThreadsCaches) {
  VirtualSegmentSource src;
  PoolConfig c;
  c.capacity = 4 * MiB;
  c.large_segment = 4 * MiB;
  c.min_large_alloc = 4 * MiB;
  DevicePool pool(src, c);
  // Another thread fills both small segments, frees everything into its
  // cache and stays alive.
  Parked holder([&] {
    std::vector<PoolAllocation> v;
    for (int i = 0; i < 4; ++i) v.push_back(must_alloc(pool, 1 * MiB));
    for (auto& a : v) EXPECT_EQ(pool.free(a), Status::ok);
  });
  EXPECT_EQ(pool.stats().thread_cached_bytes, 4 * MiB);
  EXPECT_EQ(pool.stats().free_bytes, 4 * MiB);
  // No free block in the pool's sets: the drain comes before growth.
  PoolAllocation small = must_alloc(pool, 1 * MiB);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.reserved_bytes, 4 * MiB);
  EXPECT_EQ(s.thread_cache_drains, 1u);
  EXPECT_EQ(s.thread_cached_bytes, 0u);
  ASSERT_EQ(pool.free(small), Status::ok);  // into our own cache
  // Fill the other thread's cache again (its last block needs ours), then ask
  // for a large block: only returning the small segments makes room, so the
  // other thread's cache must be drained first.
  holder.release_and_join();
  Parked holder2([&] {
    std::vector<PoolAllocation> v;
    for (int i = 0; i < 4; ++i) v.push_back(must_alloc(pool, 1 * MiB));
    for (auto& a : v) EXPECT_EQ(pool.free(a), Status::ok);
  });
  EXPECT_EQ(pool.stats().thread_cached_bytes, 4 * MiB);
  PoolAllocation big;
  ASSERT_EQ(pool.allocate(3 * MiB, &big), Status::ok);
  s = pool.stats();
  EXPECT_EQ(s.oom_count, 0u);
  EXPECT_EQ(s.cache_flushes, 1u);
  EXPECT_EQ(s.reserved_bytes, 4 * MiB);  // the large segment alone
  EXPECT_EQ(s.thread_cached_bytes, 0u);
  // Really full now: out of memory, and the pool is intact.
  PoolAllocation more;
  EXPECT_EQ(pool.allocate(2 * MiB, &more), Status::out_of_memory);
  EXPECT_EQ(pool.free(big), Status::ok);
}

TEST_F(ThreadCacheTest, PeakIsExactForOneThread) {
  VirtualSegmentSource src;
  DevicePool pool(src);
  PoolAllocation a = must_alloc(pool, 256 * KiB);
  ASSERT_EQ(pool.free(a), Status::ok);              // cached
  PoolAllocation c = must_alloc(pool, 512 * KiB);   // locked path
  PoolAllocation a2 = must_alloc(pool, 256 * KiB);  // popped: a new high
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 768 * KiB);
  ASSERT_EQ(pool.free(a2), Status::ok);
  ASSERT_EQ(pool.free(c), Status::ok);
  a2 = must_alloc(pool, 256 * KiB);
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 768 * KiB);
  pool.reset_peaks();
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 256 * KiB);
  ASSERT_EQ(pool.free(a2), Status::ok);
}

TEST_F(ThreadCacheTest, ThreadExitReturnsItsCache) {
  CpuSegmentSource src(2 * MiB);
  DevicePool pool(src);
  std::thread t([&] {
    for (int i = 0; i < 100; ++i) {
      PoolAllocation a = must_alloc(pool, 8 * KiB), b = must_alloc(pool, 300 * KiB);
      static_cast<char*>(a.ptr)[0] = 1;  // real memory
      EXPECT_EQ(pool.free(a), Status::ok);
      EXPECT_EQ(pool.free(b), Status::ok);
    }
  });
  t.join();
  PoolStats s = pool.stats();
  EXPECT_EQ(s.thread_caches, 0u);
  EXPECT_EQ(s.thread_cached_bytes, 0u);
  EXPECT_EQ(s.alloc_count, 200u);
  EXPECT_EQ(s.free_count, 200u);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.peak_allocated_bytes, 308 * KiB);
  EXPECT_EQ(s.free_bytes, 2 * MiB);
  EXPECT_EQ(s.largest_free_bytes, 2 * MiB);  // merged for real
  EXPECT_EQ(pool.empty_cache(), 2 * MiB);
}

// Threads keep caches for a pool that is destroyed under them, then a new pool
// is built at the same address: the old caches must be neither used nor
// touched, and the threads' exits must still be clean.
TEST_F(ThreadCacheTest, PoolDestroyedWhileOtherThreadsHoldCaches) {
  CpuSegmentSource src(2 * MiB);
  std::optional<DevicePool> pool(std::in_place, src);
  DevicePool* first = &*pool;
  constexpr int kThreads = 3;
  std::latch cached(kThreads), destroyed(1), reused(kThreads), rebuilt_done(1);
  std::vector<std::thread> threads;
  std::vector<Status> status(kThreads, Status::ok);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        PoolAllocation a;
        if (!ok(pool->allocate(4 * KiB * (t + 1), &a)) || !ok(pool->free(a))) {
          status[t] = Status::device_failed;
        }
      }
      cached.count_down();
      destroyed.wait();
      // A new pool, same address: this thread has no cache for it yet.
      PoolAllocation a;
      if (!ok(pool->allocate(4 * KiB * (t + 1), &a)) || !ok(pool->free(a))) {
        status[t] = Status::device_failed;
      }
      reused.count_down();
      rebuilt_done.wait();
    });
  }
  cached.wait();
  EXPECT_EQ(pool->stats().thread_caches, std::uint64_t(kThreads));
  EXPECT_GT(pool->stats().thread_cached_bytes, 0u);
  pool.reset();
  EXPECT_EQ(src.counters().physical_bytes.load(), 0u);  // cached blocks did not leak
  pool.emplace(src);
  ASSERT_EQ(&*pool, first);
  destroyed.count_down();
  reused.wait();
  PoolStats s = pool->stats();
  EXPECT_EQ(s.thread_caches, std::uint64_t(kThreads));
  EXPECT_EQ(s.alloc_count, std::uint64_t(kThreads));
  EXPECT_EQ(s.free_count, std::uint64_t(kThreads));
  EXPECT_EQ(s.thread_cached_bytes, 4 * KiB * (1 + 2 + 3));
  rebuilt_done.count_down();
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(status[t], Status::ok) << "thread " << t;
  s = pool->stats();
  EXPECT_EQ(s.thread_caches, 0u);
  EXPECT_EQ(s.active_blocks, 0u);
  pool.reset();
  EXPECT_EQ(src.counters().physical_bytes.load(), 0u);
}

// Producers allocate, consumers free what others allocated (so blocks move
// between thread caches), while one thread keeps draining with empty_cache().
TEST_F(ThreadCacheTest, HandOffStressWithConcurrentDrains) {
  CpuSegmentSource src(2 * MiB);
  DevicePool pool(src);
  std::mutex mu;
  std::deque<PoolAllocation> queue;
  constexpr int kPerProducer = 3000;
  std::atomic<int> failures{0}, produced{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < 2; ++p) {
    threads.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i) {
        // Halfway, wait (bounded) until the drainer has emptied a live thread's
        // cache at least once: on 2 busy cores the whole run can otherwise end
        // before the drainer is scheduled, and no drain races anything.
        for (int w = 0; i == kPerProducer / 2 && w < 10000; ++w) {
          if (pool.stats().thread_cache_drains > 0) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        PoolAllocation a;
        if (!ok(pool.allocate(512 * (1 + (i + p) % 8), &a))) {
          ++failures;
          continue;
        }
        ++produced;
        *static_cast<int*>(a.ptr) = i;  // touch: overlapping blocks show up under ASan/TSan
        std::lock_guard g(mu);
        queue.push_back(a);
      }
    });
  }
  std::atomic<int> freed{0};
  for (int c = 0; c < 2; ++c) {
    threads.emplace_back([&] {
      while (freed.load() + failures.load() < 2 * kPerProducer) {
        PoolAllocation a;
        {
          std::lock_guard g(mu);
          if (!queue.empty()) {
            a = queue.front();
            queue.pop_front();
          }
        }
        if (!a) {
          std::this_thread::yield();
          continue;
        }
        if (!ok(pool.free(a))) ++failures;
        // Reuse a bit, so pops race the drains too.
        PoolAllocation b;
        if (ok(pool.allocate(a.requested, &b))) {
          if (!ok(pool.free(b))) ++failures;
        }
        freed.fetch_add(1);
      }
    });
  }
  std::atomic<bool> stop{false};
  std::thread drainer([&] {
    while (!stop.load()) {
      pool.empty_cache();
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  stop = true;
  drainer.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(produced.load(), 2 * kPerProducer);
  PoolStats s = pool.stats();
  EXPECT_GE(s.thread_cache_drains, 1u);
  EXPECT_EQ(s.active_blocks, 0u);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.alloc_count, s.free_count);
  pool.empty_cache();
  EXPECT_EQ(src.counters().physical_bytes.load(), 0u);
}

}  // namespace
}  // namespace u3m::mem
