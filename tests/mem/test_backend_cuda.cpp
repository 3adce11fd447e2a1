// The cuda backend: the conformance suite (test_backend_accel.cpp) on the CUDA
// test double (or, with U3M_CUDA_TEST_REAL=1, on the real runtime), and the
// CUDA-only paths: the override variables, VMM without the driver, host
// registration, cuMemSetAccess after every map.
#include <cstdlib>
#include <cstring>
#include <string>

#include "test_backend_accel.hpp"
#include "test_backends_util.hpp"
#include "u3m/mem/backend_cuda.hpp"
#include "u3m/util/aligned.hpp"

namespace u3m::mem::testing {
namespace {

bool real_runtime() {
  const char* v = std::getenv("U3M_CUDA_TEST_REAL");
  return v != nullptr && std::string(v) == "1";
}

Status open_cuda(const std::string& library, std::unique_ptr<AccelBackend>* out, std::string* why) {
  CudaOptions o;
  o.runtime_library = library;  // the double is both libcudart and libcuda
  o.driver_library = library;
  return open_cuda_backend(o, out, why);
}

AccelTarget cuda_target() {
  AccelTarget t;
  t.name = "cuda";
  t.double_path = U3M_CUDA_DOUBLE;
  t.real = real_runtime();
  t.open = open_cuda;
  t.api_malloc = "cudaMalloc";
  t.api_copy_async = "cudaMemcpyAsync";
  t.api_stream_sync = "cudaStreamSynchronize";
  t.api_event_query = "cudaEventQuery";
  t.api_event_create = "cudaEventCreateWithFlags";
  t.api_device_count = "cudaGetDeviceCount";
  t.code_oom = 2;           // cudaErrorMemoryAllocation
  t.code_lost = 700;        // cudaErrorIllegalAddress (sticky)
  t.code_bad_handle = 400;  // cudaErrorInvalidResourceHandle
  return t;
}

INSTANTIATE_TEST_SUITE_P(Cuda, AccelTest, ::testing::Values(cuda_target()), target_name);

// The CUDA-only cases on the double; each starts from a reset double and
// checks nothing is left behind.
class CudaDoubleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (real_runtime()) GTEST_SKIP() << "steers the test double";
    ctl_.emplace(U3M_CUDA_DOUBLE);
    ctl_->reset();
  }
  void TearDown() override {
    dev_.reset();
    if (ctl_) {
      EXPECT_EQ(ctl_->live_objects(), 0u);
    }
  }
  std::unique_ptr<AccelBackend> open(CudaOptions o, std::string* why = nullptr) {
    std::string w;
    std::unique_ptr<AccelBackend> b;
    EXPECT_EQ(open_cuda_backend(o, &b, &w), Status::ok) << w;
    if (why != nullptr) *why = w;
    return b;
  }
  std::optional<DoubleControl> ctl_;
  std::unique_ptr<AccelBackend> dev_;
};

struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  const char* name_;
};

TEST_F(CudaDoubleTest, EnvironmentVariablesOverrideTheLibraryPaths) {
  {
    ScopedEnv rt("U3M_CUDART_LIBRARY", U3M_CUDA_DOUBLE);
    ScopedEnv drv("U3M_CUDA_DRIVER_LIBRARY", U3M_CUDA_DOUBLE);
    dev_ = open({});
    ASSERT_NE(dev_, nullptr);
    EXPECT_TRUE(dev_->info().test_double);
    EXPECT_TRUE(dev_->info().vmm) << dev_->info().vmm_note;
    EXPECT_NE(dev_->info().library.find("u3m_cuda_double"), std::string::npos);
    EXPECT_EQ(dev_->info().device_name, "u3m CUDA test double");
    EXPECT_EQ(dev_->info().runtime_version, "12.8");
    dev_.reset();
  }
  // An explicit choice never falls back to another library.
  ScopedEnv rt("U3M_CUDART_LIBRARY", "/nonexistent/libcudart.so.12");
  std::unique_ptr<AccelBackend> b;
  std::string why;
  EXPECT_EQ(open_cuda_backend({}, &b, &why), Status::unsupported);
  EXPECT_NE(why.find("tried /nonexistent/libcudart.so.12;"), std::string::npos) << why;
}

TEST_F(CudaDoubleTest, WithoutTheDriverLibraryThereIsNoVmm) {
  dev_ = open({.device = 0,
               .runtime_library = U3M_CUDA_DOUBLE,
               .driver_library = "/nonexistent/libcuda.so.1"});
  ASSERT_NE(dev_, nullptr);
  EXPECT_FALSE(dev_->info().vmm);
  EXPECT_NE(dev_->info().vmm_note.find("no CUDA driver library"), std::string::npos);
  EXPECT_FALSE(dev_->capabilities().vmm);
  void* va = nullptr;
  EXPECT_EQ(dev_->reserve(2 * MiB, &va), Status::unsupported);
  EXPECT_NE(dev_->last_error().find("no CUDA driver library"), std::string::npos);
  void* p = nullptr;
  EXPECT_EQ(dev_->allocate(1 * MiB, &p), Status::ok);  // memory and copies still work
  EXPECT_EQ(dev_->free(p), Status::ok);
}

TEST_F(CudaDoubleTest, VmmIsOffWhenTheDeviceCannot) {
  ctl_->fail_next("cuDeviceGetAttribute", 801);
  dev_ = open({.device = 0, .runtime_library = U3M_CUDA_DOUBLE, .driver_library = U3M_CUDA_DOUBLE});
  ASSERT_NE(dev_, nullptr);
  EXPECT_FALSE(dev_->info().vmm);
  EXPECT_NE(dev_->info().vmm_note.find("cuDeviceGetAttribute"), std::string::npos)
      << dev_->info().vmm_note;
}

