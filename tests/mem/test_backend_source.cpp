// BackendSegmentSource: a DevicePool over device-emu, with plain and with
// expandable segments. Real bytes go through the pool's pointers, copies run
// on the backend's streams into and out of them, and running out of device
// memory gives out_of_memory without leaking (mem_info is full again once the
// pool is gone).
#include "u3m/mem/backend_source.hpp"

#include <cstring>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "u3m/mem/device_emu.hpp"

namespace u3m::mem {
namespace {

DeviceEmuOptions emu_options(std::uint64_t capacity) {
  DeviceEmuOptions o;
  o.capacity = capacity;
  o.granularity = 2 * MiB;
  o.spin_ns = 0;  // no busy copy engines on a shared test machine
  o.sync_spin_ns = 0;
  return o;
}

PoolConfig pool_config(bool expandable, std::uint64_t reserve) {
  PoolConfig c;
  c.expandable_segments = expandable;
  c.expandable_reserve = reserve;  // keep reservations small under the sanitizers
  return c;
}

std::uint64_t free_device_bytes(const DeviceEmuBackend& emu) {
  std::uint64_t free_bytes = 0, total = 0;
  EXPECT_EQ(emu.mem_info(&free_bytes, &total), Status::ok);
  return free_bytes;
}

TEST(BackendSourceTest, TakesGranularityAndVmmFromTheBackend) {
  DeviceEmuBackend emu(emu_options(16 * MiB));
  BackendSegmentSource src(emu);
  EXPECT_EQ(src.granularity(), emu.capabilities().granularity);
  EXPECT_EQ(src.supports_vmm(), emu.capabilities().vmm);
  void* p = nullptr;
  EXPECT_EQ(src.allocate_segment(3 * MiB, &p), Status::invalid_argument);  // not a granule
  EXPECT_EQ(src.free_segment(&p, 2 * MiB), Status::invalid_argument);      // not ours
  EXPECT_EQ(src.unmap(reinterpret_cast<void*>(2 * MiB), 2 * MiB), Status::invalid_argument);
}

class BackendPoolTest : public ::testing::TestWithParam<bool> {};

TEST_P(BackendPoolTest, PoolPointersHoldRealBytesAndTakeCopies) {
  DeviceEmuBackend emu(emu_options(64 * MiB));
  {
    BackendSegmentSource src(emu);
    DevicePool pool(src, pool_config(GetParam(), 64 * MiB));
    std::vector<PoolAllocation> blocks;
    for (std::uint64_t bytes : {4 * KiB, 300 * KiB, 3 * MiB, std::uint64_t{1000}, 5 * MiB}) {
      PoolAllocation a;
      ASSERT_EQ(pool.allocate(bytes, &a), Status::ok) << bytes;
      blocks.push_back(a);
    }
    // Direct writes (device-emu memory is host-visible), then read back.
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      std::memset(blocks[i].ptr, int(0x11 * (i + 1)), blocks[i].requested);
    }
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      auto* p = static_cast<const unsigned char*>(blocks[i].ptr);
      EXPECT_EQ(p[0], 0x11 * (i + 1));
      EXPECT_EQ(p[blocks[i].requested - 1], 0x11 * (i + 1));
    }
    // The backend takes pool pointers as device memory: h2d, d2d, d2h.
    PoolAllocation& dst = blocks[2];  // 3 MiB
    PoolAllocation& other = blocks[4];
    std::vector<unsigned char> host(3 * MiB), back(3 * MiB, 0);
    std::iota(host.begin(), host.end(), 7);
    ASSERT_EQ(emu.memcpy_async(dst.ptr, dst.size, host.data(), host.size(), CopyKind::h2d,
                               kDefaultStream),
              Status::ok);
    ASSERT_EQ(emu.memcpy_async(other.ptr, other.size, dst.ptr, host.size(), CopyKind::d2d,
                               kDefaultStream),
              Status::ok);
    ASSERT_EQ(emu.memcpy_async(back.data(), back.size(), other.ptr, back.size(), CopyKind::d2h,
                               kDefaultStream),
              Status::ok);
    ASSERT_EQ(emu.synchronize_stream(kDefaultStream), Status::ok);
    EXPECT_EQ(back, host);
    // The blocks around were not touched.
    EXPECT_EQ(static_cast<const unsigned char*>(blocks[1].ptr)[blocks[1].requested - 1], 0x22);
    EXPECT_EQ(static_cast<const unsigned char*>(blocks[3].ptr)[0], 0x44);
    EXPECT_GT(src.counters().physical_bytes.load(), 0u);
    EXPECT_EQ(src.counters().physical_bytes.load(), pool.stats().reserved_bytes);
    for (auto& a : blocks) EXPECT_EQ(pool.free(a), Status::ok);
    pool.empty_cache();
    EXPECT_EQ(pool.stats().reserved_bytes, 0u);
    EXPECT_EQ(src.counters().physical_bytes.load(), 0u);
  }
  EXPECT_EQ(free_device_bytes(emu), 64 * MiB);
}

