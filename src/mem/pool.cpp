// The caching pool allocator (DevicePool): blocks, segments, allocation and
// free, the caches, compaction and the figures. The pool makes no OS calls:
// memory comes from a SegmentSource (segment_sources.cpp); its free blocks
// sit in a FreeIndex (free_index.cpp); its configuration is pool_config.cpp.
#include "u3m/mem/pool.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <mutex>
#include <thread>

#include "pool_block.hpp"
#include "u3m/util/error.hpp"

namespace u3m::mem {

using pool_detail::as_ptr;
using pool_detail::round_up;

// Note [Pool structure]
// A segment is one contiguous range from the source. Its blocks tile it in
// address order (prev/next), each allocated or free. Free blocks of the small
// and the large pool sit in two indexes ordered by (size, address) (Note
// [Free index]), so best fit is one search: the smallest free block that
// fits, lowest address among equals. Allocation takes that block and splits off the remainder when
// the remainder is worth keeping (Note [Pool configuration]); free marks the block free and merges
// it with free neighbours, so adjacent holes never stay apart. Segments go back to the source only
// in empty_cache(), or when an allocation would fail otherwise: a freed block is cached and the
// next request of a similar size is served without a source call (the fast path).
//
// Note [Fast path]
// Splitting and coalescing cost several ordered-set updates per allocation,
// several times glibc malloc's thread-cache pop. So, as glibc's tcache defers
// coalescing, a freed block first goes whole into a small cache (at most
// `fast_cache_blocks`, newest last), and an allocation of exactly its size
// takes it back with no split, merge or set update. A cached block still
// counts as free: stats() and snapshot() merge it with free neighbours
// (the logical layout is the coalesced one), freeing a neighbour merges it for
// real, and the cache is flushed (merged into the free sets) before the pool
// grows, before empty_cache() and before compact(), so caching never costs
// memory. In an expandable range a block next to the free tail is not cached,
// so the tail is still unmapped at once.
//
// Note [Expandable segments]
// With expandable_segments, each pool (small, large) owns one reserved virtual
// range instead of many segments. Physical chunks of the source's granularity
// are mapped at the end as the pool grows, and when the trailing free block
// spans whole chunks beyond `expandable_keep` bytes they are unmapped at once.
// Blocks freed anywhere merge with their neighbours inside one range, so the
// slivers that per-request segments leave at their ends (PyTorch's Note
// [Expandable Segments]: batch size N+1 after N) cannot form, and mapped bytes
// track the high-water mark of live blocks rather than a sum of segment sizes.
// Holes below the highest live block stay mapped; compact() closes them by
// sliding movable blocks down, after which the tail is unmapped.
//
// Note [Thread cache]
// The lock costs one atomic exchange per call, and two per allocate+free pair
// are already as much as glibc's whole tcache round trip at small sizes. So,
// like glibc's tcache and mimalloc's thread-local free lists, each thread has,
// per pool, a PoolThreadCache: 64 direct-mapped bins, each a stack of freed
// blocks of one exact size (at most thread_cache_blocks deep, at most
// thread_cache_bytes in all). free() of a block pushes it and allocate() of
// that size pops it, with plain loads and stores: no lock, no atomic
// read-modify-write. A block may be freed by another thread than the one that
// allocated it; it then lands in the freeing thread's cache.
//
// * What stays true. Liveness is one atomic word per block, its generation,
//   odd while a caller holds the block; only the block's holder writes it, so
//   checking a handle needs no lock and a double free or stale handle is still
//   rejected (ordered frees: two threads freeing the same handle at the same
//   moment is a data race in the caller, as with malloc). To the pool's
//   structure a thread-cached block is "allocated" (not in a free set, never
//   merged), but to the figures it is free: a block with an even generation
//   counts as free, so allocated/free bytes and counts are exact whenever no
//   call is in flight.
// * Figures. The lock-free calls keep only what cannot be counted later: a
//   pop count (alloc_count), the `room` word (the byte limit, and cached
//   bytes = cap - room) and its high-water mark (the peak). Requested bytes
//   and active blocks are counted by stats() from the blocks themselves
//   (held: odd generation; thread-cached: allocated with an even one), and
//   frees derive as pops + cached + drained blocks. Dropping the two
//   counters that used to track these (pushes, requested bytes) took about
//   0.4 ns off a pair; stats() walks every block instead, and is no fast call.
// * Cost. A pop or push is a few dozen instructions; what they do is chosen
//   by perf annotate of `u3m bench alloc`: the thread's slot table is read
//   through a TLS descriptor (no __tls_get_addr prologue in -fPIC code), the
//   cache's byte figure is one `room` word that both checks the byte limit
//   and counts (cached = cap - room), a new generation is computed from the
//   one just checked rather than loaded back, and "this pool's and not
//   movable" is one pointer compare (PoolBlock::push_to).
// * Draining. Whenever the pool needs memory that may sit in a cache (a
//   request no free block serves, before it grows a segment; out of memory;
//   empty_cache(); compact(); destruction), it empties every thread cache
//   into its free sets, so caching never makes the pool grow or fail. The
//   owner's pops and pushes hold no lock, so a drain from another thread uses
//   a Dekker handshake: the owner sets `busy`, fences, then reads `pending`;
//   the drainer sets `pending`, fences, then waits for `busy` to clear. Either
//   the owner sees `pending` and takes the locked path, or the drainer sees
//   `busy` and waits the few instructions until the owner leaves; so the bins
//   are never touched by both. The owner clears `pending` under the pool lock
//   on its next locked call. The fences are asymmetric, as in folly's and
//   liburcu's: the owner's is a compiler barrier, the drainer's is
//   membarrier(2), which runs a full barrier on every running thread of the
//   process (a thread that is not running passed one when it was switched
//   out). So if the owner's load of `pending` came before that barrier, its
//   store to `busy` did too and the drainer sees it; if after, it sees
//   `pending`. Drains are rare (the pool is short of memory), owner calls
//   are not: a seq_cst fence on both sides cost about 0.8 ns of a 9 ns pair
//   (vm, docs/memory.md). The choice is made at compile time: a run-time
//   switch on the owner's path cost another 0.5 ns. ThreadSanitizer cannot
//   see membarrier's barrier, so TSan builds use the symmetric fences (the
//   same protocol, checked there). Where the kernel refuses the membarrier
//   registration (before Linux 4.14, or a seccomp filter), pools have no
//   thread caches and every call takes the lock.
// * Lifetimes. A pool finds a thread's cache by a pool id that is never reused
//   (so a new pool at a dead pool's address never sees its caches), in a
//   small thread-local table. The pool and the thread share each cache
//   (shared_ptr). At thread exit the thread drains its caches into their
//   pools and folds their counters into the pool's; at pool destruction the
//   pool drains every cache and detaches it (under the cache's own mutex, so
//   a thread exiting at that moment either returns its cache first or finds
//   it detached), and a thread discards a detached cache without touching it.
// * Peak. peak_allocated_bytes is updated under the lock with the caches'
//   deltas; a cache also records its own high-water mark since its owner's
//   last locked call, so with one thread using the pool the peak is exact.
//   With several threads, pops between locked calls make it an estimate.
// * Not cached: movable blocks (compact() moves them under the lock, and a
//   lock-free free could race the move), and blocks of expandable pools (a
//   freed block that borders the free tail must unmap it at once, and whether
//   it does can only be read under the lock).

namespace {

// A counter with a single writer at a time (its cache's owner, or the pool
// under its lock once the owner is excluded): load + store, no atomic
// read-modify-write, while stats() may read it from another thread.
template <typename T>
void bump(std::atomic<T>& a, T d) {
  a.store(a.load(std::memory_order_relaxed) + d, std::memory_order_release);
}
template <typename T>
T get(const std::atomic<T>& a) {
  return a.load(std::memory_order_relaxed);
}

}  // namespace

struct PoolThreadCache {
  static constexpr std::size_t kBins = 64;
  struct Bin {
    std::uint64_t size = 0;
    PoolBlock* top = nullptr;
    std::uint64_t count = 0;
  };
  // The handshake with a drain from another thread (Note [Thread cache]).
  std::atomic<bool> busy{false}, pending{false};
  // Touched by the owner inside busy, or by a drain once the owner is out.
  Bin bins[kBins];
  // Figures for stats(), as few as the fast path can afford (Note [Thread
  // cache], "Figures"): a monotonic count of the owner's pops (single
  // writer), the byte room left under thread_cache_bytes as one word (a push
  // checks its limit and updates its figure with that one load and store; a
  // reader racing the owner sees a consistent value), and what drains took
  // (written under the pool lock, with the owner excluded). Everything else
  // derives: cached bytes = cap - room, popped minus pushed bytes =
  // -(cached + drained), pushes = pops + cached blocks + drained blocks.
  std::atomic<std::uint64_t> pops{0};
  std::int64_t cap = 0;               // thread_cache_bytes; set at creation
  std::atomic<std::int64_t> room{0};  // cap - bytes cached now
  std::atomic<std::uint64_t> drained_blocks{0};
  std::atomic<std::int64_t> drained_bytes{0};  // all bytes drains took from it
  // Peak tracking: the pool total minus this cache's delta at the owner's
  // last locked call, and the highest room since (the highest delta: a pop
  // raises both by the same bytes).
  std::atomic<std::int64_t> base{0}, high_room{0};
  // Lifetime (Note [Thread cache]): the pool, until it detaches the cache.
  std::mutex detach_mu;
  std::atomic<DevicePool*> pool{nullptr};
  std::uint64_t pool_id = 0;

