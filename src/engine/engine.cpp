#include "u3m/engine/engine.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::engine {

// Note [One move at a time]
// A tensor has at most one transfer in flight, and a transfer only reads its
// source copy: readers may keep using the source while it is copied, a writer
// may not (the copy would capture a torn state), and nobody sees the
// destination until the transfer is confirmed. That is the whole of the
// pending read/write tracking: no copy can race another, or race compute.
//
// Note [Flags are the truth, jobs are hints]
// What a tensor needs is kept on the tensor: tiers that blocked acquirers or
// prefetches want a copy in, and tiers it should leave. Queued jobs only say
// "look at this tensor on this link"; a job found stale when its link frees
// (the tensor moved, was written, was removed) is dropped, and every
// completion and release re-derives the jobs still needed from the flags.
// So nothing is lost when a job is dropped, and nothing dangles.
//
// Note [Upper copy until the lower is confirmed]
// Eviction never frees the only copy first. A dirty device copy is written to
// host (a dirty host copy to SSD), and the upper copy is freed only when the
// transfer completes ok. A failed write-back (EIO, ENOSPC, a short write)
// leaves the upper copy valid, counts the error and backs the tensor off
// from eviction for a while, doubling on each failure, so a sick disk cannot
// spin the engine. A clean copy (a lower tier is valid too) is dropped at
// once, unless that lower copy is on the SSD tier alone and has not checked
// out lately (Note [Verified before dropped]).
//
// Note [Verified before dropped]
// An SSD copy can go bad after it was written: a lost or misdirected write
// the device acknowledged, a torn write, corruption at rest. The store reads
// every put back before it installs it (mem::SsdStoreOptions::verify_writes),
// so a write-back that completes ok left a copy that checked out, and so does
// a fetch that read it whole. Entry::ssd_verified_ns keeps when that last
// happened. Dropping a clean upper copy makes the SSD copy the only one, so
// it is done at once only if that copy checked out within
// EngineConfig::ssd_verify_max_age_ns; otherwise a verify job reads it back on
// the s2h link first (write-back priority: it is part of an eviction). If the
// check fails, the SSD copy goes, the upper copy stays as the only one, and a
// later eviction writes it back (a repair). The exposure left is corruption
// at rest of a copy within the age limit, or after its upper copy went: the
// store's scrubber finds those, and the engine then reports the tensor lost
// (ssd_copy_failed) instead of serving bad bytes.

namespace {
constexpr std::uint8_t bit(Tier t) {
  return static_cast<std::uint8_t>(1u << static_cast<int>(t));
}
constexpr int idx(Tier t) {
  return static_cast<int>(t);
}
constexpr std::uint8_t kNoPrio = 255;
}  // namespace

Tier link_src(Link l) {
  switch (l) {
    case Link::d2h:
      return Tier::device;
    case Link::h2d:
      return Tier::host;
    case Link::h2s:
      return Tier::host;
    case Link::s2h:
      return Tier::ssd;
  }
  return Tier::host;
}
Tier link_dst(Link l) {
  switch (l) {
    case Link::d2h:
      return Tier::host;
    case Link::h2d:
      return Tier::device;
    case Link::h2s:
      return Tier::ssd;
    case Link::s2h:
      return Tier::host;
  }
  return Tier::host;
}

std::string_view to_string(Priority p) {
  switch (p) {
    case Priority::demand:
      return "demand";
    case Priority::prefetch:
      return "prefetch";
    case Priority::writeback:
      return "writeback";
  }
  return "?";
}

void EngineConfig::validate() const {
  auto tier = [](const TierLimits& t, std::string_view name) {
    if (t.capacity == 0) input_error("engine config", "{}.capacity must be > 0", name);
    if (!(t.low_watermark > 0 && t.low_watermark <= t.high_watermark && t.high_watermark <= 1))
      input_error("engine config", "{}: need 0 < low_watermark <= high_watermark <= 1", name);
  };
  tier(device, "device");
  tier(host, "host");
  for (int i = 0; i < kNumLinks; ++i) {
    if (link_rate[i] < 0)
      input_error("engine config", "link_rate.{} must be >= 0", to_string(static_cast<Link>(i)));
    if (link_slots[i] == 0)
      input_error("engine config", "link_slots.{} must be > 0", to_string(static_cast<Link>(i)));
  }
}

// Note [Entry layout]
// The pressure scan walks the whole LRU list of a tier, reading a few fields
// of every copy (evictable(), the victim's id and size), and residency() is
// asked for many tensors per op by the policies. Those fields fill the first
// cache line of an over-aligned Entry, and entries are made in contiguous
// chunks (Engine::new_entry), so a scan touches one line per copy.
struct alignas(64) Engine::Entry {
  // -- first cache line: what the scan and residency() read
  Entry* lru_next[2] = {nullptr, nullptr};  // Engine::LruList, per memory tier
  TensorId id = 0;
  std::uint64_t bytes = 0;
  std::uint64_t backoff_until = 0;
  std::uint32_t readers[2] = {0, 0};
  std::uint32_t waiters[2] = {0, 0};  // blocked acquirers, per tier
  std::uint8_t valid = 0;             // bit per tier: holds the latest data
  std::uint8_t evict_want = 0;        // tiers the data should leave
  std::uint8_t prefetched = 0;        // copies a prefetch brought, not used yet
  bool writer = false;
  bool moving = false;  // Note [One move at a time]
  bool lost = false;
  bool ssd = false;           // an SSD entry exists
  bool moving_evict = false;  // the running transfer is an eviction ...
  // -- the rest
  Entry* lru_prev[2] = {nullptr, nullptr};
  void* ptr[2] = {nullptr, nullptr};  // device, host buffers
  mem::PoolAllocation dev{};
  Tier moving_from = Tier::host;   // ... out of this tier
  std::uint8_t prefetch_want = 0;  // tiers a prefetch asked for
  std::uint8_t demand_want = 0;    // tiers a try_acquire asked for (not yet granted)
  std::uint8_t claimed = 0;        // Note [Claimed copies]
  std::uint8_t queued_prio[3] = {kNoPrio, kNoPrio, kNoPrio};  // best queued job into a tier
  bool in_lru[2] = {false, false};
  Status error[2] = {Status::ok, Status::ok};  // the last failed fetch into a tier
  std::uint64_t error_gen[2] = {0, 0};         // bumped when error[] of that tier is set
  std::uint64_t backoff_ns = 0;
  std::uint64_t ssd_verified_ns =
      0;  // the SSD copy last checked out (Note [Verified before dropped])
  double score[2] = {0, 0};  // victim scores, per memory tier (Note [Published victim scores])

  bool has(Tier t) const { return valid & bit(t); }
  std::uint32_t total_readers() const { return readers[0] + readers[1]; }
  bool pinned(Tier t) const { return writer || (t != Tier::ssd && readers[idx(t)] > 0); }
};

