// AccelBackend: the DeviceBackend shared by the CUDA and ACL adapters (Note
// [One backend, two runtimes] in include/u3m/mem/backend_accel.hpp).
//
// Locking: one mutex guards the bookkeeping (allocations, reservations,
// chunks, streams, events, host ranges). It is held across the native calls
// that change what it records (malloc/free, the VMM calls, stream and event
// creation), so the record and the runtime never disagree, and released
// before anything that waits (copies, synchronize), so a waiting thread
// never blocks another.
#include "u3m/mem/backend_accel.hpp"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "accel_runtime.hpp"

namespace u3m::mem {

namespace accel {

std::unique_ptr<Library> Library::open(const std::vector<std::string>& candidates,
                                       std::string* why) {
  std::string last = "no candidates";
  for (const std::string& c : candidates) {
    dlerror();
    void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (h != nullptr) {
      std::string path = c;
      link_map* lm = nullptr;
      if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr && lm->l_name != nullptr &&
          lm->l_name[0] != '\0')
        path = lm->l_name;
      return std::unique_ptr<Library>(new Library(h, std::move(path)));
    }
    const char* e = dlerror();
    last = e != nullptr ? e : "unknown loader error";
  }
  if (why != nullptr)
    *why = fmt::format("tried {}; last error: {}", fmt::join(candidates, ", "), last);
  return nullptr;
}

Library::~Library() {
  dlclose(handle_);  // RTLD_NODELETE: the code stays mapped
}

void* Library::symbol(const char* name) const {
  return dlsym(handle_, name);
}

std::vector<std::string> library_candidates(const char* env_var,
                                            std::vector<std::string> defaults) {
  const char* v = std::getenv(env_var);
  if (v != nullptr && v[0] != '\0') return {v};
  return defaults;
}

}  // namespace accel

namespace {

std::uintptr_t addr(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

struct Mapping {
  std::uint64_t chunk = 0;  // id in Impl::chunks
  std::uint64_t size = 0;
};
struct Reservation {
  std::uint64_t size = 0;
  std::map<std::uint64_t, Mapping> maps;  // offset in the reservation -> mapping
};
struct Chunk {
  std::uint64_t native = 0;
  std::uint64_t size = 0;
  std::uint32_t map_count = 0;
};
struct EventSlot {
  void* native = nullptr;
  bool recorded = false;
};

// Whether [p, p+n) overlaps a range of `ranges` (base -> size, disjoint).
bool overlaps_any(const std::map<std::uintptr_t, std::uint64_t>& ranges, std::uintptr_t p,
                  std::uint64_t n) {
  auto it = ranges.lower_bound(p + n);
  if (it == ranges.begin()) return false;
  --it;  // the range starting last before p+n is the only one that can reach p
  return it->first + it->second > p;
}
// Whether [p, p+n) lies inside one range of `ranges`.
bool inside_one(const std::map<std::uintptr_t, std::uint64_t>& ranges, std::uintptr_t p,
                std::uint64_t n) {
  auto it = ranges.upper_bound(p);
  if (it == ranges.begin()) return false;
  --it;
  return p - it->first <= it->second && n <= it->second - (p - it->first);
}

}  // namespace

struct AccelBackend::Impl {
  std::unique_ptr<accel::Runtime> rt;
  AccelInfo info;
  mutable std::atomic<bool> failed{false};  // set by const calls that meet a lost device

  mutable std::mutex mu;
  std::map<std::uintptr_t, std::uint64_t> allocations;  // device: base -> bytes
  std::map<std::uintptr_t, std::uint64_t> host_ranges;  // runtime-pinned host: base -> bytes
  std::map<std::uintptr_t, std::uint64_t> registered;   // cudaHostRegister'ed: base -> bytes
  std::map<std::uintptr_t, Reservation> reservations;
  std::map<std::uintptr_t, std::uint64_t> reservation_sizes;  // for overlaps_any
  std::unordered_map<std::uint64_t, Chunk> chunks;
  std::unordered_map<std::uint64_t, void*> streams;  // id -> native; 0 is ours (see the Note)
  std::unordered_map<std::uint64_t, EventSlot> events;
  std::uint64_t next_id = 1;