  static std::size_t bin_of(std::uint64_t size) {
    return static_cast<std::size_t>((size * 0x9E3779B97F4A7C15ull) >> 58);  // Fibonacci hashing
  }
  // Bytes popped minus pushed, from a given room. Callers hold the pool
  // lock, so drained_bytes is stable (drains take it).
  std::int64_t delta_at(std::int64_t r) const { return r - cap - get(drained_bytes); }
  std::int64_t peak_candidate() const { return get(base) + delta_at(get(high_room)); }
  std::int64_t allocated_delta() const { return delta_at(room.load(std::memory_order_acquire)); }
  std::uint64_t cached_bytes() const {
    return static_cast<std::uint64_t>(cap - room.load(std::memory_order_acquire));
  }
};

namespace {

// Note [Thread cache], the handshake: asymmetric, except under
// ThreadSanitizer, which cannot see the barrier membarrier() puts into the
// owner and would report every drain; there both sides fence.
#if defined(__SANITIZE_THREAD__)
#define U3M_POOL_SYMMETRIC_HANDSHAKE 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define U3M_POOL_SYMMETRIC_HANDSHAKE 1
#endif
#endif

inline void fence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

// Whether thread caches may be used: the asymmetric form needs expedited
// private membarrier (Linux >= 4.14), registered once per process (a few
// milliseconds, an RCU grace period, when the process already has threads);
// a seccomp filter may refuse it, and then pools run without thread caches.
bool handshake_available() {
#ifdef U3M_POOL_SYMMETRIC_HANDSHAKE
  return true;
#else
  static const bool registered =
      ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  return registered;
#endif
}

// The drainer's side: a full barrier on every running thread of the process.
// False if the kernel refused (it cannot, once registered): the caller then
// leaves the caches alone, so cached blocks may make the pool grow or fail,
// and it says so on stderr, once.
bool drainer_fence() {
#ifdef U3M_POOL_SYMMETRIC_HANDSHAKE
  fence();
  return true;
#else
  int r;
  do {
    r = static_cast<int>(::syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0));
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    static std::once_flag told;
    const int err = errno;
    std::call_once(told, [err] {
      std::fprintf(stderr,
                   "u3m: membarrier failed after registration (errno %d): other threads' pool "
                   "caches are not drained\n",
                   err);
    });
  }
  return r == 0;
#endif
}

// The owner enters: false when a drain is pending (take the locked path).
// The owner's fence is a compiler barrier only: the drainer's membarrier()
// turns it into a full one whenever a drain needs that.
[[gnu::always_inline]] inline bool enter(PoolThreadCache* c) {
  c->busy.store(true, std::memory_order_relaxed);
#ifdef U3M_POOL_SYMMETRIC_HANDSHAKE
  fence();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
  if (c->pending.load(std::memory_order_acquire)) {
    c->busy.store(false, std::memory_order_release);
    return false;
  }
  return true;
}
inline void leave(PoolThreadCache* c) {
  c->busy.store(false, std::memory_order_release);
}

std::atomic<std::uint64_t> next_pool_id{1};

// This thread's caches, most recently registered first; plain data, so
// reading it costs no thread-local guard.
struct TlsCacheSlot {
  std::uint64_t pool_id = 0;
  PoolThreadCache* cache = nullptr;
};
constexpr int kTlsSlots = 4;
// Read on every fast-path call. u3m_mem is built -fPIC (it also goes into
// the Python module), where thread_local defaults to the general-dynamic
// model: a __tls_get_addr call, and even when the linker relaxes it the
// compiler has already saved registers around it (2 ns of a 13 ns pair,
// measured on vm, perf annotate of `u3m bench alloc`). pool.cmake builds this file with TLS
// descriptors (GCC's -mtls-dialect=gnu2), whose call clobbers no register and which the linker
// relaxes to a plain %fs load in an executable; unlike the initial-exec
// model, that stays safe in a dlopen()ed module.
thread_local TlsCacheSlot tls_slots[kTlsSlots];
thread_local bool tls_exiting = false;  // the registry below is gone or going

}  // namespace