// Note [Entry table]
// Every public call and every completion looks its tensor up by id, several
// times per simulated event, so the id -> Entry map is flat. Ids below a
// bound that grows with the table (4 per entry, 1024 at least) are indexed
// directly in a vector: the simulator numbers a trace's tensors 1..N, so all
// of its ids land there and a lookup is one load. Other ids (hashes, e.g.)
// go to an open-addressing table (linear probing, Fibonacci hashing of the
// id, at most half full, backward-shift deletion: no tombstones) instead of
// std::unordered_map's node per entry and modulo by a prime. When the direct
// range grows, the hashed ids it now covers move into it, so an id is in
// exactly one place. Entries live in arena_ and are recycled through spare_
// (a training step frees and re-adds its activations), so add() and
// remove() allocate nothing in steady state. The table is never iterated in
// an order that matters (only the destructor walks it), so the layout cannot
// change a decision. Note [Entry layout] says why entries come in chunks.

std::size_t Engine::EntryTable::home(TensorId id) const {
  return static_cast<std::size_t>((id * 0x9E3779B97F4A7C15ull) >> shift_);
}

Engine::Entry* Engine::EntryTable::find_hashed(TensorId id) const {
  if (hashed_ == 0) return nullptr;
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = home(id);; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (!s.e) return nullptr;
    if (s.id == id) return s.e;
  }
}

bool Engine::EntryTable::insert(TensorId id, Entry* e) {
  if (id >= dense_.size() && id < 4 * (size_ + 1) + 1024) grow_dense(id);
  if (id < dense_.size()) {
    if (dense_[id]) return false;
    dense_[id] = e;
    ++size_;
    return true;
  }
  if (!insert_hashed(id, e)) return false;
  ++size_;
  return true;
}

// Covers `id` directly (at least doubling the range) and moves the hashed ids
// the new range covers out of slots_.
void Engine::EntryTable::grow_dense(TensorId id) {
  const std::size_t n = std::max<std::size_t>({2 * dense_.size(), id + 1, 1024});
  dense_.resize(n, nullptr);
  if (hashed_ == 0) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.size(), Slot{});
  hashed_ = 0;
  for (const Slot& s : old) {
    if (!s.e) continue;
    if (s.id < n)
      dense_[s.id] = s.e;
    else
      insert_hashed(s.id, s.e);
  }
}

bool Engine::EntryTable::insert_hashed(TensorId id, Entry* e) {
  if (2 * (hashed_ + 1) > slots_.size()) grow();
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = home(id);; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (!s.e) {
      s = Slot{id, e};
      ++hashed_;
      return true;
    }
    if (s.id == id) return false;
  }
}

void Engine::EntryTable::erase(TensorId id) {
  if (id < dense_.size()) {
    if (dense_[id]) --size_;
    dense_[id] = nullptr;
    return;
  }
  if (hashed_ == 0) return;
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = home(id);
  for (;; i = (i + 1) & mask) {
    if (!slots_[i].e) return;
    if (slots_[i].id == id) break;
  }
  // Backward shift: pull later members of the probe run into the hole unless
  // their home lies cyclically in (hole, their slot].
  for (std::size_t j = (i + 1) & mask; slots_[j].e; j = (j + 1) & mask) {
    const std::size_t h = home(slots_[j].id);
    const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
    if (!stays) {
      slots_[i] = slots_[j];
      i = j;
    }
  }
  slots_[i] = Slot{};
  --hashed_;
  --size_;
}

void Engine::EntryTable::grow() {
  std::vector<Slot> old = std::move(slots_);
  const std::size_t n = old.empty() ? 64 : 2 * old.size();
  slots_.assign(n, Slot{});
  shift_ = 64 - static_cast<unsigned>(std::countr_zero(n));
  hashed_ = 0;
  for (const Slot& s : old) {
    if (s.e) insert_hashed(s.id, s.e);
  }
}

Engine::Entry* Engine::new_entry() {
  static_assert(offsetof(Entry, moving_evict) < 64, "Note [Entry layout]: the scan's fields");
  if (spare_.empty()) {
    if (arena_used_ == kArenaChunk || arena_.empty()) {
      arena_.push_back(std::make_unique<Entry[]>(kArenaChunk));
      arena_used_ = 0;
    }
    return &arena_.back()[arena_used_++];
  }
  Entry* e = spare_.back();
  spare_.pop_back();
  *e = Entry{};
  return e;
}

void Engine::recycle(Entry* e) {
  spare_.push_back(e);
}

Engine::Engine(EngineConfig config, mem::DevicePool& device_pool, mem::MemoryBackend& host,
               Transport& transport, const Clock& clock)
    : config_(config),
      pool_(device_pool),
      host_(host),
      transport_(transport),
      clock_(clock),
      monitor_(config.monitor) {
  config_.validate();
  high_[0] = config_.device.high_watermark * static_cast<double>(config_.device.capacity);
  high_[1] = config_.host.high_watermark * static_cast<double>(config_.host.capacity);
  transport_.set_completion([this](const Transfer& t, Status s) { on_done(t, s); });
}

