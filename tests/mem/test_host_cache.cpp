// mem::HostBlockCache (Note [Pinned host cache]) over a counting host backend.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>

#include "u3m/mem/host_cache.hpp"

namespace u3m::mem {
namespace {

// Host memory from malloc with a capacity; counts the calls that reach it.
class CountingHost final : public MemoryBackend {
 public:
  explicit CountingHost(std::uint64_t capacity) : capacity_(capacity) {}
  ~CountingHost() override { EXPECT_TRUE(live.empty()) << live.size() << " blocks not given back"; }
  Capabilities capabilities() const override {
    Capabilities c;
    c.name = "counting-host";
    c.capacity = capacity_;
    return c;
  }
  Status allocate(std::uint64_t bytes, void** ptr) override {
    if (used + bytes > capacity_) return Status::out_of_memory;
    *ptr = std::malloc(bytes);
    live.insert(*ptr);
    used += bytes;
    sizes[*ptr] = bytes;
    ++allocs;
    return Status::ok;
  }
  Status free(void* ptr) override {
    if (!live.erase(ptr)) return Status::invalid_argument;
    used -= sizes[ptr];
    std::free(ptr);
    ++frees;
    return Status::ok;
  }
  Status mem_info(std::uint64_t* f, std::uint64_t* t) const override {
    *f = capacity_ - used;
    *t = capacity_;
    return Status::ok;
  }
  std::set<void*> live;
  std::map<void*, std::uint64_t> sizes;
  std::uint64_t used = 0, allocs = 0, frees = 0;

 private:
  std::uint64_t capacity_;
};

TEST(HostBlockCache, AFreedBlockServesTheNextAllocationOfItsSizeWithoutTheInnerBackend) {
  CountingHost inner(1 << 20);
  {
    HostBlockCache c(inner, 1 << 20);
    void *a = nullptr, *b = nullptr;
    ASSERT_EQ(c.allocate(4096, &a), Status::ok);
    ASSERT_EQ(c.free(a), Status::ok);
    EXPECT_EQ(inner.frees, 0u);  // kept
    ASSERT_EQ(c.allocate(4096, &b), Status::ok);
    EXPECT_EQ(b, a);
    EXPECT_EQ(inner.allocs, 1u);
    void* d = nullptr;
    ASSERT_EQ(c.allocate(8192, &d), Status::ok);  // another size: the inner backend
    EXPECT_EQ(inner.allocs, 2u);
    EXPECT_EQ(c.free(reinterpret_cast<void*>(0x1000)), Status::invalid_argument);
    ASSERT_EQ(c.free(b), Status::ok);
    ASSERT_EQ(c.free(d), Status::ok);
    EXPECT_EQ(c.free(d), Status::invalid_argument);  // twice
    const auto st = c.stats();
    EXPECT_EQ(st.hits, 1u);
    EXPECT_EQ(st.misses, 2u);
    EXPECT_EQ(st.cached_bytes, 4096u + 8192u);
    EXPECT_EQ(st.live_bytes, 0u);
  }
  EXPECT_EQ(inner.frees, 2u);  // the destructor gave both back
}

TEST(HostBlockCache, LiveAndCachedBytesStayWithinTheLimitDroppingTheOldestFirst) {
  CountingHost inner(1 << 30);
  HostBlockCache c(inner, 16384);
  void *a = nullptr, *b = nullptr, *x = nullptr;
  ASSERT_EQ(c.allocate(4096, &a), Status::ok);
  ASSERT_EQ(c.allocate(8192, &b), Status::ok);
  ASSERT_EQ(c.free(a), Status::ok);  // oldest cached
  ASSERT_EQ(c.free(b), Status::ok);
  ASSERT_EQ(c.allocate(6144, &x), Status::ok);  // 12288 cached + 6144 > 16384: drop a only
  EXPECT_EQ(inner.live.count(a), 0u);
  EXPECT_EQ(inner.live.count(b), 1u);
  EXPECT_LE(inner.used, 16384u);
  void* big = nullptr;
  EXPECT_EQ(c.allocate(16384, &big), Status::out_of_memory);  // 6144 live: can never fit
  ASSERT_EQ(c.free(x), Status::ok);
  ASSERT_EQ(c.allocate(16384, &big), Status::ok);  // everything cached dropped for it
  EXPECT_EQ(inner.live.size(), 1u);
  ASSERT_EQ(c.free(big), Status::ok);
  std::uint64_t f = 0, t = 0;
  ASSERT_EQ(c.mem_info(&f, &t), Status::ok);
  EXPECT_EQ(t, 16384u);
  EXPECT_EQ(f, 16384u);  // cached counts as free
}

TEST(HostBlockCache, AnInnerOutOfMemoryGivesTheCacheBackAndTriesOnce) {
  CountingHost inner(12288);
  HostBlockCache c(inner, 1 << 20);  // a limit above what the inner backend has
  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(c.allocate(8192, &a), Status::ok);
  ASSERT_EQ(c.free(a), Status::ok);
  ASSERT_EQ(c.allocate(12288, &b), Status::ok);  // only after the cached 8192 went back
  EXPECT_EQ(c.stats().dropped, 1u);
  ASSERT_EQ(c.free(b), Status::ok);
}

}  // namespace
}  // namespace u3m::mem
