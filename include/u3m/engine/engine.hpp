// The runtime: a registry of tensors, where each one lives (device, host,
// SSD), and the migrations that move them. Compute calls acquire() before it
// touches a tensor and release() after; the pointer is valid in between and
// no migration ever races it. docs/runtime.md describes the design; the
// Note [...] blocks in engine.cpp give the reasons.
//
// The engine is decision code: it reads time only from a Clock, allocates
// device memory from a DevicePool and host memory from a MemoryBackend, and
// moves bytes only through a Transport. Real runs plug in wall time, the
// device-emu/host backends and BackendTransport; the simulator plugs in a
// virtual clock, a pool over fake addresses and a modelled transport.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <span>
#include <vector>

#include "u3m/engine/clock.hpp"
#include "u3m/engine/run_observer.hpp"
#include "u3m/engine/transport.hpp"
#include "u3m/mem/backend.hpp"
#include "u3m/mem/monitor.hpp"
#include "u3m/mem/pool.hpp"

namespace u3m::engine {

using TensorId = std::uint64_t;

enum class Access : std::uint8_t { read, write };
// Lower value = served first on a link.
enum class Priority : std::uint8_t { demand = 0, prefetch = 1, writeback = 2 };
inline constexpr int kNumPriorities = 3;
std::string_view to_string(Priority p);
// The tiers a link moves data from and to (d2h: device to host, ...).
Tier link_src(Link l);
Tier link_dst(Link l);

struct TierLimits {
  std::uint64_t capacity = 0;    // bytes the engine may keep in the tier (device, host > 0)
  double high_watermark = 0.90;  // start evicting above this fraction ...
  double low_watermark = 0.80;   // ... down to this one
};

struct EngineConfig {
  TierLimits device{.capacity = 1ull << 30};
  TierLimits host{.capacity = 4ull << 30};
  // Per-link cap in bytes/s, 0 = none (e.g. h2s = 1e9: the emergency spill of MISSION.md).
  std::array<double, kNumLinks> link_rate{};
  // Transfers a link may have started and not finished; more wait in the
  // engine's priority queue, so a demand fetch overtakes queued write-backs.
  std::array<unsigned, kNumLinks> link_slots{2, 2, 8, 8};
  // Re-reads of an SSD copy whose read failed (checksum or I/O error) before
  // the fetch fails. Transient read faults are independent per read, so the
  // chance that all of 1 + n reads fail falls as p^(n+1): at 8, a 10% fault
  // rate fails one fetch in 10^9, where 2 failed one in 10^3 (seen as flaky
  // fault tests: a fetch ran out of retries at a 5% + 5% injected rate).
  unsigned read_retries = 8;
  // A clean copy whose only other copy is on the SSD tier is dropped at once
  // only if that copy checked out (written with read-back, or read whole)
  // within this long; an older one is verified first (Note [Verified before
  // dropped] in engine.cpp). 0 = always verify.
  std::uint64_t ssd_verify_max_age_ns = 1'000'000'000;
  std::uint64_t failure_backoff_ns =
      1'000'000;  // first pause before re-evicting after a failed write-back
  mem::MonitorConfig monitor{};
  void validate() const;  // throws InputError naming the field
};

// Where a tensor's data is, for callers and tests.
struct Residency {
  bool valid[mem::kNumTiers] = {};  // holds the latest data
  bool in_flight = false;
  std::uint32_t readers = 0;
  bool writer = false;
  bool lost = false;  // no readable copy is left (reported, never hidden)
  // An eviction of that copy is queued or running (it ends by dropping the copy, or by
  // clearing this after a failed write-back): how a poller tells "not yet" from "failed".
  bool leaving[mem::kNumTiers] = {};
};

// A pinned copy: ptr stays valid and unmoved until release(lease). Any
// thread may release it; until then it counts as held by the thread that
// acquired it (Note [No progress] in engine.cpp).
struct Lease {
  TensorId id = 0;
  Tier tier = Tier::device;
  Access access = Access::read;
  void* ptr = nullptr;
  std::uint64_t bytes = 0;
  std::thread::id holder{};  // the acquiring thread
  explicit operator bool() const { return ptr != nullptr; }
};

struct LinkStats {
  std::uint64_t transfers = 0, bytes = 0, failures = 0, retries = 0;
  std::uint64_t by_priority[kNumPriorities] = {};
  std::uint64_t busy_ns = 0;  // summed transfer durations (start to completion)
};

struct EngineStats {
  std::uint64_t tensors = 0;
  std::uint64_t used[mem::kNumTiers] = {}, peak[mem::kNumTiers] = {};
  std::array<LinkStats, kNumLinks> links{};
  std::uint64_t acquires = 0, hits = 0, misses = 0;  // a miss waited for a fetch
  // hits and misses by the tier asked for (device, host; the SSD slot stays 0)
  std::uint64_t hits_by_tier[mem::kNumTiers] = {}, misses_by_tier[mem::kNumTiers] = {};
  std::uint64_t prefetches = 0, prefetch_hits = 0;   // hits on a copy a prefetch brought
  std::uint64_t evictions = 0;                       // copies dropped from device or host
  std::uint64_t clean_drops = 0;  // of which needed no write-back (a lower copy was valid)
  std::uint64_t stall_ns = 0;     // time acquire() waited
  std::uint64_t io_errors = 0, no_space = 0, short_io = 0, corrupt_reads = 0, device_errors = 0;
  std::uint64_t lost_tensors = 0;  // no readable copy left; each was reported to its caller
  std::uint64_t lost_bytes = 0;    // their sizes
  // SSD copies read back before an upper copy was dropped (Note [Verified
  // before dropped]), those that failed (the upper copy was kept), and SSD
  // copies the store found corrupt on its own (scrub, a failed read).
  std::uint64_t ssd_verifies = 0, ssd_verify_failures = 0, ssd_copies_failed = 0;
  std::uint64_t oom = 0;  // acquires refused: nothing left to evict
};

// A tensor's victim scores, per memory tier (Note [Published victim scores]
// at Engine::set_victim_order): lower = evicted first; +inf (or NaN) = never
// by pressure.
struct VictimScores {
  double device = 0, host = 0;
};

class Engine {
 public:
  // The references must outlive the engine. `device_pool` allocates device
  // memory that `transport` can copy to and from (a pool over the device
  // backend); `host` allocates host memory.
  Engine(EngineConfig config, mem::DevicePool& device_pool, mem::MemoryBackend& host,
         Transport& transport, const Clock& clock);
  ~Engine();  // waits for transfers in flight, frees every copy
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  using Scores = VictimScores;
  // Registers a tensor with no data yet; its first acquire allocates it in
  // the tier asked for (contents undefined until written, like malloc).
  // `scores` are its first victim scores (used with VictimOrder::scores).
  // invalid_argument for 0 bytes or an id already registered.
  Status add(TensorId id, std::uint64_t bytes, Scores scores = {});
  // Forgets a tensor and frees its copies. busy while it is leased or moving.
  Status remove(TensorId id);

