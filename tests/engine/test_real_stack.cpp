// engine::RealStack: the real runtime's assembly shared by replay, the KV
// store and the Python binding.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "u3m/engine/real_stack.hpp"
#include "u3m/util/error.hpp"

namespace u3m::engine {
namespace {

StackSpec small() {
  StackSpec o;
  o.device_bytes = 4 * mem::MiB;
  o.host_bytes = 8 * mem::MiB;
  return o;
}

TEST(RealStack, BytesSurviveDeviceHostAndSsdAndTheScratchDirectoryIsRemoved) {
  StackSpec o = small();
  o.ssd_bytes = 16 * mem::MiB;
  std::string scratch;
  {
    RealStack s(o);
    ASSERT_TRUE(s.has_ssd());
    EXPECT_EQ(s.arena_bytes(), 2 * o.device_bytes + 64 * mem::MiB);
    Engine& e = s.engine();
    ASSERT_TRUE(mem::ok(e.add(1, 64 * mem::KiB)));
    Lease l;
    ASSERT_TRUE(mem::ok(e.acquire(1, Tier::device, Access::write, &l)));
    std::memset(l.ptr, 0x5a, 64 * mem::KiB);
    ASSERT_TRUE(mem::ok(e.release(l)));
    // Down to the SSD and back, through host memory.
    ASSERT_TRUE(mem::ok(e.evict(1, Tier::device)));
    e.drain();
    ASSERT_TRUE(mem::ok(e.evict(1, Tier::host)));
    e.drain();
    const auto r = e.residency(1);
    ASSERT_TRUE(r.has_value());
    EXPECT_TRUE(r->valid[static_cast<int>(Tier::ssd)]);
    EXPECT_FALSE(r->valid[static_cast<int>(Tier::device)]);
    ASSERT_TRUE(mem::ok(e.acquire(1, Tier::device, Access::read, &l)));
    const auto* p = static_cast<const unsigned char*>(l.ptr);
    for (std::uint64_t i = 0; i < 64 * mem::KiB; i += 4093) ASSERT_EQ(p[i], 0x5a) << i;
    ASSERT_TRUE(mem::ok(e.release(l)));
    scratch = s.scratch_dir();
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(scratch) / "u3m.ssd")) << scratch;
    ASSERT_FALSE(scratch.empty());
  }
  EXPECT_FALSE(std::filesystem::exists(scratch)) << scratch;
}

TEST(RealStack, ZeroCapacitiesAndAMissingSsdDirectoryAreInputErrors) {
  StackSpec o = small();
  o.device_bytes = 0;
  EXPECT_THROW(RealStack{o}, InputError);
  o = small();
  o.ssd_bytes = 16 * mem::MiB;
  o.ssd_dir = "/nonexistent/u3m-test-dir";
  try {
    RealStack s(o);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/u3m-test-dir"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace u3m::engine
