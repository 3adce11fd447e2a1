// device-emu virtual memory management: reserve / physical chunks / map / unmap.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "test_backends_util.hpp"
#include "u3m/mem/device_emu.hpp"

namespace u3m::mem {
namespace {

using testing::pattern;

constexpr std::uint64_t MiB = 1024 * 1024, kGran = 2 * MiB;

// The permissions ("rw-p", "---p", ...) of the mapping holding `p`, read
// from /proc/self/maps, so a test can check a range is inaccessible without
// touching it.
std::string permissions_at(const void* p) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::uintptr_t lo = 0, hi = 0;
    char perms[5] = {0};
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %4s", &lo, &hi, perms) == 3 &&
        a >= lo && a < hi)
      return perms;
  }
  return "unmapped";
}

class Vmm : public ::testing::Test {
 protected:
  DeviceEmuBackend dev{{.capacity = 8 * MiB}};
};

TEST_F(Vmm, ReservesGranuleAlignedRangesOnly) {
  EXPECT_TRUE(dev.capabilities().vmm);
  void* va = nullptr;
  EXPECT_EQ(dev.reserve(kGran + 4096, &va), Status::invalid_argument);
  EXPECT_EQ(dev.reserve(0, &va), Status::invalid_argument);
  U3M_ASSERT_OK(dev.reserve(16 * MiB, &va));  // address space only: beyond capacity is fine
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(va) % kGran, 0u);
  EXPECT_EQ(permissions_at(va).substr(0, 3), "---");
  std::uint64_t f = 0, t = 0;
  U3M_ASSERT_OK(dev.mem_info(&f, &t));
  EXPECT_EQ(f, t) << "a reservation holds no memory";
  U3M_ASSERT_OK(dev.release(va));
  EXPECT_EQ(dev.release(va), Status::invalid_argument);
}

TEST_F(Vmm, PhysicalChunksCountAgainstCapacity) {
  PhysicalHandle a, b, c;
  EXPECT_EQ(dev.create_physical(kGran + 4096, &a), Status::invalid_argument);
  U3M_ASSERT_OK(dev.create_physical(4 * MiB, &a));
  EXPECT_EQ(a.size, 4 * MiB);
  EXPECT_EQ(a.tier, Tier::device);
  void* p = nullptr;
  U3M_ASSERT_OK(dev.allocate(2 * MiB, &p));
  U3M_ASSERT_OK(dev.create_physical(kGran, &b));
  EXPECT_EQ(dev.create_physical(kGran, &c), Status::out_of_memory) << "allocate + chunks share it";
  std::uint64_t f = 1, t = 0;
  U3M_ASSERT_OK(dev.mem_info(&f, &t));
  EXPECT_EQ(f, 0u);
  U3M_ASSERT_OK(dev.free_physical(a));
  EXPECT_EQ(dev.free_physical(a), Status::invalid_argument);
  U3M_ASSERT_OK(dev.create_physical(4 * MiB, &c));
  U3M_ASSERT_OK(dev.free_physical(b));
  U3M_ASSERT_OK(dev.free_physical(c));
  U3M_ASSERT_OK(dev.free(p));
}

TEST_F(Vmm, MappedChunksHoldDataAcrossViewsAndRemaps) {
  void* va = nullptr;
  U3M_ASSERT_OK(dev.reserve(8 * MiB, &va));
  auto* base = static_cast<std::uint8_t*>(va);
  PhysicalHandle h;
  U3M_ASSERT_OK(dev.create_physical(kGran, &h));
  U3M_ASSERT_OK(dev.map(base, h));
  EXPECT_EQ(permissions_at(base).substr(0, 2), "rw");
  auto src = pattern(1, kGran);
  std::memcpy(base, src.data(), kGran);  // device memory is host-addressable here
  // A second view of the same chunk sees the same bytes.
  U3M_ASSERT_OK(dev.map(base + 4 * MiB, h));
  EXPECT_EQ(0, std::memcmp(base + 4 * MiB, src.data(), kGran));
  base[4 * MiB + 10] ^= 0xFF;
  EXPECT_EQ(base[10], static_cast<std::uint8_t>(src[10] ^ 0xFF));
  base[10] = src[10];
  // Unmapping keeps the chunk's data: map it again elsewhere and it is there.
  U3M_ASSERT_OK(dev.unmap(base));
  U3M_ASSERT_OK(dev.unmap(base + 4 * MiB));
  EXPECT_EQ(permissions_at(base).substr(0, 3), "---") << "an unmapped range must fault";
  EXPECT_EQ(permissions_at(base + 4 * MiB).substr(0, 3), "---");
  U3M_ASSERT_OK(dev.map(base + 2 * MiB, h));
  EXPECT_EQ(0, std::memcmp(base + 2 * MiB, src.data(), kGran));
  U3M_ASSERT_OK(dev.unmap(base + 2 * MiB));
  U3M_ASSERT_OK(dev.free_physical(h));
  U3M_ASSERT_OK(dev.release(va));
}