Engine::~Engine() {
  drain();
  // A completion callback may still be returning (it released the lock and
  // is running its actions); wait for it before anything is torn down.
  while (callbacks_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  set_observer(nullptr);  // it reads the final stats before they go
  std::unique_lock lk(mu_);
  Actions act;
  entries_.for_each([&](Entry& e) {
    for (Tier t : {Tier::device, Tier::host, Tier::ssd}) free_copy(e, t, act);
  });
  entries_ = EntryTable{};
  lk.unlock();
  transport_.set_completion({});
}

// ---- bookkeeping ------------------------------------------------------------

void Engine::note_use(Tier t) {
  int i = idx(t);
  st_.used[i] = used_[i];
  st_.peak[i] = std::max(st_.peak[i], used_[i]);
  std::uint64_t cap = t == Tier::device ? config_.device.capacity
                      : t == Tier::host ? config_.host.capacity
                                        : 0;
  const std::uint64_t now = clock_.now_ns();
  monitor_.record(t, used_[i], cap, now);
  if (observer_) observer_->occupancy(observer_card_, t, used_[i], observer_s(now));
}

void Engine::count_eviction() {
  ++st_.evictions;
  // The only writer holds the lock: a plain store, read without it.
  evictions_.store(st_.evictions, std::memory_order_relaxed);
}

void Engine::lru_unlink(Entry& e, int i) {
  LruList& l = lru_[i];
  (e.lru_prev[i] ? e.lru_prev[i]->lru_next[i] : l.head) = e.lru_next[i];
  (e.lru_next[i] ? e.lru_next[i]->lru_prev[i] : l.tail) = e.lru_prev[i];
  e.lru_prev[i] = e.lru_next[i] = nullptr;
  e.in_lru[i] = false;
}

void Engine::touch(Entry& e, Tier t) {
  if (t == Tier::ssd) return;
  int i = idx(t);
  LruList& l = lru_[i];
  if (l.tail == &e) return;  // already the most recent
  if (e.in_lru[i]) lru_unlink(e, i);
  e.lru_prev[i] = l.tail;
  (l.tail ? l.tail->lru_next[i] : l.head) = &e;
  l.tail = &e;
  e.in_lru[i] = true;
}

bool Engine::allocate_copy(Entry& e, Tier t) {
  if (t == Tier::device) {
    if (e.ptr[0]) return true;
    mem::PoolAllocation a;
    if (used_[0] + e.bytes > config_.device.capacity ||
        !mem::ok(pool_.allocate(e.bytes, &a))) {
      short_[0] += e.bytes;
      return false;
    }
    e.dev = a;
    e.ptr[0] = a.ptr;
  } else if (t == Tier::host) {
    if (e.ptr[1]) return true;
    void* p = nullptr;
    if (used_[1] + e.bytes > config_.host.capacity || !mem::ok(host_.allocate(e.bytes, &p))) {
      short_[1] += e.bytes;
      return false;
    }
    e.ptr[1] = p;
  } else {
    return true;  // the SSD store allocates its own extents
  }
  used_[idx(t)] += e.bytes;
  note_use(t);
  return true;
}

void Engine::free_copy(Entry& e, Tier t, Actions& act) {
  e.valid &= static_cast<std::uint8_t>(~bit(t));
  e.prefetched &= static_cast<std::uint8_t>(~bit(t));
  if (t == Tier::ssd) {
    if (e.ssd) {
      // Under the lock, so a remove() then add() of the same id cannot have
      // this erase land on the new tensor's SSD copy (Transport::erase_ssd).
      transport_.erase_ssd(e.id);
      e.ssd = false;
      used_[2] -= e.bytes;
      note_use(Tier::ssd);
    }
    return;
  }
  int i = idx(t);
  if (!e.ptr[i]) return;
  if (t == Tier::device) {
    pool_.free(e.dev);
    e.dev = {};
  } else {
    host_.free(e.ptr[1]);
  }
  e.ptr[i] = nullptr;
  if (e.in_lru[i]) lru_unlink(e, i);
  used_[i] -= e.bytes;
  note_use(t);
}

void Engine::drop_stale(Entry& e, Tier keep, Actions& act) {
  for (Tier t : {Tier::device, Tier::host, Tier::ssd}) {
    if (t != keep) free_copy(e, t, act);
  }
}

// Note [Claimed copies]
// A copy fetched for a polling caller (try_acquire answered busy) lands
// while that caller is not asking: it asks again after the change. Until it
// asks, the engine does not take that copy as a victim, as it does not take
// a copy a blocked acquirer waits for (waiters); else a step's own fetches
// could evict each other for ever (each landing makes room for the next by
// dropping the last), and the no-progress rule would never see the cycle.
// With the claim, that cycle is a wait for room nobody can make, which the
// rule refuses (Note [No progress]). The claim ends at the tensor's next
// acquire in that tier; explicit evictions (evict(), a policy's demotion)
// ignore it.
//
// Evictable at `now`; a copy held back only by its write-back back-off
// lowers *retry_at to when it becomes evictable.
bool Engine::evictable(const Entry& e, Tier t, std::uint64_t now, std::uint64_t* retry_at) const {
  if (!e.has(t) || e.pinned(t) || e.moving || e.waiters[idx(t)] != 0) return false;
  if (e.claimed & bit(t)) return false;
  if (now < e.backoff_until) {
    *retry_at = std::min(*retry_at, e.backoff_until);
    return false;
  }
  return true;
}

// ---- scheduling -------------------------------------------------------------

void Engine::set_evict_want(Entry& e, Tier t, bool on) {
  if (t == Tier::ssd || static_cast<bool>(e.evict_want & bit(t)) == on) return;
  if (on) {
    e.evict_want |= bit(t);
    leaving_[idx(t)] += e.bytes;
  } else {
    e.evict_want &= static_cast<std::uint8_t>(~bit(t));
    leaving_[idx(t)] -= e.bytes;
    ++changes_;  // a candidate for eviction again
  }
}

void Engine::notify() {
  ++epoch_;
  cv_.notify_all();
}

// Re-derives the fetches a tensor still needs from its flags.
void Engine::rewant(Entry& e) {
  for (Tier w : {Tier::device, Tier::host}) {
    if (e.waiters[idx(w)] > 0 || (e.demand_want & bit(w)))
      want(e, w, Priority::demand);
    else if (e.prefetch_want & bit(w))
      want(e, w, Priority::prefetch);
  }
}

void Engine::enqueue(Entry& e, Link link, Tier to, bool evict, Priority prio) {
  auto p = static_cast<std::uint8_t>(prio);
  if (!evict) {
    if (e.queued_prio[idx(to)] <= p) return;  // already queued at least this urgently
    e.queued_prio[idx(to)] = p;
  }
  links_[static_cast<int>(link)].push_back(Job{prio, next_seq_++, e.id, to, evict, 0, e.bytes});
}

bool Engine::drop_clean(Entry& e, Tier t, Actions& act) {
  const Tier other = t == Tier::device ? Tier::host : Tier::device;
  if (!e.has(other) && !e.has(Tier::ssd)) return false;  // dirty
  const std::uint64_t now = clock_.now_ns();
  if (e.has(other) || now - e.ssd_verified_ns < config_.ssd_verify_max_age_ns) {
    free_copy(e, t, act);
    count_eviction();
    ++st_.clean_drops;
    return true;
  }
  // Note [Verified before dropped]: check the SSD copy first.
  set_evict_want(e, t, true);
  links_[static_cast<int>(Link::s2h)].push_back(
      Job{Priority::writeback, next_seq_++, e.id, t, true, 0, 0, /*verify=*/true});
  return true;
}

// The next hop toward `tier` for a copy, from the nearest valid tier.
void Engine::want(Entry& e, Tier tier, Priority prio) {
  if (e.has(tier) || e.lost) return;
  if (tier == Tier::device) {
    if (e.has(Tier::host))
      enqueue(e, Link::h2d, Tier::device, false, prio);
    else if (e.has(Tier::ssd))
      enqueue(e, Link::s2h, Tier::host, false, prio);
  } else if (tier == Tier::host) {
    if (e.has(Tier::device))
      enqueue(e, Link::d2h, Tier::host, false, prio);
    else if (e.has(Tier::ssd))
      enqueue(e, Link::s2h, Tier::host, false, prio);
  }
}

void Engine::evict_for_pressure(Tier t, Actions& act) {
  const TierLimits& lim = t == Tier::device ? config_.device : config_.host;
  const double cap = static_cast<double>(lim.capacity);
  const int i = idx(t);
  double load = pressure(t);
  if (load <= high_[i]) return;
  // Nothing changed since a scan that could evict nothing: do not rescan
  // (a tier that cannot shed, e.g. host without an SSD tier, would otherwise
  // be scanned at every call).
  // The clock is read once: a scan is one decision at one instant.
  const std::uint64_t now = clock_.now_ns();
  if (futile_[i] == changes_ && now < futile_retry_[i]) return;
  const std::uint64_t evictions_before = st_.evictions;
  const std::uint64_t leaving_before = leaving_[i];
  std::uint64_t retry_at = ~0ull;  // the earliest back-off that ends
  struct Futile {                  // records a scan that evicted nothing, however it returns
    Engine& eng;
    int i;
    std::uint64_t ev, lv;
    const std::uint64_t& retry_at;
    ~Futile() {
      if (eng.st_.evictions == ev && eng.leaving_[i] == lv) {
        eng.futile_[i] = eng.changes_;
        eng.futile_retry_[i] = retry_at;  // a back-off ending is a change too
      }
    }
  } futile{*this, i, evictions_before, leaving_before, retry_at};
  const double target = lim.low_watermark * cap;
  load -= static_cast<double>(leaving_[i]);  // already on their way out
  const Link out = t == Tier::device ? Link::d2h : Link::h2s;
  auto take = [&](Entry& e) {  // evicts e from t; false if it cannot leave
    // Clean: Note [Upper copy until the lower is confirmed].
    if (drop_clean(e, t, act)) return true;
    if (t == Tier::host && !transport_.has_ssd()) return false;  // nowhere to go
    set_evict_want(e, t, true);
    enqueue(e, out, link_dst(out), true, Priority::writeback);
    return true;
  };
  auto candidate = [&](const Entry& e) {
    if ((e.evict_want & bit(t)) || !evictable(e, t, now, &retry_at)) return false;
    // Host data with no other copy can leave only to an SSD tier.
    return t == Tier::device || transport_.has_ssd() || e.has(Tier::ssd) || e.has(Tier::device);
  };
  if (victim_order_ == VictimOrder::owner) return;
  if (victim_order_ == VictimOrder::lru) {
    // Least recently used first; copies a prefetch brought and nobody used
    // yet go only in a second pass: they are recent news, not old data, and
    // evicting them wastes the prefetch (found by the simulator's lookahead
    // runs: every prefetched copy was evicted before use).
    for (int pass = 0; pass < 2 && load > target; ++pass) {
      for (Entry* x = lru_[i].head; x && load > target;) {
        Entry& e = *x;
        x = x->lru_next[i];  // take() may unlink e
        if (pass == 0 && (e.prefetched & bit(t))) continue;
        if (candidate(e) && take(e)) load -= static_cast<double>(e.bytes);
      }
    }
    return;
  }
  // Note [Victim selection]
  // By score, ties to the least recently used: the order of a stable sort of
  // the candidates in LRU order, taken until the load is down to the target.
  // Most calls come while earlier evictions are still leaving, with nothing
  // more to take: then no score is asked for. The pass over the candidates
  // only finds when a write-back back-off ends (retry_at, for the futile-scan
  // memo), so it is skipped when no back-off can still be running. When
  // something must go, (score, LRU rank) is a strict order: the first copy
  // taken is the minimum, found while scoring; only if more must go does a
  // min-heap of the rest yield the sort's sequence, O(n + k log n) for the k
  // copies taken. (Half the scans take one copy: they skip the heap.)
  if (load <= target) {
    if (now < backoff_horizon_) {
      for (Entry* x = lru_[i].head; x; x = x->lru_next[i]) candidate(*x);
    }
    return;
  }
  victims_.clear();
  std::uint64_t rank = 0;
  std::size_t best = 0;  // index of the minimum in victims_
  for (Entry* x = lru_[i].head; x; x = x->lru_next[i]) {
    if (!candidate(*x)) continue;
    const double score = x->score[i];
    if (!(score < std::numeric_limits<double>::infinity())) continue;  // +inf or NaN: never
    // Strictly lower only: an equal score later in LRU order ranks after.
    if (!victims_.empty() && score < victims_[best].score) best = victims_.size();
    victims_.push_back({score, rank++, x});
  }
  if (victims_.empty()) return;
  {
    Entry& e = *victims_[best].e;
    if (take(e)) load -= static_cast<double>(e.bytes);
  }
  if (load <= target) return;
  victims_[best] = victims_.back();
  victims_.pop_back();
  auto later = [](const Victim& a, const Victim& b) {
    return a.score != b.score ? a.score > b.score : a.rank > b.rank;
  };
  std::make_heap(victims_.begin(), victims_.end(), later);
  for (auto end = victims_.end(); end != victims_.begin() && load > target; --end) {
    std::pop_heap(victims_.begin(), end, later);
    Entry& e = *(end - 1)->e;
    if (take(e)) load -= static_cast<double>(e.bytes);
  }
}

// Starts one job if it can; false when the link must wait (no space yet).
// Stale jobs count as started (they are dropped).
bool Engine::start_job(Link link, const Job& j, Actions& act) {
  Entry* found = find(j.id);
  if (!found) return true;
  Entry& e = *found;
  if (j.verify) return start_verify(e, j, act);
  const Tier from = link_src(link), to = link_dst(link);
  if (!j.evict && e.queued_prio[idx(j.to)] == static_cast<std::uint8_t>(j.prio))
    e.queued_prio[idx(j.to)] = kNoPrio;
  if (e.moving || e.writer || !e.has(from) || e.has(to) || e.lost) {
    // A dropped eviction clears its flag, unless this very eviction is the
    // transfer running now (its completion clears it): nothing re-derives
    // evictions, and a stuck flag would keep the copy from leaving for good.
    if (j.evict && !(e.moving && e.moving_evict && e.moving_from == from))
      set_evict_want(e, from, false);
    return true;  // stale; completion or release re-derives what is still needed
  }
  if (j.evict && (!(e.evict_want & bit(from)) || e.pinned(from))) {
    set_evict_want(e, from, false);
    return true;
  }
  if (!allocate_copy(e, to)) {
    // Keep the job at the head; pressure eviction makes room.
    if (!j.evict)
      e.queued_prio[idx(j.to)] =
          std::min<std::uint8_t>(e.queued_prio[idx(j.to)], static_cast<std::uint8_t>(j.prio));
    return false;
  }
  e.moving = true;
  e.moving_evict = j.evict;
  e.moving_from = from;
  Transfer t;
  t.ticket = next_ticket_++;
  t.tensor = e.id;
  t.link = link;
  t.bytes = e.bytes;
  t.src = from == Tier::ssd ? nullptr : e.ptr[idx(from)];
  t.dst = to == Tier::ssd ? nullptr : e.ptr[idx(to)];
  t.rate_limit = config_.link_rate[static_cast<int>(link)];
  running_.push_back(Running{t.ticket, j, link, from, clock_.now_ns()});
  ++links_[static_cast<int>(link)].in_flight;
  act.transfers.push_back(t);
  return true;
}

// A verify job (Note [Verified before dropped]): reads the SSD copy back,
// then drops the copy in j.to. Never waits for room: it lands nowhere.
bool Engine::start_verify(Entry& e, const Job& j, Actions& act) {
  const Tier drop = j.to;
  if (e.moving) {
    // Stale, unless this very job's transfer is running (its completion
    // clears the flag), as in start_job.
    if (!(e.moving_evict && e.moving_from == drop)) set_evict_want(e, drop, false);
    return true;
  }
  if (e.writer || e.lost || !e.has(Tier::ssd) || !e.has(drop) || !(e.evict_want & bit(drop)) ||
      e.pinned(drop) || e.waiters[idx(drop)] != 0) {
    set_evict_want(e, drop, false);
    return true;  // stale: the copy was used, written or dropped meanwhile
  }
  e.moving = true;
  e.moving_evict = true;
  e.moving_from = drop;
  Transfer t;
  t.ticket = next_ticket_++;
  t.tensor = e.id;
  t.link = Link::s2h;
  t.bytes = e.bytes;  // src and dst null: a read that only checks
  t.rate_limit = config_.link_rate[static_cast<int>(Link::s2h)];
  running_.push_back(Running{t.ticket, j, Link::s2h, drop, clock_.now_ns()});
  ++links_[static_cast<int>(Link::s2h)].in_flight;
  act.transfers.push_back(t);
  return true;
}

void Engine::count_failure(Status s) {
  switch (s) {
    case Status::io_error:
      ++st_.io_errors;
      break;
    case Status::no_space:
      ++st_.no_space;
      break;
    case Status::short_io:
      ++st_.short_io;
      break;
    case Status::corrupt:
      ++st_.corrupt_reads;
      break;
    case Status::device_failed:
      ++st_.device_errors;
      break;
    default:
      ++st_.io_errors;
      break;
  }
}

void Engine::mark_lost_if_gone(Entry& e) {
  if (e.valid == 0 && !e.lost) {
    e.lost = true;
    ++st_.lost_tensors;
    st_.lost_bytes += e.bytes;
  }
}

void Engine::ssd_copy_failed(TensorId id) {
  Actions act;
  {
    std::lock_guard lk(mu_);
    Entry* found = find(id);
    if (!found) return;
    Entry& e = *found;
    // A newer copy the store holds, or one being written (the flag is set
    // only once its put completes), is not the one that failed.
    if (!e.has(Tier::ssd) || transport_.ssd_holds(id)) return;
    ++st_.ssd_copies_failed;
    free_copy(e, Tier::ssd, act);
    mark_lost_if_gone(e);
    rewant(e);
    pump(act);
    notify();
  }
  run(act);
}

void Engine::pump(Actions& act) {
  // Two passes: allocations that failed in the first (short_) make the
  // second evict enough for them.
  for (int pass = 0; pass < 2; ++pass) {
    // Below the high watermark, the usual case, nothing is scanned.
    if (over_high(Tier::device)) evict_for_pressure(Tier::device, act);
    if (over_high(Tier::host)) evict_for_pressure(Tier::host, act);
    short_[0] = short_[1] = 0;
    for (int l = 0; l < kNumLinks; ++l) {
      LinkQueue& lq = links_[l];
      if (lq.empty()) continue;
      while (!lq.verify.empty() && lq.in_flight < config_.link_slots[l])
        start_job(static_cast<Link>(l), lq.pop(-1), act);  // never waits for room
      for (int p = 0; p < kNumPriorities && lq.in_flight < config_.link_slots[l];) {
        if (lq.q[p].empty()) {
          ++p;
          continue;
        }
        Job j = lq.pop(p);
        if (!start_job(static_cast<Link>(l), j, act)) {
          lq.push_front(j);
          break;  // strict priority: nothing lower overtakes a blocked job
        }
      }
    }
    if (short_[0] == 0 && short_[1] == 0) break;
  }
}

void Engine::run(Actions& act) {
  for (const Transfer& t : act.transfers) transport_.start(t);
  act = {};
}

void Engine::on_done(const Transfer& t, Status s) {
  // Counted so the destructor can wait for the tail of this call (run()
  // below) even after drain() saw nothing running.
  callbacks_.fetch_add(1, std::memory_order_acq_rel);
  struct Done {
    std::atomic<int>& n;
    ~Done() { n.fetch_sub(1, std::memory_order_acq_rel); }
  } done{callbacks_};
  Actions act;
  {
    std::lock_guard lk(mu_);
    auto rit = std::find_if(running_.begin(), running_.end(),
                            [&](const Running& x) { return x.ticket == t.ticket; });
    if (rit == running_.end()) return;
    Running r = *rit;
    *rit = running_.back();  // order does not matter: only looked up by ticket
    running_.pop_back();
    LinkStats& ls = st_.links[static_cast<int>(r.link)];
    --links_[static_cast<int>(r.link)].in_flight;
    const std::uint64_t end_ns = clock_.now_ns();
    ls.busy_ns += end_ns - r.start_ns;
    if (observer_)
      observer_->transfer({.card = observer_card_,
                           .link = r.link,
                           .priority = static_cast<std::uint8_t>(r.job.prio),
                           .bytes = t.bytes,
                           .start_s = observer_s(r.start_ns),
                           .end_s = observer_s(end_ns),
                           .ok = mem::ok(s)});
    Entry* found = find(t.tensor);
    if (!found) throw std::logic_error("Engine: a transfer completed for an unknown tensor");
    Entry& e = *found;
    e.moving = false;
    ++changes_;
    const Tier from = r.from, to = link_dst(r.link);
    if (r.job.verify) {
      // Note [Verified before dropped]: r.from is the copy to drop.
      set_evict_want(e, from, false);
      ++st_.ssd_verifies;
      if (mem::ok(s)) {
        ++ls.transfers;
        ls.bytes += t.bytes;
        ++ls.by_priority[static_cast<int>(r.job.prio)];
        e.ssd_verified_ns = clock_.now_ns();
        if (e.has(from) && e.has(Tier::ssd) && !e.pinned(from) && e.waiters[idx(from)] == 0) {
          free_copy(e, from, act);
          count_eviction();
          ++st_.clean_drops;
        }
      } else {
        ++ls.failures;
        ++st_.ssd_verify_failures;
        count_failure(s);
        // The SSD copy is bad: it goes, and the upper copy, now the only
        // one, stays until a write-back confirms a new lower copy.
        if (e.has(Tier::ssd)) free_copy(e, Tier::ssd, act);
      }
      rewant(e);
    } else if (mem::ok(s)) {
      ++ls.transfers;
      ls.bytes += t.bytes;
      ++ls.by_priority[static_cast<int>(r.job.prio)];
      e.valid |= bit(to);
      if (to == Tier::ssd && !e.ssd) {
        e.ssd = true;
        used_[2] += e.bytes;
        note_use(Tier::ssd);
      }
      // Written with read-back, or read whole: the SSD copy checked out.
      if (to == Tier::ssd || from == Tier::ssd) e.ssd_verified_ns = clock_.now_ns();
      touch(e, to);
      if (r.job.prio == Priority::prefetch) e.prefetched |= bit(to);
      e.prefetch_want &= static_cast<std::uint8_t>(~bit(to));
      // A polling caller that gave up must not keep the tensor on demand:
      // the next try_acquire asks again if the copy has left by then. Until
      // it asks, the copy is its claim (Note [Claimed copies]).
      if (e.demand_want & bit(to)) e.claimed |= bit(to);
      e.demand_want &= static_cast<std::uint8_t>(~bit(to));
      e.backoff_ns = 0;
      if (r.job.evict) {
        set_evict_want(e, from, false);
        if (!e.pinned(from) && e.waiters[idx(from)] == 0) {
          free_copy(e, from, act);
          count_eviction();
        }
      }
      // Next hop of a two-hop fetch (SSD -> host -> device), or a copy that
      // was wanted while this one ran.
      rewant(e);
    } else {
      ++ls.failures;
      // The store retired the copy (found corrupt by a scrub or another
      // read) after this read was asked for: the copy is gone, as if this
      // read had failed its checksum for good.
      if (s == Status::not_found && from == Tier::ssd && !r.job.verify) s = Status::corrupt;
      count_failure(s);
      if (to != Tier::ssd) free_copy(e, to, act);  // the half-filled destination
      const bool read_fault = (s == Status::corrupt || s == Status::io_error) && from == Tier::ssd;
      if (read_fault && r.job.attempt < config_.read_retries) {
        ++ls.retries;
        Job again = r.job;
        ++again.attempt;
        again.prio = Priority::demand;
        links_[static_cast<int>(r.link)].push_front(again);
        e.queued_prio[idx(to)] = 0;
      } else if (r.job.evict) {
        // Note [Upper copy until the lower is confirmed]: the source stays.
        set_evict_want(e, from, false);
        e.backoff_ns = e.backoff_ns ? std::min<std::uint64_t>(e.backoff_ns * 2, 1'000'000'000)
                                    : config_.failure_backoff_ns;
        e.backoff_until = clock_.now_ns() + e.backoff_ns;
        backoff_horizon_ = std::max(backoff_horizon_, e.backoff_until);
      } else {
        if (s == Status::corrupt && from == Tier::ssd && e.has(Tier::ssd)) {
          free_copy(e, Tier::ssd, act);  // a copy that keeps failing its checksum is gone
          ++st_.ssd_copies_failed;
        }
        mark_lost_if_gone(e);
        for (Tier w : {Tier::device, Tier::host}) {
          if (e.waiters[idx(w)] > 0 || (e.demand_want & bit(w))) {
            e.error[idx(w)] = s;  // a failed prefetch is only counted
            ++e.error_gen[idx(w)];
          }
        }
        e.prefetch_want = 0;
        e.demand_want = 0;
      }
    }
    pump(act);
    notify();
  }
  run(act);
}

// ---- the public calls -------------------------------------------------------

Status Engine::add(TensorId id, std::uint64_t bytes, Scores scores) {
  if (bytes == 0) return Status::invalid_argument;
  std::lock_guard lk(mu_);
  if (find(id)) return Status::invalid_argument;
  Entry* e = new_entry();
  e->id = id;
  e->bytes = bytes;
  e->score[0] = scores.device;
  e->score[1] = scores.host;
  entries_.insert(id, e);
  st_.tensors = entries_.size();
  return Status::ok;
}

Status Engine::remove(TensorId id) {
  Actions act;
  {
    std::lock_guard lk(mu_);
    Entry* found = find(id);
    if (!found) return Status::not_found;
    Entry& e = *found;
    if (e.moving || e.writer || e.total_readers() > 0 || e.waiters[0] || e.waiters[1])
      return Status::busy;
    set_evict_want(e, Tier::device, false);
    set_evict_want(e, Tier::host, false);
    for (Tier t : {Tier::device, Tier::host, Tier::ssd}) free_copy(e, t, act);
    entries_.erase(id);
    recycle(&e);
    st_.tensors = entries_.size();
    pump(act);
    notify();  // room was freed
  }
  run(act);
  return Status::ok;
}

bool Engine::grantable(const Entry& e, Tier tier, Access access) const {
  if (e.writer) return false;
  const bool fresh = e.valid == 0 && !e.lost;
  if (access == Access::read) return e.has(tier) || fresh;
  return (e.has(tier) || fresh) && e.total_readers() == 0 && !e.moving;
}

void Engine::grant(Entry& e, Tier tier, Access access, Lease* out, Actions& act) {
  const int i = idx(tier);
  if (access == Access::write) {
    e.writer = true;
    e.valid = bit(tier);
    drop_stale(e, tier, act);  // a write makes every other copy stale
    set_evict_want(e, Tier::device, false);
    set_evict_want(e, Tier::host, false);
  } else {
    ++e.readers[i];
    if (e.valid == 0) e.valid = bit(tier);  // fresh: this buffer is the data now
  }
  ++st_.acquires;
  if (e.prefetched & bit(tier)) {
    ++st_.prefetch_hits;
    e.prefetched &= static_cast<std::uint8_t>(~bit(tier));
  }
  touch(e, tier);
  const std::thread::id me = std::this_thread::get_id();
  Holder& h = holder(me);
  ++h.leases;
  h.bytes += e.bytes;
  ++leases_;
  if (h.waiting) ++waiting_leases_;
  *out = Lease{e.id, tier, access, e.ptr[i], e.bytes, me};
}

// Note [Blocking acquire]
// acquire() loops: grant if it can; else register as a waiter, schedule the
// demand fetch (or the eviction that makes room), run the transfers outside
// the lock, and sleep until the engine's epoch moves (any completion, release,
// removal or eviction). It gives up only when no progress is possible.
//
// Note [No progress]
// A waiting caller cannot make progress when nothing that could change the
// state is left: no transfer is running or startable, no write-back back-off
// is still running (its end makes a copy evictable again), and every lease is
// held by a holder that is itself waiting. Holders are threads: a lease
// counts as held by the thread that acquired it, and a thread blocked in
// acquire() or wait_for_change() cannot release its own leases, so an op that
// holds its first tensors and waits for room that only they occupy (the
// replay of a trace under a host budget smaller than a tensor, issue 14) is
// refused at once instead of waiting for ever. No timeout is involved: the
// decision is read off the leases, the queues and the tiers. Of several
// threads in a cycle only the one that closes it is refused: the others
// waited while it could still release, and once refused it is no longer
// waiting, so their view stays true. A thread that frees room without
// holding a lease (a remove() on another thread) is not foreseen: as with
// malloc, a tier full of data that cannot move is out of memory now. The
// caller gets out_of_memory (busy when the only thing in the way is a
// conflicting lease of its own), and last_failure() names the tensor, each
// tier's use against its capacity and the bytes the waiting callers hold.
namespace {
thread_local std::string t_last_failure;  // Engine::last_failure()
std::string mib(std::uint64_t b) {
  return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1024.0 * 1024.0));
}
}  // namespace

