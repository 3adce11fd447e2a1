// The backend boundary of the memory layer: what the runtime, the pool
// allocator and the simulator's modelled backends talk to. Two interfaces:
//
//   MemoryBackend  allocate/free/mem_info/capabilities; the host tier
//                  (pinned DRAM) implements just this.
//   DeviceBackend  adds async copies on streams, events and virtual memory
//                  management (reserve/map/unmap) for expandable segments;
//                  device-emu implements it here, CUDA and ACL later (loaded
//                  with dlopen).
//
// No call throws; every call returns a Status (status.hpp). out_of_memory is
// recoverable: the caller may evict and retry.
//
// Note [Mapping to ACL]
// Each call maps one-to-one onto Ascend ACL (acl/acl_rt.h), so an ACL plugin
// is a thin translation layer:
//   allocate(bytes, &p)            aclrtMalloc(&p, bytes, ACL_MEM_MALLOC_HUGE_FIRST)
//   free(p)                        aclrtFree(p)
//   mem_info(&free, &total)        aclrtGetMemInfo(ACL_HBM_MEM, &free, &total)
//   memcpy_async(d, dmax, s, n, k, st)
//                                  aclrtMemcpyAsync(d, dmax, s, n, kind, st)
//                                  (n > dmax is invalid_argument, as in ACL)
//   memcpy_sync(d, dmax, s, n, k)  aclrtMemcpy(d, dmax, s, n, kind)
//   create_stream / destroy_stream aclrtCreateStream / aclrtDestroyStream
//   synchronize_stream(st)         aclrtSynchronizeStream(st)
//   create_event / destroy_event   aclrtCreateEvent / aclrtDestroyEvent
//   record_event(e, st)            aclrtRecordEvent(e, st)
//   query_event(e)                 aclrtQueryEventStatus(e, &st): ok when
//                                  ACL_EVENT_RECORDED_STATUS_COMPLETE, else busy
//   synchronize_event(e)           aclrtSynchronizeEvent(e)
//   stream_wait_event(st, e)       aclrtStreamWaitEvent(st, e)
//   reserve(bytes, &va)            aclrtReserveMemAddress(&va, bytes, 0, nullptr, 0)
//   release(va)                    aclrtReleaseMemAddress(va)
//   create_physical(bytes, &h)     aclrtMallocPhysical(&h, bytes, &prop, 0)
//   free_physical(h)               aclrtFreePhysical(h)
//   map(va, h)                     aclrtMapMem(va, h.size, 0, h, 0)
//   unmap(va)                      aclrtUnmapMem(va)
//   capabilities().granularity     aclrtMemGetAllocationGranularity
// CUDA maps the same way (cudaMallocAsync-free subset: cudaMalloc,
// cudaMemcpyAsync, cudaEvent*, cuMemAddressReserve/cuMemCreate/cuMemMap +
// cuMemSetAccess/cuMemUnmap). A host backend for ACL maps allocate/free onto
// aclrtMallocHost/aclrtFreeHost.
//
// Errors that happen asynchronously (a copy failing on a stream) surface, as
// in ACL, at the next synchronize_stream/synchronize_event and on every later
// call once the device is failed (device_failed).
#pragma once

#include <cstdint>

#include "u3m/mem/status.hpp"

namespace u3m::mem {

// Direction of a copy, as aclrtMemcpyKind. The backend checks that device-side
// pointers lie in its own memory and host-side pointers do not.
enum class CopyKind : std::uint8_t { h2h, h2d, d2h, d2d };
inline constexpr int kNumCopyKinds = 4;
std::string_view to_string(CopyKind k);

// Opaque handles. id 0 of Stream is the default stream, which always exists.
struct Stream {
  std::uint64_t id = 0;
  friend bool operator==(Stream, Stream) = default;
};
inline constexpr Stream kDefaultStream{};

struct Event {
  std::uint64_t id = 0;  // 0 is never a valid event
  friend bool operator==(Event, Event) = default;
};

// A physical memory chunk for expandable segments (aclrtDrvMemHandle). It
// knows its size and tier; size is a multiple of capabilities().granularity.
struct PhysicalHandle {
  std::uint64_t id = 0;  // 0 is never a valid chunk
  std::uint64_t size = 0;
  Tier tier = Tier::device;
};

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;

