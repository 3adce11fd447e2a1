#include "u3m/sim/virtual_time.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace u3m::sim {

void VirtualTime::schedule_at(std::uint64_t t, Callback cb) {
  if (t < now_)
    throw std::logic_error(
        fmt::format("VirtualTime: event at {} ns is before now ({} ns)", t, now_));
  std::uint32_t slot;
  if (free_.empty()) {
    slot = static_cast<std::uint32_t>(slots_.size());
    slots_.push_back(std::move(cb));
  } else {
    slot = free_.back();
    free_.pop_back();
    slots_[slot] = std::move(cb);
  }
  heap_.push_back(Item{t, seq_++, slot});
  std::push_heap(heap_.begin(), heap_.end(), Later{});
}

bool VirtualTime::run_next() {
  if (heap_.empty()) return false;
  std::pop_heap(heap_.begin(), heap_.end(), Later{});
  const Item it = heap_.back();
  heap_.pop_back();
  // Moved out and its slot freed first: the callback may schedule more events.
  Callback cb = std::move(slots_[it.slot]);
  slots_[it.slot] = nullptr;
  free_.push_back(it.slot);
  now_ = it.t;
  ++events_run_;
  cb();
  return true;
}

void VirtualTime::run_until(std::uint64_t t) {
  if (t < now_)
    throw std::logic_error(
        fmt::format("VirtualTime: run_until({} ns) is before now ({} ns)", t, now_));
  while (!heap_.empty() && heap_.front().t <= t) run_next();
  now_ = t;
}

std::optional<std::uint64_t> VirtualTime::next_time() const {
  if (heap_.empty()) return std::nullopt;
  return heap_.front().t;
}

}  // namespace u3m::sim
