// device-emu: see include/u3m/mem/device_emu.hpp and docs/memory.md.
//
// Note [device-emu locking]
// Three kinds of lock, never nested except as listed:
//   mu_            memory bookkeeping (arena blocks, reservations, mappings,
//                  physical chunks) and the stream table. Held only for
//                  bookkeeping and validation, never while copying or waiting.
//   ev_mu_         the event table; ev_cv_ wakes every event waiter (host
//                  threads in synchronize_event, copy engines in a
//                  stream_wait_event). Copy engines take it after their own
//                  stream lock is released.
//   Stream::mu     one stream's queue and its busy flag; work_cv wakes its
//                  engine, idle_cv wakes synchronize_stream.
//
// Note [Hand-off latency]
// A copy crosses two threads: the caller enqueues, the stream's engine copies,
// the caller's synchronize_stream wakes. Sleeping on condition variables at
// both ends costs two wake-ups, tens of microseconds on a VM (more when the
// machine is loaded), which is over 10% of a 4 MiB copy at cache speed. So
// both ends first spin on the stream's atomic op counters and only then sleep:
//   - an idle engine for DeviceEmuOptions::spin_ns (50 us), so a busy
//     pipeline never sleeps and an idle one burns at most that per burst;
//   - synchronize_stream for sync_spin_ns (1 ms): the caller waits anyway,
//     and past 1 ms a wake-up costs under 2% of the copy.
// Spinning yields the CPU on every turn, so on an oversubscribed machine the
// thread being waited for still runs (a bare pause loop was measured 3x
// slower for 64 KiB hand-offs on the loaded 2-core dev VM). Measured there:
// without the spins 4 MiB copies reached 83-86% of memcpy, with them 87-97%
// (docs/memory.md). Setting both to 0 turns spinning off.
//
// A large copy is not split across two engine threads: on that VM a 64 MiB
// memcpy ran at 6.5 GB/s on one thread and 6.3 GB/s on two, since one core
// already saturates the memory bandwidth it gets.
//
// Note [A waiting caller runs the copy]
// The engine is a thread, so a copy only progresses while the scheduler runs
// that thread. When other processes keep both of the dev VM's cores busy, the
// engine often waits for a core while the caller, already running, waits for
// the engine, and a hand-off can cost a scheduler slice (~ms). Measured there
// with `u3m bench copy --path engine` at load 5-5.5: 73-96% of memcpy at
// 4 MiB, 82-103% at 16 MiB, while memcpy timed against itself the same way
// stayed at 98-103% (docs/memory.md, "Measured: u3m bench copy"). A real copy
// engine never waits for a CPU, and an emulated one should not make its caller
// wait for one either. So synchronize_stream first runs, on the calling
// thread, the ops of its stream that were enqueued before the call and that
// no one has started, in order: five bench runs of this path at load 4-5 then
// gave 92-107% at 4-64 MiB. Stream order holds because one op runs at a time
// per stream, by whoever set StreamState::busy; the engine leaves the queue
// alone while it is set. The caller also looks again each time an op ends
// while it waits, since the engine may be descheduled after the op it had
// started. Only a thread that would block anyway does this, so
// memcpy_async stays asynchronous and a caller that keeps working overlaps
// with the engine as before. Throttle, failure and the before_chunk hook apply
// alike on either thread. DeviceEmuOptions::caller_runs_queued = false turns
// it off.
//
// failed_ and stopping_ are atomics read without locks on the hot path;
// whoever sets one then takes and drops every mutex a waiter could be
// sleeping on before notifying, so no waiter misses the wake-up.
#include "u3m/mem/device_emu.hpp"
#include "u3m/mem/link.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

