// A test double of the AscendCL subset u3m uses (libu3m_acl_double.so), which
// the acl backend loads through U3M_ACL_LIBRARY. Signatures, enums and codes
// follow CANN's acl_rt.h, acl_base_rt.h and rt_error_codes.h, declared here
// on their own, not shared with src/mem/backend_acl.cpp.
//
// Rules beyond the core's (fake_device.hpp), from the CANN documentation:
//   - aclInit first (ACL_ERROR_UNINITIALIZE), once (ACL_ERROR_REPEAT_INITIALIZE);
//   - every aclrt call but device selection needs a current context on the
//     calling thread (ACL_ERROR_RT_CONTEXT_NULL): aclrtSetDevice creates and
//     sets it, aclrtSetCurrentContext sets it on another thread;
//   - aclrtMemcpy[Async]: count > destMax is ACL_ERROR_INVALID_PARAM;
//   - aclrtMemcpyAsync: source and destination 64-byte aligned
//     (ACL_ERROR_RT_ADDR_UNALIGNED), no host-to-host
//     (ACL_ERROR_RT_FEATURE_NOT_SUPPORT), and the host side from
//     aclrtMallocHost. CANN calls anything else "unpredictable" without an
//     error; the double answers ACL_ERROR_RT_PARAM_INVALID, so a slip fails.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fake_device.hpp"

#define U3M_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

enum : int {
  kSuccess = 0,
  kInvalidParam = 100000,         // ACL_ERROR_INVALID_PARAM
  kUninitialize = 100001,         // ACL_ERROR_UNINITIALIZE
  kRepeatInitialize = 100002,     // ACL_ERROR_REPEAT_INITIALIZE
  kRtParamInvalid = 107000,       // ACL_ERROR_RT_PARAM_INVALID
  kRtInvalidDeviceId = 107001,    // ACL_ERROR_RT_INVALID_DEVICEID
  kRtContextNull = 107002,        // ACL_ERROR_RT_CONTEXT_NULL
  kRtAddrUnaligned = 107008,      // ACL_ERROR_RT_ADDR_UNALIGNED
  kRtInvalidHandle = 107017,      // ACL_ERROR_RT_INVALID_HANDLE
  kRtFeatureNotSupport = 207000,  // ACL_ERROR_RT_FEATURE_NOT_SUPPORT
  kRtMemoryAllocation = 207001,   // ACL_ERROR_RT_MEMORY_ALLOCATION
  kRtNoDevice = 207004,           // ACL_ERROR_RT_NO_DEVICE
  kHostAlreadyRegistered = 507910,
};
constexpr int kCompleteStatus = 1, kNotReadyStatus = 0;  // aclrtEventRecordedStatus

struct MemLocation {
  std::uint32_t id;
  int type;
};
struct PhysicalMemProp {
  int handle_type, allocation_type, mem_attr;
  MemLocation location;
  std::uint64_t reserve;
};
static_assert(sizeof(PhysicalMemProp) == 32);

std::atomic<bool> g_initialized{false};
int g_context = 0;  // its address is the device's default context
std::atomic<int> g_device_refs{0};
thread_local void* t_context = nullptr;
thread_local std::string t_last_message;

using u3m::doubles::Kind;

int fail(int code, const char* what) {
  t_last_message = what;
  return code;
}
int need_context() {
  if (!g_initialized) return fail(kUninitialize, "aclInit was not called");
  return t_context != nullptr ? 0 : fail(kRtContextNull, "no current context on this thread");
}
bool good_prop(const PhysicalMemProp* p) {
  return p != nullptr && p->handle_type == 0 && p->allocation_type == 0 && p->location.type == 1 &&
         p->location.id == 0;
}

}  // namespace

namespace u3m::doubles {
FakeDevice& device() {
  static FakeDevice d(Codes{.invalid = kRtParamInvalid,
                            .oom = kRtMemoryAllocation,
                            .bad_handle = kRtInvalidHandle,
                            .in_use = kRtParamInvalid,
                            .registered = kHostAlreadyRegistered});
  return d;
}
}  // namespace u3m::doubles

using u3m::doubles::device;
// Counts the call, answers an injected or lost-device code, then the context rule.
#define ENTER(name)                                      \
  t_last_message.clear();                                \
  if (int c_ = device().enter(name); c_ != 0) return c_; \
  if (int c_ = need_context(); c_ != 0) return c_