// Owns this thread's caches (with their pools); returns them at thread exit.
struct PoolThreadCacheRegistry {
  std::vector<std::shared_ptr<PoolThreadCache>> caches;
  ~PoolThreadCacheRegistry() {
    tls_exiting = true;
    for (TlsCacheSlot& s : tls_slots) s = {};
    for (auto& c : caches) {
      std::lock_guard g(c->detach_mu);
      if (DevicePool* p = c->pool.load(std::memory_order_acquire)) p->retire_cache(c.get());
    }
  }
};

namespace {
thread_local PoolThreadCacheRegistry tls_registry;
}  // namespace

double fragmentation(std::uint64_t largest_free, std::uint64_t total_free) {
  if (total_free == 0) return 0;
  return 1.0 - static_cast<double>(largest_free) / static_cast<double>(total_free);
}

void SpinLock::yield() noexcept {
  std::this_thread::yield();
}

bool DevicePool::thread_caches_supported() {
  return handshake_available();
}

DevicePool::DevicePool(SegmentSource& source, PoolConfig config)
    : source_(source),
      config_(config),
      granularity_(std::max<std::uint64_t>(source.granularity(), 1)),
      expandable_(config.expandable_segments),
      id_(next_pool_id.fetch_add(1, std::memory_order_relaxed)),
      thread_cache_(config.thread_cache_blocks > 0 && config.thread_cache_bytes > 0 &&
                    !config.expandable_segments && handshake_available()),
      fast_id_(thread_cache_ ? id_ : 0) {
  config_.validate();
  if (expandable_ && !source.supports_vmm()) {
    input_error("pool config", "expandable_segments: the segment source has no reserve/map");
  }
  if (expandable_ && config_.expandable_reserve == 0) {
    config_.expandable_reserve = config_.capacity ? config_.capacity : 64 * GiB;
  }
  if (expandable_ &&
      !round_up(config_.expandable_reserve, granularity_, &config_.expandable_reserve)) {
    input_error("pool config", "expandable_reserve: too large");
  }
  cache_.reserve(config_.fast_cache_blocks);
}

DevicePool::~DevicePool() {
  // Detach the caches first, without the pool lock: a thread exiting now
  // holds its cache's mutex while it takes the pool lock (Note [Thread cache]).
  std::vector<std::shared_ptr<PoolThreadCache>> caches;
  {
    std::lock_guard lock(mu_);
    caches = caches_;
  }
  for (auto& c : caches) {
    std::lock_guard g(c->detach_mu);
    c->pool.store(nullptr, std::memory_order_release);
  }
  std::lock_guard lock(mu_);
  drain_thread_caches();
  caches_.clear();
  flush_cache();
  while (!segments_.empty()) destroy_segment(segments_.back().get());
}

DevicePool::Kind DevicePool::kind_of(std::uint64_t rounded) const {
  return rounded <= config_.small_size ? kSmall : kLarge;
}

PoolBlock* DevicePool::new_block() {
  PoolBlock* b;
  if (!spare_blocks_.empty()) {
    b = spare_blocks_.back();
    spare_blocks_.pop_back();
    // The generation carries on: a stale handle to the old block stays stale.
    b->requested.store(0, std::memory_order_relaxed);
    b->owner = 0;
    b->set_movable(false);
    b->prev = b->next = b->tnext = nullptr;
    b->allocated = b->cached = false;
    b->cache_slot = 0;
  } else {
    b = &block_storage_.emplace_back();
    b->pool = this;
    b->set_movable(false);
  }
  b->in_use = true;
  return b;
}

void DevicePool::recycle(PoolBlock* b) {
  b->in_use = false;
  b->allocated = false;
  spare_blocks_.push_back(b);
}

void DevicePool::insert_free(PoolBlock* b) {
  Kind k = static_cast<Segment*>(b->segment)->kind;
  free_[k].insert(b);
  free_bytes_[k] += b->size;
}

void DevicePool::erase_free(PoolBlock* b) {
  Kind k = static_cast<Segment*>(b->segment)->kind;
  // Only what was indexed leaves the free figures (a miss is a bug: asserted above).
  if (free_[k].erase(b)) free_bytes_[k] -= b->size;
}

std::uint64_t DevicePool::total_free() const {
  std::uint64_t in_threads = 0;
  for (const auto& c : caches_) in_threads += c->cached_bytes();
  return free_bytes_[0] + free_bytes_[1] + cached_bytes_ + in_threads;
}