namespace u3m::mem {
namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) {
  return (v + a - 1) / a * a;
}
std::uintptr_t addr(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

// Best-fit allocator over an offset space [0, size) with coalescing. Serves
// the arena behind allocate() and the memfd behind physical chunks; callers
// pass sizes already rounded to their alignment.
class RangeAllocator {
 public:
  explicit RangeAllocator(std::uint64_t size) {
    if (size > 0) insert(0, size);
  }

  std::optional<std::uint64_t> allocate(std::uint64_t bytes) {
    auto it = by_size_.lower_bound({bytes, 0});
    if (it == by_size_.end()) return std::nullopt;
    auto [size, off] = *it;
    erase(off, size);
    if (size > bytes) insert(off + bytes, size - bytes);
    return off;
  }

  void free(std::uint64_t off, std::uint64_t bytes) {
    auto next = by_offset_.lower_bound(off);
    if (next != by_offset_.end() && next->first == off + bytes) {
      bytes += next->second;
      erase(next->first, next->second);
    }
    auto prev = by_offset_.lower_bound(off);
    if (prev != by_offset_.begin()) {
      --prev;
      if (prev->first + prev->second == off) {
        off = prev->first;
        bytes += prev->second;
        erase(prev->first, prev->second);
      }
    }
    insert(off, bytes);
  }

 private:
  void insert(std::uint64_t off, std::uint64_t size) {
    by_offset_.emplace(off, size);
    by_size_.emplace(size, off);
  }
  void erase(std::uint64_t off, std::uint64_t size) {
    by_offset_.erase(off);
    by_size_.erase({size, off});
  }
  std::map<std::uint64_t, std::uint64_t> by_offset_;           // free: offset -> size
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;  // free: (size, offset)
};

// One link direction's bandwidth, shared by every stream copying that way.
// Each chunk books the next free slot on the link (mem::LinkSchedule, Note
// [Link model] in link.hpp); the engine sleeps until its slot ends, so B
// bytes never take less than B / rate.
struct Link {
  double bytes_per_s = 0;  // 0 = unthrottled
  std::mutex mu;
  LinkSchedule schedule;  // on steady_clock nanoseconds

  std::optional<Clock::time_point> book(std::uint64_t bytes) {
    if (bytes_per_s <= 0) return std::nullopt;
    std::lock_guard g(mu);
    const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         Clock::now().time_since_epoch())
                         .count();
    const std::uint64_t end =
        schedule.book(static_cast<std::uint64_t>(now), bytes, bytes_per_s).free_ns;
    return Clock::time_point(std::chrono::nanoseconds(end));
  }
};

struct Op {
  enum class Type : std::uint8_t { copy, record, wait } type;
  void* dst = nullptr;
  const void* src = nullptr;
  std::uint64_t count = 0;
  CopyKind kind = CopyKind::h2h;
  std::uint64_t event = 0;
  std::uint64_t generation = 0;
};

struct EventState {
  std::uint64_t recorded = 0;       // generation of the latest record
  std::set<std::uint64_t> pending;  // recorded generations not yet reached
  bool reached(std::uint64_t gen) const { return !pending.contains(gen); }
};

struct Reservation {
  std::uint64_t size = 0;
  std::map<std::uint64_t, std::uint64_t> mappings;  // offset -> physical chunk id
};

struct Physical {
  std::uint64_t offset = 0;  // in the memfd
  std::uint64_t size = 0;
  std::uint32_t map_count = 0;
};

}  // namespace

struct DeviceEmuBackend::Impl {
  struct StreamState {
    std::uint64_t id = 0;
    std::mutex mu;
    std::condition_variable work_cv, idle_cv;
    std::deque<Op> queue;
    // Ops ever enqueued / taken from the queue / finished; atomics so the
    // spinning fast paths (Note [Hand-off latency]) can read them unlocked.
    std::atomic<std::uint64_t> submitted{0}, started{0}, finished{0};
    bool stop = false;
    bool busy = false;          // an op of this stream is running (engine or caller)
    Status error = Status::ok;  // first asynchronous error, sticky
    std::thread engine;
  };

  DeviceEmuOptions opt;
  std::uint64_t page = 4096;
  char* arena = nullptr;
  int memfd = -1;
  std::array<Link, kNumCopyKinds> links;
  std::atomic<bool> failed{false};
  std::atomic<bool> stopping{false};
  std::atomic<std::uint64_t> ops_by_engine{0}, ops_by_caller{0};

  mutable std::mutex mu;
  std::uint64_t used = 0;  // allocate() bytes + physical chunk bytes
  RangeAllocator arena_space;
  RangeAllocator phys_space;
  std::map<std::uint64_t, std::uint64_t> blocks;  // arena offset -> bytes, live allocations
  std::map<std::uintptr_t, Reservation> reservations;
  std::unordered_map<std::uint64_t, Physical> physical;
  std::unordered_map<std::uint64_t, std::shared_ptr<StreamState>> streams;
  std::uint64_t next_id = 1;