  // Blocks until the tensor is in `tier` (device or host) and may be used as
  // asked: any number of readers, or one writer and nobody else. A write
  // makes the other copies stale (they are dropped). Errors: not_found,
  // out_of_memory when no progress is possible (Note [No progress]: the room
  // cannot be made, counting the caller's own leases as held), busy when a
  // lease of the waiting caller itself is in the way, and the I/O status of a
  // fetch that failed (io_error, corrupt, device_failed): the tensor is then
  // reported lost if no other copy remains. last_failure() says why.
  Status acquire(TensorId id, Tier tier, Access access, Lease* out);
  // The non-blocking form: ok and a lease if it can be granted now; busy
  // after scheduling what it needs (a demand fetch) otherwise.
  Status try_acquire(TensorId id, Tier tier, Access access, Lease* out);
  Status release(const Lease& lease);

  // For callers that poll with try_acquire: epoch() moves on every state
  // change a waiter may care about (a transfer done, a release, room made).
  // wait_for_change(seen) blocks until epoch() != seen, counting the calling
  // thread as waiting with its leases held; out_of_memory when nothing can
  // change any more (Note [No progress]), with last_failure() saying why.
  std::uint64_t epoch() const;
  Status wait_for_change(std::uint64_t seen);
  // wait_for_change's decision without the wait, for a caller whose time
  // passes elsewhere (the simulator, when nothing of this engine's is in
  // flight on its virtual clock): ok when something can still change (a
  // rescan started or evicted something, a release may come, or a back-off
  // ends at *wake_at, ~0 if none), else out_of_memory with last_failure().
  Status check_progress(std::uint64_t* wake_at = nullptr);
  // Why this thread's last acquire or wait_for_change failed: the tensor,
  // each tier's use against its capacity, the leases in the way. Empty if
  // none failed yet.
  static const std::string& last_failure();