  // Probed at construction; may change at run time only by degrading (e.g.
  // pinned becomes false once mlock is refused), hence returned by value.
  virtual Capabilities capabilities() const = 0;

  // Allocates `bytes` (> 0) and stores the pointer in *ptr. out_of_memory when
  // the capacity would be exceeded; *ptr is left unchanged on any error.
  virtual Status allocate(std::uint64_t bytes, void** ptr) = 0;
  // Frees a pointer returned by allocate (exactly that pointer, else
  // invalid_argument). The caller must have synchronized copies that use it.
  virtual Status free(void* ptr) = 0;
  // Bytes still allocatable and the capacity, in bytes.
  virtual Status mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) const = 0;
};

class DeviceBackend : public MemoryBackend {
 public:
  // Enqueues a copy of `count` bytes on `stream`. Validation is synchronous
  // (invalid_argument: count > dst_max, null pointers, a device-side range
  // outside live device memory, a host-side range inside it; not_found: an
  // unknown stream); the copy itself happens later, in stream order.
  // count == 0 is a no-op that returns ok.
  virtual Status memcpy_async(void* dst, std::uint64_t dst_max, const void* src,
                              std::uint64_t count, CopyKind kind, Stream stream) = 0;
  // Copies now and returns when done, ordered with no stream (as aclrtMemcpy
  // and cudaMemcpy): for a caller that would wait on the copy anyway. The
  // same validation as memcpy_async; a failure of the copy is its result.
  virtual Status memcpy_sync(void* dst, std::uint64_t dst_max, const void* src, std::uint64_t count,
                             CopyKind kind) = 0;

  virtual Status create_stream(Stream* stream) = 0;
  // Waits for the stream's work, then destroys it. The default stream cannot
  // be destroyed (invalid_argument).
  virtual Status destroy_stream(Stream stream) = 0;
  // Waits until everything enqueued on the stream so far has completed;
  // returns the first asynchronous error seen on it.
  virtual Status synchronize_stream(Stream stream) = 0;

  virtual Status create_event(Event* event) = 0;
  virtual Status destroy_event(Event event) = 0;
  // Marks the current end of `stream`; the event completes when all work
  // enqueued before it has. Re-recording moves the mark (CUDA/ACL semantics).
  virtual Status record_event(Event event, Stream stream) = 0;
  // ok if the latest record has completed (or the event was never recorded),
  // busy if not yet.
  virtual Status query_event(Event event) const = 0;
  virtual Status synchronize_event(Event event) = 0;
  // Work enqueued on `stream` after this call waits for the event's latest
  // record (as of this call) to complete. Does not block the caller.
  virtual Status stream_wait_event(Stream stream, Event event) = 0;

  // Virtual memory management for expandable segments. All sizes and
  // addresses are multiples of capabilities().granularity; unsupported when
  // capabilities().vmm is false.
  //
  // Reserves `bytes` of device address space (no memory behind it yet).
  virtual Status reserve(std::uint64_t bytes, void** va) = 0;
  // Releases a reservation; busy while any chunk is still mapped in it.
  virtual Status release(void* va) = 0;
  // Creates a physical chunk; counts against capacity (out_of_memory).
  virtual Status create_physical(std::uint64_t bytes, PhysicalHandle* handle) = 0;
  // Frees a chunk; busy while it is mapped anywhere.
  virtual Status free_physical(PhysicalHandle handle) = 0;
  // Maps the whole chunk at `va`, which must lie with the chunk's full size
  // inside one reservation and overlap no other mapping (invalid_argument).
  // A chunk may be mapped at several addresses; all views share the bytes.
  virtual Status map(void* va, PhysicalHandle handle) = 0;
  // Unmaps the chunk mapped at exactly `va`; the range becomes inaccessible.
  virtual Status unmap(void* va) = 0;
};

}  // namespace u3m::mem