  mutable std::mutex ev_mu;
  std::condition_variable ev_cv;
  std::unordered_map<std::uint64_t, EventState> events;
  std::uint64_t next_event = 1;

  explicit Impl(DeviceEmuOptions o)
      : opt(std::move(o)), arena_space(opt.capacity), phys_space(opt.capacity) {}

  bool in_arena(std::uintptr_t p, std::uint64_t n) const {
    std::uintptr_t b = addr(arena);
    return p >= b && n <= opt.capacity && p - b <= opt.capacity - n;
  }

  // Whether [p, p+n) lies inside one live allocation or inside mapped chunks
  // of one reservation. Caller holds mu.
  bool is_device_range(std::uintptr_t p, std::uint64_t n) const {
    if (in_arena(p, n)) {
      std::uint64_t off = p - addr(arena);
      auto it = blocks.upper_bound(off);
      if (it == blocks.begin()) return false;
      --it;
      return off - it->first <= it->second && n <= it->second - (off - it->first);
    }
    auto r = reservations.upper_bound(p);
    if (r == reservations.begin()) return false;
    --r;
    std::uint64_t off = p - r->first;
    if (off >= r->second.size || n > r->second.size - off) return false;
    // Walk the mappings covering [off, off+n); they must be contiguous.
    auto m = r->second.mappings.upper_bound(off);
    if (m == r->second.mappings.begin()) return false;
    --m;
    std::uint64_t covered = m->first;
    for (; m != r->second.mappings.end() && m->first == covered; ++m) {
      covered += physical.at(m->second).size;
      if (covered >= off + n) return true;
    }
    return false;
  }

  // Whether [p, p+n) touches device address space at all. Caller holds mu.
  Status check_copy(void* dst, std::uint64_t dst_max, const void* src, std::uint64_t count,
                    CopyKind kind) const;
  bool overlaps_device(std::uintptr_t p, std::uint64_t n) const {
    std::uintptr_t b = addr(arena);
    if (p < b + opt.capacity && b < p + n) return true;
    auto r = reservations.lower_bound(p + n);
    if (r == reservations.begin()) return false;
    --r;
    return r->first + r->second.size > p;
  }

  std::shared_ptr<StreamState> find_stream(std::uint64_t id) {
    std::lock_guard g(mu);
    auto it = streams.find(id);
    return it == streams.end() ? nullptr : it->second;
  }

  // Starts a copy engine; the default stream passes id 0.
  std::shared_ptr<StreamState> start_stream(std::optional<std::uint64_t> id = std::nullopt) {
    auto s = std::make_shared<StreamState>();
    std::lock_guard g(mu);
    s->id = id ? *id : next_id++;
    s->engine = std::thread([this, raw = s.get()] { engine(*raw); });
    streams.emplace(s->id, s);
    return s;
  }

  void enqueue(StreamState& s, Op op) {
    {
      std::lock_guard g(s.mu);
      s.queue.push_back(op);
      s.submitted.fetch_add(1, std::memory_order_release);
    }
    s.work_cv.notify_one();  // cheap when the engine is spinning, not sleeping
  }

  // Spins for at most `ns` until pred() holds (Note [Hand-off latency]).
  template <typename P>
  static bool spin_until(P pred, std::uint64_t ns) {
    if (ns == 0) return pred();
    auto end = Clock::now() + std::chrono::nanoseconds(ns);
    for (unsigned i = 0;; ++i) {
      if (pred()) return true;
      if ((i & 15) == 15 && Clock::now() >= end) return false;
      // Yield, never a bare pause loop: on an oversubscribed machine the
      // thread we wait for may need this very core (measured: a pause loop
      // made 64 KiB hand-offs 3x slower on the loaded 2-core VM).
      std::this_thread::yield();
    }
  }

