// The core of u3m's test doubles of the CUDA and ACL C APIs: one emulated
// device over host memory that both shims (cuda_double.cpp, acl_double.cpp)
// drive, each answering in its own API's error codes. It is a test double,
// not an emulator: it enforces the documented rules u3m must follow and lets
// a test inject failures, so CI checks the loading, binding, error mapping
// and ordering of the real backends without hardware (docs/accelerators.md).
//
// What it enforces:
//   - device-side pointers of copies lie inside live device memory (an
//     allocation, or mapped chunks of a reservation that are accessible:
//     a CUDA mapping is not until cuMemSetAccess), host-side ones do not;
//   - unknown stream, event and physical handles are rejected;
//   - streams run their ops in order on a worker thread each, truly
//     asynchronously (a test can hold every worker), and an event completes
//     when its stream reaches it; a stream waiting on an event waits;
//   - VMM sizes and addresses are multiples of the granularity, a chunk is
//     mapped whole inside one reservation, no overlaps;
//   - capacity: allocations and chunks together never exceed it.
// What the shims add: per-API rules (ACL's destMax, 64-byte alignment,
// host memory from aclrtMallocHost, a current context per thread; CUDA's
// context for driver calls), and the control API of double_control.h.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>

namespace u3m::doubles {

// The native codes a shim answers with, one per condition the core detects.
struct Codes {
  int invalid;     // bad value, pointer or size
  int oom;         // over capacity
  int bad_handle;  // unknown stream / event / chunk
  int in_use;      // freeing or releasing something still mapped
  int registered;  // registering host memory that already is
};

enum class Kind { h2h = 0, h2d = 1, d2h = 2, d2d = 3 };

class FakeDevice {
 public:
  explicit FakeDevice(Codes codes) : codes_(codes) {}
  ~FakeDevice();

  // Control (double_control.h).
  void reset();
  void configure(int device_count, std::uint64_t capacity, std::uint64_t granularity);
  void fail_next(const std::string& api, int code, int times);
  void fail_next_copy(int code, bool sticky);
  void hold(bool on);
  std::uint64_t calls(const std::string& api);
  std::uint64_t live_objects();

  // Every API entry point calls this first: counts the call and returns a
  // code to fail with (an injected one, or the lost device's), else 0.
  int enter(const char* api);

  int device_count();
  std::uint64_t granularity();

  int alloc(std::uint64_t bytes, void** p);
  int free(void* p);
  int alloc_host(std::uint64_t bytes, void** p);
  int free_host(void* p);
  int register_host(void* p, std::uint64_t bytes);
  int unregister_host(void* p);
  void mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes);
  bool is_runtime_host(const void* p, std::uint64_t n);  // from alloc_host / register_host

  // Validated at the call; a synchronous copy runs on the caller's thread,
  // an async one on its stream's worker, in order.
  int copy(void* dst, const void* src, std::uint64_t n, Kind k);
  int copy_async(void* dst, const void* src, std::uint64_t n, Kind k, void* stream);

  // stream nullptr is the runtime's implicit default stream, which always exists.
  int stream_create(void** s);
  int stream_destroy(void* s);
  int stream_sync(void* s);  // waits; returns (and clears) the stream's async error
  int event_create(void** e);
  int event_destroy(void* e);
  int event_record(void* e, void* s);
  int event_query(void* e, bool* done);
  int event_sync(void* e);
  int stream_wait_event(void* s, void* e);

  int reserve(std::uint64_t bytes, void** va);
  int release(void* va);
  int create_physical(std::uint64_t bytes, std::uint64_t* handle);
  int free_physical(std::uint64_t handle);
  // accessible: CUDA maps without access until set_access; ACL maps read-write.
  int map(void* va, std::uint64_t bytes, std::uint64_t handle, bool accessible);
  int set_access(void* va, std::uint64_t bytes);
  int unmap(void* va, std::uint64_t bytes);  // bytes 0: the mapping at va, whatever its size

 private:
  struct Op {
    enum Type { copy, record, wait } type;
    void* dst = nullptr;
    const void* src = nullptr;
    std::uint64_t n = 0;
    void* event = nullptr;
    std::uint64_t gen = 0;
  };
  struct StreamState {
    std::deque<Op> q;
    bool running = false, stop = false;
    int error = 0;
    std::thread worker;
  };
  struct EventState {
    std::uint64_t recorded = 0, done = 0;
  };
  struct Mapping {
    std::uint64_t chunk, size;
    bool accessible;
  };
  struct Reservation {
    std::uint64_t size;
    std::map<std::uint64_t, Mapping> maps;  // offset -> mapping
  };
  struct Chunk {
    int fd;
    std::uint64_t size;
    int map_count = 0;
  };

  bool device_range(std::uintptr_t p, std::uint64_t n) const;  // caller holds mu_
  Mapping* mapping_at(std::uintptr_t p, Reservation** res, std::uint64_t* off);
  bool touches_device(std::uintptr_t p, std::uint64_t n) const;
  int check_copy(const void* dst, const void* src, std::uint64_t n, Kind k) const;
  StreamState* stream(void* s);
  void run(StreamState& s);
  void stop_all();

  Codes codes_;
  std::mutex mu_;
  std::condition_variable cv_;
  int device_count_ = 1;
  std::uint64_t capacity_ = 1ull << 30, granularity_ = 2ull << 20, used_ = 0;
  bool held_ = false;
  int lost_ = 0;  // a sticky failure: every later call answers it
  int copy_fail_ = 0;
  bool copy_fail_sticky_ = false;
  std::map<std::string, std::uint64_t> calls_;
  std::map<std::string, std::pair<int, int>> fail_;  // api -> (code, times left)
  std::map<std::uintptr_t, std::uint64_t> allocs_, host_, registered_;
  std::map<std::uintptr_t, Reservation> reservations_;
  std::unordered_map<std::uint64_t, Chunk> chunks_;
  std::uint64_t next_chunk_ = 1;
  std::unordered_map<void*, std::unique_ptr<StreamState>> streams_;
  std::unique_ptr<StreamState> default_stream_;
  std::unordered_map<void*, std::unique_ptr<EventState>> events_;
};

// The shim's one device, with its API's codes (each shim defines it).
FakeDevice& device();

}  // namespace u3m::doubles
