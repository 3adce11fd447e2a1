// The test doubles' device core (fake_device.hpp). One mutex and one
// condition variable for everything: it is a test double, simple beats fast.
#include "fake_device.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace u3m::doubles {
namespace {

std::uintptr_t addr(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}
bool overlaps(const std::map<std::uintptr_t, std::uint64_t>& m, std::uintptr_t p, std::uint64_t n) {
  auto it = m.lower_bound(p + n);
  if (it == m.begin()) return false;
  --it;
  return it->first + it->second > p;
}
bool inside(const std::map<std::uintptr_t, std::uint64_t>& m, std::uintptr_t p, std::uint64_t n) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return false;
  --it;
  return p + n <= it->first + it->second;
}
// Anonymous memory aligned to `align` (a multiple of the page size).
void* map_aligned(std::uint64_t n, std::uint64_t align, int prot) {
  void* raw = mmap(nullptr, n + align, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  std::uintptr_t base = (addr(raw) + align - 1) / align * align;
  if (base > addr(raw)) munmap(raw, base - addr(raw));
  std::uintptr_t end = addr(raw) + n + align;
  if (end > base + n) munmap(reinterpret_cast<void*>(base + n), end - base - n);
  return reinterpret_cast<void*>(base);
}
std::uint64_t page_round(std::uint64_t n) {
  const std::uint64_t pg = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  return (n + pg - 1) / pg * pg;
}

}  // namespace

FakeDevice::~FakeDevice() {
  stop_all();
}

void FakeDevice::stop_all() {
  std::vector<std::unique_ptr<StreamState>> all;
  {
    std::lock_guard g(mu_);
    for (auto& [h, s] : streams_) all.push_back(std::move(s));
    streams_.clear();
    if (default_stream_) all.push_back(std::move(default_stream_));
    for (auto& s : all) s->stop = true;
  }
  cv_.notify_all();
  for (auto& s : all)
    if (s->worker.joinable()) s->worker.join();
}

void FakeDevice::reset() {
  stop_all();
  std::lock_guard g(mu_);
  for (auto& [p, n] : allocs_) munmap(reinterpret_cast<void*>(p), page_round(n));
  for (auto& [p, n] : host_) munmap(reinterpret_cast<void*>(p), page_round(n));
  for (auto& [p, r] : reservations_) munmap(reinterpret_cast<void*>(p), r.size);
  for (auto& [h, c] : chunks_) close(c.fd);
  allocs_.clear();
  host_.clear();
  registered_.clear();
  reservations_.clear();
  chunks_.clear();
  events_.clear();
  calls_.clear();
  fail_.clear();
  used_ = 0;
  held_ = false;
  lost_ = 0;
  copy_fail_ = 0;
  copy_fail_sticky_ = false;
  device_count_ = 1;
  capacity_ = 1ull << 30;
  granularity_ = 2ull << 20;
}

void FakeDevice::configure(int device_count, std::uint64_t capacity, std::uint64_t granularity) {
  std::lock_guard g(mu_);
  device_count_ = device_count;
  capacity_ = capacity;
  granularity_ = granularity;
}

void FakeDevice::fail_next(const std::string& api, int code, int times) {
  std::lock_guard g(mu_);
  fail_[api] = {code, times};
}

void FakeDevice::fail_next_copy(int code, bool sticky) {
  std::lock_guard g(mu_);
  copy_fail_ = code;
  copy_fail_sticky_ = sticky;
}

void FakeDevice::hold(bool on) {
  {
    std::lock_guard g(mu_);
    held_ = on;
  }
  cv_.notify_all();
}

std::uint64_t FakeDevice::calls(const std::string& api) {
  std::lock_guard g(mu_);
  auto it = calls_.find(api);
  return it == calls_.end() ? 0 : it->second;
}

std::uint64_t FakeDevice::live_objects() {
  std::lock_guard g(mu_);
  return allocs_.size() + host_.size() + registered_.size() + reservations_.size() +
         chunks_.size() + streams_.size() + events_.size();
}

int FakeDevice::enter(const char* api) {
  std::lock_guard g(mu_);
  ++calls_[api];
  if (lost_ != 0) return lost_;
  auto it = fail_.find(api);
  if (it == fail_.end() || it->second.second <= 0) return 0;
  --it->second.second;
  return it->second.first;
}

int FakeDevice::device_count() {
  std::lock_guard g(mu_);
  return device_count_;
}

std::uint64_t FakeDevice::granularity() {
  std::lock_guard g(mu_);
  return granularity_;
}