  void engine(StreamState& s) {
    std::unique_lock lk(s.mu);
    for (;;) {
      if ((s.queue.empty() || s.busy) && !s.stop) {
        lk.unlock();
        spin_until(
            [&] {
              return s.submitted.load(std::memory_order_acquire) !=
                         s.started.load(std::memory_order_acquire) ||
                     stopping.load();
            },
            opt.spin_ns);
        lk.lock();
      }
      s.work_cv.wait(lk, [&] { return s.stop || (!s.queue.empty() && !s.busy); });
      if (s.stop) break;
      if (opt.before_engine_op) {
        lk.unlock();
        opt.before_engine_op(s.id);
        lk.lock();
        if (s.stop) break;
        if (s.queue.empty() || s.busy) continue;  // a waiting caller took it meanwhile
      }
      run_front(s, lk, ops_by_engine);
    }
    s.queue.clear();
    s.idle_cv.notify_all();
  }

  // Runs the op at the head of s's queue; lk holds s.mu, is released while
  // the op runs, and is held again on return.
  void run_front(StreamState& s, std::unique_lock<std::mutex>& lk,
                 std::atomic<std::uint64_t>& count) {
    Op op = s.queue.front();
    s.queue.pop_front();
    s.busy = true;
    s.started.fetch_add(1, std::memory_order_release);
    lk.unlock();
    Status st = execute(s, op);
    lk.lock();
    if (!ok(st) && ok(s.error)) s.error = st;
    s.busy = false;
    count.fetch_add(1, std::memory_order_relaxed);
    s.finished.fetch_add(1, std::memory_order_release);
    s.idle_cv.notify_all();                        // cheap when nobody waits
    if (!s.queue.empty()) s.work_cv.notify_all();  // the engine may wait for busy to clear
  }

  // Note [A waiting caller runs the copy]: whether the caller may run the
  // next op of s (lk holds s.mu): one enqueued before `target` that no one
  // has started, while no one else runs one of this stream's ops.
  bool caller_may_run(const StreamState& s, std::uint64_t target) const {
    return !s.stop && !failed && !s.busy && !s.queue.empty() &&
           s.started.load(std::memory_order_relaxed) < target;
  }
  void run_queued(StreamState& s, std::unique_lock<std::mutex>& lk, std::uint64_t target) {
    while (caller_may_run(s, target)) run_front(s, lk, ops_by_caller);
  }

  Status execute(const StreamState& s, const Op& op) {
    switch (op.type) {
      case Op::Type::copy:
        return copy(s.id, op);
      case Op::Type::record: {
        {
          std::lock_guard g(ev_mu);
          if (auto it = events.find(op.event); it != events.end())
            it->second.pending.erase(op.generation);
        }
        ev_cv.notify_all();
        return failed ? Status::device_failed : Status::ok;
      }
      case Op::Type::wait: {
        std::unique_lock g(ev_mu);
        ev_cv.wait(g, [&] {
          if (failed || stopping) return true;
          auto it = events.find(op.event);  // a destroyed event no longer holds anyone
          return it == events.end() || it->second.reached(op.generation);
        });
        return failed ? Status::device_failed : Status::ok;
      }
    }
    return Status::ok;
  }

  // `stream`: the id the before_chunk hook sees.
  Status copy(std::uint64_t stream, const Op& op) {
    auto* dst = static_cast<char*>(op.dst);
    const auto* src = static_cast<const char*>(op.src);
    Link& link = links[static_cast<int>(op.kind)];
    for (std::uint64_t done = 0; done < op.count;) {
      std::uint64_t n = std::min(opt.chunk_bytes, op.count - done);
      if (opt.before_chunk) opt.before_chunk(op.kind, stream, n);
      if (failed || stopping) return Status::device_failed;
      auto slot_end = link.book(n);
      std::memcpy(dst + done, src + done, n);
      if (slot_end) std::this_thread::sleep_until(*slot_end);
      done += n;
    }
    return Status::ok;
  }

  // Wakes every waiter after failed or stopping was set (Note [device-emu
  // locking]).
  void wake_all() {
    std::vector<std::shared_ptr<StreamState>> all;
    {
      std::lock_guard g(mu);
      for (auto& [id, s] : streams) all.push_back(s);
    }
    { std::lock_guard g(ev_mu); }
    ev_cv.notify_all();
    for (auto& s : all) {
      { std::lock_guard g(s->mu); }
      s->work_cv.notify_all();
      s->idle_cv.notify_all();
    }
  }