std::uint64_t DevicePool::largest_free() const {
  std::uint64_t largest = 0;
  free_runs(&largest);
  return largest;
}

std::uint64_t DevicePool::free_runs(std::uint64_t* largest) const {
  std::uint64_t runs = 0, m = 0;
  if (cache_.empty() && thread_cached_bytes() == 0) {  // coalesced: each free block is a run
    for (const FreeSet& f : free_) {
      if (const PoolBlock* b = f.largest()) m = std::max(m, b->size);
      runs += f.size();
    }
  } else {
    for (const auto& s : segments_) {
      std::uint64_t run = 0;
      for (const PoolBlock* b = s->head; b; b = b->next) {
        bool free = b->free_now();
        if (free && run == 0) ++runs;
        run = free ? run + b->size : 0;
        m = std::max(m, run);
      }
    }
  }
  *largest = m;
  return runs;
}

PoolBlock* DevicePool::pop_cached(std::uint64_t size) {
  for (std::size_t i = cache_.size(); i-- > 0;) {
    if (cache_[i]->size == size) {
      PoolBlock* b = cache_[i];
      uncache(b);
      return b;
    }
  }
  return nullptr;
}

void DevicePool::uncache(PoolBlock* b) {
  PoolBlock* last = cache_.back();
  cache_[b->cache_slot] = last;
  last->cache_slot = b->cache_slot;
  cache_.pop_back();
  b->cached = false;
  cached_bytes_ -= b->size;
}

void DevicePool::flush_cache() {
  while (!cache_.empty()) {
    PoolBlock* b = cache_.back();
    uncache(b);
    b = coalesce(b);
    insert_free(b);
    auto* seg = static_cast<Segment*>(b->segment);
    if (seg->expandable && b == seg->tail) trim_tail(seg, config_.expandable_keep);
  }
}

void DevicePool::note_reserved(std::int64_t delta) {
  st_.reserved_bytes += delta;
  st_.peak_reserved_bytes = std::max(st_.peak_reserved_bytes, st_.reserved_bytes);
}

bool DevicePool::within_capacity(std::uint64_t more) const {
  return config_.capacity == 0 ||
         (st_.reserved_bytes <= config_.capacity && more <= config_.capacity - st_.reserved_bytes);
}

PoolBlock* DevicePool::best_fit(Kind k, std::uint64_t size) {
  return free_[k].best_fit(size);
}

std::uint64_t DevicePool::segment_size(Kind k, std::uint64_t size) const {
  std::uint64_t s;
  if (k == kSmall) {
    s = config_.small_segment;
  } else if (size < config_.min_large_alloc) {
    s = config_.large_segment;
  } else if (!round_up(size, config_.round_large, &s)) {
    return 0;
  }
  if (!round_up(s, granularity_, &s)) return 0;
  return s;
}

Status DevicePool::new_segment(Kind k, std::uint64_t size, PoolBlock** out) {
  std::uint64_t bytes = segment_size(k, size);
  if (bytes == 0 || !within_capacity(bytes)) return Status::out_of_memory;
  void* base = nullptr;
  ++st_.source_calls;
  Status s = source_.allocate_segment(bytes, &base);
  if (!ok(s)) return s;
  if (reinterpret_cast<std::uintptr_t>(base) % config_.alignment) {
    // A source that cannot honour the alignment is a configuration error.
    ++st_.source_calls;
    source_.free_segment(base, bytes);
    return Status::invalid_argument;
  }
  auto seg = std::make_unique<Segment>();
  seg->pool = this;
  seg->base = reinterpret_cast<std::uintptr_t>(base);
  seg->size = bytes;
  seg->kind = k;
  PoolBlock* b = new_block();
  b->ptr = seg->base;
  b->size = bytes;
  b->segment = seg.get();
  seg->head = seg->tail = b;
  segments_.push_back(std::move(seg));
  note_reserved(static_cast<std::int64_t>(bytes));
  insert_free(b);
  *out = b;
  return Status::ok;
}

Status DevicePool::extend_expandable(Kind k, std::uint64_t size, PoolBlock** out) {
  Segment* seg = expandable_seg_[k];
  if (!seg) {
    void* base = nullptr;
    ++st_.source_calls;
    Status s = source_.reserve(config_.expandable_reserve, &base);
    if (!ok(s)) return s;
    auto owned = std::make_unique<Segment>();
    seg = owned.get();
    seg->pool = this;
    seg->base = reinterpret_cast<std::uintptr_t>(base);
    seg->reserve = config_.expandable_reserve;
    seg->kind = k;
    seg->expandable = true;
    segments_.push_back(std::move(owned));
    expandable_seg_[k] = seg;
  }
  PoolBlock* tail = seg->tail && !seg->tail->allocated ? seg->tail : nullptr;
  std::uint64_t have = tail ? tail->size : 0;
  std::uint64_t bytes;
  if (!round_up(size - have, granularity_, &bytes)) return Status::out_of_memory;
  if (bytes > seg->reserve - seg->size || !within_capacity(bytes)) return Status::out_of_memory;
  ++st_.source_calls;
  Status s = source_.map(as_ptr(seg->base + seg->size), bytes);
  if (!ok(s)) return s;
  if (tail) {
    erase_free(tail);
    tail->size += bytes;
  } else {
    tail = new_block();
    tail->ptr = seg->base + seg->size;
    tail->size = bytes;
    tail->segment = seg;
    tail->prev = seg->tail;
    if (seg->tail) seg->tail->next = tail;
    if (!seg->head) seg->head = tail;
    seg->tail = tail;
  }
  seg->size += bytes;
  note_reserved(static_cast<std::int64_t>(bytes));
  insert_free(tail);
  *out = tail;
  return Status::ok;
}

Status DevicePool::grow(Kind k, std::uint64_t size, PoolBlock** out) {
  return expandable_ ? extend_expandable(k, size, out) : new_segment(k, size, out);
}