const std::string& Engine::last_failure() {
  return t_last_failure;
}

class Engine::Waiting {
 public:
  explicit Waiting(Engine& eng) : eng_(eng) {}
  ~Waiting() { set(false); }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;
  void set(bool on) {  // under the engine's lock
    if (on == on_) return;
    on_ = on;
    const std::thread::id me = std::this_thread::get_id();
    Holder& h = eng_.holder(me);
    h.waiting = on;
    if (on)
      eng_.waiting_leases_ += h.leases;
    else
      eng_.waiting_leases_ -= h.leases;
    if (!on) eng_.drop_holder_if_idle(me);
  }

 private:
  Engine& eng_;
  bool on_ = false;
};

Engine::Holder& Engine::holder(std::thread::id tid) {
  for (Holder& h : holders_)
    if (h.tid == tid) return h;
  holders_.push_back(Holder{tid});
  return holders_.back();
}

void Engine::drop_holder_if_idle(std::thread::id tid) {
  for (std::size_t k = 0; k < holders_.size(); ++k) {
    Holder& h = holders_[k];
    if (h.tid != tid) continue;
    if (h.leases == 0 && !h.waiting) {
      h = holders_.back();
      holders_.pop_back();
    }
    return;
  }
}

bool Engine::can_change(std::uint64_t now, std::uint64_t* wake_at) const {
  if (!running_.empty()) return true;          // a completion will come
  if (leases_ > waiting_leases_) return true;  // someone not waiting may release
  if (now < backoff_horizon_) {                // a back-off may still end
    *wake_at = std::min(*wake_at, backoff_horizon_);
    return true;
  }
  return false;
}

