// Shared helpers of the SSD store tests: a scratch directory under /tmp,
// deterministic blob contents, the engines the fault tests run over, and a
// recorder of on_corrupt calls.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "u3m/mem/pool.hpp"  // KiB, MiB
#include "u3m/mem/ssd_store.hpp"

namespace u3m::mem::testing {

// A fresh directory under /tmp, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = "/tmp/u3m-ssd-test-XXXXXX";
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Whether this file system accepts O_DIRECT, probed independently of the store.
inline bool dir_supports_direct_io(const ScratchDir& dir) {
  std::string p = dir.file("probe");
  int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (fd >= 0) ::close(fd);
  ::unlink(p.c_str());
  return fd >= 0;
}

// Bytes that depend on (key, version) at every position, so a stale, torn or
// misplaced read never looks right.
inline std::vector<unsigned char> blob(std::uint64_t key, std::uint64_t version, std::size_t n) {
  std::vector<unsigned char> v(n);
  std::uint64_t x = key * 0x9E3779B97F4A7C15ULL + version * 0xBF58476D1CE4E5B9ULL + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x >> 31;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 29;
    v[i] = static_cast<unsigned char>(x >> 56);
  }
  return v;
}

// Aligned or deliberately misaligned storage for direct and bounce paths.
class Buffer {
 public:
  Buffer(std::size_t n, bool misaligned) : n_(n) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, n + 4096 + 1) != 0) throw std::bad_alloc();
    base_.reset(static_cast<unsigned char*>(p));
    data_ = base_.get() + (misaligned ? 1 : 0);
  }
  unsigned char* data() { return data_; }
  std::size_t size() const { return n_; }
  std::vector<unsigned char> bytes(std::size_t n) const { return {data_, data_ + n}; }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> base_;
  unsigned char* data_;
  std::size_t n_;
};

inline std::unique_ptr<SsdStore> open_store(SsdStoreOptions o) {
  std::unique_ptr<SsdStore> s;
  std::string why;
  Status st = SsdStore::open(std::move(o), s, &why);
  EXPECT_EQ(st, Status::ok) << why;
  return s;
}

inline std::uint64_t rounded(std::uint64_t n) {
  return (n + 4095) / 4096 * 4096;
}

// The engine a parameterised fault test runs over: "io_uring" (null, with the
// reason in `why`, where the kernel refuses it) or "pread_pwrite".
inline std::shared_ptr<IoEngine> real_engine(const std::string& name, std::string& why) {
  if (name != "io_uring") return make_sync_engine();
  std::unique_ptr<IoEngine> e;
  if (!ok(make_uring_engine(64, e, &why))) return nullptr;
  return e;
}

// The fault layer over real_engine(name); null (with `why`) as real_engine.
inline std::shared_ptr<FaultInjectionIoEngine> fault_engine(const std::string& name,
                                                            std::string& why) {
  auto inner = real_engine(name, why);
  return inner ? std::make_shared<FaultInjectionIoEngine>(inner) : nullptr;
}

// Counts on_corrupt calls per key; thread-safe (the store calls it from its
// completion thread).
class CorruptKeys {
 public:
  std::function<void(std::uint64_t)> callback() {
    return [this](std::uint64_t k) {
      std::lock_guard lk(mu_);
      ++calls_[k];
    };
  }
  std::uint64_t count(std::uint64_t key) const {
    std::lock_guard lk(mu_);
    auto it = calls_.find(key);
    return it == calls_.end() ? 0 : it->second;
  }
  std::map<std::uint64_t, std::uint64_t> all() const {
    std::lock_guard lk(mu_);
    return calls_;
  }
  std::uint64_t total() const {
    std::lock_guard lk(mu_);
    std::uint64_t t = 0;
    for (auto& [k, n] : calls_) t += n;
    return t;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::uint64_t, std::uint64_t> calls_;
};

}  // namespace u3m::mem::testing
