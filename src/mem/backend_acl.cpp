// The AscendCL adapter of AccelBackend (include/u3m/mem/backend_acl.hpp).
//
// As in backend_cuda.cpp (Note [Function tables]), no CANN header is
// included: the few types and constants u3m passes are declared below from
// CANN's acl_rt.h / acl_base_rt.h / rt_error_codes.h, and every function is
// bound by name from the library dlopen found, once, into a table. This is
// the shape of Ascend's own memfabric DlAclApi (a table of typed pointers
// filled by dlsym after one dlopen); the code is u3m's. The VMM calls are
// optional: a CANN without them gives a backend with vmm = false.
//
// Contexts: ACL keeps the current context per thread, and most aclrt calls
// fail with ACL_ERROR_RT_CONTEXT_NULL on a thread that never set one. The
// backend opens the device once (aclrtSetDevice creates its default context)
// and every call first makes that context current on the calling thread
// (aclrtSetCurrentContext).
#include "u3m/mem/backend_acl.hpp"

#include <cstdint>
#include <cstdlib>

#include <fmt/format.h>

#include "accel_runtime.hpp"

namespace u3m::mem {
namespace {

using accel::Code;
using aclError = int;

// acl_rt.h
constexpr int kHugeFirst = 0;              // ACL_MEM_MALLOC_HUGE_FIRST
constexpr int kHbmMem = 1;                 // aclrtMemAttr ACL_HBM_MEM
constexpr int kHbmMemHuge = 4;             // aclrtMemAttr ACL_HBM_MEM_HUGE
constexpr int kRecordedComplete = 1;       // ACL_EVENT_RECORDED_STATUS_COMPLETE
constexpr int kLocationDevice = 1;         // ACL_MEM_LOCATION_TYPE_DEVICE
constexpr int kGranularityMinimum = 0;     // ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM
constexpr int kRepeatInitialize = 100002;  // ACL_ERROR_REPEAT_INITIALIZE

struct AclMemLocation {
  std::uint32_t id;
  int type;
};
struct AclPhysicalMemProp {
  int handleType;      // ACL_MEM_HANDLE_TYPE_NONE = 0
  int allocationType;  // ACL_MEM_ALLOCATION_TYPE_PINNED = 0
  int memAttr;
  AclMemLocation location;
  std::uint64_t reserve;
};
static_assert(sizeof(AclPhysicalMemProp) == 32, "aclrtPhysicalMemProp layout (acl_rt.h)");

template <typename F>
using Fn = F*;

#define U3M_ACL_FUNCS(X)                                                        \
  X(aclInit, aclError(const char*))                                             \
  X(aclrtSetDevice, aclError(std::int32_t))                                     \
  X(aclrtResetDevice, aclError(std::int32_t))                                   \
  X(aclrtGetDeviceCount, aclError(std::uint32_t*))                              \
  X(aclrtGetCurrentContext, aclError(void**))                                   \
  X(aclrtSetCurrentContext, aclError(void*))                                    \
  X(aclrtMalloc, aclError(void**, size_t, int))                                 \
  X(aclrtFree, aclError(void*))                                                 \
  X(aclrtMallocHost, aclError(void**, size_t))                                  \
  X(aclrtFreeHost, aclError(void*))                                             \
  X(aclrtGetMemInfo, aclError(int, size_t*, size_t*))                           \
  X(aclrtMemcpy, aclError(void*, size_t, const void*, size_t, int))             \
  X(aclrtMemcpyAsync, aclError(void*, size_t, const void*, size_t, int, void*)) \
  X(aclrtCreateStream, aclError(void**))                                        \
  X(aclrtDestroyStream, aclError(void*))                                        \
  X(aclrtSynchronizeStream, aclError(void*))                                    \
  X(aclrtCreateEvent, aclError(void**))                                         \
  X(aclrtDestroyEvent, aclError(void*))                                         \
  X(aclrtRecordEvent, aclError(void*, void*))                                   \
  X(aclrtQueryEventStatus, aclError(void*, int*))                               \
  X(aclrtSynchronizeEvent, aclError(void*))                                     \
  X(aclrtStreamWaitEvent, aclError(void*, void*))

#define U3M_ACL_VMM_FUNCS(X)                                                                 \
  X(aclrtReserveMemAddress, aclError(void**, size_t, size_t, void*, std::uint64_t))          \
  X(aclrtReleaseMemAddress, aclError(void*))                                                 \
  X(aclrtMallocPhysical, aclError(void**, size_t, const AclPhysicalMemProp*, std::uint64_t)) \
  X(aclrtFreePhysical, aclError(void*))                                                      \
  X(aclrtMapMem, aclError(void*, size_t, size_t, void*, std::uint64_t))                      \
  X(aclrtUnmapMem, aclError(void*))                                                          \
  X(aclrtMemGetAllocationGranularity, aclError(AclPhysicalMemProp*, int, size_t*))

#define U3M_DECLARE(name, sig) Fn<sig> name = nullptr;
#define U3M_BIND(name, sig) \
  if (!lib.bind(name, #name)) return #name;

struct AclTable {
  U3M_ACL_FUNCS(U3M_DECLARE)
  U3M_ACL_VMM_FUNCS(U3M_DECLARE)
  Fn<const char*()> aclrtGetSocName = nullptr;     // optional: the device's name
  Fn<const char*()> aclGetRecentErrMsg = nullptr;  // optional: the runtime's last message
  // The first required function the library lacks, or nullptr.
  const char* bind(const accel::Library& lib) {
    U3M_ACL_FUNCS(U3M_BIND)
    lib.bind(aclrtGetSocName, "aclrtGetSocName");
    lib.bind(aclGetRecentErrMsg, "aclGetRecentErrMsg");
    return nullptr;
  }
  // The first VMM function missing, or nullptr.
  const char* bind_vmm(const accel::Library& lib) {
    U3M_ACL_VMM_FUNCS(U3M_BIND)
    return nullptr;
  }
};
#undef U3M_DECLARE
#undef U3M_BIND

// Note [Error mapping] (ACL): acl_base_rt.h's ACL_ERROR_* and
// rt_error_codes.h's ACL_ERROR_RT_*, one row each: the Status a code stands
// for and its name for messages. Caller mistakes (bad parameter, bad
// alignment, no context) are invalid_argument; unknown handles not_found;
// exhausted memory or runtime resources out_of_memory; unsupported features
// unsupported; "not complete" busy. The 5xxxxx internal, device and DMA
// errors, and any code not listed, are device_failed.
struct CodeRow {
  Code code;
  Status status;
  const char* name;
};
constexpr CodeRow kCodes[] = {
    {100000, Status::invalid_argument, "ACL_ERROR_INVALID_PARAM"},
    {100001, Status::invalid_argument, "ACL_ERROR_UNINITIALIZE"},
    {107000, Status::invalid_argument, "ACL_ERROR_RT_PARAM_INVALID"},
    {107001, Status::invalid_argument, "ACL_ERROR_RT_INVALID_DEVICEID"},
    {107002, Status::invalid_argument, "ACL_ERROR_RT_CONTEXT_NULL"},
    {107008, Status::invalid_argument, "ACL_ERROR_RT_ADDR_UNALIGNED"},
    {200002, Status::invalid_argument, "ACL_ERROR_INVALID_DEVICE"},
    {200003, Status::invalid_argument, "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED"},
    {207002, Status::invalid_argument, "ACL_ERROR_RT_MEMORY_FREE"},
    {107003, Status::not_found, "ACL_ERROR_RT_STREAM_CONTEXT"},
    {107017, Status::not_found, "ACL_ERROR_RT_INVALID_HANDLE"},
    {200005, Status::not_found, "ACL_ERROR_INVALID_RESOURCE_HANDLE"},
    {200000, Status::out_of_memory, "ACL_ERROR_BAD_ALLOC"},
    {207001, Status::out_of_memory, "ACL_ERROR_RT_MEMORY_ALLOCATION"},
    {207005, Status::out_of_memory, "ACL_ERROR_RT_RESOURCE_ALLOC_FAIL"},
    {207007, Status::out_of_memory, "ACL_ERROR_RT_NO_EVENT_RESOURCE"},
    {207008, Status::out_of_memory, "ACL_ERROR_RT_NO_STREAM_RESOURCE"},
    {207018, Status::out_of_memory, "ACL_ERROR_RT_DEVICE_OOM"},
    {200001, Status::unsupported, "ACL_ERROR_API_NOT_SUPPORT"},
    {200006, Status::unsupported, "ACL_ERROR_FEATURE_UNSUPPORTED"},
    {207000, Status::unsupported, "ACL_ERROR_RT_FEATURE_NOT_SUPPORT"},
    {207006, Status::unsupported, "ACL_ERROR_RT_NO_PERMISSION"},
    {507004, Status::busy, "ACL_ERROR_RT_STREAM_NOT_COMPLETE"},
    {507006, Status::busy, "ACL_ERROR_RT_EVENT_NOT_COMPLETE"},
    {207004, Status::device_failed, "ACL_ERROR_RT_NO_DEVICE"},
    {107022, Status::device_failed, "ACL_ERROR_RT_DEVICE_TASK_ABORT"},
    {500000, Status::device_failed, "ACL_ERROR_INTERNAL_ERROR"},
    {507000, Status::device_failed, "ACL_ERROR_RT_INTERNAL_ERROR"},
    {507013, Status::device_failed, "ACL_ERROR_RT_SYS_DMA"},
    {507053, Status::device_failed, "ACL_ERROR_RT_DEVICE_MEM_ERROR"},
    {507054, Status::device_failed, "ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR"},
};
const CodeRow* row_of(Code c) {
  for (const CodeRow& r : kCodes)
    if (r.code == c) return &r;
  return nullptr;
}

class AclRuntime final : public accel::Runtime {
 public:
  AclRuntime(std::unique_ptr<accel::Library> lib, AclTable t, int device)
      : lib_(std::move(lib)), t_(t), device_(device) {}
  ~AclRuntime() override {
    if (opened_) t_.aclrtResetDevice(device_);  // balances our aclrtSetDevice; no aclFinalize
  }

  // aclInit (tolerating an earlier one), then the device and its context.
  std::string open_device(std::uint64_t* total_bytes) {
    if (Code c = t_.aclInit(nullptr); c != 0 && c != kRepeatInitialize)
      return "aclInit: " + describe(c);
    std::uint32_t count = 0;
    if (Code c = t_.aclrtGetDeviceCount(&count); c != 0)
      return "aclrtGetDeviceCount: " + describe(c);
    if (count == 0) return "the runtime reports no Ascend device";
    if (static_cast<std::uint32_t>(device_) >= count)
      return fmt::format("device {} asked for, {} present", device_, count);
    if (Code c = t_.aclrtSetDevice(device_); c != 0) return "aclrtSetDevice: " + describe(c);
    opened_ = true;
    if (Code c = t_.aclrtGetCurrentContext(&ctx_); c != 0)
      return "aclrtGetCurrentContext: " + describe(c);
    std::uint64_t free_bytes = 0;
    if (Code c = mem_info(&free_bytes, total_bytes); c != 0)
      return "aclrtGetMemInfo: " + describe(c);
    return {};
  }
  // VMM; on failure returns why it is off.
  std::string probe_vmm(std::uint64_t* granularity) {
    if (const char* missing = t_.bind_vmm(*lib_))
      return fmt::format("{} has no {} (CANN without VMM)", lib_->path(), missing);
    AclPhysicalMemProp prop = device_prop();
    size_t g = 0;
    if (Code c = t_.aclrtMemGetAllocationGranularity(&prop, kGranularityMinimum, &g); c != 0)
      return "aclrtMemGetAllocationGranularity: " + describe(c);
    if (g == 0) return "aclrtMemGetAllocationGranularity returned 0";
    *granularity = g;
    return {};
  }
  const char* soc_name() const { return t_.aclrtGetSocName ? t_.aclrtGetSocName() : nullptr; }

  Status status_of(Code c) const override {
    if (c == 0) return Status::ok;
    const CodeRow* r = row_of(c);
    return r != nullptr ? r->status : Status::device_failed;
  }
  std::string describe(Code c) const override {
    const char* msg = t_.aclGetRecentErrMsg ? t_.aclGetRecentErrMsg() : nullptr;
    const CodeRow* r = row_of(c);
    const char* name = r != nullptr ? r->name : "unlisted ACL error";
    if (msg != nullptr && msg[0] != '\0') return fmt::format("{} {} ({})", c, name, msg);
    return fmt::format("{} {}", c, name);
  }

  Code bind_thread() override { return t_.aclrtSetCurrentContext(ctx_); }

  Code malloc(std::uint64_t bytes, void** ptr) override {
    return t_.aclrtMalloc(ptr, bytes, kHugeFirst);
  }
  Code free(void* ptr) override { return t_.aclrtFree(ptr); }
  Code malloc_host(std::uint64_t bytes, void** ptr) override {
    return t_.aclrtMallocHost(ptr, bytes);
  }
  Code free_host(void* ptr) override { return t_.aclrtFreeHost(ptr); }
  Code host_register(void*, std::uint64_t) override { return 200001; }  // not bound here
  Code host_unregister(void*) override { return 200001; }
  Code mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) override {
    size_t f = 0, t = 0;
    Code c = t_.aclrtGetMemInfo(kHbmMem, &f, &t);
    *free_bytes = f;
    *total_bytes = t;
    return c;
  }
  Code memcpy(void* dst, std::uint64_t dst_max, const void* src, std::uint64_t count,
              CopyKind kind) override {
    return t_.aclrtMemcpy(dst, dst_max, src, count, static_cast<int>(kind));  // same order
  }
  Code memcpy_async(void* dst, std::uint64_t dst_max, const void* src, std::uint64_t count,
                    CopyKind kind, void* stream) override {
    return t_.aclrtMemcpyAsync(dst, dst_max, src, count, static_cast<int>(kind), stream);
  }
  Code stream_create(void** stream) override { return t_.aclrtCreateStream(stream); }
  Code stream_destroy(void* stream) override { return t_.aclrtDestroyStream(stream); }
  Code stream_sync(void* stream) override { return t_.aclrtSynchronizeStream(stream); }
  Code event_create(void** event) override { return t_.aclrtCreateEvent(event); }
  Code event_destroy(void* event) override { return t_.aclrtDestroyEvent(event); }
  Code event_record(void* event, void* stream) override {
    return t_.aclrtRecordEvent(event, stream);
  }
  Code event_query(void* event, bool* done) override {
    int status = 0;
    Code c = t_.aclrtQueryEventStatus(event, &status);
    *done = c == 0 && status == kRecordedComplete;
    return c;
  }
  Code event_sync(void* event) override { return t_.aclrtSynchronizeEvent(event); }
  Code stream_wait_event(void* stream, void* event) override {
    return t_.aclrtStreamWaitEvent(stream, event);
  }

  Code reserve(std::uint64_t bytes, void** va) override {
    return t_.aclrtReserveMemAddress(va, bytes, 0, nullptr, 0);
  }
  Code release(void* va, std::uint64_t) override { return t_.aclrtReleaseMemAddress(va); }
  Code create_physical(std::uint64_t bytes, std::uint64_t* handle) override {
    AclPhysicalMemProp prop = device_prop();
    void* h = nullptr;
    Code c = t_.aclrtMallocPhysical(&h, bytes, &prop, 0);
    *handle = reinterpret_cast<std::uintptr_t>(h);
    return c;
  }
  Code free_physical(std::uint64_t handle) override {
    return t_.aclrtFreePhysical(reinterpret_cast<void*>(handle));
  }
  Code map(void* va, std::uint64_t bytes, std::uint64_t handle) override {
    return t_.aclrtMapMem(va, bytes, 0, reinterpret_cast<void*>(handle), 0);
  }
  Code unmap(void* va, std::uint64_t) override { return t_.aclrtUnmapMem(va); }

 private:
  AclPhysicalMemProp device_prop() const {
    return AclPhysicalMemProp{
        .handleType = 0,
        .allocationType = 0,
        .memAttr = kHbmMemHuge,
        .location = {.id = static_cast<std::uint32_t>(device_), .type = kLocationDevice},
        .reserve = 0};
  }

  std::unique_ptr<accel::Library> lib_;
  AclTable t_;
  int device_;
  void* ctx_ = nullptr;
  bool opened_ = false;
};

std::vector<std::string> acl_candidates() {
  std::vector<std::string> d = {"libascendcl.so"};
  for (const char* env : {"ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"})
    if (const char* v = std::getenv(env); v != nullptr && v[0] != '\0')
      d.push_back(std::string(v) + "/lib64/libascendcl.so");
  d.push_back("/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so");
  return accel::library_candidates("U3M_ACL_LIBRARY", std::move(d));
}

}  // namespace

Status open_acl_backend(const AclOptions& o, std::unique_ptr<AccelBackend>* out, std::string* why) {
  auto fail = [&](Status s, std::string text) {
    if (why != nullptr) *why = std::move(text);
    return s;
  };
  if (o.device < 0) return fail(Status::invalid_argument, "acl: device must be >= 0");
  std::string err;
  auto lib =
      accel::Library::open(o.library.empty() ? acl_candidates() : std::vector{o.library}, &err);
  if (!lib) return fail(Status::unsupported, "acl: no AscendCL library (" + err + ")");
  AclTable table;
  if (const char* missing = table.bind(*lib))
    return fail(Status::unsupported, fmt::format("acl: {} has no {}", lib->path(), missing));

  AccelInfo info;
  info.name = "acl";
  info.library = lib->path();
  info.test_double = lib->is_test_double();
  info.device = o.device;
  info.copy_alignment = 64;                       // aclrtMemcpyAsync: both addresses
  info.async_host_must_be_runtime_pinned = true;  // else "unpredictable" per CANN docs
  auto rt = std::make_unique<AclRuntime>(std::move(lib), table, o.device);
  if (std::string e = rt->open_device(&info.total_bytes); !e.empty())
    return fail(Status::unsupported, "acl: " + e);
  const char* soc = rt->soc_name();
  info.device_name = soc != nullptr && soc[0] != '\0' ? std::string(soc)
                                                      : fmt::format("Ascend device {}", o.device);
  info.vmm_note = rt->probe_vmm(&info.granularity);
  info.vmm = info.vmm_note.empty();
  *out = accel::make_backend(std::move(rt), std::move(info));
  return Status::ok;
}

}  // namespace u3m::mem