void DevicePool::split(PoolBlock* b, std::uint64_t size) {
  // b is off the free set; the remainder goes on it.
  auto* seg = static_cast<Segment*>(b->segment);
  PoolBlock* rest = new_block();
  rest->ptr = b->ptr + size;
  rest->size = b->size - size;
  rest->segment = seg;
  rest->prev = b;
  rest->next = b->next;
  if (b->next) b->next->prev = rest;
  b->next = rest;
  if (seg->tail == b) seg->tail = rest;
  b->size = size;
  insert_free(rest);
}

void DevicePool::hand_out(PoolBlock* b, std::uint64_t requested, bool movable, std::uint64_t owner,
                          PoolAllocation* out) {
  b->allocated = true;
  b->requested.store(requested, std::memory_order_relaxed);
  b->set_movable(movable);
  b->owner = owner;
  b->bump_generation();
  st_.allocated_bytes += b->size;
  note_allocated();
  *out = PoolAllocation{as_ptr(b->ptr), b->size, requested, b,
                        b->generation.load(std::memory_order_relaxed)};
}

void DevicePool::note_allocated() {
  std::uint64_t now = st_.allocated_bytes + static_cast<std::uint64_t>(thread_allocated_delta());
  st_.peak_allocated_bytes = std::max(st_.peak_allocated_bytes, now);
}

// ---- thread caches (Note [Thread cache]) -----------------------------------

// Inlined: a call and its prologue are a tenth of the lock-free path.
[[gnu::always_inline]] inline PoolThreadCache* DevicePool::fast_cache() const {
  // fast_id_ is 0 when the pool has no thread cache: it matches only empty
  // slots, whose cache is null, so there is no separate flag to test.
  for (const TlsCacheSlot& s : tls_slots) {
    if (s.pool_id == fast_id_) return s.cache;
  }
  return nullptr;
}

PoolThreadCache* DevicePool::own_cache(bool create) {
  if (!thread_cache_ || tls_exiting) return nullptr;
  if (PoolThreadCache* c = fast_cache()) return c;
  auto& mine = tls_registry.caches;
  PoolThreadCache* found = nullptr;
  for (auto& c : mine) {
    if (c->pool_id == id_) found = c.get();
  }
  if (!found) {
    if (!create) return nullptr;
    std::erase_if(mine, [](const std::shared_ptr<PoolThreadCache>& c) {
      return c->pool.load(std::memory_order_acquire) == nullptr;  // its pool is gone
    });
    auto c = std::make_shared<PoolThreadCache>();
    c->pool_id = id_;
    // Clamped so that room arithmetic cannot overflow a signed word.
    c->cap = static_cast<std::int64_t>(
        std::min<std::uint64_t>(config_.thread_cache_bytes, std::uint64_t{1} << 62));
    c->room.store(c->cap, std::memory_order_relaxed);
    c->high_room.store(c->cap, std::memory_order_relaxed);
    c->pool.store(this, std::memory_order_release);
    c->base.store(static_cast<std::int64_t>(st_.allocated_bytes +
                                            static_cast<std::uint64_t>(thread_allocated_delta())),
                  std::memory_order_relaxed);
    caches_.push_back(c);
    mine.push_back(c);
    found = c.get();
  }
  for (int i = kTlsSlots - 1; i > 0; --i) tls_slots[i] = tls_slots[i - 1];
  tls_slots[0] = {id_, found};
  return found;
}

[[gnu::always_inline]] inline bool DevicePool::cache_push(PoolThreadCache* c, PoolBlock* b,
                                                          std::uint64_t generation) {
  std::uint64_t size = b->size;
  PoolThreadCache::Bin& bin = c->bins[PoolThreadCache::bin_of(size)];
  const std::int64_t room = get(c->room);  // >= 0
  if ((bin.count > 0 && bin.size != size) || bin.count >= config_.thread_cache_blocks ||
      size > static_cast<std::uint64_t>(room)) {
    return false;
  }
  b->bump_generation_from(generation);  // even: the handle that freed it is stale now
  b->tnext = bin.top;
  bin.top = b;
  bin.size = size;
  ++bin.count;
  c->room.store(room - static_cast<std::int64_t>(size), std::memory_order_release);
  return true;
}

void DevicePool::sync_own_cache(PoolThreadCache* c) {
  if (!c) return;
  // A drain emptied the bins and marked them; the owner may use them again.
  if (c->pending.load(std::memory_order_relaxed))
    c->pending.store(false, std::memory_order_relaxed);
  // The high-water mark of the lock-free calls since the last locked one.
  st_.peak_allocated_bytes =
      std::max(st_.peak_allocated_bytes, static_cast<std::uint64_t>(c->peak_candidate()));
}

void DevicePool::rebase(PoolThreadCache* c) {
  std::int64_t delta = c->allocated_delta();
  auto total = static_cast<std::int64_t>(st_.allocated_bytes +
                                         static_cast<std::uint64_t>(thread_allocated_delta()));
  c->base.store(total - delta, std::memory_order_relaxed);
  c->high_room.store(get(c->room), std::memory_order_relaxed);
}

void DevicePool::drain(PoolThreadCache* c) {
  std::uint64_t blocks = 0;
  for (PoolThreadCache::Bin& bin : c->bins) {
    blocks += bin.count;
    for (PoolBlock* b = bin.top; b;) {
      PoolBlock* next = b->tnext;
      b->tnext = nullptr;
      put_back(b, false);
      b = next;
    }
    bin = {};
  }
  // The owner is out (Note [Thread cache]), so these are exact. The delta
  // (room - cap - drained) is unchanged; the high-water room moves with it.
  const std::int64_t cached = c->cap - get(c->room);
  c->high_room.store(get(c->high_room) + cached, std::memory_order_relaxed);
  c->drained_bytes.store(get(c->drained_bytes) + cached, std::memory_order_relaxed);
  c->room.store(c->cap, std::memory_order_release);
  c->drained_blocks.store(get(c->drained_blocks) + blocks, std::memory_order_relaxed);
}

