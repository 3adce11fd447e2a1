// The simulator's host tier: a MemoryBackend that hands out fake addresses
// and never touches memory. Nothing may dereference what it returns; the
// simulator's transport only books time. (The device tier is the real
// DevicePool over mem::VirtualSegmentSource, which fakes addresses the same way.)
#pragma once

#include <cstdint>
#include <unordered_map>

#include "u3m/mem/backend.hpp"

namespace u3m::sim {

class SimHost final : public mem::MemoryBackend {
 public:
  // `capacity` bytes may be allocated at once (0 = unbounded); out_of_memory past it.
  explicit SimHost(std::uint64_t capacity = 0);

  mem::Capabilities capabilities() const override;
  mem::Status allocate(std::uint64_t bytes, void** ptr) override;
  mem::Status free(void* ptr) override;
  mem::Status mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) const override;

  std::uint64_t used() const { return used_; }
  std::uint64_t peak() const { return peak_; }
  std::uint64_t live_allocations() const { return live_.size(); }

 private:
  std::uint64_t capacity_, used_ = 0, peak_ = 0;
  std::uintptr_t next_;
  std::unordered_map<std::uintptr_t, std::uint64_t> live_;  // address -> bytes
};

}  // namespace u3m::sim
