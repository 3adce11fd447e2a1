// A test double of the CUDA runtime and driver API subset u3m uses, built as
// one shared library (libu3m_cuda_double.so) that the cuda backend loads as
// both libcudart and libcuda through U3M_CUDART_LIBRARY /
// U3M_CUDA_DRIVER_LIBRARY. Signatures and codes follow the CUDA
// documentation (cuda_runtime_api.h, cuda.h, driver_types.h), declared here
// on their own, not shared with src/mem/backend_cuda.cpp, so a layout slip
// in one shows up against the other.
//
// Rules beyond the core's (fake_device.hpp): driver VMM calls need cuInit
// and a current context on the calling thread (cuCtxSetCurrent, or
// cudaSetDevice, which makes the primary context current since CUDA 12),
// else CUDA_ERROR_NOT_INITIALIZED / CUDA_ERROR_INVALID_CONTEXT; a mapping is
// inaccessible until cuMemSetAccess; the VMM structs' fields are checked.
// Stricter than CUDA where u3m never goes: cuMemRelease of a mapped chunk
// fails instead of being deferred.
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "fake_device.hpp"

#define U3M_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

enum : int {
  kSuccess = 0,
  kInvalidValue = 1,
  kMemoryAllocation = 2,
  kNotInitialized = 3,
  kInvalidMemcpyDirection = 21,
  kNoDevice = 100,
  kInvalidDevice = 101,
  kInvalidContext = 201,
  kInvalidHandle = 400,
  kNotReady = 600,
  kHostAlreadyRegistered = 712,
  kNotSupported = 801,
};

struct Location {
  int type, id;
};
struct AllocProp {
  int type, requested_handle_types;
  Location location;
  void* win32;
  unsigned char flags[8];
};
static_assert(sizeof(AllocProp) == 32);
struct AccessDesc {
  Location location;
  int flags;
};

std::atomic<bool> g_initialized{false};  // cuInit
int g_primary_ctx = 0;       // its address is the context handle
thread_local bool t_ctx_current = false;

using u3m::doubles::Kind;

// Driver VMM calls: cuInit first, and a current context.
int need_ctx() {
  if (!g_initialized) return kNotInitialized;
  return t_ctx_current ? 0 : kInvalidContext;
}
bool good_prop(const AllocProp* p) {
  return p != nullptr && p->type == 1 && p->requested_handle_types == 0 && p->location.type == 1 &&
         p->location.id == 0;
}
int good_kind(int kind) {
  return kind >= 0 && kind <= 3 ? 0 : kInvalidMemcpyDirection;
}

}  // namespace

namespace u3m::doubles {
FakeDevice& device() {
  static FakeDevice d(Codes{.invalid = kInvalidValue,
                            .oom = kMemoryAllocation,
                            .bad_handle = kInvalidHandle,
                            .in_use = kInvalidValue,
                            .registered = kHostAlreadyRegistered});
  return d;
}
}  // namespace u3m::doubles

using u3m::doubles::device;
#define ENTER(name) \
  if (int c_ = device().enter(name); c_ != 0) return c_