  // The SSD store found the tensor's SSD copy corrupt (a scrub, a read) and
  // dropped it: the engine forgets that copy, and reports the tensor lost if
  // it was the only one. Idempotent; a no-op if the store still holds the key
  // (a newer copy). Called by the stack from the store's on_corrupt callback.
  void ssd_copy_failed(TensorId id);

  // Hints from the policy/predictor: bring a copy to `tier` at prefetch
  // priority, or move the tensor's data out of `from` (write-back priority).
  Status prefetch(TensorId id, Tier tier);
  Status evict(TensorId id, Tier from);

  // Note [Published victim scores]
  // The eviction order is data, not a call: under VictimOrder::scores the
  // engine ranks candidates by the scores stored with each tensor, which
  // the policy publishes (set at add(), then publish_scores() once per step,
  // under the engine's lock). The engine never calls into policy state, so
  // a transfer's completion thread, which may scan for victims, cannot race
  // the policy thread that changes that state. A policy publishes only the
  // scores that changed (the tensors a step touched, those that entered or
  // left its window), so its scores must be keys whose order does not
  // change by itself as time passes (policy/heat.hpp, HeatTracker::order_key).
  //   lru     least recently used first (the default);
  //   scores  by published score, ties to the least recently used;
  //   owner   never by pressure: the engine's owner decides every eviction
  //           (the KV store, whose block manager owns placement).
  enum class VictimOrder : std::uint8_t { lru, scores, owner };
  void set_victim_order(VictimOrder order);
  struct ScoreUpdate {
    TensorId id;
    Scores scores;
  };
  // Sets each listed tensor's scores (ids not registered are skipped).
  void publish_scores(std::span<const ScoreUpdate> updates);

  // Waits until no transfer is running; what is still queued then waits for
  // a release (room or a lease) to become startable.
  void drain();
  // Changes a link's rate cap at run time (e.g. the emergency spill).
  void set_link_rate(Link link, double bytes_per_s);

  std::optional<Residency> residency(TensorId id) const;
  EngineStats stats() const;
  std::uint64_t evictions() const;  // stats().evictions without copying the rest, or locking
  mem::TierReport monitor(Tier t) const;
  // Level changes of any tier. Called under the engine's lock: it must be
  // quick and must not call back into the engine (queue the alert instead).
  void on_alert(mem::AlertFn fn);
  // Reports every transfer and every change of a tier's use to `observer` as
  // `card` (null = none, the default: then the cost is one branch). The calls
  // run under the engine's lock, on whichever thread made the change (a
  // completion thread, an acquirer): they must be quick and must not call
  // back into the engine. The observer's attached() and detached() run
  // outside the lock, here and in the destructor; between them it may read
  // stats() and monitor(). It must outlive the engine or be replaced first.
  // Times are seconds on the engine's clock after `origin_ns` (a driver
  // passes the origin its own reports count from, so both share a timebase).
  void set_observer(RunObserver* observer, int card = 0, std::uint64_t origin_ns = 0);
  const EngineConfig& config() const { return config_; }

 private:
  struct Entry;
  struct Job {  // a queued move on one link; a hint, Note [Flags are the truth, jobs are hints]
    Priority prio;
    std::uint64_t seq;
    TensorId id;
    Tier to;     // the tier the data goes to
    bool evict;  // drop the source copy once the destination is confirmed
    unsigned attempt;
    std::uint64_t bytes;  // the tensor's size when queued (0 for a verify: it lands nowhere)
    // On s2h: read the SSD copy back to check it, then drop the copy in `to`
    // (Note [Verified before dropped]).
    bool verify = false;
  };
  struct LinkQueue {
    std::deque<Job> q[kNumPriorities];
    // Verify jobs (Note [Verified before dropped]) need no room and make it:
    // they start ahead of the priority queues, whose head may be waiting
    // for the very room they free.
    std::deque<Job> verify;
    unsigned in_flight = 0;
    std::uint64_t bytes = 0;  // of the queued jobs (stale ones too: an upper bound)
    std::size_t jobs = 0;     // queued, all priorities
    bool empty() const { return jobs == 0; }
    void push_back(const Job& j) {
      (j.verify ? verify : q[static_cast<int>(j.prio)]).push_back(j);
      bytes += j.bytes;
      ++jobs;
    }
    void push_front(const Job& j) {
      q[static_cast<int>(j.prio)].push_front(j);
      bytes += j.bytes;
      ++jobs;
    }
    Job pop(int prio) {  // prio -1: a verify job
      std::deque<Job>& from = prio < 0 ? verify : q[prio];
      Job j = from.front();
      from.pop_front();
      bytes -= j.bytes;
      --jobs;
      return j;
    }
  };
  struct Running {
    std::uint64_t ticket;
    Job job;
    Link link;
    Tier from;
    std::uint64_t start_ns;
  };
  // Least recently used first; intrusive (Entry::lru_prev/next), so a touch
  // allocates nothing.
  struct LruList {
    Entry* head = nullptr;
    Entry* tail = nullptr;
  };
  // id -> Entry*: small ids indexed directly, the rest in an open-addressing
  // table (Note [Entry table] in engine.cpp).
  class EntryTable {
   public:
    Entry* find(TensorId id) const {
      if (id < dense_.size()) return dense_[id];
      return find_hashed(id);
    }
    bool insert(TensorId id, Entry* e);  // false if id is present
    void erase(TensorId id);
    std::size_t size() const { return size_; }
    template <class F>
    void for_each(F f) const {
      for (Entry* e : dense_)
        if (e) f(*e);
      for (const Slot& s : slots_)
        if (s.e) f(*s.e);
    }

