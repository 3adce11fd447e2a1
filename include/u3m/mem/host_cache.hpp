// A cache of freed host blocks over a host MemoryBackend (Note [Pinned host
// cache]): what the real stack puts in front of a runtime's pinned allocator.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

#include "u3m/mem/backend.hpp"

namespace u3m::mem {

// Note [Pinned host cache]
// On cuda and acl every host-tier block is the runtime's pinned memory
// (cudaHostAlloc / aclrtMallocHost), and pinning is slow: the pages are
// faulted in and locked on each call, and cudaFreeHost may synchronize the
// device. The engine allocates and frees a host block per tensor it moves, and
// a training step moves the same sizes every step (the same parameters, the
// same activations), so freed blocks are kept and handed out again for an
// allocation of exactly their size. Cached and live bytes together stay
// within `limit`: an allocation that does not fit first frees cached blocks,
// oldest first. Every block is still the inner backend's, so a runtime's rule
// that its host side come from its own allocator still holds.
class HostBlockCache final : public MemoryBackend {
 public:
  // `inner` must outlive the cache; limit 0 = the inner backend's capacity.
  HostBlockCache(MemoryBackend& inner, std::uint64_t limit);
  ~HostBlockCache() override;  // gives every cached block back
  HostBlockCache(const HostBlockCache&) = delete;
  HostBlockCache& operator=(const HostBlockCache&) = delete;

  Capabilities capabilities() const override;
  Status allocate(std::uint64_t bytes, void** ptr) override;
  Status free(void* ptr) override;
  Status mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) const override;

  struct Stats {
    std::uint64_t hits = 0, misses = 0, dropped = 0;  // dropped: cached blocks given back
    std::uint64_t cached_bytes = 0, live_bytes = 0;
  };
  Stats stats() const;

 private:
  void drop_oldest();  // under mu_

  MemoryBackend& inner_;
  std::uint64_t limit_;
  mutable std::mutex mu_;
  using Cached = std::list<std::pair<std::uint64_t, void*>>;  // (size, block), oldest first
  std::unordered_map<void*, std::uint64_t> live_;              // handed out: size
  Cached order_;
  std::multimap<std::uint64_t, Cached::iterator> by_size_;
  Stats st_;
};

}  // namespace u3m::mem