int FakeDevice::alloc(std::uint64_t bytes, void** p) {
  if (p == nullptr || bytes == 0) return codes_.invalid;
  std::lock_guard g(mu_);
  if (bytes > capacity_ - used_) return codes_.oom;
  void* m = map_aligned(page_round(bytes), 4096, PROT_READ | PROT_WRITE);
  if (m == nullptr) return codes_.oom;
  allocs_.emplace(addr(m), bytes);
  used_ += bytes;
  *p = m;
  return 0;
}

int FakeDevice::free(void* p) {
  if (p == nullptr) return 0;  // both APIs accept freeing null
  std::lock_guard g(mu_);
  auto it = allocs_.find(addr(p));
  if (it == allocs_.end()) return codes_.invalid;
  munmap(p, page_round(it->second));
  used_ -= it->second;
  allocs_.erase(it);
  return 0;
}

int FakeDevice::alloc_host(std::uint64_t bytes, void** p) {
  if (p == nullptr || bytes == 0) return codes_.invalid;
  void* m = map_aligned(page_round(bytes), 4096, PROT_READ | PROT_WRITE);
  if (m == nullptr) return codes_.oom;
  std::lock_guard g(mu_);
  host_.emplace(addr(m), bytes);
  *p = m;
  return 0;
}

int FakeDevice::free_host(void* p) {
  std::lock_guard g(mu_);
  auto it = host_.find(addr(p));
  if (it == host_.end()) return codes_.invalid;
  munmap(p, page_round(it->second));
  host_.erase(it);
  return 0;
}

int FakeDevice::register_host(void* p, std::uint64_t bytes) {
  if (p == nullptr || bytes == 0) return codes_.invalid;
  std::lock_guard g(mu_);
  if (touches_device(addr(p), bytes)) return codes_.invalid;
  if (overlaps(registered_, addr(p), bytes) || overlaps(host_, addr(p), bytes))
    return codes_.registered;
  registered_.emplace(addr(p), bytes);
  return 0;
}

int FakeDevice::unregister_host(void* p) {
  std::lock_guard g(mu_);
  return registered_.erase(addr(p)) == 1 ? 0 : codes_.invalid;
}

void FakeDevice::mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) {
  std::lock_guard g(mu_);
  *free_bytes = capacity_ - used_;
  *total_bytes = capacity_;
}

bool FakeDevice::is_runtime_host(const void* p, std::uint64_t n) {
  std::lock_guard g(mu_);
  return inside(host_, addr(p), n) || inside(registered_, addr(p), n);
}

bool FakeDevice::device_range(std::uintptr_t p, std::uint64_t n) const {
  if (inside(allocs_, p, n)) return true;
  auto r = reservations_.upper_bound(p);
  if (r == reservations_.begin()) return false;
  --r;
  std::uint64_t off = p - r->first;
  if (off >= r->second.size || n > r->second.size - off) return false;
  auto m = r->second.maps.upper_bound(off);
  if (m == r->second.maps.begin()) return false;
  --m;
  for (std::uint64_t at = m->first; m != r->second.maps.end() && m->first == at; ++m) {
    if (!m->second.accessible) return false;
    at += m->second.size;
    if (at >= off + n) return true;
  }
  return false;
}

bool FakeDevice::touches_device(std::uintptr_t p, std::uint64_t n) const {
  if (overlaps(allocs_, p, n)) return true;
  auto it = reservations_.lower_bound(p + n);
  if (it == reservations_.begin()) return false;
  --it;
  return it->first + it->second.size > p;
}

int FakeDevice::check_copy(const void* dst, const void* src, std::uint64_t n, Kind k) const {
  if (dst == nullptr || src == nullptr) return codes_.invalid;
  const bool dd = k == Kind::h2d || k == Kind::d2d, sd = k == Kind::d2h || k == Kind::d2d;
  if (dd ? !device_range(addr(dst), n) : touches_device(addr(dst), n)) return codes_.invalid;
  if (sd ? !device_range(addr(src), n) : touches_device(addr(src), n)) return codes_.invalid;
  return 0;
}

int FakeDevice::copy(void* dst, const void* src, std::uint64_t n, Kind k) {
  {
    std::lock_guard g(mu_);
    if (int c = check_copy(dst, src, n, k); c != 0) return c;
  }
  std::memmove(dst, src, n);
  return 0;
}

FakeDevice::StreamState* FakeDevice::stream(void* s) {
  if (s == nullptr) {
    if (!default_stream_) {
      default_stream_ = std::make_unique<StreamState>();
      StreamState* raw = default_stream_.get();
      raw->worker = std::thread([this, raw] { run(*raw); });
    }
    return default_stream_.get();
  }
  auto it = streams_.find(s);
  return it == streams_.end() ? nullptr : it->second.get();
}

