// Helpers shared by the backend tests.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include "u3m/mem/device_emu.hpp"

namespace u3m::mem::testing {

#define U3M_ASSERT_OK(expr) ASSERT_EQ((expr), ::u3m::mem::Status::ok) << #expr

// Deterministic bytes for (seed, index), so every buffer is distinguishable.
inline std::uint8_t pattern_byte(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  return static_cast<std::uint8_t>(x ^ (x >> 17));
}

inline std::vector<std::uint8_t> pattern(std::uint64_t seed, std::size_t n) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = pattern_byte(seed, i);
  return v;
}

// Holds copy engines in the before_chunk hook while closed: a copy "in
// flight" for as long as a test needs.
class Gate {
 public:
  void close() {
    std::lock_guard g(mu_);
    open_ = false;
  }
  void open() {
    {
      std::lock_guard g(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void pass() {
    std::unique_lock g(mu_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(g, [&] { return open_; });
    --waiting_;
  }
  // Blocks until at least n engines are held at the gate.
  void wait_for_waiters(int n) {
    std::unique_lock g(mu_);
    cv_.wait(g, [&] { return waiting_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int waiting_ = 0;
};

}  // namespace u3m::mem::testing