TEST_F(CudaDoubleTest, AnOldDriverIsTheReason) {
  ctl_->fail_next("cudaGetDeviceCount", 35);
  std::unique_ptr<AccelBackend> b;
  std::string why;
  EXPECT_EQ(
      open_cuda_backend(
          {.device = 0, .runtime_library = U3M_CUDA_DOUBLE, .driver_library = U3M_CUDA_DOUBLE}, &b,
          &why),
      Status::unsupported);
  EXPECT_NE(why.find("cudaGetDeviceCount: 35 cudaErrorInsufficientDriver"), std::string::npos)
      << why;
}

TEST_F(CudaDoubleTest, AbsentDeviceOrdinalIsNamed) {
  std::unique_ptr<AccelBackend> b;
  std::string why;
  EXPECT_EQ(
      open_cuda_backend(
          {.device = 3, .runtime_library = U3M_CUDA_DOUBLE, .driver_library = U3M_CUDA_DOUBLE}, &b,
          &why),
      Status::invalid_argument);
  EXPECT_NE(why.find("device 3 asked for, 1 present"), std::string::npos) << why;
}

// A mapping is usable only after cuMemSetAccess; when that fails, map
// undoes cuMemMap and reports the failure.
TEST_F(CudaDoubleTest, EveryMapGrantsAccessOrUndoesItself) {
  dev_ = open({.device = 0, .runtime_library = U3M_CUDA_DOUBLE, .driver_library = U3M_CUDA_DOUBLE});
  ASSERT_NE(dev_, nullptr);
  void* va = nullptr;
  PhysicalHandle c;
  ASSERT_EQ(dev_->reserve(2 * MiB, &va), Status::ok);
  ASSERT_EQ(dev_->create_physical(2 * MiB, &c), Status::ok);
  ctl_->fail_next("cuMemSetAccess", 1);
  EXPECT_EQ(dev_->map(va, c), Status::invalid_argument);
  EXPECT_EQ(ctl_->calls("cuMemUnmap"), 1u);
  EXPECT_EQ(dev_->free_physical(c), Status::ok);  // not mapped after all
  ASSERT_EQ(dev_->create_physical(2 * MiB, &c), Status::ok);
  ASSERT_EQ(dev_->map(va, c), Status::ok);
  EXPECT_EQ(ctl_->calls("cuMemSetAccess"), 2u);
  auto host = dev_->make_host_backend(4 * MiB);
  void* h = nullptr;
  ASSERT_EQ(host->allocate(4096, &h), Status::ok);
  EXPECT_EQ(dev_->memcpy_sync(va, 4096, h, 4096, CopyKind::h2d), Status::ok) << dev_->last_error();
  EXPECT_EQ(dev_->unmap(va), Status::ok);
  EXPECT_EQ(dev_->free_physical(c), Status::ok);
  EXPECT_EQ(dev_->release(va), Status::ok);
}

TEST_F(CudaDoubleTest, RegistersExistingHostMemory) {
  dev_ = open({.device = 0, .runtime_library = U3M_CUDA_DOUBLE, .driver_library = U3M_CUDA_DOUBLE});
  ASSERT_NE(dev_, nullptr);
  AlignedBuffer buf = aligned_buffer(4096, 1 * MiB);
  ASSERT_EQ(dev_->register_host(buf.get(), 1 * MiB), Status::ok);
  EXPECT_EQ(dev_->register_host(buf.get() + 4096, 4096), Status::invalid_argument);  // overlaps
  void* d = nullptr;
  ASSERT_EQ(dev_->allocate(1 * MiB, &d), Status::ok);
  EXPECT_EQ(dev_->register_host(d, 4096), Status::invalid_argument);  // device memory
  const auto want = pattern(4, 1 * MiB);
  std::memcpy(buf.get(), want.data(), 1 * MiB);
  ASSERT_EQ(dev_->memcpy_async(d, 1 * MiB, buf.get(), 1 * MiB, CopyKind::h2d, kDefaultStream),
            Status::ok);
  ASSERT_EQ(dev_->synchronize_stream(kDefaultStream), Status::ok);
  EXPECT_EQ(dev_->unregister_host(buf.get()), Status::ok);
  EXPECT_EQ(dev_->unregister_host(buf.get()), Status::invalid_argument);
  EXPECT_EQ(dev_->free(d), Status::ok);
}

// cudaMemcpy does not wait for a device-to-device copy; memcpy_sync must.
TEST_F(CudaDoubleTest, SynchronousDeviceToDeviceCopyWaits) {
  dev_ = open({.device = 0, .runtime_library = U3M_CUDA_DOUBLE, .driver_library = U3M_CUDA_DOUBLE});
  ASSERT_NE(dev_, nullptr);
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(dev_->allocate(4096, &a), Status::ok);
  ASSERT_EQ(dev_->allocate(4096, &b), Status::ok);
  const std::uint64_t before = ctl_->calls("cudaStreamSynchronize");
  EXPECT_EQ(dev_->memcpy_sync(b, 4096, a, 4096, CopyKind::d2d), Status::ok);
  EXPECT_EQ(ctl_->calls("cudaStreamSynchronize"), before + 1);
  EXPECT_EQ(dev_->free(a), Status::ok);
  EXPECT_EQ(dev_->free(b), Status::ok);
}

}  // namespace
}  // namespace u3m::mem::testing