// ---- runtime -------------------------------------------------------------
U3M_EXPORT int cudaGetDeviceCount(int* n) {
  ENTER("cudaGetDeviceCount");
  if (n == nullptr) return kInvalidValue;
  *n = device().device_count();
  return *n == 0 ? kNoDevice : kSuccess;
}
U3M_EXPORT int cudaSetDevice(int d) {
  ENTER("cudaSetDevice");
  if (d < 0 || d >= device().device_count()) return kInvalidDevice;
  t_ctx_current = true;
  return kSuccess;
}
U3M_EXPORT int cudaFree(void* p) {
  ENTER("cudaFree");
  return device().free(p);
}
U3M_EXPORT int cudaMalloc(void** p, size_t n) {
  ENTER("cudaMalloc");
  return device().alloc(n, p);
}
U3M_EXPORT int cudaHostAlloc(void** p, size_t n, unsigned) {
  ENTER("cudaHostAlloc");
  return device().alloc_host(n, p);
}
U3M_EXPORT int cudaFreeHost(void* p) {
  ENTER("cudaFreeHost");
  return device().free_host(p);
}
U3M_EXPORT int cudaHostRegister(void* p, size_t n, unsigned) {
  ENTER("cudaHostRegister");
  return device().register_host(p, n);
}
U3M_EXPORT int cudaHostUnregister(void* p) {
  ENTER("cudaHostUnregister");
  return device().unregister_host(p);
}
U3M_EXPORT int cudaMemGetInfo(size_t* f, size_t* t) {
  ENTER("cudaMemGetInfo");
  if (f == nullptr || t == nullptr) return kInvalidValue;
  std::uint64_t a = 0, b = 0;
  device().mem_info(&a, &b);
  *f = a;
  *t = b;
  return kSuccess;
}
U3M_EXPORT int cudaMemcpy(void* d, const void* s, size_t n, int kind) {
  ENTER("cudaMemcpy");
  if (int c = good_kind(kind)) return c;
  return device().copy(d, s, n, static_cast<Kind>(kind));
}
U3M_EXPORT int cudaMemcpyAsync(void* d, const void* s, size_t n, int kind, void* stream) {
  ENTER("cudaMemcpyAsync");
  if (int c = good_kind(kind)) return c;
  return device().copy_async(d, s, n, static_cast<Kind>(kind), stream);
}
U3M_EXPORT int cudaStreamCreateWithFlags(void** s, unsigned) {
  ENTER("cudaStreamCreateWithFlags");
  return device().stream_create(s);
}
U3M_EXPORT int cudaStreamDestroy(void* s) {
  ENTER("cudaStreamDestroy");
  return device().stream_destroy(s);
}
U3M_EXPORT int cudaStreamSynchronize(void* s) {
  ENTER("cudaStreamSynchronize");
  return device().stream_sync(s);
}
U3M_EXPORT int cudaEventCreateWithFlags(void** e, unsigned) {
  ENTER("cudaEventCreateWithFlags");
  return device().event_create(e);
}
U3M_EXPORT int cudaEventDestroy(void* e) {
  ENTER("cudaEventDestroy");
  return device().event_destroy(e);
}
U3M_EXPORT int cudaEventRecord(void* e, void* s) {
  ENTER("cudaEventRecord");
  return device().event_record(e, s);
}
U3M_EXPORT int cudaEventQuery(void* e) {
  ENTER("cudaEventQuery");
  bool done = false;
  if (int c = device().event_query(e, &done)) return c;
  return done ? kSuccess : kNotReady;
}
U3M_EXPORT int cudaEventSynchronize(void* e) {
  ENTER("cudaEventSynchronize");
  return device().event_sync(e);
}
U3M_EXPORT int cudaStreamWaitEvent(void* s, void* e, unsigned) {
  ENTER("cudaStreamWaitEvent");
  return device().stream_wait_event(s, e);
}
U3M_EXPORT int cudaRuntimeGetVersion(int* v) {
  *v = 12080;
  return kSuccess;
}
U3M_EXPORT int cudaDriverGetVersion(int* v) {
  *v = 12080;
  return kSuccess;
}
U3M_EXPORT const char* cudaGetErrorName(int c) {
  switch (c) {
    case kSuccess:
      return "cudaSuccess";
    case kInvalidValue:
      return "cudaErrorInvalidValue";
    case kMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case kNotInitialized:
      return "cudaErrorInitializationError";
    case kInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case 35:
      return "cudaErrorInsufficientDriver";
    case kNoDevice:
      return "cudaErrorNoDevice";
    case kInvalidDevice:
      return "cudaErrorInvalidDevice";
    case kInvalidContext:
      return "cudaErrorDeviceUninitialized";
    case kInvalidHandle:
      return "cudaErrorInvalidResourceHandle";
    case kNotReady:
      return "cudaErrorNotReady";
    case 700:
      return "cudaErrorIllegalAddress";
    case kHostAlreadyRegistered:
      return "cudaErrorHostMemoryAlreadyRegistered";
    case kNotSupported:
      return "cudaErrorNotSupported";
    default:
      return "cudaErrorUnknown";
  }
}
U3M_EXPORT const char* cudaGetErrorString(int c) {
  return c == 0 ? "no error" : "reported by the u3m CUDA test double";
}

