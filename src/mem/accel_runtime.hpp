// What a vendor runtime provides to AccelBackend (Note [One backend, two
// runtimes] in include/u3m/mem/backend_accel.hpp), and the dlopen helper both
// adapters bind their function tables with. Private to src/mem.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "u3m/mem/backend.hpp"
#include "u3m/mem/backend_accel.hpp"

namespace u3m::mem::accel {

// A native return code; 0 is success in both CUDA and ACL.
using Code = int;

// One call in u3m's vocabulary = one native call (two for CUDA's map:
// cuMemMap + cuMemSetAccess). No bookkeeping and no checks here: AccelBackend
// does both. Handles are the runtime's own (cudaStream_t, aclrtEvent, ...),
// physical chunks its 64-bit handle (CUmemGenericAllocationHandle,
// aclrtDrvMemHandle).
class Runtime {
 public:
  virtual ~Runtime() = default;

  // Note [Error mapping] in each adapter: the Status a native code stands
  // for; device_failed means the device is lost and stays so.
  virtual Status status_of(Code c) const = 0;
  // "700 cudaErrorIllegalAddress (an illegal memory access was encountered)".
  virtual std::string describe(Code c) const = 0;

  // Makes the backend's device current on the calling thread.
  virtual Code bind_thread() = 0;

  virtual Code malloc(std::uint64_t bytes, void** ptr) = 0;
  virtual Code free(void* ptr) = 0;
  virtual Code malloc_host(std::uint64_t bytes, void** ptr) = 0;
  virtual Code free_host(void* ptr) = 0;
  virtual Code host_register(void* ptr, std::uint64_t bytes) = 0;  // AccelInfo::host_register
  virtual Code host_unregister(void* ptr) = 0;
  virtual Code mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) = 0;

  // Returns when the bytes have landed (CUDA's device-to-device cudaMemcpy
  // does not wait by itself; the adapter waits).
  virtual Code memcpy(void* dst, std::uint64_t dst_max, const void* src, std::uint64_t count,
                      CopyKind kind) = 0;
  virtual Code memcpy_async(void* dst, std::uint64_t dst_max, const void* src, std::uint64_t count,
                            CopyKind kind, void* stream) = 0;
  virtual Code stream_create(void** stream) = 0;
  virtual Code stream_destroy(void* stream) = 0;
  virtual Code stream_sync(void* stream) = 0;
  virtual Code event_create(void** event) = 0;
  virtual Code event_destroy(void* event) = 0;
  virtual Code event_record(void* event, void* stream) = 0;
  // *done: whether the latest record has completed (a not-ready answer is
  // success with *done = false).
  virtual Code event_query(void* event, bool* done) = 0;
  virtual Code event_sync(void* event) = 0;
  virtual Code stream_wait_event(void* stream, void* event) = 0;

  // VMM; only called when AccelInfo::vmm is true.
  virtual Code reserve(std::uint64_t bytes, void** va) = 0;
  virtual Code release(void* va, std::uint64_t bytes) = 0;
  virtual Code create_physical(std::uint64_t bytes, std::uint64_t* handle) = 0;
  virtual Code free_physical(std::uint64_t handle) = 0;
  // Maps the whole chunk at va and makes it readable and writable by the device.
  virtual Code map(void* va, std::uint64_t bytes, std::uint64_t handle) = 0;
  virtual Code unmap(void* va, std::uint64_t bytes) = 0;
};

// A shared library opened with dlopen (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE:
// vendor runtimes register exit handlers, so they are never unloaded).
class Library {
 public:
  // Opens the first candidate that loads: a path or a soname for the dynamic
  // linker's search. `why` gets one line naming what was tried and the last
  // loader error.
  static std::unique_ptr<Library> open(const std::vector<std::string>& candidates,
                                       std::string* why);
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  void* symbol(const char* name) const;
  // Binds `fn` to the symbol `name`; false if it is missing.
  template <typename F>
  bool bind(F*& fn, const char* name) const {
    fn = reinterpret_cast<F*>(symbol(name));
    return fn != nullptr;
  }
  // The file the loader picked (its full path where the loader says).
  const std::string& path() const { return path_; }
  // u3m's test doubles export their control API (tests/mem/doubles).
  bool is_test_double() const { return symbol("u3m_double_reset") != nullptr; }

 private:
  Library(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  void* handle_;
  std::string path_;
};

// The candidates for one library: the environment variable's value alone
// when it is set (an explicit choice never falls back), else `defaults`.
std::vector<std::string> library_candidates(const char* env_var, std::vector<std::string> defaults);

// Builds the backend around an opened runtime (AccelBackend's constructor is
// given its Impl; this keeps Impl private to backend_accel.cpp).
std::unique_ptr<AccelBackend> make_backend(std::unique_ptr<Runtime> runtime, AccelInfo info);

}  // namespace u3m::mem::accel