   private:
    struct Slot {
      TensorId id = 0;
      Entry* e = nullptr;  // null = empty
    };
    Entry* find_hashed(TensorId id) const;
    bool insert_hashed(TensorId id, Entry* e);
    std::size_t home(TensorId id) const;
    void grow();
    void grow_dense(TensorId id);
    // Ids below dense_.size() live here and never in slots_.
    std::vector<Entry*> dense_;
    std::vector<Slot> slots_;  // power-of-two size, at most half full
    std::size_t size_ = 0;     // entries in both
    std::size_t hashed_ = 0;   // entries in slots_
    unsigned shift_ = 64;      // 64 - log2(slots_.size())
  };
  // A candidate for pressure eviction: its score and its place in LRU order
  // (ties go to the least recently used, as a stable sort would order them).
  struct Victim {
    double score;
    std::uint64_t rank;
    Entry* e;
  };
  struct Actions {  // work done outside the lock
    std::vector<Transfer> transfers;
  };
  // Whoever holds leases: a thread. Note [No progress].
  struct Holder {
    std::thread::id tid;
    std::uint64_t leases = 0;
    std::uint64_t bytes = 0;  // of its leases (a tensor leased twice counts twice)
    bool waiting = false;
  };
  class Waiting;  // marks the calling thread as waiting while in scope

  Status acquire_entry(TensorId id, Tier tier, Access access, Lease* out, bool block);
  Holder& holder(std::thread::id tid);
  void drop_holder_if_idle(std::thread::id tid);
  // True if something other than the waiting callers can still change the
  // state; *wake_at is lowered to when a write-back back-off ends.
  bool can_change(std::uint64_t now, std::uint64_t* wake_at) const;
  // Re-scans (clearing the futile-scan memo) and starts what it can; true if
  // that started a transfer or evicted something.
  bool rescan(Actions& act);
  Status nothing_changes(Actions& act);  // wait_for_change and check_progress: Note [No progress]
  // Sleeps until epoch_ != seen, or until wake_at on the engine's clock.
  void sleep_for_change(std::unique_lock<std::mutex>& lk, std::uint64_t seen,
                        std::uint64_t wake_at);
  std::string describe_stuck(const Entry* e, Tier tier) const;
  Status acquire_locked(std::unique_lock<std::mutex>& lk, Entry& e, Tier tier, Access access,
                        Lease* out, bool block, Actions& act);
  bool grantable(const Entry& e, Tier tier, Access access) const;
  void grant(Entry& e, Tier tier, Access access, Lease* out, Actions& act);
  void want(Entry& e, Tier tier, Priority prio);
  void enqueue(Entry& e, Link link, Tier to, bool evict, Priority prio);
  // Drops a clean copy in t, or queues the SSD copy's verification first;
  // false if the copy is dirty (the caller writes it back instead).
  bool drop_clean(Entry& e, Tier t, Actions& act);
  void rewant(Entry& e);
  void set_evict_want(Entry& e, Tier t, bool on);
  void notify();
  void pump(Actions& act);
  // Use, queued arrivals and failed allocations above the high watermark
  // (device or host); inline: pump() asks for both tiers at every call.
  // Bytes a tier holds or is about to, against its watermarks.
  double pressure(Tier t) const {
    const int i = static_cast<int>(t);
    return static_cast<double>(used_[i] + pending_bytes(t) + short_[i]);
  }
  bool over_high(Tier t) const { return pressure(t) > high_[static_cast<int>(t)]; }
  void evict_for_pressure(Tier t, Actions& act);
  bool start_job(Link link, const Job& j, Actions& act);
  bool start_verify(Entry& e, const Job& j, Actions& act);
  void count_failure(Status s);
  void mark_lost_if_gone(Entry& e);
  bool allocate_copy(Entry& e, Tier t);
  void free_copy(Entry& e, Tier t, Actions& act);
  void drop_stale(Entry& e, Tier keep, Actions& act);
  void touch(Entry& e, Tier t);
  void lru_unlink(Entry& e, int i);
  Entry* find(TensorId id) const { return entries_.find(id); }
  Entry* new_entry();
  void recycle(Entry* e);
  void on_done(const Transfer& t, Status s);
  void run(Actions& act);
  void note_use(Tier t);
  void count_eviction();  // ++st_.evictions, mirrored in evictions_
  // Bytes queued to land in t and not yet started. Kept per link as jobs are
  // queued and popped, so it is O(1); stale jobs count until popped, which
  // only makes eviction start a little early. The links into each tier:
  // h2d into the device, d2h and s2h into host, h2s into SSD.
  std::uint64_t pending_bytes(Tier t) const {
    auto q = [this](Link l) { return links_[static_cast<int>(l)].bytes; };
    switch (t) {
      case Tier::device:
        return q(Link::h2d);
      case Tier::host:
        return q(Link::d2h) + q(Link::s2h);
      case Tier::ssd:
        return q(Link::h2s);
    }
    return 0;
  }
  bool evictable(const Entry& e, Tier t, std::uint64_t now, std::uint64_t* retry_at) const;

