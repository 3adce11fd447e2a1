// Accelerator backends over a vendor runtime found at run time: CUDA
// (libcudart + libcuda, backend_cuda.hpp) and Ascend ACL (libascendcl,
// backend_acl.hpp). Nothing links against a vendor library: each is opened
// with dlopen and its calls are bound into a function table, so one u3m build
// runs on a CPU-only machine, an NVIDIA machine and an Ascend machine alike
// (docs/accelerators.md).
//
// Note [One backend, two runtimes]
// AccelBackend is the DeviceBackend both runtimes share: the bookkeeping and
// the checks the interface promises (backend.hpp) live here once, and a
// runtime adapter (src/mem/accel_runtime.hpp) only translates one call into
// one native call and maps the native error code onto a Status:
//   - every device pointer handed out (allocations, reservations, mapped
//     chunks) is recorded, so a copy's device side is checked against live
//     device memory and its host side against device address space before
//     the native call, as device-emu does; a native runtime would often
//     accept a wrong pointer and fail later, on the stream;
//   - Stream and Event ids map onto native handles; id 0 is a stream of the
//     backend's own (non-blocking on CUDA), not the runtime's implicit
//     default stream, so u3m's copies never serialise with a framework's
//     compute on that stream;
//   - an event never recorded counts as complete, without asking the runtime;
//   - a native code that means the device is lost (illegal address, ECC,
//     task abort, ...) makes every later call return device_failed;
//   - the device is made current on each calling thread before a native call
//     (cudaSetDevice + cuCtxSetCurrent, aclrtSetCurrentContext): both
//     runtimes keep the current device per thread, and the runtime's
//     transfer workers are threads of their own.
// The runtime's own rules that the interface does not have are data of the
// adapter (AccelInfo): ACL's aclrtMemcpyAsync needs 64-byte aligned source and
// destination, and its host side must come from aclrtMallocHost (other host
// memory is "undefined behaviour" there, not an error), so both are checked
// here and answered invalid_argument.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "u3m/mem/backend.hpp"

namespace u3m::mem {

// What the capability probe found, for `u3m doctor` and the bench's labels.
struct AccelInfo {
  std::string name;            // "cuda" or "acl"
  std::string library;         // the runtime library as opened (path or soname)
  std::string driver_library;  // CUDA: libcuda, for VMM; empty when not loaded
  std::string device_name;     // e.g. "NVIDIA H200"; "device N" when the runtime does not say
  int device = 0;
  std::string runtime_version, driver_version;  // as the runtime reports them; "" unknown
  // The library is u3m's in-repo test double over host memory
  // (tests/mem/doubles), not a vendor runtime: figures measured on it say so.
  bool test_double = false;
  bool vmm = false;                        // reserve/map/unmap available
  std::string vmm_note;                    // why not, when vmm is false
  std::uint64_t granularity = 2ull << 20;  // VMM granularity (also segment rounding)
  std::uint64_t total_bytes = 0;           // device memory, from mem_info at open
  std::uint64_t copy_alignment = 1;        // async copies: src and dst multiples of this (ACL: 64)
  bool async_host_must_be_runtime_pinned = false;  // ACL: host side from aclrtMallocHost
  bool host_register = false;                      // cudaHostRegister is available
};

class AccelBackend final : public DeviceBackend {
 public:
  struct Impl;  // src/mem/backend_accel.cpp; built by open_cuda_backend / open_acl_backend
  explicit AccelBackend(std::unique_ptr<Impl> impl);
  // Synchronizes every stream, then frees what is still allocated, mapped,
  // reserved or created, and releases the device.
  ~AccelBackend() override;
  AccelBackend(const AccelBackend&) = delete;
  AccelBackend& operator=(const AccelBackend&) = delete;

  Capabilities capabilities() const override;
  Status allocate(std::uint64_t bytes, void** ptr) override;
  Status free(void* ptr) override;
  Status mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) const override;

  Status memcpy_async(void* dst, std::uint64_t dst_max, const void* src, std::uint64_t count,
                      CopyKind kind, Stream stream) override;
  Status memcpy_sync(void* dst, std::uint64_t dst_max, const void* src, std::uint64_t count,
                     CopyKind kind) override;
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

  const AccelInfo& info() const;
  // The last native failure, one line: "cudaMemcpyAsync: 1 cudaErrorInvalidValue
  // (invalid argument)", or a u3m check that refused a call before it reached
  // the runtime. Empty when nothing failed.
  std::string last_error() const;

  // Pinned host memory from the runtime (cudaHostAlloc / aclrtMallocHost) as
  // the host tier; capacity 0 means physical RAM. The result must not outlive
  // this backend.
  std::unique_ptr<MemoryBackend> make_host_backend(std::uint64_t capacity = 0);
  // Page-locks an existing host range for fast DMA (cudaHostRegister), and
  // undoes it. unsupported where the runtime has no such call (ACL here).
  Status register_host(void* ptr, std::uint64_t bytes);
  Status unregister_host(void* ptr);

  // The runtime's own synchronous copy (cudaMemcpy / aclrtMemcpy), returning
  // when the bytes have landed, with none of u3m's bookkeeping or checks: the
  // reference `u3m bench copy` measures the backend against.
  Status raw_memcpy(void* dst, std::uint64_t dst_max, const void* src, std::uint64_t count,
                    CopyKind kind);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace u3m::mem