  mutable std::mutex err_mu;
  mutable std::string last_error;

  // The Status of a native call's code; records the failure and marks the
  // device lost on device_failed.
  Status check(accel::Code c, const char* call) const {
    if (c == 0) return Status::ok;
    Status s = rt->status_of(c);
    note(fmt::format("{}: {}", call, rt->describe(c)));
    if (s == Status::device_failed) failed = true;
    return s;
  }
  // A refusal by u3m's own checks, before any native call.
  Status refuse(Status s, std::string why) const {
    note(std::move(why));
    return s;
  }
  void note(std::string line) const {
    std::lock_guard g(err_mu);
    last_error = std::move(line);
  }
  Status bind() const { return check(rt->bind_thread(), "bind device to thread"); }
  // One native call on the calling thread, the device bound first: the Status
  // of its code.
  template <typename F>
  Status call(const char* what, F&& native) const {
    if (Status s = bind(); !ok(s)) return s;
    return check(native(), what);
  }

  bool is_device_range(std::uintptr_t p, std::uint64_t n) const {
    if (inside_one(allocations, p, n)) return true;
    auto r = reservations.upper_bound(p);
    if (r == reservations.begin()) return false;
    --r;
    std::uint64_t off = p - r->first;
    if (off >= r->second.size || n > r->second.size - off) return false;
    auto m = r->second.maps.upper_bound(off);
    if (m == r->second.maps.begin()) return false;
    --m;
    // The mappings covering [off, off+n) must follow each other without a gap.
    for (std::uint64_t covered = m->first; m != r->second.maps.end() && m->first == covered; ++m) {
      covered += m->second.size;
      if (covered >= off + n) return true;
    }
    return false;
  }
  bool touches_device(std::uintptr_t p, std::uint64_t n) const {
    return overlaps_any(allocations, p, n) || overlaps_any(reservation_sizes, p, n);
  }

  // backend.hpp's checks for both copy calls, plus the runtime's own rules
  // for async copies (AccelInfo). Caller holds mu.
  Status check_copy(void* dst, std::uint64_t dst_max, const void* src, std::uint64_t count,
                    CopyKind kind, bool async) const {
    if (count > dst_max)
      return refuse(Status::invalid_argument,
                    fmt::format("copy of {} bytes into a destination of {} (count > destMax)",
                                count, dst_max));
    if (static_cast<int>(kind) >= kNumCopyKinds)
      return refuse(Status::invalid_argument, "copy: unknown kind");
    if (count == 0) return Status::ok;
    if (dst == nullptr || src == nullptr)
      return refuse(Status::invalid_argument, "copy: null pointer");
    std::uintptr_t d = addr(dst), s = addr(src);
    if (d + count < d || s + count < s)
      return refuse(Status::invalid_argument, "copy: range wraps");
    if (d < s + count && s < d + count)
      return refuse(Status::invalid_argument, "copy: source and destination overlap");
    const bool dst_dev = kind == CopyKind::h2d || kind == CopyKind::d2d;
    const bool src_dev = kind == CopyKind::d2h || kind == CopyKind::d2d;
    for (auto [p, dev, what] : {std::tuple{d, dst_dev, "destination"}, {s, src_dev, "source"}}) {
      if (dev ? !is_device_range(p, count) : touches_device(p, count))
        return refuse(Status::invalid_argument,
                      fmt::format("{} copy: {} {:#x}+{} is {}", to_string(kind), what, p, count,
                                  dev ? "not inside live device memory"
                                      : "host-side but touches device memory"));
    }
    if (!async) return Status::ok;
    const std::uint64_t a = info.copy_alignment;
    if (a > 1 && (d % a != 0 || s % a != 0))
      return refuse(Status::invalid_argument,
                    fmt::format("{} async copy: source and destination must be {}-byte aligned "
                                "({:#x} <- {:#x})",
                                info.name, a, d, s));
    if (info.async_host_must_be_runtime_pinned) {
      for (auto [p, dev] : {std::pair{d, dst_dev}, std::pair{s, src_dev}}) {
        if (!dev && !inside_one(host_ranges, p, count))
          return refuse(Status::invalid_argument,
                        fmt::format("{} async copy: host range {:#x}+{} was not allocated by the "
                                    "runtime's pinned host allocator",
                                    info.name, p, count));
      }
    }
    return Status::ok;
  }