int FakeDevice::copy_async(void* dst, const void* src, std::uint64_t n, Kind k, void* s) {
  std::lock_guard g(mu_);
  StreamState* st = stream(s);
  if (st == nullptr) return codes_.bad_handle;
  if (int c = check_copy(dst, src, n, k); c != 0) return c;
  st->q.push_back(Op{.type = Op::copy, .dst = dst, .src = src, .n = n});
  cv_.notify_all();
  return 0;
}

void FakeDevice::run(StreamState& s) {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] {
      if (s.stop) return true;
      if (held_ || s.q.empty()) return false;
      const Op& op = s.q.front();
      if (op.type != Op::wait) return true;
      auto e = events_.find(op.event);  // a destroyed event holds no one
      return e == events_.end() || e->second->done >= op.gen || lost_ != 0;
    });
    if (s.stop) return;
    Op op = s.q.front();
    s.q.pop_front();
    s.running = true;
    if (op.type == Op::copy) {
      if (copy_fail_ != 0) {
        if (s.error == 0) s.error = copy_fail_;
        if (copy_fail_sticky_) lost_ = copy_fail_;
        copy_fail_ = 0;
      } else if (lost_ == 0) {
        lk.unlock();
        std::memmove(op.dst, op.src, op.n);
        lk.lock();
      }
    } else if (op.type == Op::record) {
      auto e = events_.find(op.event);
      if (e != events_.end()) e->second->done = std::max(e->second->done, op.gen);
    }
    s.running = false;
    cv_.notify_all();
  }
}

int FakeDevice::stream_create(void** s) {
  if (s == nullptr) return codes_.invalid;
  auto st = std::make_unique<StreamState>();
  StreamState* raw = st.get();
  std::lock_guard g(mu_);
  raw->worker = std::thread([this, raw] { run(*raw); });
  streams_.emplace(raw, std::move(st));
  *s = raw;
  return 0;
}

int FakeDevice::stream_sync(void* s) {
  std::unique_lock lk(mu_);
  StreamState* st = stream(s);
  if (st == nullptr) return codes_.bad_handle;
  cv_.wait(lk, [&] { return (st->q.empty() && !st->running) || lost_ != 0; });
  if (lost_ != 0) return lost_;
  int e = st->error;
  st->error = 0;
  return e;
}

int FakeDevice::stream_destroy(void* s) {
  if (s == nullptr) return codes_.invalid;
  std::unique_ptr<StreamState> st;
  {
    std::unique_lock lk(mu_);
    auto it = streams_.find(s);
    if (it == streams_.end()) return codes_.bad_handle;
    StreamState* raw = it->second.get();
    cv_.wait(lk, [&] { return (raw->q.empty() && !raw->running) || lost_ != 0 || held_; });
    st = std::move(it->second);
    streams_.erase(it);
    st->stop = true;
  }
  cv_.notify_all();
  st->worker.join();
  return 0;
}

int FakeDevice::event_create(void** e) {
  if (e == nullptr) return codes_.invalid;
  auto ev = std::make_unique<EventState>();
  std::lock_guard g(mu_);
  *e = ev.get();
  events_.emplace(ev.get(), std::move(ev));
  return 0;
}

int FakeDevice::event_destroy(void* e) {
  {
    std::lock_guard g(mu_);
    if (events_.erase(e) == 0) return codes_.bad_handle;
  }
  cv_.notify_all();
  return 0;
}

int FakeDevice::event_record(void* e, void* s) {
  std::lock_guard g(mu_);
  auto it = events_.find(e);
  StreamState* st = stream(s);
  if (it == events_.end() || st == nullptr) return codes_.bad_handle;
  std::uint64_t gen = ++it->second->recorded;
  st->q.push_back(Op{.type = Op::record, .event = e, .gen = gen});
  cv_.notify_all();
  return 0;
}

int FakeDevice::event_query(void* e, bool* done) {
  std::lock_guard g(mu_);
  auto it = events_.find(e);
  if (it == events_.end()) return codes_.bad_handle;
  *done = it->second->done >= it->second->recorded;
  return 0;
}

int FakeDevice::event_sync(void* e) {
  std::unique_lock lk(mu_);
  auto it = events_.find(e);
  if (it == events_.end()) return codes_.bad_handle;
  const std::uint64_t want = it->second->recorded;
  cv_.wait(lk, [&] {
    auto f = events_.find(e);
    return f == events_.end() || f->second->done >= want || lost_ != 0;
  });
  return lost_;
}

int FakeDevice::stream_wait_event(void* s, void* e) {
  std::lock_guard g(mu_);
  auto it = events_.find(e);
  StreamState* st = stream(s);
  if (it == events_.end() || st == nullptr) return codes_.bad_handle;
  st->q.push_back(Op{.type = Op::wait, .event = e, .gen = it->second->recorded});
  cv_.notify_all();
  return 0;
}