// ---- driver --------------------------------------------------------------
U3M_EXPORT int cuInit(unsigned) {
  ENTER("cuInit");
  g_initialized = true;
  return kSuccess;
}
U3M_EXPORT int cuDeviceGet(int* d, int ordinal) {
  ENTER("cuDeviceGet");
  if (!g_initialized) return kNotInitialized;
  if (ordinal < 0 || ordinal >= device().device_count()) return kInvalidDevice;
  *d = ordinal;
  return kSuccess;
}
U3M_EXPORT int cuDeviceGetName(char* name, int len, int) {
  ENTER("cuDeviceGetName");
  const char text[] = "u3m CUDA test double";
  int i = 0;
  for (; i + 1 < len && text[i] != '\0'; ++i) name[i] = text[i];
  if (len > 0) name[i] = '\0';
  return kSuccess;
}
U3M_EXPORT int cuDeviceGetAttribute(int* v, int attr, int) {
  ENTER("cuDeviceGetAttribute");
  *v = attr == 102 ? 1 : 0;  // VMM supported
  return kSuccess;
}
U3M_EXPORT int cuDevicePrimaryCtxRetain(void** ctx, int) {
  ENTER("cuDevicePrimaryCtxRetain");
  if (!g_initialized) return kNotInitialized;
  *ctx = &g_primary_ctx;
  return kSuccess;
}
U3M_EXPORT int cuDevicePrimaryCtxRelease(int) {
  ENTER("cuDevicePrimaryCtxRelease");
  return kSuccess;
}
U3M_EXPORT int cuCtxSetCurrent(void* ctx) {
  ENTER("cuCtxSetCurrent");
  if (ctx != nullptr && ctx != &g_primary_ctx) return kInvalidContext;
  t_ctx_current = ctx != nullptr;
  return kSuccess;
}
U3M_EXPORT int cuMemGetAllocationGranularity(size_t* g, const AllocProp* prop, int) {
  ENTER("cuMemGetAllocationGranularity");
  if (!g_initialized) return kNotInitialized;
  if (g == nullptr || !good_prop(prop)) return kInvalidValue;
  *g = device().granularity();
  return kSuccess;
}
U3M_EXPORT int cuMemAddressReserve(std::uint64_t* p, size_t n, size_t align, std::uint64_t want,
                                   unsigned long long) {
  ENTER("cuMemAddressReserve");
  if (int c = need_ctx()) return c;
  if (want != 0 || (align != 0 && align != device().granularity())) return kNotSupported;
  void* va = nullptr;
  int c = device().reserve(n, &va);
  *p = reinterpret_cast<std::uintptr_t>(va);
  return c;
}
U3M_EXPORT int cuMemAddressFree(std::uint64_t p, size_t) {
  ENTER("cuMemAddressFree");
  if (int c = need_ctx()) return c;
  return device().release(reinterpret_cast<void*>(p));
}
U3M_EXPORT int cuMemCreate(std::uint64_t* h, size_t n, const AllocProp* prop, unsigned long long) {
  ENTER("cuMemCreate");
  if (int c = need_ctx()) return c;
  if (!good_prop(prop)) return kInvalidValue;
  return device().create_physical(n, h);
}
U3M_EXPORT int cuMemRelease(std::uint64_t h) {
  ENTER("cuMemRelease");
  if (int c = need_ctx()) return c;
  return device().free_physical(h);
}
U3M_EXPORT int cuMemMap(std::uint64_t p, size_t n, size_t offset, std::uint64_t h,
                        unsigned long long) {
  ENTER("cuMemMap");
  if (int c = need_ctx()) return c;
  if (offset != 0) return kNotSupported;
  return device().map(reinterpret_cast<void*>(p), n, h, false);
}
U3M_EXPORT int cuMemSetAccess(std::uint64_t p, size_t n, const AccessDesc* desc, size_t count) {
  ENTER("cuMemSetAccess");
  if (int c = need_ctx()) return c;
  if (count != 1 || desc == nullptr || desc->location.type != 1 || desc->location.id != 0 ||
      desc->flags != 3)
    return kInvalidValue;
  return device().set_access(reinterpret_cast<void*>(p), n);
}
U3M_EXPORT int cuMemUnmap(std::uint64_t p, size_t n) {
  ENTER("cuMemUnmap");
  if (int c = need_ctx()) return c;
  return device().unmap(reinterpret_cast<void*>(p), n);
}