  void* stream_of(std::uint64_t id) const {
    auto it = streams.find(id);
    return it == streams.end() ? nullptr : it->second;
  }

  // Frees everything still recorded, best effort (the destructor).
  void tear_down() {
    if (!ok(bind())) return;
    for (auto& [id, s] : streams) rt->stream_sync(s);
    for (auto& [base, r] : reservations) {
      for (auto& [off, m] : r.maps) rt->unmap(reinterpret_cast<void*>(base + off), m.size);
      rt->release(reinterpret_cast<void*>(base), r.size);
    }
    for (auto& [id, c] : chunks) rt->free_physical(c.native);
    for (auto& [base, bytes] : allocations) rt->free(reinterpret_cast<void*>(base));
    for (auto& [base, bytes] : registered) rt->host_unregister(reinterpret_cast<void*>(base));
    for (auto& [id, e] : events) rt->event_destroy(e.native);
    for (auto& [id, s] : streams) rt->stream_destroy(s);
  }
};

namespace {

// The host tier on the runtime's pinned allocator (cudaHostAlloc /
// aclrtMallocHost). Its ranges are recorded in the backend, since ACL's
// async copies accept only these.
class RuntimeHostBackend final : public MemoryBackend {
 public:
  RuntimeHostBackend(AccelBackend::Impl& m, std::uint64_t capacity) : m_(m), capacity_(capacity) {
    page_ = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
    if (capacity_ == 0) capacity_ = static_cast<std::uint64_t>(sysconf(_SC_PHYS_PAGES)) * page_;
  }
  ~RuntimeHostBackend() override {
    std::lock_guard g(m_.mu);
    if (!ok(m_.bind())) return;
    for (auto& [p, n] : mine_) {
      m_.rt->free_host(reinterpret_cast<void*>(p));
      m_.host_ranges.erase(p);
    }
  }

  Capabilities capabilities() const override {
    Capabilities c;
    c.name = m_.info.name + "-host";
    c.tier = Tier::host;
    c.granularity = page_;
    c.pinned = true;
    c.capacity = capacity_;
    return c;
  }
  Status allocate(std::uint64_t bytes, void** ptr) override {
    if (m_.failed) return Status::device_failed;
    if (bytes == 0 || ptr == nullptr) return Status::invalid_argument;
    std::lock_guard g(m_.mu);
    if (bytes > capacity_ - used_) return Status::out_of_memory;
    void* p = nullptr;
    if (Status s = m_.call("malloc host", [&] { return m_.rt->malloc_host(bytes, &p); }); !ok(s))
      return s;
    mine_.emplace(addr(p), bytes);
    m_.host_ranges.emplace(addr(p), bytes);
    used_ += bytes;
    *ptr = p;
    return Status::ok;
  }
  Status free(void* ptr) override {
    if (m_.failed) return Status::device_failed;
    std::lock_guard g(m_.mu);
    auto it = mine_.find(addr(ptr));
    if (it == mine_.end()) return Status::invalid_argument;
    if (Status s = m_.call("free host", [&] { return m_.rt->free_host(ptr); }); !ok(s)) return s;
    used_ -= it->second;
    m_.host_ranges.erase(it->first);
    mine_.erase(it);
    return Status::ok;
  }
  Status mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) const override {
    if (free_bytes == nullptr || total_bytes == nullptr) return Status::invalid_argument;
    std::lock_guard g(m_.mu);
    *free_bytes = capacity_ - used_;
    *total_bytes = capacity_;
    return Status::ok;
  }

 private:
  AccelBackend::Impl& m_;
  std::uint64_t capacity_, page_ = 4096, used_ = 0;
  std::map<std::uintptr_t, std::uint64_t> mine_;
};

}  // namespace

namespace accel {

std::unique_ptr<AccelBackend> make_backend(std::unique_ptr<Runtime> runtime, AccelInfo info) {
  auto impl = std::make_unique<AccelBackend::Impl>();
  impl->rt = std::move(runtime);
  impl->info = std::move(info);
  return std::make_unique<AccelBackend>(std::move(impl));
}

}  // namespace accel