  void stop_stream(StreamState& s) {
    {
      std::lock_guard g(s.mu);
      s.stop = true;
    }
    s.work_cv.notify_all();
    if (s.engine.joinable()) s.engine.join();
  }
};

DeviceEmuBackend::DeviceEmuBackend(DeviceEmuOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  Impl& m = *impl_;
  m.page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  if (m.opt.capacity == 0) throw std::invalid_argument("device-emu: capacity must be > 0");
  if (m.opt.granularity == 0 || m.opt.granularity % m.page != 0)
    throw std::invalid_argument("device-emu: granularity must be a multiple of the page size");
  if (m.opt.chunk_bytes == 0) throw std::invalid_argument("device-emu: chunk_bytes must be > 0");
  // NORESERVE: the arena is address space; pages appear when first written.
  void* a = mmap(nullptr, m.opt.capacity, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (a == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "device-emu arena");
  m.arena = static_cast<char*>(a);
  m.memfd = memfd_create("u3m-device-emu", MFD_CLOEXEC);
  if (m.memfd < 0 || ftruncate(m.memfd, static_cast<off_t>(m.opt.capacity)) != 0) {
    int e = errno;
    if (m.memfd >= 0) close(m.memfd);
    munmap(m.arena, m.opt.capacity);
    throw std::system_error(e, std::generic_category(), "device-emu memfd");
  }
  for (int k = 0; k < kNumCopyKinds; ++k) m.links[k].bytes_per_s = m.opt.throttle_bytes_per_s[k];
  m.start_stream(kDefaultStream.id);
}

DeviceEmuBackend::~DeviceEmuBackend() {
  Impl& m = *impl_;
  m.stopping = true;  // queued work is dropped; engines finish at most their current chunk
  m.wake_all();
  for (auto& [id, s] : m.streams) m.stop_stream(*s);
  for (auto& [base, r] : m.reservations) munmap(reinterpret_cast<void*>(base), r.size);
  close(m.memfd);
  munmap(m.arena, m.opt.capacity);
}

Capabilities DeviceEmuBackend::capabilities() const {
  const DeviceEmuOptions& o = impl_->opt;
  Capabilities c;
  c.name = "device-emu";
  c.tier = Tier::device;
  c.vmm = true;
  c.granularity = o.granularity;
  c.pinned = false;
  c.read_gbps = o.throttle_bytes_per_s[static_cast<int>(CopyKind::d2h)] / 1e9;
  c.write_gbps = o.throttle_bytes_per_s[static_cast<int>(CopyKind::h2d)] / 1e9;
  c.capacity = o.capacity;
  return c;
}

Status DeviceEmuBackend::allocate(std::uint64_t bytes, void** ptr) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (bytes == 0 || ptr == nullptr) return Status::invalid_argument;
  if (bytes > m.opt.capacity) return Status::out_of_memory;
  std::uint64_t n = round_up(bytes, kAllocAlignment);
  std::lock_guard g(m.mu);
  if (n > m.opt.capacity - m.used) return Status::out_of_memory;
  auto off = m.arena_space.allocate(n);
  if (!off) return Status::out_of_memory;  // enough bytes, but fragmented
  m.blocks.emplace(*off, n);
  m.used += n;
  *ptr = m.arena + *off;
  return Status::ok;
}

Status DeviceEmuBackend::free(void* ptr) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  if (!m.in_arena(addr(ptr), 1)) return Status::invalid_argument;
  auto it = m.blocks.find(addr(ptr) - addr(m.arena));
  if (it == m.blocks.end()) return Status::invalid_argument;
  auto [off, n] = *it;
  // Give whole pages of big blocks back to the OS, so a large emulated HBM
  // costs only what is in use (a real device does not zero freed memory
  // either, so nothing may rely on the old contents).
  if (n >= (1u << 20)) {
    std::uint64_t lo = round_up(off, m.page), hi = (off + n) / m.page * m.page;
    if (hi > lo) madvise(m.arena + lo, hi - lo, MADV_DONTNEED);
  }
  m.arena_space.free(off, n);
  m.blocks.erase(it);
  m.used -= n;
  return Status::ok;
}