TEST_P(BackendPoolTest, ExhaustionIsOutOfMemoryAndLeaksNothing) {
  DeviceEmuBackend emu(emu_options(8 * MiB));
  {
    BackendSegmentSource src(emu);
    DevicePool pool(src, pool_config(GetParam(), 32 * MiB));
    std::vector<PoolAllocation> blocks;
    Status s = Status::ok;
    while (blocks.size() < 100) {
      PoolAllocation a;
      s = pool.allocate(1 * MiB, &a);
      if (!ok(s)) break;
      std::memset(a.ptr, 0x5a, a.size);  // each block is really there
      blocks.push_back(a);
    }
    EXPECT_EQ(s, Status::out_of_memory);
    EXPECT_EQ(blocks.size(), 8u);  // 8 MiB of 1 MiB blocks, nothing lost to the source
    EXPECT_EQ(free_device_bytes(emu), 0u);
    EXPECT_EQ(pool.stats().oom_count, 1u);
    for (auto& a : blocks) EXPECT_EQ(pool.free(a), Status::ok);
    // Freed blocks serve again without the backend.
    PoolAllocation again;
    EXPECT_EQ(pool.allocate(1 * MiB, &again), Status::ok);
    EXPECT_EQ(pool.free(again), Status::ok);
  }  // pool first, then the source
  EXPECT_EQ(free_device_bytes(emu), 8 * MiB);
}

INSTANTIATE_TEST_SUITE_P(Segments, BackendPoolTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Expandable" : "Plain"; });

// A map() that runs out of chunks part-way unwinds the chunks it made.
TEST(BackendSourceTest, PartialMapFailureTakesNothing) {
  DeviceEmuBackend emu(emu_options(8 * MiB));
  BackendSegmentSource src(emu);
  DevicePool pool(src, pool_config(true, 32 * MiB));
  PoolAllocation a, b;
  ASSERT_EQ(pool.allocate(3 * MiB, &a), Status::ok);  // two chunks mapped
  EXPECT_EQ(free_device_bytes(emu), 4 * MiB);
  std::uint64_t maps = src.counters().map;
  // Needs three more chunks; the third fails.
  EXPECT_EQ(pool.allocate(6 * MiB, &b), Status::out_of_memory);
  EXPECT_GT(src.counters().map.load(), maps);
  EXPECT_EQ(free_device_bytes(emu), 4 * MiB);
  EXPECT_EQ(src.counters().physical_bytes.load(), 4 * MiB);
  EXPECT_EQ(pool.allocate(4 * MiB, &b), Status::ok);  // what is left still serves
  EXPECT_EQ(free_device_bytes(emu), 0u);
  EXPECT_EQ(pool.free(a), Status::ok);
  EXPECT_EQ(pool.free(b), Status::ok);
  EXPECT_EQ(free_device_bytes(emu), 8 * MiB);  // the whole tail unmapped at once
}

}  // namespace
}  // namespace u3m::mem
