// The simulator's clock: a u3m::engine::Clock whose time moves only when the
// simulator advances it, and the queue of events (transfer completions, ...)
// scheduled on it. Single-threaded: the engine, the modelled transport and
// the runner all run on the thread that drives the queue.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "u3m/engine/clock.hpp"

namespace u3m::sim {

class VirtualTime final : public engine::Clock {
 public:
  using Callback = std::function<void()>;

  std::uint64_t now_ns() const override { return now_; }

  // Schedules `cb` at virtual time `t` (>= now, else std::logic_error: an
  // event in the past would make time run backwards). Events at equal times
  // run in the order they were scheduled, so runs are deterministic.
  void schedule_at(std::uint64_t t, Callback cb);
  void schedule_after(std::uint64_t dt, Callback cb) { schedule_at(now_ + dt, std::move(cb)); }

  // Runs the earliest event, moving time to it; false when none is queued.
  // A callback may schedule more events.
  bool run_next();
  // Runs every event due at or before `t`, then sets the time to `t`
  // (t >= now, else std::logic_error).
  void run_until(std::uint64_t t);
  // Runs events until none is left.
  void run_all() {
    while (run_next()) {
    }
  }

  std::optional<std::uint64_t> next_time() const;
  std::size_t pending() const { return heap_.size(); }
  std::uint64_t events_run() const { return events_run_; }

 private:
  // Note [Event queue]
  // The heap orders small records (time, sequence, slot); the callbacks stay
  // put in slots_, reused through free_, so a sift moves 24 bytes instead of
  // a std::function and a steady run allocates no queue storage.
  struct Item {
    std::uint64_t t, seq;
    std::uint32_t slot;
  };
  struct Later {  // min-heap on (t, seq)
    bool operator()(const Item& a, const Item& b) const {
      return a.t != b.t ? a.t > b.t : a.seq > b.seq;
    }
  };
  std::vector<Item> heap_;
  std::vector<Callback> slots_;
  std::vector<std::uint32_t> free_;
  std::uint64_t now_ = 0, seq_ = 0, events_run_ = 0;
};

}  // namespace u3m::sim