#define ENTER_NO_CONTEXT(name) \
  t_last_message.clear();      \
  if (int c_ = device().enter(name); c_ != 0) return c_

U3M_EXPORT int aclInit(const char*) {
  ENTER_NO_CONTEXT("aclInit");
  return g_initialized.exchange(true) ? kRepeatInitialize : kSuccess;
}
U3M_EXPORT int aclrtGetDeviceCount(std::uint32_t* n) {
  ENTER_NO_CONTEXT("aclrtGetDeviceCount");
  if (!g_initialized) return fail(kUninitialize, "aclInit was not called");
  *n = static_cast<std::uint32_t>(device().device_count());
  return *n == 0 ? fail(kRtNoDevice, "no device") : kSuccess;
}
U3M_EXPORT int aclrtSetDevice(std::int32_t d) {
  ENTER_NO_CONTEXT("aclrtSetDevice");
  if (!g_initialized) return fail(kUninitialize, "aclInit was not called");
  if (d < 0 || d >= device().device_count()) return fail(kRtInvalidDeviceId, "bad device id");
  ++g_device_refs;
  t_context = &g_context;
  return kSuccess;
}
U3M_EXPORT int aclrtResetDevice(std::int32_t) {
  ENTER_NO_CONTEXT("aclrtResetDevice");
  if (g_device_refs == 0) return fail(kRtParamInvalid, "device was not set");
  --g_device_refs;
  return kSuccess;
}
U3M_EXPORT int aclrtGetCurrentContext(void** ctx) {
  ENTER("aclrtGetCurrentContext");
  *ctx = t_context;
  return kSuccess;
}
U3M_EXPORT int aclrtSetCurrentContext(void* ctx) {
  ENTER_NO_CONTEXT("aclrtSetCurrentContext");
  if (ctx != &g_context) return fail(kRtParamInvalid, "not a context of this runtime");
  t_context = ctx;
  return kSuccess;
}
U3M_EXPORT int aclrtMalloc(void** p, size_t n, int policy) {
  ENTER("aclrtMalloc");
  if (policy < 0 || policy > 2) return fail(kInvalidParam, "bad malloc policy");
  return device().alloc(n, p);
}
U3M_EXPORT int aclrtFree(void* p) {
  ENTER("aclrtFree");
  return device().free(p);
}
U3M_EXPORT int aclrtMallocHost(void** p, size_t n) {
  ENTER("aclrtMallocHost");
  return device().alloc_host(n, p);
}
U3M_EXPORT int aclrtFreeHost(void* p) {
  ENTER("aclrtFreeHost");
  return device().free_host(p);
}
U3M_EXPORT int aclrtGetMemInfo(int attr, size_t* f, size_t* t) {
  ENTER("aclrtGetMemInfo");
  if (attr < 0 || attr > 11 || f == nullptr || t == nullptr)
    return fail(kInvalidParam, "bad aclrtGetMemInfo arguments");
  std::uint64_t a = 0, b = 0;
  device().mem_info(&a, &b);
  *f = a;
  *t = b;
  return kSuccess;
}
U3M_EXPORT int aclrtMemcpy(void* d, size_t dmax, const void* s, size_t n, int kind) {
  ENTER("aclrtMemcpy");
  if (n > dmax) return fail(kInvalidParam, "count > destMax");
  if (kind < 0 || kind > 3) return fail(kInvalidParam, "bad copy kind");
  return device().copy(d, s, n, static_cast<Kind>(kind));
}
U3M_EXPORT int aclrtMemcpyAsync(void* d, size_t dmax, const void* s, size_t n, int kind,
                                void* stream) {
  ENTER("aclrtMemcpyAsync");
  if (n > dmax) return fail(kInvalidParam, "count > destMax");
  if (kind < 0 || kind > 3) return fail(kInvalidParam, "bad copy kind");
  if (kind == 0) return fail(kRtFeatureNotSupport, "no async host-to-host copy");
  if ((reinterpret_cast<std::uintptr_t>(d) | reinterpret_cast<std::uintptr_t>(s)) % 64 != 0)
    return fail(kRtAddrUnaligned, "async copy addresses must be 64-byte aligned");
  const void* host = kind == 1 ? s : kind == 2 ? d : nullptr;
  if (host != nullptr && !device().is_runtime_host(host, n))
    return fail(kRtParamInvalid, "host memory not from aclrtMallocHost (undefined in CANN)");
  return device().copy_async(d, s, n, static_cast<Kind>(kind), stream);
}
U3M_EXPORT int aclrtCreateStream(void** s) {
  ENTER("aclrtCreateStream");
  return device().stream_create(s);
}
U3M_EXPORT int aclrtDestroyStream(void* s) {
  ENTER("aclrtDestroyStream");
  return device().stream_destroy(s);
}
U3M_EXPORT int aclrtSynchronizeStream(void* s) {
  ENTER("aclrtSynchronizeStream");
  return device().stream_sync(s);
}
U3M_EXPORT int aclrtCreateEvent(void** e) {
  ENTER("aclrtCreateEvent");
  return device().event_create(e);
}
U3M_EXPORT int aclrtDestroyEvent(void* e) {
  ENTER("aclrtDestroyEvent");
  return device().event_destroy(e);
}
U3M_EXPORT int aclrtRecordEvent(void* e, void* s) {
  ENTER("aclrtRecordEvent");
  return device().event_record(e, s);
}
U3M_EXPORT int aclrtQueryEventStatus(void* e, int* status) {
  ENTER("aclrtQueryEventStatus");
  bool done = false;
  if (int c = device().event_query(e, &done)) return c;
  *status = done ? kCompleteStatus : kNotReadyStatus;
  return kSuccess;
}
U3M_EXPORT int aclrtSynchronizeEvent(void* e) {
  ENTER("aclrtSynchronizeEvent");
  return device().event_sync(e);
}
U3M_EXPORT int aclrtStreamWaitEvent(void* s, void* e) {
  ENTER("aclrtStreamWaitEvent");
  return device().stream_wait_event(s, e);
}
U3M_EXPORT int aclrtMemGetAllocationGranularity(PhysicalMemProp* prop, int, size_t* g) {
  ENTER("aclrtMemGetAllocationGranularity");
  if (!good_prop(prop) || g == nullptr) return fail(kInvalidParam, "bad memory properties");
  *g = device().granularity();
  return kSuccess;
}
U3M_EXPORT int aclrtReserveMemAddress(void** va, size_t n, size_t align, void* expect,
                                      std::uint64_t flags) {
  ENTER("aclrtReserveMemAddress");
  if (align != 0 || expect != nullptr || flags != 0)
    return fail(kInvalidParam, "alignment, expectPtr and flags are reserved (0)");
  return device().reserve(n, va);
}
U3M_EXPORT int aclrtReleaseMemAddress(void* va) {
  ENTER("aclrtReleaseMemAddress");
  return device().release(va);
}
U3M_EXPORT int aclrtMallocPhysical(void** h, size_t n, const PhysicalMemProp* prop,
                                   std::uint64_t flags) {
  ENTER("aclrtMallocPhysical");
  if (!good_prop(prop) || flags != 0 || h == nullptr)
    return fail(kInvalidParam, "bad aclrtMallocPhysical arguments");
  std::uint64_t handle = 0;
  int c = device().create_physical(n, &handle);
  *h = reinterpret_cast<void*>(static_cast<std::uintptr_t>(handle));
  return c;
}
U3M_EXPORT int aclrtFreePhysical(void* h) {
  ENTER("aclrtFreePhysical");
  return device().free_physical(reinterpret_cast<std::uintptr_t>(h));
}
U3M_EXPORT int aclrtMapMem(void* va, size_t n, size_t offset, void* h, std::uint64_t flags) {
  ENTER("aclrtMapMem");
  if (offset != 0 || flags != 0) return fail(kInvalidParam, "offset and flags must be 0");
  return device().map(va, n, reinterpret_cast<std::uintptr_t>(h), true);
}
U3M_EXPORT int aclrtUnmapMem(void* va) {
  ENTER("aclrtUnmapMem");
  return device().unmap(va, 0);
}
U3M_EXPORT const char* aclrtGetSocName() {
  return "u3m ACL test double";
}
U3M_EXPORT const char* aclGetRecentErrMsg() {
  return t_last_message.c_str();
}
