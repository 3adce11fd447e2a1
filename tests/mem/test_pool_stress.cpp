// Randomized stress: several threads allocate and free blocks of mixed sizes
// from one pool over real memory, stamp each block with a pattern and check
// it before freeing, so overlapping blocks or lost data show up as a mismatch.
// Runs under ASan+UBSan and TSan (see tests/mem/pool.cmake).
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "u3m/mem/pool.hpp"

namespace u3m::mem {
namespace {

struct Held {
  PoolAllocation a;
  std::uint64_t stamp = 0;
};

// Writes `stamp` at both ends and every 64 KiB (probes never overlap each
// other): enough to catch two blocks sharing bytes without memsetting
// megabytes under the sanitizers.
std::vector<std::uint64_t> probe_offsets(std::uint64_t bytes) {
  constexpr std::uint64_t w = sizeof(std::uint64_t);
  std::vector<std::uint64_t> at;
  for (std::uint64_t o = 0; o + w <= bytes; o += 64 * KiB) at.push_back(o);
  if (bytes - w >= at.back() + w) at.push_back(bytes - w);
  return at;
}
void stamp(const Held& h) {
  for (std::uint64_t o : probe_offsets(h.a.requested)) {
    std::memcpy(static_cast<char*>(h.a.ptr) + o, &h.stamp, sizeof h.stamp);
  }
}
int check(const Held& h) {
  int bad = 0;
  for (std::uint64_t o : probe_offsets(h.a.requested)) {
    std::uint64_t v;
    std::memcpy(&v, static_cast<const char*>(h.a.ptr) + o, sizeof v);
    bad += v != h.stamp;
  }
  return bad;
}

std::uint64_t random_size(std::mt19937_64& rng) {
  // Mostly small blocks, some up to 4 MiB, sizes not multiples of anything.
  std::uint64_t r = rng() % 100;
  if (r < 60) return 8 + rng() % (16 * KiB);
  if (r < 90) return 16 * KiB + rng() % (1 * MiB);
  return 1 * MiB + rng() % (3 * MiB);
}

void run_stress(const PoolConfig& config, int threads, int ops_per_thread) {
  CpuSegmentSource src(2 * MiB);
  DevicePool pool(src, config);
  std::vector<int> mismatches(threads, 0), failures(threads, 0);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      std::vector<Held> held;
      for (int i = 0; i < ops_per_thread; ++i) {
        bool alloc = held.empty() || (held.size() < 64 && rng() % 100 < 55);
        if (alloc) {
          Held h;
          h.stamp = (std::uint64_t(t) << 48) | std::uint64_t(i);
          if (pool.allocate(random_size(rng), &h.a) != Status::ok) {
            ++failures[t];
            continue;
          }
          stamp(h);
          held.push_back(h);
        } else {
          std::size_t k = rng() % held.size();
          mismatches[t] += check(held[k]);
          if (pool.free(held[k].a) != Status::ok) ++failures[t];
          held[k] = held.back();
          held.pop_back();
        }
        if (t == 0 && i % 500 == 0) pool.empty_cache();  // races the others' allocations
        if (t == 1 && i % 100 == 0) (void)pool.stats();
      }
      for (const Held& h : held) {
        mismatches[t] += check(h);
        if (pool.free(h.a) != Status::ok) ++failures[t];
      }
    });
  }
  for (auto& w : workers) w.join();
  for (int t = 0; t < threads; ++t) {
    EXPECT_EQ(mismatches[t], 0) << "thread " << t;
    EXPECT_EQ(failures[t], 0) << "thread " << t;
  }
  PoolStats s = pool.stats();
  EXPECT_EQ(s.active_blocks, 0u);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.alloc_count, s.free_count);
  EXPECT_GT(s.alloc_count, std::uint64_t(threads) * ops_per_thread / 3);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
  EXPECT_EQ(src.counters().physical_bytes.load(), 0u);
}

TEST(PoolStressTest, SegmentsManyThreads) {
  run_stress(PoolConfig{}, 4, 3000);
}

TEST(PoolStressTest, ExpandableManyThreads) {
  PoolConfig c;
  c.expandable_segments = true;
  c.expandable_reserve = 4 * GiB;
  run_stress(c, 4, 3000);
}

// Blocks freed by another thread than the one that allocated them: two
// producers hand blocks to two consumers, which free them and reuse the size
// once, while a fifth thread keeps returning cached segments to the source.
TEST(PoolStressTest, HandOffBetweenThreadsWithConcurrentEmptyCache) {
  CpuSegmentSource src(2 * MiB);
  DevicePool pool(src);
  std::mutex mu;
  std::deque<PoolAllocation> queue;
  constexpr int kPerProducer = 3000;
  std::atomic<int> failures{0}, freed{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < 2; ++p) {
    threads.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i) {
        PoolAllocation a;
        if (!ok(pool.allocate(512 * (1 + (i + p) % 8), &a))) {
          ++failures;
          continue;
        }
        *static_cast<int*>(a.ptr) = i;  // touch: overlapping blocks show up under ASan/TSan
        std::lock_guard g(mu);
        queue.push_back(a);
      }
    });
  }
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
        if (pool.free(a) != Status::invalid_argument) ++failures;  // a stale handle
        PoolAllocation b;
        if (!ok(pool.allocate(a.requested, &b)) || !ok(pool.free(b))) ++failures;
        freed.fetch_add(1);
      }
    });
  }
  std::atomic<bool> stop{false};
  std::thread emptier([&] {
    while (!stop.load()) {
      pool.empty_cache();
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  stop = true;
  emptier.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(freed.load(), 2 * kPerProducer);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.active_blocks, 0u);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.requested_bytes, 0u);
  EXPECT_EQ(s.alloc_count, s.free_count);
  EXPECT_EQ(s.alloc_count, 4u * kPerProducer);
  pool.empty_cache();
  EXPECT_EQ(src.counters().physical_bytes.load(), 0u);
}

}  // namespace
}  // namespace u3m::mem
