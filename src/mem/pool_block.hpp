// Private to the pool's sources (pool.cpp, pool_config.cpp, free_index.cpp,
// segment_sources.cpp): a block of a segment, a segment, and the rounding
// helpers they share. Not installed: callers see include/u3m/mem/pool.hpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>

#include "u3m/mem/pool.hpp"

namespace u3m::mem {

struct PoolBlock {
  std::uintptr_t ptr = 0;
  std::uint64_t size = 0, owner = 0;
  // What the holder asked for: written by whoever hands the block out (a
  // lock-free pop too), read by stats() under the lock, hence atomic.
  std::atomic<std::uint64_t> requested{0};
  std::atomic<std::uint64_t> generation{0};  // odd while allocated; written by the holder only
  std::atomic<bool> movable{false};
  const DevicePool* pool = nullptr;  // set once; blocks are recycled within their pool
  // `pool` while the block is not movable, else null: the lock-free free's
  // "ours and cacheable" test in one load (set with movable, by set_movable()).
  std::atomic<const DevicePool*> push_to{nullptr};
  void* segment = nullptr;  // the DevicePool::Segment holding it
  PoolBlock *prev = nullptr, *next = nullptr;
  PoolBlock* tnext = nullptr;  // next in a thread cache bin
  // allocated: out of the pool's free structures (held by a caller or a
  // thread cache); guarded by the pool lock.
  bool allocated = false, in_use = false;  // in_use: not on the spare list
  bool cached = false;                     // free, in DevicePool::cache_ (not in a free set)
  std::uint32_t cache_slot = 0;

  bool held() const { return generation.load(std::memory_order_acquire) & 1; }
  void set_movable(bool m) {
    movable.store(m, std::memory_order_relaxed);
    push_to.store(m ? nullptr : pool, std::memory_order_relaxed);
  }
  // Free to the figures: in a free set, the pool cache, or a thread cache.
  bool free_now() const { return !allocated || !held(); }
  // Returns the new generation, so callers need not load it back (a reload
  // is a store-to-load forward on the fast path's critical chain).
  std::uint64_t bump_generation() {
    return bump_generation_from(generation.load(std::memory_order_relaxed));
  }
  std::uint64_t bump_generation_from(std::uint64_t current) {
    generation.store(current + 1, std::memory_order_release);
    return current + 1;
  }
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
