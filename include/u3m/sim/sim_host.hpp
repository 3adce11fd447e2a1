// The simulator's host tier: a MemoryBackend that hands out fake addresses
// and never touches memory. Nothing may dereference what it returns; the
// simulator's transport only books time. (The device tier is the real
// DevicePool over mem::VirtualSegmentSource, which fakes addresses the same way.)
#pragma once

#include <cstdint>
#include <vector>

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
  std::uint64_t live_allocations() const { return live_; }

 private:
  // Addresses only grow, so the allocations in the order made are sorted by
  // address: free() finds its block by binary search, with no node per
  // allocation as a hash map would need. A freed block keeps its place
  // (bytes = 0) until the freed outnumber the live, then they are dropped.
  struct Block {
    std::uintptr_t addr;
    std::uint64_t bytes;  // 0 = freed
  };
  std::uint64_t capacity_, used_ = 0, peak_ = 0, live_ = 0;
  std::uintptr_t next_;
  std::vector<Block> blocks_;
};

}  // namespace u3m::sim