Status DeviceEmuBackend::mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) const {
  const Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (free_bytes == nullptr || total_bytes == nullptr) return Status::invalid_argument;
  std::lock_guard g(m.mu);
  *free_bytes = m.opt.capacity - m.used;
  *total_bytes = m.opt.capacity;
  return Status::ok;
}

// The checks memcpy_async and memcpy_sync share; the caller holds m.mu.
Status DeviceEmuBackend::Impl::check_copy(void* dst, std::uint64_t dst_max, const void* src,
                                          std::uint64_t count, CopyKind kind) const {
  if (count > dst_max) return Status::invalid_argument;
  if (static_cast<int>(kind) >= kNumCopyKinds) return Status::invalid_argument;
  if (count == 0) return Status::ok;
  if (dst == nullptr || src == nullptr) return Status::invalid_argument;
  std::uintptr_t d = addr(dst), sp = addr(src);
  if (d + count < d || sp + count < sp) return Status::invalid_argument;  // wraps
  if (d < sp + count && sp < d + count) return Status::invalid_argument;  // overlap
  bool dst_dev = kind == CopyKind::h2d || kind == CopyKind::d2d;
  bool src_dev = kind == CopyKind::d2h || kind == CopyKind::d2d;
  if (dst_dev ? !is_device_range(d, count) : overlaps_device(d, count))
    return Status::invalid_argument;
  if (src_dev ? !is_device_range(sp, count) : overlaps_device(sp, count))
    return Status::invalid_argument;
  return Status::ok;
}

Status DeviceEmuBackend::memcpy_async(void* dst, std::uint64_t dst_max, const void* src,
                                      std::uint64_t count, CopyKind kind, Stream stream) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::shared_ptr<Impl::StreamState> s;
  {
    std::lock_guard g(m.mu);
    auto it = m.streams.find(stream.id);
    if (it == m.streams.end()) return Status::not_found;
    s = it->second;
    if (Status st = m.check_copy(dst, dst_max, src, count, kind); !ok(st) || count == 0) return st;
  }
  m.enqueue(*s, Op{.type = Op::Type::copy, .dst = dst, .src = src, .count = count, .kind = kind});
  return Status::ok;
}

// Note [Synchronous copies]
// A caller that waits on its copy right away (the runtime's transfer
// workers) gains nothing from the engine thread and pays for waking it: on
// the idle dev VM each wake cost device-emu 8-9 us per copy, so 4 MiB copies
// ran at 87-90% of memcpy even when the waiting caller ran the copy itself
// (Note [A waiting caller runs the copy]; docs/memory.md). memcpy_sync runs
// the copy on the calling thread through the same chunks, link throttle,
// before_chunk hook and failure checks, and never touches a stream. The
// hook sees stream id kSyncStream.
Status DeviceEmuBackend::memcpy_sync(void* dst, std::uint64_t dst_max, const void* src,
                                     std::uint64_t count, CopyKind kind) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  {
    std::lock_guard g(m.mu);
    if (Status st = m.check_copy(dst, dst_max, src, count, kind); !ok(st) || count == 0) return st;
  }
  m.ops_by_caller.fetch_add(1, std::memory_order_relaxed);
  return m.copy(kSyncStream,
                Op{.type = Op::Type::copy, .dst = dst, .src = src, .count = count, .kind = kind});
}

Status DeviceEmuBackend::create_stream(Stream* stream) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (stream == nullptr) return Status::invalid_argument;
  stream->id = m.start_stream()->id;
  return Status::ok;
}

Status DeviceEmuBackend::destroy_stream(Stream stream) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (stream.id == kDefaultStream.id) return Status::invalid_argument;
  Status st = synchronize_stream(stream);
  if (st == Status::not_found) return st;
  std::shared_ptr<Impl::StreamState> s;
  {
    std::lock_guard g(m.mu);
    auto it = m.streams.find(stream.id);
    if (it == m.streams.end()) return Status::not_found;  // destroyed concurrently
    s = std::move(it->second);
    m.streams.erase(it);
  }
  m.stop_stream(*s);
  return st;
}