bool Engine::rescan(Actions& act) {
  const std::uint64_t evictions_before = st_.evictions;
  const std::size_t started = act.transfers.size();
  // The futile-scan memo is only a shortcut: before concluding anything,
  // scan every tier afresh once.
  futile_[0] = futile_[1] = ~0ull;
  pump(act);
  return act.transfers.size() != started || st_.evictions != evictions_before;
}

void Engine::sleep_for_change(std::unique_lock<std::mutex>& lk, std::uint64_t seen,
                              std::uint64_t wake_at) {
  auto changed = [&] { return epoch_ != seen; };
  if (wake_at == ~0ull) {
    cv_.wait(lk, changed);
    return;
  }
  // A back-off ends on the engine's clock, which may be a test's manual
  // clock: poll it at most every millisecond while one is pending.
  const std::uint64_t now = clock_.now_ns();
  const std::uint64_t dt = wake_at > now ? std::min<std::uint64_t>(wake_at - now, 1'000'000) : 0;
  cv_.wait_for(lk, std::chrono::nanoseconds(dt), changed);
}

std::string Engine::describe_stuck(const Entry* e, Tier tier) const {
  std::uint64_t mine = 0, waiting_bytes = 0;
  const std::thread::id me = std::this_thread::get_id();
  for (const Holder& h : holders_) {
    if (h.tid == me) mine = h.bytes;
    if (h.waiting) waiting_bytes += h.bytes;
  }
  std::string what = e ? fmt::format("tensor {} ({}) cannot get into {}", e->id, mib(e->bytes),
                                     mem::to_string(tier))
                       : std::string("the waiting caller cannot go on");
  return fmt::format(
      "{}: no progress is possible: device {} of {} used, host {} of {} used, {}; "
      "{} held by the waiting caller's own leases ({} by all waiting callers), "
      "nothing in flight and nothing left to evict",
      what, mib(used_[0]), mib(config_.device.capacity), mib(used_[1]), mib(config_.host.capacity),
      transport_.has_ssd() ? fmt::format("ssd {} used", mib(used_[2])) : std::string("no SSD tier"),
      mib(mine), mib(waiting_bytes));
}

