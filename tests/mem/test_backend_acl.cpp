// The acl backend: the conformance suite (test_backend_accel.cpp) on the ACL
// test double, and ACL's own rules: 64-byte aligned async copies whose host
// side comes from aclrtMallocHost, no async host-to-host copy, destMax reaching
// the runtime, a context on every thread, the override variable, repeated init.
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "test_backend_accel.hpp"
#include "test_backends_util.hpp"
#include "u3m/mem/backend_acl.hpp"

namespace u3m::mem::testing {
namespace {

// U3M_ACL_TEST_REAL=1: the conformance suite on the installed CANN instead of
// the double (not run yet: no Ascend machine so far; docs/accelerators.md).
bool real_runtime() {
  const char* v = std::getenv("U3M_ACL_TEST_REAL");
  return v != nullptr && std::string(v) == "1";
}

Status open_acl(const std::string& library, std::unique_ptr<AccelBackend>* out, std::string* why) {
  return open_acl_backend({.device = 0, .library = library}, out, why);
}

AccelTarget acl_target() {
  AccelTarget t;
  t.name = "acl";
  t.double_path = U3M_ACL_DOUBLE;
  t.real = real_runtime();
  t.open = open_acl;
  t.api_malloc = "aclrtMalloc";
  t.api_copy_async = "aclrtMemcpyAsync";
  t.api_stream_sync = "aclrtSynchronizeStream";
  t.api_event_query = "aclrtQueryEventStatus";
  t.api_event_create = "aclrtCreateEvent";
  t.api_device_count = "aclrtGetDeviceCount";
  t.code_oom = 207001;         // ACL_ERROR_RT_MEMORY_ALLOCATION
  t.code_lost = 507053;        // ACL_ERROR_RT_DEVICE_MEM_ERROR
  t.code_bad_handle = 107017;  // ACL_ERROR_RT_INVALID_HANDLE
  return t;
}

INSTANTIATE_TEST_SUITE_P(Acl, AccelTest, ::testing::Values(acl_target()), target_name);

class AclDoubleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (real_runtime()) GTEST_SKIP() << "steers the test double";
    ctl_.emplace(U3M_ACL_DOUBLE);
    ctl_->reset();
    std::string why;
    ASSERT_EQ(open_acl(U3M_ACL_DOUBLE, &dev_, &why), Status::ok) << why;
    host_ = dev_->make_host_backend(16 * MiB);
    ASSERT_EQ(host_->allocate(1 * MiB, &h_), Status::ok);
    ASSERT_EQ(dev_->allocate(1 * MiB, &d_), Status::ok);
  }
  void TearDown() override {
    host_.reset();
    dev_.reset();
    if (ctl_) {
      EXPECT_EQ(ctl_->live_objects(), 0u);
    }
  }
  std::uint8_t* h() { return static_cast<std::uint8_t*>(h_); }
  std::uint8_t* d() { return static_cast<std::uint8_t*>(d_); }
  std::optional<DoubleControl> ctl_;
  std::unique_ptr<AccelBackend> dev_;
  std::unique_ptr<MemoryBackend> host_;
  void* h_ = nullptr;
  void* d_ = nullptr;
};

TEST_F(AclDoubleTest, AsyncCopiesNeed64ByteAlignedAddresses) {
  EXPECT_EQ(dev_->info().copy_alignment, 64u);
  const std::uint64_t before = ctl_->calls("aclrtMemcpyAsync");
  EXPECT_EQ(dev_->memcpy_async(d() + 32, 4096, h(), 4096, CopyKind::h2d, kDefaultStream),
            Status::invalid_argument);
  EXPECT_NE(dev_->last_error().find("64-byte aligned"), std::string::npos) << dev_->last_error();
  EXPECT_EQ(dev_->memcpy_async(d(), 4096, h() + 8, 4096, CopyKind::h2d, kDefaultStream),
            Status::invalid_argument);
  EXPECT_EQ(ctl_->calls("aclrtMemcpyAsync"), before);  // refused before the runtime
  // Synchronous copies have no such rule.
  EXPECT_EQ(dev_->memcpy_sync(d() + 32, 4096, h() + 8, 4096, CopyKind::h2d), Status::ok);
  EXPECT_EQ(dev_->memcpy_async(d() + 64, 4096, h() + 128, 4096, CopyKind::h2d, kDefaultStream),
            Status::ok);
  EXPECT_EQ(dev_->synchronize_stream(kDefaultStream), Status::ok);
}