Status DeviceEmuBackend::synchronize_stream(Stream stream) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  auto s = m.find_stream(stream.id);
  if (!s) return Status::not_found;
  // Waits for the work enqueued before this call, not for work other threads
  // keep adding meanwhile.
  const std::uint64_t target = s->submitted.load(std::memory_order_acquire);
  auto done = [&] { return s->finished.load(std::memory_order_acquire) >= target || m.failed; };
  const bool help = m.opt.caller_runs_queued;
  if (help) {
    std::unique_lock lk(s->mu);
    m.run_queued(*s, lk, target);
  }
  Impl::spin_until(done, m.opt.sync_spin_ns);
  std::unique_lock lk(s->mu);
  // Every op's end wakes us: if the engine has not taken the next one by
  // then (it may be waiting for a core), we run it.
  for (;;) {
    s->idle_cv.wait(lk,
                    [&] { return done() || s->stop || (help && m.caller_may_run(*s, target)); });
    if (done() || s->stop) break;
    m.run_queued(*s, lk, target);
  }
  if (m.failed) return Status::device_failed;
  return s->error;
}

Status DeviceEmuBackend::create_event(Event* event) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (event == nullptr) return Status::invalid_argument;
  std::lock_guard g(m.ev_mu);
  event->id = m.next_event++;
  m.events.emplace(event->id, EventState{});
  return Status::ok;
}

Status DeviceEmuBackend::destroy_event(Event event) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  {
    std::lock_guard g(m.ev_mu);
    if (m.events.erase(event.id) == 0) return Status::not_found;
  }
  m.ev_cv.notify_all();  // engines waiting on it are released
  return Status::ok;
}

Status DeviceEmuBackend::record_event(Event event, Stream stream) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  auto s = m.find_stream(stream.id);
  if (!s) return Status::not_found;
  std::uint64_t gen;
  {
    std::lock_guard g(m.ev_mu);
    auto it = m.events.find(event.id);
    if (it == m.events.end()) return Status::not_found;
    gen = ++it->second.recorded;
    it->second.pending.insert(gen);
  }
  m.enqueue(*s, Op{.type = Op::Type::record, .event = event.id, .generation = gen});
  return Status::ok;
}

Status DeviceEmuBackend::query_event(Event event) const {
  const Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.ev_mu);
  auto it = m.events.find(event.id);
  if (it == m.events.end()) return Status::not_found;
  return it->second.reached(it->second.recorded) ? Status::ok : Status::busy;
}

Status DeviceEmuBackend::synchronize_event(Event event) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::unique_lock g(m.ev_mu);
  auto it = m.events.find(event.id);
  if (it == m.events.end()) return Status::not_found;
  std::uint64_t gen = it->second.recorded;
  bool destroyed = false;
  m.ev_cv.wait(g, [&] {
    if (m.failed) return true;
    auto e = m.events.find(event.id);
    destroyed = e == m.events.end();
    return destroyed || e->second.reached(gen);
  });
  if (m.failed) return Status::device_failed;
  return destroyed ? Status::not_found : Status::ok;
}

Status DeviceEmuBackend::stream_wait_event(Stream stream, Event event) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  auto s = m.find_stream(stream.id);
  if (!s) return Status::not_found;
  std::uint64_t gen;
  {
    std::lock_guard g(m.ev_mu);
    auto it = m.events.find(event.id);
    if (it == m.events.end()) return Status::not_found;
    gen = it->second.recorded;
  }
  if (gen == 0) return Status::ok;  // never recorded: nothing to wait for (CUDA/ACL)
  m.enqueue(*s, Op{.type = Op::Type::wait, .event = event.id, .generation = gen});
  return Status::ok;
}

Status DeviceEmuBackend::reserve(std::uint64_t bytes, void** va) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  const std::uint64_t gran = m.opt.granularity;
  if (bytes == 0 || bytes % gran != 0 || va == nullptr) return Status::invalid_argument;
  // Over-reserve by one granule and trim, so the base is granule-aligned.
  void* raw =
      mmap(nullptr, bytes + gran, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return Status::out_of_memory;
  std::uintptr_t base = round_up(addr(raw), gran);
  std::uintptr_t head = base - addr(raw);
  if (head > 0) munmap(raw, head);
  if (gran - head > 0) munmap(reinterpret_cast<void*>(base + bytes), gran - head);
  std::lock_guard g(m.mu);
  m.reservations.emplace(base, Reservation{.size = bytes, .mappings = {}});
  *va = reinterpret_cast<void*>(base);
  return Status::ok;
}