Status Engine::acquire_locked(std::unique_lock<std::mutex>& lk, Entry& e, Tier tier, Access access,
                              Lease* out, bool block, Actions& act) {
  const int i = idx(tier);
  e.claimed &= static_cast<std::uint8_t>(~bit(tier));  // asked again: Note [Claimed copies]
  const std::uint64_t gen = e.error_gen[i];
  const std::uint64_t t0 = clock_.now_ns();
  bool waited = false, counted_waiter = false;
  Status result = Status::ok;
  Waiting waiting(*this);
  for (;;) {
    // A fetch failed for this tier: a blocked caller sees the failures that
    // happened while it waited; a polling caller sees the one it asked for.
    if (e.error[i] != Status::ok && (!block || e.error_gen[i] != gen)) {
      result = e.error[i];
      if (!block || e.waiters[i] <= (counted_waiter ? 1u : 0u)) e.error[i] = Status::ok;
      break;
    }
    if (e.lost) {
      result = Status::corrupt;
      break;
    }
    if (grantable(e, tier, access) && allocate_copy(e, tier)) {
      grant(e, tier, access, out, act);
      e.demand_want &= static_cast<std::uint8_t>(~bit(tier));
      // Granted: a claim set while this call waited (its own fetch landed,
      // after an earlier try_acquire) ends here too, or the copy would stay
      // unevictable until some later ask (Note [Claimed copies]).
      e.claimed &= static_cast<std::uint8_t>(~bit(tier));
      e.error[i] = Status::ok;  // an old failure must not fail a later caller
      waited ? ++st_.misses : ++st_.hits;
      ++(waited ? st_.misses_by_tier : st_.hits_by_tier)[i];
      break;
    }
    if (!counted_waiter) {
      ++e.waiters[i];
      counted_waiter = true;
    }
    want(e, tier, Priority::demand);
    const std::uint64_t evictions_before = st_.evictions;
    pump(act);
    if (!block) {
      e.demand_want |= bit(tier);
      result = Status::busy;
      break;
    }
    waiting.set(true);
    std::uint64_t wake_at = ~0ull;
    bool evicted = st_.evictions != evictions_before;
    if (act.transfers.empty() && !evicted && !can_change(clock_.now_ns(), &wake_at)) {
      evicted = rescan(act) && act.transfers.empty();
      if (!evicted && act.transfers.empty()) {
        const bool in_the_way = e.has(tier) && !grantable(e, tier, access);
        result = in_the_way ? Status::busy : Status::out_of_memory;
        if (!in_the_way) ++st_.oom;
        t_last_failure = in_the_way
                             ? fmt::format(
                                   "tensor {} ({}): a conflicting lease of the waiting caller "
                                   "itself is in the way, so it would wait for ever",
                                   e.id, mib(e.bytes))
                             : describe_stuck(&e, tier);
        break;
      }
    }
    // Room made without a transfer (clean copies dropped): no completion
    // will come to wake us, so try again at once.
    if (evicted && act.transfers.empty()) continue;
    const std::uint64_t epoch = epoch_;
    lk.unlock();
    run(act);
    lk.lock();
    waited = true;
    sleep_for_change(lk, epoch, wake_at);
  }
  if (counted_waiter && --e.waiters[i] == 0) ++changes_;  // no longer held by a waiter
  if (waited) st_.stall_ns += clock_.now_ns() - t0;
  return result;
}

