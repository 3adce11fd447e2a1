// BackendSegmentSource: the pool's SegmentSource over a DeviceBackend, so a
// DevicePool hands out real device memory (device-emu here; CUDA/ACL when
// their backends exist). docs/memory.md, "Pool allocator" > "Layers".
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "u3m/mem/backend.hpp"
#include "u3m/mem/pool.hpp"

namespace u3m::mem {

// Note [Backend segment source]
// Segments map onto allocate/free (aclrtMalloc/aclrtFree). The VMM calls map
// onto the backend's physical chunks: map(addr, bytes) creates and maps one
// chunk of granularity() bytes per granule (aclrtMallocPhysical +
// aclrtMapMem), and unmap unmaps and frees them one by one. One chunk per
// granule, not one per map() call, because the pool unmaps tails from any
// granule boundary (trim_tail), which may cut through an earlier map(); ACL
// and CUDA can only unmap whole chunks. A map() that fails part-way unwinds
// the chunks it made, so it takes nothing. granularity() and supports_vmm()
// come from backend.capabilities() at construction. Thread-safe (one mutex;
// the pool already serializes its calls, the mutex guards sharing a source).
class BackendSegmentSource final : public SegmentSource {
 public:
  // `backend` must outlive the source, and the source the pools using it.
  explicit BackendSegmentSource(DeviceBackend& backend);
  // Returns whatever a pool failed to give back (a pool returns everything
  // when destroyed, so normally nothing).
  ~BackendSegmentSource() override;
  BackendSegmentSource(const BackendSegmentSource&) = delete;
  BackendSegmentSource& operator=(const BackendSegmentSource&) = delete;

  std::uint64_t granularity() const override { return granularity_; }
  bool supports_vmm() const override { return vmm_; }
  Status allocate_segment(std::uint64_t bytes, void** base) override;
  Status free_segment(void* base, std::uint64_t bytes) override;
  Status reserve(std::uint64_t bytes, void** base) override;
  Status map(void* addr, std::uint64_t bytes) override;
  Status unmap(void* addr, std::uint64_t bytes) override;
  Status release(void* base, std::uint64_t bytes) override;

  const SourceCounters& counters() const { return counters_; }
  DeviceBackend& backend() const { return backend_; }

 private:
  // Unmaps and frees the chunks at [addr, addr+bytes); the first error.
  Status unmap_chunks(std::uintptr_t addr, std::uint64_t bytes);

  DeviceBackend& backend_;
  std::uint64_t granularity_;
  bool vmm_;
  std::mutex mu_;
  std::map<std::uintptr_t, std::uint64_t> segments_;      // base -> bytes
  std::map<std::uintptr_t, std::uint64_t> reservations_;  // base -> bytes
  std::map<std::uintptr_t, PhysicalHandle> chunks_;       // mapped address -> chunk
  SourceCounters counters_;
};

}  // namespace u3m::mem