AccelBackend::AccelBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  Impl& m = *impl_;
  // Stream 0, our own (the Note in the header says why it is not the
  // runtime's default stream). Without it the backend is still usable for
  // memory; every stream-0 call then answers not_found.
  void* s = nullptr;
  if (ok(m.call("create stream 0", [&] { return m.rt->stream_create(&s); })))
    m.streams.emplace(kDefaultStream.id, s);
}

AccelBackend::~AccelBackend() {
  std::lock_guard g(impl_->mu);
  impl_->tear_down();
}

const AccelInfo& AccelBackend::info() const {
  return impl_->info;
}

std::string AccelBackend::last_error() const {
  std::lock_guard g(impl_->err_mu);
  return impl_->last_error;
}

Capabilities AccelBackend::capabilities() const {
  const AccelInfo& i = impl_->info;
  Capabilities c;
  c.name = i.name;
  c.tier = Tier::device;
  c.vmm = i.vmm;
  c.granularity = i.granularity;
  c.capacity = i.total_bytes;
  return c;
}

Status AccelBackend::allocate(std::uint64_t bytes, void** ptr) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (bytes == 0 || ptr == nullptr) return Status::invalid_argument;
  std::lock_guard g(m.mu);
  void* p = nullptr;
  if (Status s = m.call("malloc", [&] { return m.rt->malloc(bytes, &p); }); !ok(s)) return s;
  m.allocations.emplace(addr(p), bytes);
  *ptr = p;
  return Status::ok;
}

Status AccelBackend::free(void* ptr) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  auto it = m.allocations.find(addr(ptr));
  if (it == m.allocations.end())
    return m.refuse(Status::invalid_argument, "free: not a pointer allocate() returned");
  if (Status s = m.call("free", [&] { return m.rt->free(ptr); }); !ok(s)) return s;
  m.allocations.erase(it);
  return Status::ok;
}

Status AccelBackend::mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) const {
  const Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (free_bytes == nullptr || total_bytes == nullptr) return Status::invalid_argument;
  return m.call("mem info", [&] { return m.rt->mem_info(free_bytes, total_bytes); });
}

Status AccelBackend::memcpy_async(void* dst, std::uint64_t dst_max, const void* src,
                                  std::uint64_t count, CopyKind kind, Stream stream) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  void* s = nullptr;
  {
    std::lock_guard g(m.mu);
    s = m.stream_of(stream.id);
    if (s == nullptr) return Status::not_found;
    if (Status st = m.check_copy(dst, dst_max, src, count, kind, true); !ok(st) || count == 0)
      return st;
  }
  return m.call("memcpy async",
                [&] { return m.rt->memcpy_async(dst, dst_max, src, count, kind, s); });
}

Status AccelBackend::memcpy_sync(void* dst, std::uint64_t dst_max, const void* src,
                                 std::uint64_t count, CopyKind kind) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  {
    std::lock_guard g(m.mu);
    if (Status st = m.check_copy(dst, dst_max, src, count, kind, false); !ok(st) || count == 0)
      return st;
  }
  return m.call("memcpy", [&] { return m.rt->memcpy(dst, dst_max, src, count, kind); });
}

Status AccelBackend::raw_memcpy(void* dst, std::uint64_t dst_max, const void* src,
                                std::uint64_t count, CopyKind kind) {
  Impl& m = *impl_;
  return m.call("memcpy (reference)", [&] { return m.rt->memcpy(dst, dst_max, src, count, kind); });
}

Status AccelBackend::create_stream(Stream* stream) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (stream == nullptr) return Status::invalid_argument;
  std::lock_guard g(m.mu);
  void* s = nullptr;
  if (Status st = m.call("create stream", [&] { return m.rt->stream_create(&s); }); !ok(st))
    return st;
  stream->id = m.next_id++;
  m.streams.emplace(stream->id, s);
  return Status::ok;
}

Status AccelBackend::destroy_stream(Stream stream) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (stream.id == kDefaultStream.id) return Status::invalid_argument;
  Status synced = synchronize_stream(stream);
  if (synced == Status::not_found) return synced;
  std::lock_guard g(m.mu);
  auto it = m.streams.find(stream.id);
  if (it == m.streams.end()) return Status::not_found;  // destroyed concurrently
  Status d = m.call("destroy stream", [&] { return m.rt->stream_destroy(it->second); });
  m.streams.erase(it);  // a handle the runtime refused to destroy is not usable either
  return ok(synced) ? d : synced;
}

