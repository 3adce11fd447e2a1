// The tiered KV cache's data path (issue 6 item 5, issue 7's KV cache; docs/kv.md, "The data
// path"). A TieredStore owns a BlockManager (the decisions) and drives an Engine (the bytes):
// its own real stack, or a stack the caller built from stack_spec() (the serving simulator's
// sim::SimStack; Note [Either stack] in tiered_store.cpp). It
// carries out every Action the manager emits on the engine, so each physical block (token
// block x layer group) is one engine tensor of slot_bytes that really lives in the tier the
// manager says. Requests read and write their KV by (request, logical token block, group,
// byte offset, length) through acquire/release, so compute never sees a block in flight.
// Note [...] blocks in src/kv/tiered_store.cpp give the reasons.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "u3m/engine/engine.hpp"
#include "u3m/engine/real_stack.hpp"
#include "u3m/kv/block_manager.hpp"
#include "u3m/mem/ssd_store.hpp"

namespace u3m::kv {

struct TieredStoreStats {
  std::uint64_t allocated = 0, moved = 0, freed = 0;  // actions completed ok
  std::uint64_t moved_bytes = 0;                      // bytes of those moves
  std::uint64_t writes = 0, reads = 0;                // write()/read() calls
  std::uint64_t bytes_written = 0, bytes_read = 0;
  std::uint64_t reads_by_tier[kTiers] = {};  // tier the read was served from
  // Note [Pending transfers]: actions completed as failed or lost, cancelled by the manager
  // (one they waited for failed), attempts tried again (a write-back to SSD, a free), faults
  // the test hook injected, admissions rolled back, reads/writes that waited for their
  // block's pending action, and the most actions pending at once.
  std::uint64_t failed = 0, lost = 0, cancelled = 0, retried = 0, injected = 0;
  std::uint64_t aborted = 0, block_waits = 0, peak_pending = 0;
  std::uint64_t lost_at_rest = 0;  // blocks the engine lost outside any action (dropped)
};

struct TieredStoreOptions {
  std::string ssd_dir;  // see engine::StackSpec::ssd_dir
  // The real stack's device backend and ordinal (engine::StackSpec::backend).
  std::string backend = "device-emu";
  int device = 0;
  mem::FaultSpec ssd_faults;  // injected under the SSD tier (tests); empty = none
  // After every call, check that the engine holds each settled block in exactly the tier
  // the manager says (check_agreement). For tests: it walks every live block.
  bool check_every_step = false;
  // Fault injection for tests (Note [Pending transfers]): asked before each attempt of an
  // action reaches the engine; true makes that attempt fail as the engine would report it
  // (nothing moves; a free is tried again). Null: none.
  std::function<bool(const Action&)> inject;
  // Promotions from SSD to HBM in flight at once: each stages through one host slot.
  unsigned staging_slots = 2;
  // Attempts of a write-back to SSD (or a free) before it counts as failed.
  unsigned attempts = 8;
  // Host slots that stage moves to SSD (Note [Write-behind staging]): a move to SSD is
  // completed to the manager once its data sits in host memory in one of these, and the SSD
  // write drains behind it. 0: none, a move to SSD is done when the SSD copy is (and needs a
  // host tier). They add to the engine's host capacity.
  std::uint64_t writeback_slots = 0;
  // false (the serving simulator, Note [Non-blocking calls]): the manager's calls neither
  // wait for pending actions nor start the ones they emit; poll() moves them on, ready(id)
  // says when a request's blocks are in place.
  bool blocking = true;
};

// The stack a store runs over when the caller builds it (Note [Either stack]).
struct StoreStack {
  engine::Engine& engine;  // built from TieredStore::stack_spec(config, options)
  // Blocks until engine.epoch() != seen; out_of_memory when nothing can change any more.
  // Real stack: Engine::wait_for_change. Simulated: run the virtual clock's next event.
  std::function<mem::Status(std::uint64_t seen)> wait;
  // false: the engine's addresses are fake (a simulated stack), so read() and write() refuse.
  bool has_bytes = true;
};

class TieredStore {
 public:
  // Validates `config` (InputError naming the field) and builds the engine with capacities
  // equal to the manager's: Note [Capacities agree]. With an SSD tier it needs a host tier
  // (capacity_slots[host] > 0) or write-back slots: the engine stages every SSD move through
  // host memory.
  explicit TieredStore(KvConfig config, TieredStoreOptions options = {});
  // Over the caller's stack, which must outlive the store: its engine's capacities must be
  // stack_spec(config, options)'s (std::invalid_argument otherwise).
  TieredStore(KvConfig config, StoreStack stack, TieredStoreOptions options = {});
  // The stack this config needs (Note [Capacities agree]): budgets and SSD size. InputError
  // for a config the store cannot run.
  static engine::StackSpec stack_spec(const KvConfig& c, const TieredStoreOptions& o);
  ~TieredStore();
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // The BlockManager's calls. Each first completes the actions still pending, then decides,
  // then submits the actions it emitted and returns once its admissions hold (Note [Pending
  // transfers]): other moves (demotions, spills) and frees go on in the background. An
  // admission whose allocation or promotion failed is rolled back: submit() then answers
  // aborted (the caller may submit again), and finish()/admit_waiting() leave the request at
  // the front of the queue and do not return it.
  SubmitResult submit(RequestId id, const workload::ServeRequest& r, Admission* out = nullptr);
  std::vector<Admission> finish(RequestId id);
  // BlockManager::prefilled: the request's blend sources are no longer read.
  void prefilled(RequestId id);
  std::vector<Admission> admit_waiting();
  std::uint64_t spill(std::uint64_t budget_bytes);
  bool pin_prefix(const std::vector<workload::PromptSegment>& prefix);