bool DevicePool::drain_thread_caches() {
  PoolThreadCache* self = fast_cache();
  std::vector<PoolThreadCache*> remote;
  bool any = false;
  for (auto& c : caches_) {
    if (c->cached_bytes() == 0) continue;  // a push racing this drain comes after it
    if (c.get() == self) {                 // our own: we are not inside a push or pop
      drain(self);
      any = true;
    } else if (!c->pending.load(std::memory_order_relaxed)) {
      c->pending.store(true, std::memory_order_relaxed);
      remote.push_back(c.get());
    }
  }
  // One barrier for all of them; the caches of one pool share its form.
  if (!remote.empty() && drainer_fence()) {
    for (PoolThreadCache* c : remote) {
      while (c->busy.load(std::memory_order_acquire)) std::this_thread::yield();
      any = any || c->cached_bytes() > 0;
      drain(c);
    }
  }
  if (any) ++st_.thread_cache_drains;
  return any;
}

void DevicePool::retire_cache(PoolThreadCache* c) {
  std::lock_guard lock(mu_);
  drain(c);  // we are its owner, exiting
  st_.peak_allocated_bytes =
      std::max(st_.peak_allocated_bytes, static_cast<std::uint64_t>(c->peak_candidate()));
  st_.allocated_bytes += static_cast<std::uint64_t>(c->allocated_delta());
  st_.alloc_count += get(c->pops);
  st_.free_count += get(c->pops) + get(c->drained_blocks);  // its pushes: it is empty now
  std::erase_if(caches_, [c](const std::shared_ptr<PoolThreadCache>& p) { return p.get() == c; });
  c->pool.store(nullptr, std::memory_order_release);
}

std::uint64_t DevicePool::thread_cached_bytes() const {
  std::uint64_t n = 0;
  for (const auto& c : caches_) n += c->cached_bytes();
  return n;
}

std::int64_t DevicePool::thread_allocated_delta() const {
  std::int64_t d = 0;
  for (const auto& c : caches_) d += c->allocated_delta();
  return d;
}

Status DevicePool::allocate(std::uint64_t bytes, PoolAllocation* out, bool movable,
                            std::uint64_t owner) {
  if (out == nullptr || bytes == 0) return Status::invalid_argument;
  // alignment is a power of two (validate()): a mask, not a division, which
  // alone would cost more than the rest of the fast path.
  const std::uint64_t mask = config_.alignment - 1;
  if (bytes > std::numeric_limits<std::uint64_t>::max() - mask) return Status::out_of_memory;
  const std::uint64_t size = (bytes + mask) & ~mask;
  if (PoolThreadCache* c = movable ? nullptr : fast_cache(); c && enter(c)) {
    PoolThreadCache::Bin& bin = c->bins[PoolThreadCache::bin_of(size)];
    if (bin.count > 0 && bin.size == size) {  // the lock-free pop
      PoolBlock* b = bin.top;
      bin.top = b->tnext;
      --bin.count;
      const std::int64_t room = get(c->room) + static_cast<std::int64_t>(size);
      c->room.store(room, std::memory_order_release);
      bump(c->pops, std::uint64_t{1});
      if (room > get(c->high_room)) c->high_room.store(room, std::memory_order_relaxed);
      b->requested.store(bytes, std::memory_order_relaxed);
      b->owner = owner;
      const std::uint64_t g = b->bump_generation();
      leave(c);
      *out = PoolAllocation{as_ptr(b->ptr), size, bytes, b, g};
      return Status::ok;
    }
    leave(c);
  }
  return allocate_locked(bytes, size, out, movable, owner);
}

// Out of line, so the lock-free path above stays a leaf with a short prologue.
[[gnu::noinline]] Status DevicePool::allocate_locked(std::uint64_t bytes, std::uint64_t size,
                                                     PoolAllocation* out, bool movable,
                                                     std::uint64_t owner) {
  Kind k = kind_of(size);
  std::lock_guard lock(mu_);
  PoolThreadCache* own = own_cache(true);
  sync_own_cache(own);
  Rebase rebase{this, own};
  if (PoolBlock* c = cache_.empty() ? nullptr : pop_cached(size)) {
    hand_out(c, bytes, movable, owner, out);
    ++st_.alloc_count;
    return Status::ok;
  }
  PoolBlock* b = best_fit(k, size);
  if (!b && (!cache_.empty() || thread_cached_bytes() > 0)) {
    // Cached blocks must not make the pool grow (Note [Thread cache]).
    drain_thread_caches();
    flush_cache();
    b = best_fit(k, size);
  }
  if (!b) {
    Status s = grow(k, size, &b);
    if (s == Status::out_of_memory && release_cached() > 0) {
      ++st_.cache_flushes;
      s = grow(k, size, &b);
    }
    if (!ok(s)) {
      if (s == Status::out_of_memory) ++st_.oom_count;
      return s;
    }
  }
  erase_free(b);
  std::uint64_t rest = b->size - size;
  // The tail of an expandable range is no sliver: it merges with the next
  // chunk mapped, or is unmapped.
  auto* seg = static_cast<Segment*>(b->segment);
  bool open_tail = seg->expandable && seg->tail == b;
  bool keep_rest =
      k == kSmall || open_tail ? rest >= config_.alignment : rest > config_.large_split_min;
  if (keep_rest) split(b, size);
  hand_out(b, bytes, movable, owner, out);
  ++st_.alloc_count;
  return Status::ok;
}

bool DevicePool::live(const PoolAllocation& a) const {
  // Blocks are never deallocated (only recycled within their pool), so
  // reading a stale handle's block is safe; the generation, odd while
  // allocated, tells a stale handle from a live one. ptr is read only once
  // the generation matched, i.e. while the block is held and cannot change.
  const PoolBlock* b = a.block;
  return b && b->pool == this && (a.generation & 1) &&
         b->generation.load(std::memory_order_acquire) == a.generation &&
         b->ptr == reinterpret_cast<std::uintptr_t>(a.ptr);
}