std::uint64_t Engine::epoch() const {
  std::lock_guard lk(mu_);
  return epoch_;
}

Status Engine::wait_for_change(std::uint64_t seen) {
  Actions act;
  Status result = Status::ok;
  {
    std::unique_lock lk(mu_);
    Waiting waiting(*this);
    waiting.set(true);
    while (epoch_ == seen) {
      std::uint64_t wake_at = ~0ull;
      if (!can_change(clock_.now_ns(), &wake_at)) {
        result = nothing_changes(act);
        break;
      }
      sleep_for_change(lk, seen, wake_at);
    }
  }
  run(act);
  return result;
}

// Nothing changes by itself any more: a rescan may still start or evict
// something (a change of its own); if not, nothing ever will.
Status Engine::nothing_changes(Actions& act) {
  if (rescan(act)) {
    notify();
    return Status::ok;
  }
  ++st_.oom;
  t_last_failure = describe_stuck(nullptr, Tier::device);
  return Status::out_of_memory;
}

Status Engine::check_progress(std::uint64_t* wake_at) {
  Actions act;
  Status result = Status::ok;
  {
    std::unique_lock lk(mu_);
    Waiting waiting(*this);
    waiting.set(true);
    std::uint64_t at = ~0ull;
    if (!can_change(clock_.now_ns(), &at)) result = nothing_changes(act);
    if (wake_at) *wake_at = at;
  }
  run(act);
  return result;
}

