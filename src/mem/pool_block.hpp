// Private to the pool's sources (pool.cpp, pool_config.cpp, free_index.cpp,
// segment_sources.cpp): a block of a segment, a segment, and the rounding
// helpers they share. Not installed: callers see include/u3m/mem/pool.hpp.
#pragma once

#include <cstdint>
#include <limits>

#include "u3m/mem/pool.hpp"

namespace u3m::mem {

// Note [Pool structure] in pool.cpp. Every field is guarded by the pool lock.
struct PoolBlock {
  std::uintptr_t ptr = 0;
  std::uint64_t size = 0;
  std::uint64_t requested = 0;       // what the holder asked for
  std::uint64_t generation = 0;      // odd while allocated; PoolAllocation::generation
  const DevicePool* pool = nullptr;  // set once; blocks are recycled within their pool
  void* segment = nullptr;           // the DevicePool::Segment holding it
  PoolBlock *prev = nullptr, *next = nullptr;
  bool allocated = false;  // held by a caller
  bool in_use = false;     // not on the spare list
  bool cached = false;     // free, in DevicePool::cache_ (not in a free set)
  std::uint32_t cache_slot = 0;
};

struct DevicePool::Segment {
  const DevicePool* pool = nullptr;
  std::uintptr_t base = 0;
  std::uint64_t size = 0;     // bytes mapped (expandable) or allocated (plain)
  std::uint64_t reserve = 0;  // virtual bytes reserved (expandable only)
  Kind kind = kSmall;
  bool expandable = false;
  PoolBlock *head = nullptr, *tail = nullptr;
};

namespace pool_detail {

constexpr bool is_pow2(std::uint64_t x) {
  return x && !(x & (x - 1));
}
// Rounds up; false on overflow.
inline bool round_up(std::uint64_t x, std::uint64_t to, std::uint64_t* out) {
  std::uint64_t r = x % to;
  if (r == 0) {
    *out = x;
    return true;
  }
  if (x > std::numeric_limits<std::uint64_t>::max() - (to - r)) return false;
  *out = x + (to - r);
  return true;
}
inline void* as_ptr(std::uintptr_t p) {
  return reinterpret_cast<void*>(p);
}

}  // namespace pool_detail
}  // namespace u3m::mem
