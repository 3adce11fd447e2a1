// The conformance suite both accelerator backends run (test_backend_accel.cpp),
// instantiated by test_backend_cuda.cpp and test_backend_acl.cpp. In CI the
// backend loads the in-repo test double of its C API (tests/mem/doubles); with
// U3M_CUDA_TEST_REAL=1 (scripts/gpu-check.sh) or U3M_ACL_TEST_REAL=1 the suite
// loads the installed runtime instead, and the tests that steer the double
// are skipped.
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "u3m/mem/backend_accel.hpp"
#include "u3m/mem/pool.hpp"

namespace u3m::mem::testing {

// The control API of a test double (tests/mem/doubles/double_control.h),
// bound from the library the backend loaded: dlopen of the same path gives
// the same instance.
class DoubleControl {
 public:
  explicit DoubleControl(const std::string& path) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (h == nullptr) throw std::runtime_error("cannot load the test double " + path);
    bind(h, reset_, "u3m_double_reset");
    bind(h, configure_, "u3m_double_configure");
    bind(h, fail_next_, "u3m_double_fail_next");
    bind(h, fail_next_copy_, "u3m_double_fail_next_copy");
    bind(h, hold_, "u3m_double_hold");
    bind(h, calls_, "u3m_double_calls");
    bind(h, live_, "u3m_double_live_objects");
  }
  void reset() { reset_(); }
  void configure(int devices, std::uint64_t capacity, std::uint64_t granularity) {
    configure_(devices, capacity, granularity);
  }
  void fail_next(const char* api, int code, int times = 1) { fail_next_(api, code, times); }
  void fail_next_copy(int code, bool sticky) { fail_next_copy_(code, sticky ? 1 : 0); }
  void hold(bool on) { hold_(on ? 1 : 0); }
  std::uint64_t calls(const std::string& api) { return calls_(api.c_str()); }
  std::uint64_t live_objects() { return live_(); }

 private:
  template <typename F>
  static void bind(void* h, F*& f, const char* name) {
    f = reinterpret_cast<F*>(dlsym(h, name));
    if (f == nullptr) throw std::runtime_error(std::string("test double lacks ") + name);
  }
  void (*reset_)() = nullptr;
  void (*configure_)(int, std::uint64_t, std::uint64_t) = nullptr;
  void (*fail_next_)(const char*, int, int) = nullptr;
  void (*fail_next_copy_)(int, int) = nullptr;
  void (*hold_)(int) = nullptr;
  std::uint64_t (*calls_)(const char*) = nullptr;
  std::uint64_t (*live_)() = nullptr;
};

// One backend under test and the native names the suite counts and injects into.
struct AccelTarget {
  std::string name;         // "cuda" or "acl"
  std::string double_path;  // its test double
  bool real = false;        // the vendor runtime instead of the double
  // Opens the backend on `library` (empty: the backend's default search).
  Status (*open)(const std::string& library, std::unique_ptr<AccelBackend>* out,
                 std::string* why) = nullptr;
  // Native functions behind u3m calls.
  std::string api_malloc, api_copy_async, api_stream_sync, api_event_query, api_event_create,
      api_device_count;
  int code_oom = 0;         // native out-of-memory
  int code_lost = 0;        // a native code meaning the device is lost
  int code_bad_handle = 0;  // native invalid handle
};

inline std::ostream& operator<<(std::ostream& os, const AccelTarget& t) {
  return os << t.name << (t.real ? " (real runtime)" : " (test double)");
}
inline std::string target_name(const ::testing::TestParamInfo<AccelTarget>& i) {
  return i.param.name + (i.param.real ? "Real" : "Double");
}

class AccelTest : public ::testing::TestWithParam<AccelTarget> {
 protected:
  void SetUp() override {
    const AccelTarget& t = GetParam();
    if (!t.real) {
      ctl_.emplace(t.double_path);
      ctl_->reset();
    }
    std::string why;
    ASSERT_EQ(open(&dev_, &why), Status::ok) << why;
  }
  void TearDown() override {
    host_.reset();
    dev_.reset();
    if (ctl_) {
      EXPECT_EQ(ctl_->live_objects(), 0u) << "the backend left native objects behind";
    }
  }
  Status open(std::unique_ptr<AccelBackend>* out, std::string* why) {
    const AccelTarget& t = GetParam();
    return t.open(t.real ? std::string() : t.double_path, out, why);
  }
  // The runtime's pinned host tier, created on first use.
  MemoryBackend& host() {
    if (!host_) host_ = dev_->make_host_backend(256 * MiB);
    return *host_;
  }
  void* host_alloc(std::uint64_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(host().allocate(bytes, &p), Status::ok);
    return p;
  }
  void* dev_alloc(std::uint64_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(dev_->allocate(bytes, &p), Status::ok) << dev_->last_error();
    return p;
  }

  std::unique_ptr<AccelBackend> dev_;
  std::unique_ptr<MemoryBackend> host_;
  std::optional<DoubleControl> ctl_;
};

// Tests that steer the double (inject, hold, count) cannot run on hardware.
#define U3M_NEEDS_DOUBLE() \
  if (!ctl_) GTEST_SKIP() << "needs the test double's control API"

}  // namespace u3m::mem::testing