Status Engine::acquire(TensorId id, Tier tier, Access access, Lease* out) {
  return acquire_entry(id, tier, access, out, /*block=*/true);
}

Status Engine::try_acquire(TensorId id, Tier tier, Access access, Lease* out) {
  return acquire_entry(id, tier, access, out, /*block=*/false);
}

Status Engine::acquire_entry(TensorId id, Tier tier, Access access, Lease* out, bool block) {
  if (!out || tier == Tier::ssd) return Status::invalid_argument;
  Actions act;
  Status s;
  {
    std::unique_lock lk(mu_);
    Entry* e = find(id);
    if (!e) return Status::not_found;
    s = acquire_locked(lk, *e, tier, access, out, block, act);
  }
  run(act);
  return s;
}

Status Engine::release(const Lease& lease) {
  Actions act;
  {
    std::lock_guard lk(mu_);
    Entry* found = find(lease.id);
    if (!found) return Status::not_found;
    Entry& e = *found;
    const int i = idx(lease.tier);
    auto h = std::find_if(holders_.begin(), holders_.end(),
                          [&](const Holder& x) { return x.tid == lease.holder; });
    if (h == holders_.end() || h->leases == 0) return Status::invalid_argument;  // not a lease
    if (lease.access == Access::write) {
      if (!e.writer || !e.has(lease.tier)) return Status::invalid_argument;
      e.writer = false;
    } else {
      if (lease.tier == Tier::ssd || e.readers[i] == 0) return Status::invalid_argument;
      --e.readers[i];
    }
    --h->leases;
    h->bytes -= std::min(h->bytes, lease.bytes);
    --leases_;
    if (h->waiting) --waiting_leases_;
    drop_holder_if_idle(lease.holder);
    touch(e, lease.tier);
    ++changes_;  // a released copy may be evictable now
    rewant(e);
    pump(act);
    notify();
  }
  run(act);
  return Status::ok;
}

Status Engine::prefetch(TensorId id, Tier tier) {
  if (tier == Tier::ssd) return Status::invalid_argument;
  Actions act;
  {
    std::lock_guard lk(mu_);
    Entry* found = find(id);
    if (!found) return Status::not_found;
    Entry& e = *found;
    if (e.has(tier) || e.valid == 0) return Status::ok;  // nothing to bring
    e.prefetch_want |= bit(tier);
    ++st_.prefetches;
    want(e, tier, Priority::prefetch);
    pump(act);
  }
  run(act);
  return Status::ok;
}

Status Engine::evict(TensorId id, Tier from) {
  if (from == Tier::ssd) return Status::invalid_argument;
  Actions act;
  {
    std::lock_guard lk(mu_);
    Entry* found = find(id);
    if (!found) return Status::not_found;
    Entry& e = *found;
    if (!e.has(from)) return Status::ok;
    if (e.pinned(from) || e.moving) return Status::busy;
    if (e.evict_want & bit(from)) return Status::ok;  // already leaving
    if (!drop_clean(e, from, act)) {
      if (from == Tier::host && !transport_.has_ssd()) return Status::unsupported;
      set_evict_want(e, from, true);
      Link out = from == Tier::device ? Link::d2h : Link::h2s;
      enqueue(e, out, link_dst(out), true, Priority::writeback);
    }
    pump(act);
    notify();  // room may have been freed
  }
  run(act);
  return Status::ok;
}

// pump() starts every job that can start after each change, so once nothing
// runs, what is still queued waits for a release (room or a lease).
void Engine::set_victim_order(VictimOrder order) {
  std::lock_guard lk(mu_);
  victim_order_ = order;
  ++changes_;  // copies the old order kept may be evictable now
  notify();
}

// Scores take effect at the next pressure scan (the next acquire, release or
// completion), not here: publishing is the policy's bookkeeping, and a scan
// of its own would move evictions ahead of where the driver's next call
// makes them.
void Engine::publish_scores(std::span<const ScoreUpdate> updates) {
  std::lock_guard lk(mu_);
  bool lowered = false;
  for (const ScoreUpdate& u : updates) {
    Entry* e = find(u.id);
    if (!e) continue;
    lowered = lowered || !(u.scores.device >= e->score[0]) || !(u.scores.host >= e->score[1]);
    e->score[0] = u.scores.device;
    e->score[1] = u.scores.host;
  }
  if (lowered && victim_order_ == VictimOrder::scores) {
    ++changes_;  // a copy the old scores kept may be a victim now
    notify();
  }
}

void Engine::drain() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return running_.empty(); });
}

void Engine::set_link_rate(Link link, double bytes_per_s) {
  std::lock_guard lk(mu_);
  config_.link_rate[static_cast<int>(link)] = std::max(0.0, bytes_per_s);
}

std::optional<Residency> Engine::residency(TensorId id) const {
  std::lock_guard lk(mu_);
  const Entry* found = find(id);
  if (!found) return std::nullopt;
  const Entry& e = *found;
  Residency r;
  for (Tier t : {Tier::device, Tier::host, Tier::ssd}) r.valid[idx(t)] = e.has(t);
  r.in_flight = e.moving;
  r.readers = e.total_readers();
  r.writer = e.writer;
  r.lost = e.lost;
  for (Tier t : {Tier::device, Tier::host}) r.leaving[idx(t)] = (e.evict_want & bit(t)) != 0;
  return r;
}

EngineStats Engine::stats() const {
  std::lock_guard lk(mu_);
  return st_;
}

// Lock-free: the simulator asks after every pass over a step's tensors.
std::uint64_t Engine::evictions() const {
  return evictions_.load(std::memory_order_relaxed);
}

mem::TierReport Engine::monitor(Tier t) const {
  std::lock_guard lk(mu_);
  return monitor_.report(t);
}

void Engine::on_alert(mem::AlertFn fn) {
  std::lock_guard lk(mu_);
  monitor_.on_alert(std::move(fn));
}

void Engine::set_observer(RunObserver* observer, int card, std::uint64_t origin_ns) {
  RunObserver* old = nullptr;
  int old_card = 0;
  {
    std::lock_guard lk(mu_);
    old = std::exchange(observer_, observer);
    old_card = std::exchange(observer_card_, card);
    observer_origin_ns_ = origin_ns;
  }
  // Outside the lock: an observer reads stats() and monitor() from here on.
  if (old) old->detached(old_card, *this);
  if (observer) observer->attached(card, *this);
}

}  // namespace u3m::engine