Status AccelBackend::synchronize_stream(Stream stream) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  void* s = nullptr;
  {
    std::lock_guard g(m.mu);
    s = m.stream_of(stream.id);
  }
  if (s == nullptr) return Status::not_found;
  return m.call("synchronize stream", [&] { return m.rt->stream_sync(s); });
}

Status AccelBackend::create_event(Event* event) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (event == nullptr) return Status::invalid_argument;
  std::lock_guard g(m.mu);
  void* e = nullptr;
  if (Status s = m.call("create event", [&] { return m.rt->event_create(&e); }); !ok(s)) return s;
  event->id = m.next_id++;
  m.events.emplace(event->id, EventSlot{e, false});
  return Status::ok;
}

Status AccelBackend::destroy_event(Event event) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  auto it = m.events.find(event.id);
  if (it == m.events.end()) return Status::not_found;
  Status s = m.call("destroy event", [&] { return m.rt->event_destroy(it->second.native); });
  m.events.erase(it);
  return s;
}

Status AccelBackend::record_event(Event event, Stream stream) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  void* s = m.stream_of(stream.id);
  auto it = m.events.find(event.id);
  if (s == nullptr || it == m.events.end()) return Status::not_found;
  if (Status st = m.call("record event", [&] { return m.rt->event_record(it->second.native, s); });
      !ok(st))
    return st;
  it->second.recorded = true;
  return Status::ok;
}

Status AccelBackend::query_event(Event event) const {
  const Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  void* e = nullptr;
  {
    std::lock_guard g(m.mu);
    auto it = m.events.find(event.id);
    if (it == m.events.end()) return Status::not_found;
    if (!it->second.recorded) return Status::ok;  // never recorded: complete
    e = it->second.native;
  }
  bool done = false;
  if (Status s = m.call("query event", [&] { return m.rt->event_query(e, &done); }); !ok(s))
    return s;
  return done ? Status::ok : Status::busy;
}

Status AccelBackend::synchronize_event(Event event) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  void* e = nullptr;
  {
    std::lock_guard g(m.mu);
    auto it = m.events.find(event.id);
    if (it == m.events.end()) return Status::not_found;
    if (!it->second.recorded) return Status::ok;
    e = it->second.native;
  }
  return m.call("synchronize event", [&] { return m.rt->event_sync(e); });
}

Status AccelBackend::stream_wait_event(Stream stream, Event event) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  void* s = m.stream_of(stream.id);
  auto it = m.events.find(event.id);
  if (s == nullptr || it == m.events.end()) return Status::not_found;
  if (!it->second.recorded) return Status::ok;  // nothing to wait for (CUDA/ACL)
  return m.call("stream wait event", [&] { return m.rt->stream_wait_event(s, it->second.native); });
}

Status AccelBackend::reserve(std::uint64_t bytes, void** va) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (!m.info.vmm) return m.refuse(Status::unsupported, "reserve: " + m.info.vmm_note);
  if (bytes == 0 || bytes % m.info.granularity != 0 || va == nullptr)
    return Status::invalid_argument;
  std::lock_guard g(m.mu);
  void* p = nullptr;
  if (Status s = m.call("reserve address", [&] { return m.rt->reserve(bytes, &p); }); !ok(s))
    return s;
  m.reservations.emplace(addr(p), Reservation{.size = bytes, .maps = {}});
  m.reservation_sizes.emplace(addr(p), bytes);
  *va = p;
  return Status::ok;
}

Status AccelBackend::release(void* va) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  auto it = m.reservations.find(addr(va));
  if (it == m.reservations.end()) return Status::invalid_argument;
  if (!it->second.maps.empty()) return Status::busy;
  if (Status s = m.call("release address", [&] { return m.rt->release(va, it->second.size); });
      !ok(s))
    return s;
  m.reservation_sizes.erase(it->first);
  m.reservations.erase(it);
  return Status::ok;
}