TEST_F(Vmm, RejectsMapsOutsideTheReservationOrOverlapping) {
  void* va = nullptr;
  U3M_ASSERT_OK(dev.reserve(4 * MiB, &va));
  auto* base = static_cast<std::uint8_t*>(va);
  PhysicalHandle small, big;
  U3M_ASSERT_OK(dev.create_physical(kGran, &small));
  U3M_ASSERT_OK(dev.create_physical(4 * MiB, &big));
  const auto bad = Status::invalid_argument;
  EXPECT_EQ(dev.map(base + 2 * MiB, big), bad) << "runs past the end of the reservation";
  EXPECT_EQ(dev.map(base + 4 * MiB, small), bad) << "starts at the end";
  EXPECT_EQ(dev.map(base + 4096, small), bad) << "not granule-aligned";
  int outside = 0;
  EXPECT_EQ(dev.map(&outside, small), bad) << "not in any reservation";
  EXPECT_EQ(dev.map(base, PhysicalHandle{.id = 777, .size = kGran}), bad) << "unknown chunk";
  EXPECT_EQ(dev.map(base, PhysicalHandle{.id = small.id, .size = 4 * MiB}), bad)
      << "handle size disagrees";
  U3M_ASSERT_OK(dev.map(base + 2 * MiB, small));
  EXPECT_EQ(dev.map(base, big), bad) << "overlaps the mapping above";
  EXPECT_EQ(dev.map(base + 2 * MiB, small), bad) << "already mapped there";
  EXPECT_EQ(dev.unmap(base), bad) << "nothing mapped at base";
  EXPECT_EQ(dev.free_physical(small), Status::busy);
  EXPECT_EQ(dev.release(va), Status::busy);
  U3M_ASSERT_OK(dev.unmap(base + 2 * MiB));
  U3M_ASSERT_OK(dev.free_physical(small));
  U3M_ASSERT_OK(dev.free_physical(big));
  U3M_ASSERT_OK(dev.release(va));
}

TEST_F(Vmm, CopiesReachMappedRangesOnly) {
  void* va = nullptr;
  U3M_ASSERT_OK(dev.reserve(8 * MiB, &va));
  auto* base = static_cast<std::uint8_t*>(va);
  PhysicalHandle h0, h1;
  U3M_ASSERT_OK(dev.create_physical(kGran, &h0));
  U3M_ASSERT_OK(dev.create_physical(kGran, &h1));
  U3M_ASSERT_OK(dev.map(base, h0));
  U3M_ASSERT_OK(dev.map(base + kGran, h1));  // contiguous: one copy may span both chunks
  const std::uint64_t n = kGran + 12345, off = kGran / 2;
  auto src = pattern(2, n);
  U3M_ASSERT_OK(
      dev.memcpy_async(base + off, 8 * MiB - off, src.data(), n, CopyKind::h2d, kDefaultStream));
  std::vector<std::uint8_t> back(n, 0);
  U3M_ASSERT_OK(dev.memcpy_async(back.data(), n, base + off, n, CopyKind::d2h, kDefaultStream));
  U3M_ASSERT_OK(dev.synchronize_stream(kDefaultStream));
  EXPECT_EQ(back, src);
  // Past the mapped chunks, and into a host range inside the reservation.
  EXPECT_EQ(
      dev.memcpy_async(base + 3 * MiB, MiB * 2, src.data(), MiB + 1, CopyKind::h2d, kDefaultStream),
      Status::invalid_argument);
  EXPECT_EQ(dev.memcpy_async(base + 5 * MiB, MiB, src.data(), 16, CopyKind::h2d, kDefaultStream),
            Status::invalid_argument);
  EXPECT_EQ(dev.memcpy_async(back.data(), n, base + 5 * MiB, 16, CopyKind::d2h, kDefaultStream),
            Status::invalid_argument);
  EXPECT_EQ(dev.memcpy_async(base, 16, back.data(), 16, CopyKind::h2h, kDefaultStream),
            Status::invalid_argument)
      << "a mapped device range is not host memory";
  U3M_ASSERT_OK(dev.unmap(base + kGran));
  EXPECT_EQ(
      dev.memcpy_async(base + off, 8 * MiB - off, src.data(), n, CopyKind::h2d, kDefaultStream),
      Status::invalid_argument)
      << "half of the range is unmapped now";
  U3M_ASSERT_OK(dev.unmap(base));
  U3M_ASSERT_OK(dev.free_physical(h0));
  U3M_ASSERT_OK(dev.free_physical(h1));
  U3M_ASSERT_OK(dev.release(va));
}

}  // namespace
}  // namespace u3m::mem