Status DeviceEmuBackend::release(void* va) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  auto it = m.reservations.find(addr(va));
  if (it == m.reservations.end()) return Status::invalid_argument;
  if (!it->second.mappings.empty()) return Status::busy;
  munmap(va, it->second.size);
  m.reservations.erase(it);
  return Status::ok;
}

Status DeviceEmuBackend::create_physical(std::uint64_t bytes, PhysicalHandle* handle) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  if (bytes == 0 || bytes % m.opt.granularity != 0 || handle == nullptr)
    return Status::invalid_argument;
  std::lock_guard g(m.mu);
  if (bytes > m.opt.capacity - m.used) return Status::out_of_memory;
  auto off = m.phys_space.allocate(bytes);
  if (!off) return Status::out_of_memory;
  std::uint64_t id = m.next_id++;
  m.physical.emplace(id, Physical{.offset = *off, .size = bytes, .map_count = 0});
  m.used += bytes;
  *handle = PhysicalHandle{.id = id, .size = bytes, .tier = Tier::device};
  return Status::ok;
}

Status DeviceEmuBackend::free_physical(PhysicalHandle handle) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  auto it = m.physical.find(handle.id);
  if (it == m.physical.end()) return Status::invalid_argument;
  if (it->second.map_count > 0) return Status::busy;
  // Return the pages to the OS; the memfd stays sparse.
  fallocate(m.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            static_cast<off_t>(it->second.offset), static_cast<off_t>(it->second.size));
  m.phys_space.free(it->second.offset, it->second.size);
  m.used -= it->second.size;
  m.physical.erase(it);
  return Status::ok;
}

Status DeviceEmuBackend::map(void* va, PhysicalHandle handle) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  auto ph = m.physical.find(handle.id);
  if (ph == m.physical.end() || ph->second.size != handle.size) return Status::invalid_argument;
  std::uintptr_t p = addr(va);
  if (p % m.opt.granularity != 0) return Status::invalid_argument;
  auto r = m.reservations.upper_bound(p);
  if (r == m.reservations.begin()) return Status::invalid_argument;
  --r;
  std::uint64_t off = p - r->first, size = ph->second.size;
  if (off >= r->second.size || size > r->second.size - off) return Status::invalid_argument;
  auto& maps = r->second.mappings;
  auto next = maps.lower_bound(off);
  if (next != maps.end() && next->first < off + size) return Status::invalid_argument;
  if (next != maps.begin()) {
    auto prev = std::prev(next);
    if (prev->first + m.physical.at(prev->second).size > off) return Status::invalid_argument;
  }
  void* got = mmap(va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, m.memfd,
                   static_cast<off_t>(ph->second.offset));
  if (got == MAP_FAILED) return Status::out_of_memory;
  maps.emplace(off, handle.id);
  ++ph->second.map_count;
  return Status::ok;
}

Status DeviceEmuBackend::unmap(void* va) {
  Impl& m = *impl_;
  if (m.failed) return Status::device_failed;
  std::lock_guard g(m.mu);
  std::uintptr_t p = addr(va);
  auto r = m.reservations.upper_bound(p);
  if (r == m.reservations.begin()) return Status::invalid_argument;
  --r;
  auto mp = r->second.mappings.find(p - r->first);
  if (mp == r->second.mappings.end()) return Status::invalid_argument;
  Physical& ph = m.physical.at(mp->second);
  // Back to an inaccessible reservation: touching it now faults, as on a device.
  void* got =
      mmap(va, ph.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (got == MAP_FAILED) return Status::out_of_memory;
  --ph.map_count;
  r->second.mappings.erase(mp);
  return Status::ok;
}

DeviceEmuRunStats DeviceEmuBackend::run_stats() const {
  return {.by_engine = impl_->ops_by_engine.load(std::memory_order_relaxed),
          .by_caller = impl_->ops_by_caller.load(std::memory_order_relaxed)};
}

void DeviceEmuBackend::inject_failure() {
  impl_->failed = true;
  impl_->wake_all();
}

}  // namespace u3m::mem