  // Copies `len` bytes into / out of layer group `group` of the request's logical token block
  // `block`, at byte `offset` of the group's slot, through an engine lease in the tier the
  // block rests in, after waiting for that block's pending action only. Throws
  // std::out_of_range for an id, block, group or range outside the request's table,
  // std::runtime_error naming the engine status if the engine refuses. Writing a block shared
  // with other requests (a prefix hit) changes it for all of them: callers write only the
  // blocks their admission did not hit (Admission::hit_blocks).
  void write(RequestId id, std::uint32_t block, std::uint32_t group, std::uint64_t offset,
             const void* src, std::uint64_t len);
  void read(RequestId id, std::uint32_t block, std::uint32_t group, std::uint64_t offset, void* dst,
            std::uint64_t len);

  void drain();  // waits until no action is pending
  std::size_t pending() const { return pending_.size() + trailing_.size(); }

  // Non-blocking use (TieredStoreOptions::blocking = false, Note [Non-blocking calls]).
  // One pass without waiting: starts what can start, completes what is done, and settles the
  // admissions once no admission-critical action is pending. Returns the requests whose
  // admission was rolled back (the caller still owns them and may submit them again).
  std::vector<RequestId> poll();
  // True when the request runs and none of its blocks, nor of its blend sources, has a
  // pending action.
  bool ready(RequestId id) const;
  // The actions the calls since the last poll() emitted, in seq order; none has started (a
  // driver picks recompute-or-fetch from them before the next poll()).
  std::vector<const Action*> emitted() const;
  // Token block `block` of the request is recomputed, not fetched (Note [Recompute in
  // place]): its promotions emitted since the last poll() drop the old copies and take a
  // write lease in their target tier instead of reading. Call before the next poll().
  void recompute(RequestId id, std::uint32_t block);
  // Throws std::logic_error if a settled block's engine copies are not where the manager says
  // (memory copy in another tier, two memory copies, none in its tier), or, with nothing
  // pending, if the engine's bytes per tier are not the manager's slots.
  void check_agreement() const;

  const BlockManager& manager() const { return bm_; }
  BlockManager& manager() { return bm_; }
  engine::EngineStats engine_stats() const { return engine_.stats(); }
  // The store's own real stack; std::logic_error over a caller's stack.
  const engine::RealStack& stack() const;
  const TieredStoreStats& stats() const { return st_; }
  std::uint64_t slot_bytes() const { return slot_bytes_; }
  std::size_t live_blocks() const { return live_.size(); }

 private:
  // write()/read()'s copy: src into the lease at offset, or the lease into dst.
  void copy_lease(const engine::Lease& l, std::uint64_t offset, const void* src, void* dst,
                  std::uint64_t len);
  struct Exec {  // an action the manager prepared, not completed yet
    Action a;
    bool started = false;
    bool staged = false;  // holds a staging slot (SSD -> HBM)
    bool landed = false;  // a move to memory whose copy is there; the other one still to drop
    bool rewrite = false;  // recompute(): written in place, not fetched
    unsigned attempts = 0;
  };
  struct Trail {  // a move to SSD completed to the manager, its SSD write still draining
    Tier from = Tier::host;
    bool reported = false;  // the manager was told (ok, or lost)
    unsigned attempts = 1;
  };
  std::vector<RequestId> execute();  // submits the prepared actions, settles admissions
  void enqueue();                    // the manager's prepared actions into pending_
  void reap_lost();  // blocks the engine lost at rest: the manager forgets them
  bool pump();                       // one pass; true if anything changed
  void wait_until(const std::function<bool()>& done);
  std::optional<Outcome> step(Exec& x);  // starts or polls; an outcome once it is done
  std::optional<Outcome> step_staged_write(Exec& x);  // a move to SSD through write-back slots
  bool trail(engine::TensorId id, Trail& t);  // polls a draining write; true once it is done
  std::vector<Admission> decided(std::vector<Admission> a);  // finish/admit_waiting's tail
  void resolve(std::uint64_t seq, Outcome o);
  bool ready(const Action& a) const;
  std::vector<Admission> settled(std::vector<Admission> adm);  // those still running
  engine::TensorId locate(RequestId id, std::uint32_t block, std::uint32_t group,
                          std::uint64_t offset, std::uint64_t len, Tier* tier);

  BlockManager bm_;
  std::uint64_t slot_bytes_;
  TieredStoreOptions opt_;
  std::unique_ptr<engine::RealStack> real_;  // null over a caller's stack
  engine::Engine& engine_;
  std::function<mem::Status(std::uint64_t)> wait_;
  bool has_bytes_;
  std::unordered_map<engine::TensorId, Tier> live_;  // allocated blocks, where they are
  std::map<std::uint64_t, Exec> pending_;            // by seq: started in that order
  std::unordered_map<engine::TensorId, unsigned> block_pending_;  // pending actions per block
  unsigned staging_ = 0;                                          // staging slots in use
  std::map<engine::TensorId, Trail> trailing_;  // Note [Write-behind staging]
  std::deque<engine::TensorId> trail_order_;    // trailing_ in the order the writes began
  std::uint64_t writeback_ = 0;                 // write-back slots in use
  std::uint64_t last_seq_ = 0, polled_seq_ = 0;  // newest action enqueued; and at the last poll
  std::uint64_t lost_seen_ = 0;  // engine lost_tensors already reaped
  TieredStoreStats st_;
};

}  // namespace u3m::kv
