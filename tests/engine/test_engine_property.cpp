// The runtime's randomized property test (issue 4): many threads over
// thousands of tensors, with random writes, reads, prefetches, evictions and
// acquisitions on both memory tiers, through a device and a host tier far
// smaller than the data (the rest lives on the SSD tier). Every byte read
// must equal the last byte written. U3M_PROPERTY_OPS scales the run.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/rig.hpp"

namespace u3m::engine {
namespace {

using mem::KiB;
using mem::MiB;
using testing::Rig;
using testing::RigOptions;

int ops_per_thread() {
  if (const char* s = std::getenv("U3M_PROPERTY_OPS")) return std::max(1, std::atoi(s));
  return 1500;
}

TEST(EngineProperty, EveryByteReadEqualsTheLastByteWritten) {
  constexpr int kTensors = 2000, kThreads = 6;
  RigOptions o;
  o.device = 1 * MiB;
  o.host = 2 * MiB;
  o.ssd = 64 * MiB;
  Rig rig(o);
  Engine& e = *rig.engine;

  std::mt19937_64 init(42);
  std::vector<std::uint64_t> size(kTensors);
  std::uint64_t total = 0;
  for (int i = 0; i < kTensors; ++i) {
    size[i] = 64 + init() % (8 * KiB);
    total += size[i];
    ASSERT_EQ(e.add(i, size[i]), Status::ok);
  }
  ASSERT_GT(total, 4 * (o.device + o.host) / 2);  // the data does not fit in memory tiers
  std::vector<std::atomic<std::uint64_t>> version(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    ASSERT_EQ(rig.write(i, 1, i % 2 ? Tier::host : Tier::device), Status::ok) << i;
    version[i] = 1;
  }

  std::atomic<std::uint64_t> bad_bytes{0}, errors{0}, reads{0}, writes{0};
  std::atomic<int> first_error{0};
  auto worker = [&](int seed) {
    std::mt19937_64 rng(1000 + seed);
    const int n = ops_per_thread();
    for (int k = 0; k < n; ++k) {
      // Skewed choice: a hot tenth of the tensors gets half the accesses.
      TensorId id = rng() % 2 ? rng() % (kTensors / 10) : rng() % kTensors;
      Tier tier = rng() % 3 ? Tier::device : Tier::host;
      switch (rng() % 10) {
        case 0:
        case 1:
        case 2: {  // write a new version
          Lease l;
          Status s = e.acquire(id, tier, Access::write, &l);
          if (!mem::ok(s)) {
            first_error = static_cast<int>(s);
            ++errors;
            break;
          }
          std::uint64_t v = version[id].load() + 1;  // exclusive: no other writer
          testing::fill(l.ptr, l.bytes, id, v);
          version[id] = v;
          e.release(l);
          ++writes;
          break;
        }
        case 3:
          e.prefetch(id, tier);
          break;
        case 4:
          e.evict(id, tier);
          break;    // busy while leased: fine
        default: {  // read and check
          Lease l;
          Status s = e.acquire(id, tier, Access::read, &l);
          if (!mem::ok(s)) {
            first_error = static_cast<int>(s);
            ++errors;
            break;
          }
          if (testing::first_mismatch(l.ptr, l.bytes, id, version[id].load()) >= 0) ++bad_bytes;
          e.release(l);
          ++reads;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  e.drain();

  EXPECT_EQ(errors.load(), 0u) << "first error status " << first_error.load();
  EXPECT_EQ(bad_bytes.load(), 0u);
  for (int i = 0; i < kTensors; ++i) ASSERT_TRUE(rig.holds(i, version[i], Tier::host)) << i;
  EngineStats st = e.stats();
  std::printf("reads %llu writes %llu misses %llu evictions %llu (clean %llu) prefetch hits %llu\n",
              (unsigned long long)reads.load(), (unsigned long long)writes.load(),
              (unsigned long long)st.misses, (unsigned long long)st.evictions,
              (unsigned long long)st.clean_drops, (unsigned long long)st.prefetch_hits);
  for (int l = 0; l < kNumLinks; ++l)
    std::printf("  %s: %llu transfers, %llu bytes\n", std::string(to_string(Link(l))).c_str(),
                (unsigned long long)st.links[l].transfers, (unsigned long long)st.links[l].bytes);
  EXPECT_EQ(st.lost_tensors, 0u);
  EXPECT_LE(st.peak[0], o.device);
  EXPECT_LE(st.peak[1], o.host);
  EXPECT_GT(reads.load(), 0u);
  EXPECT_GT(writes.load(), 0u);
  // All four links carried data: the run really crossed the three tiers.
  for (int l = 0; l < kNumLinks; ++l) EXPECT_GT(st.links[l].bytes, 0u) << to_string(Link(l));
}

}  // namespace
}  // namespace u3m::engine