int FakeDevice::reserve(std::uint64_t bytes, void** va) {
  std::lock_guard g(mu_);
  if (va == nullptr || bytes == 0 || bytes % granularity_ != 0) return codes_.invalid;
  void* p = map_aligned(bytes, granularity_, PROT_NONE);
  if (p == nullptr) return codes_.oom;
  reservations_.emplace(addr(p), Reservation{.size = bytes, .maps = {}});
  *va = p;
  return 0;
}

int FakeDevice::release(void* va) {
  std::lock_guard g(mu_);
  auto it = reservations_.find(addr(va));
  if (it == reservations_.end()) return codes_.invalid;
  if (!it->second.maps.empty()) return codes_.in_use;
  munmap(va, it->second.size);
  reservations_.erase(it);
  return 0;
}

int FakeDevice::create_physical(std::uint64_t bytes, std::uint64_t* handle) {
  std::lock_guard g(mu_);
  if (handle == nullptr || bytes == 0 || bytes % granularity_ != 0) return codes_.invalid;
  if (bytes > capacity_ - used_) return codes_.oom;
  int fd = memfd_create("u3m-double-chunk", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (fd >= 0) close(fd);
    return codes_.oom;
  }
  *handle = next_chunk_++;
  chunks_.emplace(*handle, Chunk{.fd = fd, .size = bytes});
  used_ += bytes;
  return 0;
}

int FakeDevice::free_physical(std::uint64_t handle) {
  std::lock_guard g(mu_);
  auto it = chunks_.find(handle);
  if (it == chunks_.end()) return codes_.bad_handle;
  if (it->second.map_count > 0) return codes_.in_use;
  close(it->second.fd);
  used_ -= it->second.size;
  chunks_.erase(it);
  return 0;
}

int FakeDevice::map(void* va, std::uint64_t bytes, std::uint64_t handle, bool accessible) {
  std::lock_guard g(mu_);
  auto ch = chunks_.find(handle);
  if (ch == chunks_.end()) return codes_.bad_handle;
  const std::uintptr_t p = addr(va);
  if (bytes != ch->second.size || p % granularity_ != 0) return codes_.invalid;
  auto r = reservations_.upper_bound(p);
  if (r == reservations_.begin()) return codes_.invalid;
  --r;
  const std::uint64_t off = p - r->first;
  if (off >= r->second.size || bytes > r->second.size - off) return codes_.invalid;
  auto next = r->second.maps.lower_bound(off);
  if (next != r->second.maps.end() && next->first < off + bytes) return codes_.invalid;
  if (next != r->second.maps.begin() && std::prev(next)->first + std::prev(next)->second.size > off)
    return codes_.invalid;
  void* got = mmap(va, bytes, accessible ? PROT_READ | PROT_WRITE : PROT_NONE,
                   MAP_SHARED | MAP_FIXED, ch->second.fd, 0);
  if (got == MAP_FAILED) return codes_.oom;
  r->second.maps.emplace(off, Mapping{.chunk = handle, .size = bytes, .accessible = accessible});
  ++ch->second.map_count;
  return 0;
}

// The mapping that starts at exactly p, with its reservation and its offset
// there; caller holds mu_.
FakeDevice::Mapping* FakeDevice::mapping_at(std::uintptr_t p, Reservation** res,
                                            std::uint64_t* off) {
  auto r = reservations_.upper_bound(p);
  if (r == reservations_.begin()) return nullptr;
  --r;
  auto m = r->second.maps.find(p - r->first);
  if (m == r->second.maps.end()) return nullptr;
  *res = &r->second;
  *off = m->first;
  return &m->second;
}

int FakeDevice::set_access(void* va, std::uint64_t bytes) {
  std::lock_guard g(mu_);
  Reservation* r = nullptr;
  std::uint64_t off = 0;
  Mapping* m = mapping_at(addr(va), &r, &off);
  if (m == nullptr || m->size != bytes) return codes_.invalid;
  if (mprotect(va, bytes, PROT_READ | PROT_WRITE) != 0) return codes_.invalid;
  m->accessible = true;
  return 0;
}

int FakeDevice::unmap(void* va, std::uint64_t bytes) {
  std::lock_guard g(mu_);
  Reservation* r = nullptr;
  std::uint64_t off = 0;
  Mapping* m = mapping_at(addr(va), &r, &off);
  if (m == nullptr || (bytes != 0 && m->size != bytes)) return codes_.invalid;
  if (mmap(va, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
           0) == MAP_FAILED)
    return codes_.invalid;
  --chunks_.at(m->chunk).map_count;
  r->maps.erase(off);
  return 0;
}

}  // namespace u3m::doubles