// CANN: async copies with host memory not from aclrtMallocHost are
// "unpredictable" and report no error; the backend refuses them.
TEST_F(AclDoubleTest, AsyncHostSideMustComeFromMallocHost) {
  std::vector<std::uint8_t> pageable(8192 + 64);
  auto* p = reinterpret_cast<std::uint8_t*>(
      (reinterpret_cast<std::uintptr_t>(pageable.data()) + 63) / 64 * 64);
  EXPECT_EQ(dev_->memcpy_async(d(), 4096, p, 4096, CopyKind::h2d, kDefaultStream),
            Status::invalid_argument);
  EXPECT_NE(dev_->last_error().find("pinned host allocator"), std::string::npos)
      << dev_->last_error();
  EXPECT_EQ(dev_->memcpy_async(p, 4096, d(), 4096, CopyKind::d2h, kDefaultStream),
            Status::invalid_argument);
  EXPECT_EQ(dev_->memcpy_sync(p, 4096, d(), 4096, CopyKind::d2h), Status::ok);
  EXPECT_EQ(dev_->register_host(p, 4096), Status::unsupported);  // no host-register here
}

TEST_F(AclDoubleTest, AsyncHostToHostIsTheRuntimesUnsupported) {
  void* h2 = nullptr;
  ASSERT_EQ(host_->allocate(4096, &h2), Status::ok);
  EXPECT_EQ(dev_->memcpy_async(h2, 4096, h(), 4096, CopyKind::h2h, kDefaultStream),
            Status::unsupported);
  EXPECT_NE(dev_->last_error().find("207000 ACL_ERROR_RT_FEATURE_NOT_SUPPORT"), std::string::npos)
      << dev_->last_error();
  EXPECT_EQ(dev_->memcpy_sync(h2, 4096, h(), 4096, CopyKind::h2h), Status::ok);
}

// destMax reaches aclrtMemcpy as given: the raw path skips u3m's own check
// and the runtime refuses count > destMax itself.
TEST_F(AclDoubleTest, DestMaxReachesTheRuntime) {
  EXPECT_EQ(dev_->raw_memcpy(d(), 1024, h(), 4096, CopyKind::h2d), Status::invalid_argument);
  EXPECT_NE(dev_->last_error().find("100000 ACL_ERROR_INVALID_PARAM (count > destMax)"),
            std::string::npos)
      << dev_->last_error();
  EXPECT_EQ(dev_->raw_memcpy(d(), 4096, h(), 4096, CopyKind::h2d), Status::ok);
}

// The double enforces ACL's per-thread context, so the conformance suite's
// WorksFromAnyThread means something: a raw call from a fresh thread fails.
TEST_F(AclDoubleTest, TheDoubleRefusesCallsWithoutAContext) {
  void* lib = dlopen(U3M_ACL_DOUBLE, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  ASSERT_NE(lib, nullptr);
  auto malloc_fn = reinterpret_cast<int (*)(void**, size_t, int)>(dlsym(lib, "aclrtMalloc"));
  ASSERT_NE(malloc_fn, nullptr);
  int code = 0;
  std::thread t([&] {
    void* p = nullptr;
    code = malloc_fn(&p, 4096, 0);
  });
  t.join();
  EXPECT_EQ(code, 107002);  // ACL_ERROR_RT_CONTEXT_NULL
}

TEST_F(AclDoubleTest, InitByAnotherUserIsFine) {
  std::unique_ptr<AccelBackend> second;
  std::string why;
  EXPECT_EQ(open_acl(U3M_ACL_DOUBLE, &second, &why), Status::ok) << why;  // aclInit repeats
  EXPECT_EQ(second->info().device_name, "u3m ACL test double");
}

TEST_F(AclDoubleTest, VmmIsOffWhenTheRuntimeCannot) {
  ctl_->fail_next("aclrtMemGetAllocationGranularity", 207000);
  std::unique_ptr<AccelBackend> b;
  std::string why;
  ASSERT_EQ(open_acl(U3M_ACL_DOUBLE, &b, &why), Status::ok) << why;
  EXPECT_FALSE(b->info().vmm);
  EXPECT_NE(b->info().vmm_note.find("aclrtMemGetAllocationGranularity"), std::string::npos);
  void* va = nullptr;
  EXPECT_EQ(b->reserve(2 * MiB, &va), Status::unsupported);
}

TEST_F(AclDoubleTest, EnvironmentVariableOverridesTheLibraryPath) {
  setenv("U3M_ACL_LIBRARY", U3M_ACL_DOUBLE, 1);
  std::unique_ptr<AccelBackend> b;
  std::string why;
  EXPECT_EQ(open_acl_backend({}, &b, &why), Status::ok) << why;
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(b->info().test_double);
  setenv("U3M_ACL_LIBRARY", "/nonexistent/libascendcl.so", 1);
  std::unique_ptr<AccelBackend> c;
  EXPECT_EQ(open_acl_backend({}, &c, &why), Status::unsupported);
  EXPECT_NE(why.find("/nonexistent/libascendcl.so"), std::string::npos) << why;
  unsetenv("U3M_ACL_LIBRARY");
}

}  // namespace
}  // namespace u3m::mem::testing