Status AccelBackend::create_physical(std::uint64_t bytes, PhysicalHandle* handle) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (!m.info.vmm) return m.refuse(Status::unsupported, "create_physical: " + m.info.vmm_note);
  if (bytes == 0 || bytes % m.info.granularity != 0 || handle == nullptr)
    return Status::invalid_argument;
  std::lock_guard g(m.mu);
  std::uint64_t native = 0;
  if (Status s = m.call("create physical", [&] { return m.rt->create_physical(bytes, &native); });
      !ok(s))
    return s;
  std::uint64_t id = m.next_id++;
  m.chunks.emplace(id, Chunk{.native = native, .size = bytes, .map_count = 0});
  *handle = PhysicalHandle{.id = id, .size = bytes, .tier = Tier::device};
  return Status::ok;
}

Status AccelBackend::free_physical(PhysicalHandle handle) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  auto it = m.chunks.find(handle.id);
  if (it == m.chunks.end()) return Status::invalid_argument;
  if (it->second.map_count > 0) return Status::busy;
  if (Status s = m.call("free physical", [&] { return m.rt->free_physical(it->second.native); });
      !ok(s))
    return s;
  m.chunks.erase(it);
  return Status::ok;
}

Status AccelBackend::map(void* va, PhysicalHandle handle) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  auto ch = m.chunks.find(handle.id);
  if (ch == m.chunks.end() || ch->second.size != handle.size) return Status::invalid_argument;
  const std::uintptr_t p = addr(va);
  if (p % m.info.granularity != 0) return Status::invalid_argument;
  auto r = m.reservations.upper_bound(p);
  if (r == m.reservations.begin()) return Status::invalid_argument;
  --r;
  const std::uint64_t off = p - r->first, size = ch->second.size;
  if (off >= r->second.size || size > r->second.size - off) return Status::invalid_argument;
  auto& maps = r->second.maps;
  auto next = maps.lower_bound(off);
  if (next != maps.end() && next->first < off + size) return Status::invalid_argument;
  if (next != maps.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > off) return Status::invalid_argument;
  }
  if (Status s = m.call("map", [&] { return m.rt->map(va, size, ch->second.native); }); !ok(s))
    return s;
  maps.emplace(off, Mapping{.chunk = handle.id, .size = size});
  ++ch->second.map_count;
  return Status::ok;
}

Status AccelBackend::unmap(void* va) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  const std::uintptr_t p = addr(va);
  auto r = m.reservations.upper_bound(p);
  if (r == m.reservations.begin()) return Status::invalid_argument;
  --r;
  auto mp = r->second.maps.find(p - r->first);
  if (mp == r->second.maps.end()) return Status::invalid_argument;
  if (Status s = m.call("unmap", [&] { return m.rt->unmap(va, mp->second.size); }); !ok(s))
    return s;
  --m.chunks.at(mp->second.chunk).map_count;
  r->second.maps.erase(mp);
  return Status::ok;
}

std::unique_ptr<MemoryBackend> AccelBackend::make_host_backend(std::uint64_t capacity) {
  return std::make_unique<RuntimeHostBackend>(*impl_, capacity);
}

Status AccelBackend::register_host(void* ptr, std::uint64_t bytes) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (!m.info.host_register)
    return m.refuse(Status::unsupported, m.info.name + ": no host-register call in this runtime");
  if (ptr == nullptr || bytes == 0) return Status::invalid_argument;
  std::lock_guard g(m.mu);
  if (m.touches_device(addr(ptr), bytes) || overlaps_any(m.registered, addr(ptr), bytes))
    return Status::invalid_argument;
  if (Status s = m.call("host register", [&] { return m.rt->host_register(ptr, bytes); }); !ok(s))
    return s;
  m.registered.emplace(addr(ptr), bytes);
  return Status::ok;
}

Status AccelBackend::unregister_host(void* ptr) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (!m.info.host_register) return Status::unsupported;
  std::lock_guard g(m.mu);
  auto it = m.registered.find(addr(ptr));
  if (it == m.registered.end()) return Status::invalid_argument;
  if (Status s = m.call("host unregister", [&] { return m.rt->host_unregister(ptr); }); !ok(s))
    return s;
  m.registered.erase(it);
  return Status::ok;
}

}  // namespace u3m::mem
