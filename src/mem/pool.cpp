// The caching pool allocator (DevicePool): blocks, segments, allocation and
// free, the pool cache and the figures. The pool makes no OS calls: memory
// comes from a SegmentSource (segment_sources.cpp); its free blocks sit in a
// FreeIndex (free_index.cpp); its configuration is pool_config.cpp.
#include "u3m/mem/pool.hpp"

#include <algorithm>
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
// grows and before empty_cache(), so caching never costs memory. In an
// expandable range a block next to the free tail is not cached, so the tail
// is still unmapped at once.
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
// Holes below the highest live block stay mapped until best fit reuses them:
// the pool never moves a live block (docs/memory.md, "What the pool leaves
// out", measured why compaction would not pay under the engine).

double fragmentation(std::uint64_t largest_free, std::uint64_t total_free) {
  if (total_free == 0) return 0;
  return 1.0 - static_cast<double>(largest_free) / static_cast<double>(total_free);
}

void SpinLock::yield() noexcept {
  std::this_thread::yield();
}

DevicePool::DevicePool(SegmentSource& source, PoolConfig config)
    : source_(source),
      config_(config),
      granularity_(std::max<std::uint64_t>(source.granularity(), 1)),
      expandable_(config.expandable_segments) {
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
  std::lock_guard lock(mu_);
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
    b->requested = 0;
    b->prev = b->next = nullptr;
    b->allocated = b->cached = false;
    b->cache_slot = 0;
  } else {
    b = &block_storage_.emplace_back();
    b->pool = this;
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
  return free_bytes_[0] + free_bytes_[1] + cached_bytes_;
}

std::uint64_t DevicePool::free_runs(std::uint64_t* largest) const {
  std::uint64_t runs = 0, m = 0;
  if (cache_.empty()) {  // coalesced: each free block is a run
    for (const FreeSet& f : free_) {
      if (const PoolBlock* b = f.largest()) m = std::max(m, b->size);
      runs += f.size();
    }
  } else {
    for (const auto& s : segments_) {
      std::uint64_t run = 0;
      for (const PoolBlock* b = s->head; b; b = b->next) {
        bool free = !b->allocated;
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

void DevicePool::hand_out(PoolBlock* b, std::uint64_t requested, PoolAllocation* out) {
  b->allocated = true;
  b->requested = requested;
  ++b->generation;  // odd: held
  st_.allocated_bytes += b->size;
  st_.requested_bytes += requested;
  ++st_.active_blocks;
  st_.peak_allocated_bytes = std::max(st_.peak_allocated_bytes, st_.allocated_bytes);
  *out = PoolAllocation{as_ptr(b->ptr), b->size, requested, b, b->generation};
}

Status DevicePool::allocate(std::uint64_t bytes, PoolAllocation* out) {
  if (out == nullptr || bytes == 0) return Status::invalid_argument;
  // alignment is a power of two (validate()): a mask, not a division.
  const std::uint64_t mask = config_.alignment - 1;
  if (bytes > std::numeric_limits<std::uint64_t>::max() - mask) return Status::out_of_memory;
  const std::uint64_t size = (bytes + mask) & ~mask;
  Kind k = kind_of(size);
  std::lock_guard lock(mu_);
  if (PoolBlock* c = cache_.empty() ? nullptr : pop_cached(size)) {
    hand_out(c, bytes, out);
    ++st_.alloc_count;
    return Status::ok;
  }
  PoolBlock* b = best_fit(k, size);
  if (!b && !cache_.empty()) {
    flush_cache();  // cached blocks must not make the pool grow (Note [Fast path])
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
  hand_out(b, bytes, out);
  ++st_.alloc_count;
  return Status::ok;
}

bool DevicePool::live(const PoolAllocation& a) const {
  // Blocks are never deallocated (only recycled within their pool), so
  // reading a stale handle's block is safe; the generation, odd while
  // allocated, tells a stale handle from a live one.
  const PoolBlock* b = a.block;
  return b && b->pool == this && (a.generation & 1) && b->generation == a.generation &&
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

void DevicePool::release_block(PoolBlock* b) {
  ++b->generation;  // even: every handle to it is stale now
  st_.allocated_bytes -= b->size;
  st_.requested_bytes -= b->requested;
  --st_.active_blocks;
  b->allocated = false;
  auto* s = static_cast<Segment*>(b->segment);
  if (cache_.size() < config_.fast_cache_blocks &&
      !(s->expandable && (!b->next || !b->next->allocated))) {
    b->cached = true;
    b->cache_slot = static_cast<std::uint32_t>(cache_.size());
    cache_.push_back(b);
    cached_bytes_ += b->size;
    return;
  }
  b = coalesce(b);
  insert_free(b);
  if (s->expandable && b == s->tail) trim_tail(s, config_.expandable_keep);
}

Status DevicePool::free(const PoolAllocation& a) {
  std::lock_guard lock(mu_);
  if (!live(a)) return Status::invalid_argument;
  release_block(a.block);
  ++st_.free_count;
  return Status::ok;
}

void DevicePool::destroy_segment(Segment* s) {
  for (PoolBlock* b = s->head; b;) {
    PoolBlock* n = b->next;
    if (!b->allocated) {
      erase_free(b);
    } else {
      // Freed with live blocks (pool destroyed): the handles become stale.
      st_.allocated_bytes -= b->size;
      st_.requested_bytes -= b->requested;
      --st_.active_blocks;
      ++b->generation;
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

PoolStats DevicePool::stats() const {
  std::lock_guard lock(mu_);
  PoolStats s = st_;
  s.segments = segments_.size();
  s.free_blocks = free_runs(&s.largest_free_bytes);
  s.free_bytes = total_free();
  s.fragmentation = fragmentation(s.largest_free_bytes, s.free_bytes);
  return s;
}

void DevicePool::reset_peaks() {
  std::lock_guard lock(mu_);
  st_.peak_allocated_bytes = st_.allocated_bytes;
  st_.peak_reserved_bytes = st_.reserved_bytes;
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
      bool free = !b->allocated;
      bool merge = free && b->prev && !b->prev->allocated;  // a cached block's run
      if (merge) {
        out.back().size += b->size;
      } else {
        out.push_back(
            BlockInfo{b->ptr, b->size, !free, segs[i]->kind == kSmall, segs[i]->expandable, i});
      }
    }
  }
  return out;
}

}  // namespace u3m::mem