  EngineConfig config_;
  mem::DevicePool& pool_;
  mem::MemoryBackend& host_;
  Transport& transport_;
  const Clock& clock_;

  mutable std::mutex mu_;
  std::atomic<int> callbacks_{0};  // completion callbacks still running
  std::condition_variable cv_;     // any state change a waiter may care about
  EntryTable entries_;
  // Every Entry ever made, in chunks (Note [Entry layout]); entries_ points here.
  static constexpr std::size_t kArenaChunk = 64;
  std::vector<std::unique_ptr<Entry[]>> arena_;
  std::size_t arena_used_ = 0;  // entries handed out from the last chunk
  std::vector<Entry*> spare_;   // removed entries, reused by add()
  LruList lru_[2];              // device, host
  std::array<LinkQueue, kNumLinks> links_{};
  // Transfers started and not completed: at most the sum of link_slots, so a
  // short vector searched linearly beats a hash map.
  std::vector<Running> running_;
  std::vector<Victim> victims_;        // evict_for_pressure's scratch
  std::uint64_t backoff_horizon_ = 0;  // the latest Entry::backoff_until ever set
  std::uint64_t next_seq_ = 1, next_ticket_ = 1;
  std::uint64_t used_[mem::kNumTiers] = {};
  std::uint64_t leaving_[2] = {0, 0};  // bytes with an eviction queued or running, per tier
  std::uint64_t short_[2] = {0, 0};    // bytes of allocations that failed since the last pump
  std::uint64_t epoch_ = 0;            // bumped on every state change waiters care about
  // Bumped when a copy may have become evictable (release, transfer done, a
  // new victim order, lowered scores).
  std::uint64_t changes_ = 0;
  std::uint64_t futile_[2] = {~0ull, ~0ull};  // changes_ at a pressure scan that evicted nothing
  std::uint64_t futile_retry_[2] = {0, 0};    // ... and when the first back-off it skipped ends
  // Lease holders (a handful of threads), and the leases held in all and by
  // waiting holders: progress needs a lease held by someone who is not waiting.
  std::vector<Holder> holders_;
  std::uint64_t leases_ = 0, waiting_leases_ = 0;
  mem::Monitor monitor_;
  RunObserver* observer_ = nullptr;  // set_observer; read and written under mu_
  int observer_card_ = 0;
  std::uint64_t observer_origin_ns_ = 0;
  double observer_s(std::uint64_t ns) const {  // may be < 0: before the origin
    return static_cast<double>(static_cast<std::int64_t>(ns - observer_origin_ns_)) * 1e-9;
  }
  VictimOrder victim_order_ = VictimOrder::lru;
  EngineStats st_;
  std::atomic<std::uint64_t> evictions_{0};  // st_.evictions, for evictions() without the lock
  double high_[2] = {0, 0};  // high_watermark * capacity, per memory tier (config_ is fixed)
};

}  // namespace u3m::engine
