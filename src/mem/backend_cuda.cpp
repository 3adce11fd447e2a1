// The CUDA runtime adapter of AccelBackend (include/u3m/mem/backend_cuda.hpp).
//
// Note [Function tables]
// No CUDA header is included and nothing links against CUDA: the types u3m
// passes across are declared below from the CUDA documentation (driver_types.h,
// cuda.h; the VMM structs' layout is checked by size), and every function is
// looked up by name in the library dlopen found, once, into a table. A
// missing function is a one-line reason at open, never a crash at a call. The
// runtime covers memory, copies, streams and events; the driver only VMM,
// which the runtime API does not expose. The runtime and the driver share one
// context (the device's primary context), so pointers from both are
// interchangeable.
#include "u3m/mem/backend_cuda.hpp"

#include <cstdlib>
#include <utility>

#include <fmt/format.h>

#include "accel_runtime.hpp"

namespace u3m::mem {
namespace {

using accel::Code;
using cudaError_t = int;
using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUmemHandle = unsigned long long;  // CUmemGenericAllocationHandle

struct CUmemLocation {
  int type;  // CU_MEM_LOCATION_TYPE_DEVICE = 1
  int id;
};
struct CUmemAllocationProp {
  int type;                  // CU_MEM_ALLOCATION_TYPE_PINNED = 1
  int requestedHandleTypes;  // CU_MEM_HANDLE_TYPE_NONE = 0
  CUmemLocation location;
  void* win32HandleMetaData;
  unsigned char compressionType, gpuDirectRDMACapable;
  unsigned short usage;
  unsigned char reserved[4];
};
static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp layout (cuda.h)");
struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;  // CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
};
static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc layout (cuda.h)");

constexpr int kLocationDevice = 1, kAllocationPinned = 1, kAccessReadWrite = 3;
constexpr int kGranularityMinimum = 0;
constexpr int kAttrVmmSupported = 102;  // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
constexpr unsigned kStreamNonBlocking = 1, kEventDisableTiming = 2, kHostAllocDefault = 0;
// cudaError_t values u3m treats specially (driver_types.h); CUresult uses the
// same numbers for these.
constexpr int kNotReady = 600;

template <typename F>
using Fn = F*;

#define U3M_CUDART_FUNCS(X)                                               \
  X(cudaGetDeviceCount, cudaError_t(int*))                                \
  X(cudaSetDevice, cudaError_t(int))                                      \
  X(cudaFree, cudaError_t(void*))                                         \
  X(cudaMalloc, cudaError_t(void**, size_t))                              \
  X(cudaHostAlloc, cudaError_t(void**, size_t, unsigned))                 \
  X(cudaFreeHost, cudaError_t(void*))                                     \
  X(cudaHostRegister, cudaError_t(void*, size_t, unsigned))               \
  X(cudaHostUnregister, cudaError_t(void*))                               \
  X(cudaMemGetInfo, cudaError_t(size_t*, size_t*))                        \
  X(cudaMemcpy, cudaError_t(void*, const void*, size_t, int))             \
  X(cudaMemcpyAsync, cudaError_t(void*, const void*, size_t, int, void*)) \
  X(cudaStreamCreateWithFlags, cudaError_t(void**, unsigned))             \
  X(cudaStreamDestroy, cudaError_t(void*))                                \
  X(cudaStreamSynchronize, cudaError_t(void*))                            \
  X(cudaEventCreateWithFlags, cudaError_t(void**, unsigned))              \
  X(cudaEventDestroy, cudaError_t(void*))                                 \
  X(cudaEventRecord, cudaError_t(void*, void*))                           \
  X(cudaEventQuery, cudaError_t(void*))                                   \
  X(cudaEventSynchronize, cudaError_t(void*))                             \
  X(cudaStreamWaitEvent, cudaError_t(void*, void*, unsigned))             \
  X(cudaGetErrorName, const char*(cudaError_t))                           \
  X(cudaGetErrorString, const char*(cudaError_t))                         \
  X(cudaRuntimeGetVersion, cudaError_t(int*))                             \
  X(cudaDriverGetVersion, cudaError_t(int*))

#define U3M_CUDA_DRIVER_FUNCS(X)                                                                  \
  X(cuInit, CUresult(unsigned))                                                                   \
  X(cuDeviceGet, CUresult(int*, int))                                                             \
  X(cuDeviceGetName, CUresult(char*, int, int))                                                   \
  X(cuDeviceGetAttribute, CUresult(int*, int, int))                                               \
  X(cuDevicePrimaryCtxRetain, CUresult(void**, int))                                              \
  X(cuCtxSetCurrent, CUresult(void*))                                                             \
  X(cuMemGetAllocationGranularity, CUresult(size_t*, const CUmemAllocationProp*, int))            \
  X(cuMemAddressReserve, CUresult(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)) \
  X(cuMemAddressFree, CUresult(CUdeviceptr, size_t))                                              \
  X(cuMemCreate, CUresult(CUmemHandle*, size_t, const CUmemAllocationProp*, unsigned long long))  \
  X(cuMemRelease, CUresult(CUmemHandle))                                                          \
  X(cuMemMap, CUresult(CUdeviceptr, size_t, size_t, CUmemHandle, unsigned long long))             \
  X(cuMemUnmap, CUresult(CUdeviceptr, size_t))                                                    \
  X(cuMemSetAccess, CUresult(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t))

#define U3M_DECLARE(name, sig) Fn<sig> name = nullptr;
#define U3M_BIND(name, sig) \
  if (!lib.bind(name, #name)) return #name;

struct RuntimeTable {
  U3M_CUDART_FUNCS(U3M_DECLARE)
  // The first function the library lacks, or nullptr when all are bound.
  const char* bind(const accel::Library& lib) {
    U3M_CUDART_FUNCS(U3M_BIND)
    return nullptr;
  }
};
struct DriverTable {
  U3M_CUDA_DRIVER_FUNCS(U3M_DECLARE)
  Fn<CUresult(int)> cuDevicePrimaryCtxRelease = nullptr;
  const char* bind(const accel::Library& lib) {
    U3M_CUDA_DRIVER_FUNCS(U3M_BIND)
    // cuda.h maps the name onto its _v2 since CUDA 11; older drivers have only the first.
    if (!lib.bind(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") &&
        !lib.bind(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease"))
      return "cuDevicePrimaryCtxRelease";
    return nullptr;
  }
};
#undef U3M_DECLARE
#undef U3M_BIND

int kind_of(CopyKind k) {
  return static_cast<int>(k);  // cudaMemcpyHostToHost..DeviceToDevice = 0..3, as CopyKind
}
CUdeviceptr dptr(const void* p) {
  return reinterpret_cast<CUdeviceptr>(p);
}
std::string version_text(int v) {
  return v > 0 ? fmt::format("{}.{}", v / 1000, v % 1000 / 10) : std::string();
}

// Note [Error mapping] (CUDA): the cudaError_t codes of driver_types.h, which
// CUresult shares for these. Sticky errors (the context is unusable: illegal
// address, ECC, launch failure, ...), a missing or too old driver, and any
// code not listed are device_failed.
constexpr std::pair<Code, Status> kCodes[] = {
    {1, Status::invalid_argument},    // InvalidValue
    {9, Status::invalid_argument},    // InvalidConfiguration
    {17, Status::invalid_argument},   // InvalidDevicePointer
    {21, Status::invalid_argument},   // InvalidMemcpyDirection
    {101, Status::invalid_argument},  // InvalidDevice
    {201, Status::invalid_argument},  // DeviceUninitialized / CUDA_ERROR_INVALID_CONTEXT
    {712, Status::invalid_argument},  // HostMemoryAlreadyRegistered
    {713, Status::invalid_argument},  // HostMemoryNotRegistered
    {400, Status::not_found},         // InvalidResourceHandle
    {500, Status::not_found},         // SymbolNotFound / CUDA_ERROR_NOT_FOUND
    {2, Status::out_of_memory},       // MemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY
    {800, Status::unsupported},       // NotPermitted
    {801, Status::unsupported},       // NotSupported
    {kNotReady, Status::busy},        // NotReady
};

class CudaRuntime final : public accel::Runtime {
 public:
  CudaRuntime(std::unique_ptr<accel::Library> rt_lib, RuntimeTable rt, int device)
      : rt_lib_(std::move(rt_lib)), rt_(rt), device_(device) {}
  ~CudaRuntime() override {
    if (ctx_ != nullptr) drv_.cuDevicePrimaryCtxRelease(cu_device_);
  }

  // VMM and the context for it; on failure returns why VMM is off.
  std::string attach_driver(std::unique_ptr<accel::Library> lib, std::uint64_t* granularity,
                            std::string* device_name) {
    if (const char* missing = drv_.bind(*lib))
      return fmt::format("{} has no {}", lib->path(), missing);
    drv_lib_ = std::move(lib);
    if (CUresult r = drv_.cuInit(0); r != 0) return "cuInit: " + describe(r);
    if (CUresult r = drv_.cuDeviceGet(&cu_device_, device_); r != 0)
      return "cuDeviceGet: " + describe(r);
    char name[256] = {0};
    if (drv_.cuDeviceGetName(name, sizeof name - 1, cu_device_) == 0 && name[0] != '\0')
      *device_name = name;
    if (CUresult r = drv_.cuDevicePrimaryCtxRetain(&ctx_, cu_device_); r != 0) {
      ctx_ = nullptr;
      return "cuDevicePrimaryCtxRetain: " + describe(r);
    }
    int vmm = 0;
    if (CUresult r = drv_.cuDeviceGetAttribute(&vmm, kAttrVmmSupported, cu_device_); r != 0)
      return "cuDeviceGetAttribute(VMM supported): " + describe(r);
    if (vmm == 0) return "the device does not support virtual memory management";
    if (CUresult r = drv_.cuCtxSetCurrent(ctx_); r != 0) return "cuCtxSetCurrent: " + describe(r);
    size_t g = 0;
    CUmemAllocationProp prop = device_prop();
    if (CUresult r = drv_.cuMemGetAllocationGranularity(&g, &prop, kGranularityMinimum); r != 0)
      return "cuMemGetAllocationGranularity: " + describe(r);
    if (g == 0) return "cuMemGetAllocationGranularity returned 0";
    *granularity = g;
    return {};
  }
  const accel::Library& runtime_library() const { return *rt_lib_; }
  const accel::Library* driver_library() const { return drv_lib_.get(); }

  Status status_of(Code c) const override {
    if (c == 0) return Status::ok;
    for (const auto& [code, status] : kCodes)
      if (code == c) return status;
    return Status::device_failed;
  }
  std::string describe(Code c) const override {
    const char* name = rt_.cudaGetErrorName(c);
    const char* text = rt_.cudaGetErrorString(c);
    return fmt::format("{} {} ({})", c, name ? name : "?", text ? text : "?");
  }

  Code bind_thread() override {
    if (Code c = rt_.cudaSetDevice(device_); c != 0) return c;
    return ctx_ != nullptr ? drv_.cuCtxSetCurrent(ctx_) : 0;
  }

  Code malloc(std::uint64_t bytes, void** ptr) override { return rt_.cudaMalloc(ptr, bytes); }
  Code free(void* ptr) override { return rt_.cudaFree(ptr); }
  Code malloc_host(std::uint64_t bytes, void** ptr) override {
    return rt_.cudaHostAlloc(ptr, bytes, kHostAllocDefault);
  }
  Code free_host(void* ptr) override { return rt_.cudaFreeHost(ptr); }
  Code host_register(void* ptr, std::uint64_t bytes) override {
    return rt_.cudaHostRegister(ptr, bytes, 0);
  }
  Code host_unregister(void* ptr) override { return rt_.cudaHostUnregister(ptr); }
  Code mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) override {
    size_t f = 0, t = 0;
    Code c = rt_.cudaMemGetInfo(&f, &t);
    *free_bytes = f;
    *total_bytes = t;
    return c;
  }

  Code memcpy(void* dst, std::uint64_t, const void* src, std::uint64_t count,
              CopyKind kind) override {
    Code c = rt_.cudaMemcpy(dst, src, count, kind_of(kind));
    // cudaMemcpy does not wait for a device-to-device copy; this call must.
    if (c == 0 && kind == CopyKind::d2d) c = rt_.cudaStreamSynchronize(nullptr);
    return c;
  }
  Code memcpy_async(void* dst, std::uint64_t, const void* src, std::uint64_t count, CopyKind kind,
                    void* stream) override {
    return rt_.cudaMemcpyAsync(dst, src, count, kind_of(kind), stream);
  }
  Code stream_create(void** stream) override {
    return rt_.cudaStreamCreateWithFlags(stream, kStreamNonBlocking);
  }
  Code stream_destroy(void* stream) override { return rt_.cudaStreamDestroy(stream); }
  Code stream_sync(void* stream) override { return rt_.cudaStreamSynchronize(stream); }
  Code event_create(void** event) override {
    return rt_.cudaEventCreateWithFlags(event, kEventDisableTiming);
  }
  Code event_destroy(void* event) override { return rt_.cudaEventDestroy(event); }
  Code event_record(void* event, void* stream) override {
    return rt_.cudaEventRecord(event, stream);
  }
  Code event_query(void* event, bool* done) override {
    Code c = rt_.cudaEventQuery(event);
    *done = c == 0;
    return c == kNotReady ? 0 : c;
  }
  Code event_sync(void* event) override { return rt_.cudaEventSynchronize(event); }
  Code stream_wait_event(void* stream, void* event) override {
    return rt_.cudaStreamWaitEvent(stream, event, 0);
  }

  Code reserve(std::uint64_t bytes, void** va) override {
    CUdeviceptr p = 0;
    Code c = drv_.cuMemAddressReserve(&p, bytes, 0, 0, 0);  // alignment 0: the granularity
    *va = reinterpret_cast<void*>(p);
    return c;
  }
  Code release(void* va, std::uint64_t bytes) override {
    return drv_.cuMemAddressFree(dptr(va), bytes);
  }
  Code create_physical(std::uint64_t bytes, std::uint64_t* handle) override {
    CUmemAllocationProp prop = device_prop();
    CUmemHandle h = 0;
    Code c = drv_.cuMemCreate(&h, bytes, &prop, 0);
    *handle = h;
    return c;
  }
  Code free_physical(std::uint64_t handle) override { return drv_.cuMemRelease(handle); }
  Code map(void* va, std::uint64_t bytes, std::uint64_t handle) override {
    if (Code c = drv_.cuMemMap(dptr(va), bytes, 0, handle, 0); c != 0) return c;
    // A mapping is inaccessible until access is granted (CUDA VMM).
    CUmemAccessDesc access{.location = {.type = kLocationDevice, .id = device_},
                           .flags = kAccessReadWrite};
    Code c = drv_.cuMemSetAccess(dptr(va), bytes, &access, 1);
    if (c != 0) drv_.cuMemUnmap(dptr(va), bytes);
    return c;
  }
  Code unmap(void* va, std::uint64_t bytes) override { return drv_.cuMemUnmap(dptr(va), bytes); }

 private:
  CUmemAllocationProp device_prop() const {
    CUmemAllocationProp p{};
    p.type = kAllocationPinned;
    p.location = {.type = kLocationDevice, .id = device_};
    return p;
  }

  std::unique_ptr<accel::Library> rt_lib_, drv_lib_;
  RuntimeTable rt_;
  DriverTable drv_;
  int device_;
  int cu_device_ = 0;
  void* ctx_ = nullptr;
};

std::vector<std::string> runtime_candidates() {
  std::vector<std::string> d = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                "libcudart.so.11.0"};
  if (const char* home = std::getenv("CUDA_HOME"); home != nullptr && home[0] != '\0')
    d.push_back(std::string(home) + "/lib64/libcudart.so");
  d.push_back("/usr/local/cuda/lib64/libcudart.so");
  return accel::library_candidates("U3M_CUDART_LIBRARY", std::move(d));
}

}  // namespace

Status open_cuda_backend(const CudaOptions& o, std::unique_ptr<AccelBackend>* out,
                         std::string* why) {
  auto fail = [&](Status s, std::string text) {
    if (why != nullptr) *why = std::move(text);
    return s;
  };
  if (o.device < 0) return fail(Status::invalid_argument, "cuda: device must be >= 0");
  std::string err;
  auto lib = accel::Library::open(
      o.runtime_library.empty() ? runtime_candidates() : std::vector{o.runtime_library}, &err);
  if (!lib) return fail(Status::unsupported, "cuda: no CUDA runtime library (" + err + ")");
  RuntimeTable table;
  if (const char* missing = table.bind(*lib))
    return fail(Status::unsupported, fmt::format("cuda: {} has no {}", lib->path(), missing));

  AccelInfo info;
  info.name = "cuda";
  info.library = lib->path();
  info.test_double = lib->is_test_double();
  info.device = o.device;
  info.host_register = true;
  auto rt = std::make_unique<CudaRuntime>(std::move(lib), table, o.device);
  int count = 0;
  if (Code c = table.cudaGetDeviceCount(&count); c != 0)
    return fail(Status::unsupported, "cuda: cudaGetDeviceCount: " + rt->describe(c));
  if (count == 0) return fail(Status::unsupported, "cuda: the driver reports no CUDA device");
  if (o.device >= count)
    return fail(Status::invalid_argument,
                fmt::format("cuda: device {} asked for, {} present", o.device, count));
  // cudaFree(nullptr) creates the device's primary context now, not at the first real call.
  if (Code c = table.cudaSetDevice(o.device); c != 0)
    return fail(Status::unsupported, "cuda: cudaSetDevice: " + rt->describe(c));
  if (Code c = table.cudaFree(nullptr); c != 0)
    return fail(Status::unsupported, "cuda: creating the context: " + rt->describe(c));
  int v = 0;
  if (table.cudaRuntimeGetVersion(&v) == 0) info.runtime_version = version_text(v);
  if (table.cudaDriverGetVersion(&v) == 0) info.driver_version = version_text(v);
  std::uint64_t free_bytes = 0;
  if (Code c = rt->mem_info(&free_bytes, &info.total_bytes); c != 0)
    return fail(Status::unsupported, "cuda: cudaMemGetInfo: " + rt->describe(c));
  info.device_name = fmt::format("CUDA device {}", o.device);

  auto drv = accel::Library::open(
      o.driver_library.empty()
          ? accel::library_candidates("U3M_CUDA_DRIVER_LIBRARY", {"libcuda.so.1", "libcuda.so"})
          : std::vector{o.driver_library},
      &err);
  if (!drv) {
    info.vmm_note = "no CUDA driver library for VMM (" + err + ")";
  } else {
    info.driver_library = drv->path();
    info.vmm_note = rt->attach_driver(std::move(drv), &info.granularity, &info.device_name);
    info.vmm = info.vmm_note.empty();
  }
  *out = accel::make_backend(std::move(rt), std::move(info));
  return Status::ok;
}

}  // namespace u3m::mem
