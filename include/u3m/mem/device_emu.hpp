// device-emu: an emulated accelerator whose "HBM" is a capacity-limited arena
// in host memory. Copy engines are worker threads, one per stream (a caller
// blocked in synchronize_stream runs the stream's not-yet-started ops itself);
// an optional per-direction throttle emulates a link's bandwidth. Expandable
// segments are emulated with mmap(PROT_NONE) reservations and memfd-backed
// physical chunks mapped with MAP_FIXED (docs/memory.md, "Backends").
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>

#include "u3m/mem/backend.hpp"

namespace u3m::mem {

struct DeviceEmuOptions {
  std::uint64_t capacity = 1ull << 30;     // bytes of emulated HBM (allocate + physical chunks)
  std::uint64_t granularity = 2ull << 20;  // VMM granularity, like ACL/CUDA (2 MiB)
  // Link bandwidth per direction in bytes/s, indexed by CopyKind; 0 means
  // unthrottled. Streams copying in the same direction share it, like a link.
  // E.g. PCIe 4.0 x16 is about 25e9 in practice.
  std::array<double, kNumCopyKinds> throttle_bytes_per_s{};
  // Copies are done in chunks of this size, so throttling, device failure
  // and interleaving between streams act at chunk boundaries.
  std::uint64_t chunk_bytes = 4ull << 20;
  // How long an idle copy engine spins for new work, and a caller in
  // synchronize_stream for completion, before sleeping; 0 = never spin. Cuts
  // hand-off latency (Note [Hand-off latency] in device_emu.cpp).
  std::uint64_t spin_ns = 50'000;
  std::uint64_t sync_spin_ns = 1'000'000;
  // A caller in synchronize_stream runs its stream's queued ops itself when
  // the engine has not started them yet (Note [A waiting caller runs the
  // copy] in device_emu.cpp). Same order and results; false = engine only.
  bool caller_runs_queued = true;
  // Test hook: called before each chunk is copied (kind, stream id, chunk
  // bytes), on the thread that copies it: the stream's engine, or a caller
  // running queued work in synchronize_stream, or memcpy_sync's caller (stream
  // id kSyncStream). Lets a test hold a copy "in flight".
  std::function<void(CopyKind, std::uint64_t stream, std::uint64_t bytes)> before_chunk{};
  // Test hook: called on a stream's engine each time it is about to take an
  // op from the queue (stream id). Lets a test hold the engine idle, as a
  // thread starved of CPU would be.
  std::function<void(std::uint64_t stream)> before_engine_op{};
};

// The stream id the before_chunk hook sees for a memcpy_sync copy.
inline constexpr std::uint64_t kSyncStream = UINT64_MAX;

// Who ran the ops (copies and event records) since construction.
struct DeviceEmuRunStats {
  std::uint64_t by_engine = 0;  // the streams' copy engine threads
  std::uint64_t by_caller = 0;  // callers waiting in synchronize_stream
};

class DeviceEmuBackend final : public DeviceBackend {
 public:
  // Throws std::system_error if the arena cannot be mapped at all (a
  // construction failure, not a call across the boundary).
  explicit DeviceEmuBackend(DeviceEmuOptions options = {});
  ~DeviceEmuBackend() override;
  DeviceEmuBackend(const DeviceEmuBackend&) = delete;
  DeviceEmuBackend& operator=(const DeviceEmuBackend&) = delete;

  Capabilities capabilities() const override;
  Status allocate(std::uint64_t bytes, void** ptr) override;
  Status free(void* ptr) override;
  Status mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) const override;

  // On the calling thread, through the same link throttle and failure
  // checks as the copy engines (Note [Synchronous copies] in device_emu.cpp).
  Status memcpy_sync(void* dst, std::uint64_t dst_max, const void* src, std::uint64_t count,
                     CopyKind kind) override;
  Status memcpy_async(void* dst, std::uint64_t dst_max, const void* src, std::uint64_t count,
                      CopyKind kind, Stream stream) override;
  Status create_stream(Stream* stream) override;
  Status destroy_stream(Stream stream) override;
  Status synchronize_stream(Stream stream) override;
  Status create_event(Event* event) override;
  Status destroy_event(Event event) override;
  Status record_event(Event event, Stream stream) override;
  Status query_event(Event event) const override;
  Status synchronize_event(Event event) override;
  Status stream_wait_event(Stream stream, Event event) override;

  Status reserve(std::uint64_t bytes, void** va) override;
  Status release(void* va) override;
  Status create_physical(std::uint64_t bytes, PhysicalHandle* handle) override;
  Status free_physical(PhysicalHandle handle) override;
  Status map(void* va, PhysicalHandle handle) override;
  Status unmap(void* va) override;

  // Test hook for failure-mode work: the device fails now. Copies not yet
  // done are dropped (their streams report device_failed at synchronize),
  // waiters wake up, and every later call returns device_failed. Memory stays
  // mapped until destruction so stale host-side pointers do not crash.
  void inject_failure();

  DeviceEmuRunStats run_stats() const;

  // Alignment of allocate()'s pointers (like cudaMalloc's 256 B, ACL's 32 B+).
  static constexpr std::uint64_t kAllocAlignment = 512;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace u3m::mem