PoolBlock* DevicePool::coalesce(PoolBlock* b) {
  // Cached neighbours may sit next to free ones (Note [Fast path]): merge
  // whole runs, not one block a side.
  auto* seg = static_cast<Segment*>(b->segment);
  auto take = [this](PoolBlock* x) {
    if (x->cached) {
      uncache(x);
    } else {
      erase_free(x);
    }
  };
  while (PoolBlock* p = b->prev) {
    if (p->allocated) break;
    take(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    if (seg->tail == b) seg->tail = p;
    recycle(b);
    b = p;
  }
  while (PoolBlock* n = b->next) {
    if (n->allocated) break;
    take(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    if (seg->tail == n) seg->tail = b;
    recycle(n);
  }
  return b;
}

std::uint64_t DevicePool::trim_tail(Segment* s, std::uint64_t keep) {
  PoolBlock* t = s->tail;
  if (!t || t->allocated || t->cached) return 0;
  std::uint64_t from = t->ptr - s->base;
  std::uint64_t keep_to;
  if (!round_up(std::min(from + keep, s->size), granularity_, &keep_to) || keep_to >= s->size) {
    return 0;
  }
  std::uint64_t bytes = s->size - keep_to;
  ++st_.source_calls;
  if (!ok(source_.unmap(as_ptr(s->base + keep_to), bytes))) return 0;  // still mapped: keep it
  erase_free(t);
  t->size -= bytes;
  if (t->size == 0) {
    s->tail = t->prev;
    if (t->prev) t->prev->next = nullptr;
    if (s->head == t) s->head = nullptr;
    recycle(t);
  } else {
    insert_free(t);
  }
  s->size -= bytes;
  note_reserved(-static_cast<std::int64_t>(bytes));
  return bytes;
}

void DevicePool::release_block(PoolBlock* b, bool may_cache) {
  b->bump_generation();  // even: every handle to it is stale now
  st_.allocated_bytes -= b->size;
  put_back(b, may_cache);
}

void DevicePool::put_back(PoolBlock* b, bool may_cache) {
  b->allocated = false;
  auto* s = static_cast<Segment*>(b->segment);
  if (may_cache && cache_.size() < config_.fast_cache_blocks &&
      !(s->expandable && (!b->next || !b->next->allocated))) {
    b->cached = true;
    b->cache_slot = static_cast<std::uint32_t>(cache_.size());
    cache_.push_back(b);
    cached_bytes_ += b->size;
    return;
  }
  b = coalesce(b);
  insert_free(b);
  auto* seg = static_cast<Segment*>(b->segment);
  if (seg->expandable && b == seg->tail) trim_tail(seg, config_.expandable_keep);
}

Status DevicePool::free(const PoolAllocation& a) {
  PoolBlock* b = a.block;
  // The lock-free push: a live, non-movable block of this pool into this
  // thread's bin for its size, if the bin has room (Note [Thread cache]).
  if (PoolThreadCache* c =
          b && b->push_to.load(std::memory_order_relaxed) == this ? fast_cache() : nullptr;
      c && (a.generation & 1) && b->generation.load(std::memory_order_acquire) == a.generation &&
      b->ptr == reinterpret_cast<std::uintptr_t>(a.ptr) && enter(c)) {
    bool pushed = cache_push(c, b, a.generation);  // equal to the block's, just checked
    leave(c);
    if (pushed) return Status::ok;
  }
  return free_locked(a);
}

[[gnu::noinline]] Status DevicePool::free_locked(const PoolAllocation& a) {
  PoolBlock* b = a.block;
  std::lock_guard lock(mu_);
  PoolThreadCache* c = own_cache(true);
  sync_own_cache(c);
  Rebase rebase{this, c};
  if (!live(a)) return Status::invalid_argument;
  // The owner may fill its bins under the lock too: drains hold the lock.
  if (c && !b->movable.load(std::memory_order_relaxed) && cache_push(c, b, a.generation)) {
    return Status::ok;
  }
  release_block(a.block, true);
  ++st_.free_count;
  return Status::ok;
}

Status DevicePool::set_movable(const PoolAllocation& a, bool movable) {
  std::lock_guard lock(mu_);
  if (!live(a)) return Status::invalid_argument;
  a.block->set_movable(movable);
  return Status::ok;
}

void DevicePool::destroy_segment(Segment* s) {
  for (PoolBlock* b = s->head; b;) {
    PoolBlock* n = b->next;
    if (!b->allocated) {
      erase_free(b);
    } else if (b->held()) {
      // Freed with live blocks (pool destroyed): the handles become stale.
      st_.allocated_bytes -= b->size;
      b->bump_generation();
    }
    recycle(b);
    b = n;
  }
  ++st_.source_calls;
  if (s->expandable) {
    if (s->size) {
      ++st_.source_calls;
      source_.unmap(as_ptr(s->base), s->size);
    }
    source_.release(as_ptr(s->base), s->reserve);
    expandable_seg_[s->kind] = nullptr;
  } else {
    source_.free_segment(as_ptr(s->base), s->size);
  }
  note_reserved(-static_cast<std::int64_t>(s->size));
  auto it = std::find_if(segments_.begin(), segments_.end(),
                         [s](const std::unique_ptr<Segment>& p) { return p.get() == s; });
  segments_.erase(it);
}

std::uint64_t DevicePool::release_cached() {
  drain_thread_caches();
  flush_cache();
  std::uint64_t released = 0;
  std::vector<Segment*> empty;
  for (auto& s : segments_) {
    if (s->expandable) {
      released += trim_tail(s.get(), 0);
      if (s->size == 0) empty.push_back(s.get());
    } else if (s->head == s->tail && !s->head->allocated) {
      empty.push_back(s.get());
    }
  }
  for (Segment* s : empty) {
    released += s->size;
    destroy_segment(s);
  }
  return released;
}

std::uint64_t DevicePool::empty_cache() {
  std::lock_guard lock(mu_);
  return release_cached();
}

// Note [Compaction]
// The pool cannot move user data: the caller (the runtime, which knows which
// tensors are unpinned and idle) supplies a callback that copies a block and
// repoints its owner. The plan is "slide down": movable allocated blocks are
// taken from the highest address down, and each is moved into the
// lowest-addressed free block of its pool, below it, that holds it whole. So
// every move goes strictly down and into free space (source and destination
// never overlap; no block moves twice), holes fill from the bottom, and the
// freed space gathers at the top of segments where it merges into one block;
// an expandable segment then unmaps its tail, and plain segments left wholly
// free go back on empty_cache(). This is the classic sliding compaction made
// safe for copy engines that do not support overlapping copies; it does not
// find the optimal packing (a bin-packing problem). Pinned (non-movable)
// blocks stay put and bound what can be gained.
CompactResult DevicePool::compact(const MoveFn& fn) {
  std::lock_guard lock(mu_);
  CompactResult r;
  drain_thread_caches();
  flush_cache();  // coalesced free space: holes are real blocks to move into
  r.free_bytes_before = total_free();
  r.largest_free_before = largest_free();
  r.fragmentation_before = fragmentation(r.largest_free_before, r.free_bytes_before);
  std::uint64_t reserved_before = st_.reserved_bytes;

  std::vector<PoolBlock*> movable;
  for (auto& s : segments_) {
    for (PoolBlock* b = s->head; b; b = b->next) {
      if (b->allocated && b->held() && b->movable.load(std::memory_order_relaxed)) {
        movable.push_back(b);
      }
    }
  }
  std::sort(movable.begin(), movable.end(),
            [](const PoolBlock* a, const PoolBlock* b) { return a->ptr > b->ptr; });
  for (PoolBlock* src : movable) {
    Kind k = static_cast<Segment*>(src->segment)->kind;
    PoolBlock* hole = nullptr;
    free_[k].for_each([&](PoolBlock* f) {
      if (f->size >= src->size && f->ptr < src->ptr && (!hole || f->ptr < hole->ptr)) hole = f;
    });
    if (!hole) continue;
    erase_free(hole);
    if (hole->size > src->size) split(hole, src->size);
    PoolAllocation from{as_ptr(src->ptr), src->size, src->requested, src,
                        src->generation.load(std::memory_order_relaxed)};
    PoolAllocation to;
    hand_out(hole, src->requested, true, src->owner, &to);
    if (!fn(PoolMove{src->owner, from, to})) {
      ++r.refused;
      release_block(hole, false);
      continue;
    }
    ++r.moves;
    r.moved_bytes += src->size;
    release_block(src, false);
  }
  st_.moves += r.moves;
  st_.moved_bytes += r.moved_bytes;
  r.released_bytes = reserved_before - st_.reserved_bytes;
  r.free_bytes_after = total_free();
  r.largest_free_after = largest_free();
  r.fragmentation_after = fragmentation(r.largest_free_after, r.free_bytes_after);
  return r;
}

PoolStats DevicePool::stats() const {
  std::lock_guard lock(mu_);
  PoolStats s = st_;
  std::int64_t allocated = 0;
  for (const auto& c : caches_) {
    allocated += c->allocated_delta();
    s.alloc_count += get(c->pops);
    s.free_count += get(c->pops) + get(c->drained_blocks);  // + what it holds, counted below
    s.thread_cached_bytes += c->cached_bytes();
    s.peak_allocated_bytes =
        std::max(s.peak_allocated_bytes, static_cast<std::uint64_t>(c->peak_candidate()));
  }
  // Counted, not tracked (Note [Thread cache], "Figures"): a held block has
  // an odd generation; an allocated one with an even generation sits in a
  // thread cache, where a free put it.
  for (const auto& seg : segments_) {
    for (const PoolBlock* b = seg->head; b; b = b->next) {
      if (!b->allocated) continue;
      if (b->held()) {
        ++s.active_blocks;
        s.requested_bytes += b->requested.load(std::memory_order_relaxed);
      } else {
        ++s.free_count;
      }
    }
  }
  s.allocated_bytes += static_cast<std::uint64_t>(allocated);
  s.peak_allocated_bytes = std::max(s.peak_allocated_bytes, s.allocated_bytes);
  s.thread_caches = caches_.size();
  s.segments = segments_.size();
  s.free_blocks = free_runs(&s.largest_free_bytes);
  s.free_bytes = total_free();
  s.fragmentation = fragmentation(s.largest_free_bytes, s.free_bytes);
  return s;
}

void DevicePool::reset_peaks() {
  std::lock_guard lock(mu_);
  std::int64_t delta = thread_allocated_delta();
  std::uint64_t now = st_.allocated_bytes + static_cast<std::uint64_t>(delta);
  st_.peak_allocated_bytes = now;
  st_.peak_reserved_bytes = st_.reserved_bytes;
  for (const auto& c : caches_) {  // an estimate if their owners pop meanwhile
    std::int64_t d = c->allocated_delta();
    c->base.store(static_cast<std::int64_t>(now) - d, std::memory_order_relaxed);
    c->high_room.store(get(c->room), std::memory_order_relaxed);
  }
}

std::vector<BlockInfo> DevicePool::snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<const Segment*> segs;
  for (const auto& s : segments_) segs.push_back(s.get());
  std::sort(segs.begin(), segs.end(),
            [](const Segment* a, const Segment* b) { return a->base < b->base; });
  std::vector<BlockInfo> out;
  for (std::size_t i = 0; i < segs.size(); ++i) {
    for (const PoolBlock* b = segs[i]->head; b; b = b->next) {
      bool free = b->free_now();
      bool merge = free && b->prev && b->prev->free_now();  // a cached block's run
      if (merge) {
        out.back().size += b->size;
      } else {
        out.push_back(BlockInfo{b->ptr, b->size, !free, b->movable.load(std::memory_order_relaxed),
                                segs[i]->kind == kSmall, segs[i]->expandable, i});
      }
    }
  }
  return out;
}

}  // namespace u3m::mem
