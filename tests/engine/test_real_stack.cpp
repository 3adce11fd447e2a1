// engine::RealStack: the real runtime's assembly shared by replay, the KV
// store and the Python binding.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
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
    EXPECT_EQ(s.backend_name(), "device-emu");
    EXPECT_EQ(s.host_cache(), nullptr);
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

// The device tier through the registry (StackSpec::backend): cuda over u3m's
// test double of the CUDA runtime, whose "device" memory is host memory, so
// the test can fill and read device leases directly (hardware cannot).
TEST(RealStack, OnTheCudaBackendBytesMoveThroughItsCopiesAndPinnedHost) {
  setenv("U3M_CUDART_LIBRARY", U3M_CUDA_DOUBLE, 1);
  setenv("U3M_CUDA_DRIVER_LIBRARY", U3M_CUDA_DOUBLE, 1);
  StackSpec o = small();
  o.backend = "cuda";
  o.ssd_bytes = 16 * mem::MiB;
  // The double's control API, on the very instance the backend loads.
  void* lib = dlopen(U3M_CUDA_DOUBLE, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  using Calls = std::uint64_t (*)(const char*);
  const auto calls = reinterpret_cast<Calls>(dlsym(lib, "u3m_double_calls"));
  ASSERT_NE(calls, nullptr);
  const std::uint64_t async0 = calls("cudaMemcpyAsync"), sync0 = calls("cudaMemcpy"),
                      streams0 = calls("cudaStreamCreateWithFlags");
  {
    RealStack s(o);
    EXPECT_EQ(s.backend_name(), "cuda");
    ASSERT_NE(s.accel(), nullptr);
    EXPECT_TRUE(s.accel()->info().test_double);
    EXPECT_NE(s.host_cache(), nullptr);  // Note [Pinned host cache]
    Engine& e = s.engine();
    ASSERT_TRUE(mem::ok(e.add(1, 64 * mem::KiB)));
    Lease l;
    ASSERT_TRUE(mem::ok(e.acquire(1, Tier::device, Access::write, &l)));
    std::memset(l.ptr, 0x3c, 64 * mem::KiB);
    ASSERT_TRUE(mem::ok(e.release(l)));
    ASSERT_TRUE(mem::ok(e.evict(1, Tier::device)));  // d2h on the backend's stream
    e.drain();
    ASSERT_TRUE(mem::ok(e.evict(1, Tier::host)));  // from pinned host to the SSD
    e.drain();
    ASSERT_TRUE(mem::ok(e.acquire(1, Tier::device, Access::read, &l)));  // s2h, then h2d
    const auto* p = static_cast<const unsigned char*>(l.ptr);
    for (std::uint64_t i = 0; i < 64 * mem::KiB; i += 4093) ASSERT_EQ(p[i], 0x3c) << i;
    ASSERT_TRUE(mem::ok(e.release(l)));
    const EngineStats st = e.stats();
    EXPECT_EQ(st.links[static_cast<int>(Link::d2h)].bytes, 64 * mem::KiB);
    EXPECT_EQ(st.links[static_cast<int>(Link::h2d)].bytes, 64 * mem::KiB);
    // Note [Copies on u3m's streams]: both moves ran on the links' own
    // streams, none on the runtime's implicit one (cudaMemcpy).
    EXPECT_EQ(calls("cudaMemcpyAsync") - async0, 2u);
    EXPECT_EQ(calls("cudaMemcpy") - sync0, 0u);
    EXPECT_GE(calls("cudaStreamCreateWithFlags") - streams0, 2u);
  }
  dlclose(lib);
  unsetenv("U3M_CUDART_LIBRARY");
  unsetenv("U3M_CUDA_DRIVER_LIBRARY");
}

TEST(RealStack, ABackendThatCannotOpenOrAThrottleOnHardwareIsAnInputError) {
  auto message = [](const StackSpec& o) {
    try {
      RealStack s(o);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  StackSpec o = small();
  o.backend = "tpu";
  EXPECT_NE(message(o).find("unknown backend 'tpu'"), std::string::npos) << message(o);
  setenv("U3M_CUDART_LIBRARY", "/nonexistent/libcudart.so", 1);
  o.backend = "cuda";
  EXPECT_NE(message(o).find("backend 'cuda' cannot open"), std::string::npos) << message(o);
  EXPECT_NE(message(o).find("/nonexistent/libcudart.so"), std::string::npos) << message(o);
  unsetenv("U3M_CUDART_LIBRARY");
  o.links[static_cast<int>(Link::h2d)].bandwidth = 1e9;
  EXPECT_NE(message(o).find("device-emu only"), std::string::npos) << message(o);
}

}  // namespace
}  // namespace u3m::engine
