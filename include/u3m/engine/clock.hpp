// The one source of time for decision code (docs/architecture.md, "one
// policy, two clocks"). Real runs use SteadyClock; the simulator and tests
// use a clock they advance themselves.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace u3m::engine {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual std::uint64_t now_ns() const = 0;
};

class SteadyClock final : public Clock {
 public:
  std::uint64_t now_ns() const override {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
  }
};

// Time moves only when the owner says so (tests, the simulator's virtual clock).
class ManualClock final : public Clock {
 public:
  std::uint64_t now_ns() const override { return t_.load(std::memory_order_acquire); }
  void set(std::uint64_t t) { t_.store(t, std::memory_order_release); }
  void advance(std::uint64_t dt) { t_.fetch_add(dt, std::memory_order_acq_rel); }

 private:
  std::atomic<std::uint64_t> t_{0};
};

}  // namespace u3m::engine
