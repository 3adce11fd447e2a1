#include "u3m/sim/virtual_time.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace u3m::sim {

void VirtualTime::schedule_at(std::uint64_t t, Callback cb) {
  if (t < now_)
    throw std::logic_error(
        fmt::format("VirtualTime: event at {} ns is before now ({} ns)", t, now_));
  queue_.push(Item{t, seq_++, std::move(cb)});
}

bool VirtualTime::run_next() {
  if (queue_.empty()) return false;
  // Move the callback out before popping: it may schedule (and so reorder) the heap.
  Item it = std::move(const_cast<Item&>(queue_.top()));
  queue_.pop();
  now_ = it.t;
  ++events_run_;
  it.cb();
  return true;
}

void VirtualTime::run_until(std::uint64_t t) {
  if (t < now_)
    throw std::logic_error(
        fmt::format("VirtualTime: run_until({} ns) is before now ({} ns)", t, now_));
  while (!queue_.empty() && queue_.top().t <= t) run_next();
  now_ = t;
}

std::optional<std::uint64_t> VirtualTime::next_time() const {
  if (queue_.empty()) return std::nullopt;
  return queue_.top().t;
}

}  // namespace u3m::sim
