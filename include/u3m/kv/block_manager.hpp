// The block manager of the tiered paged KV cache (issue 6; docs/kv.md).
//
// Decision code only: it never reads a clock and never touches a device. It
// decides which physical block holds which request's KV, in which tier (HBM,
// DRAM, SSD), what is shared, what is evicted, and which requests wait; it
// reports every allocation, move and free as an Action that its driver carries
// out (the serving simulator books the bytes on modelled links; the real
// runtime mirrors them as engine tensors). The Note [...] blocks in
// src/kv/block_manager.cpp give the reasons.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "u3m/kv/eviction.hpp"
#include "u3m/mem/status.hpp"
#include "u3m/workload/request_trace.hpp"
#include "u3m/workload/shape.hpp"

namespace u3m::kv {

using mem::Tier;
inline constexpr int kTiers = 3;  // device (HBM), host (DRAM), ssd

// Note [Block = layer group x token block] in block_manager.cpp.
struct KvGeometry {
  std::uint32_t block_tokens = 128;
  std::uint32_t layers = 0;
  std::uint32_t layers_per_group = 4;
  std::uint64_t bytes_per_token_layer = 0;  // K and V of one token in one layer
  // Recompute cost model for PGDSF, in FLOPs: a token of a layer costs
  // linear_flops + attn_flops_per_ctx * (tokens before it).
  double linear_flops = 0;
  double attn_flops_per_ctx = 0;

  std::uint32_t groups() const;                       // ceil(layers / layers_per_group)
  std::uint32_t group_layers(std::uint32_t g) const;  // the last group may be smaller
  std::uint64_t group_bytes(std::uint32_t g) const;   // bytes group g's slot really holds
  // A slot (one physical block) is sized for a full group, so every slot of a
  // tier is interchangeable; a smaller last group leaves part of its slot unused.
  std::uint64_t slot_bytes() const;
  std::uint64_t token_block_bytes() const;  // all groups of one token block
  // FLOPs to recompute token block `index` (0-based) for all layers.
  double recompute_flops(std::uint32_t index) const;
  void validate() const;  // throws InputError naming the field

  // From a model: bytes_per_token_layer = 2 * kv_heads * head_dim * dtype_bytes
  // (workload::analytic::kv_bytes_per_token / layers).
  static KvGeometry of(const workload::ModelShape& m, std::uint32_t block_tokens,
                       std::uint32_t layers_per_group = 4, std::uint32_t dtype_bytes = 2);
};

// How prompts reuse cached KV (Note [Segment reuse] in block_manager.cpp).
//   exact  a block is reused only where the whole chain of prompt content before it is the
//          same (vLLM's prefix caching; RAGCache's knowledge tree at block granularity);
//   blend  besides exact hits, a block of a segment (a passage) cached after any other
//          context is reused at a new position: the request gets its own copy, re-rotated,
//          with a share of its tokens recomputed (CacheBlend). The driver charges that work.
enum class Reuse : std::uint8_t { exact, blend };
std::string_view to_string(Reuse r);

struct KvConfig {
  KvGeometry geometry;
  Reuse reuse = Reuse::exact;
  // Note [SSD admission]: a victim is written to SSD only once its content was looked up by
  // at least this many admissions; below it is dropped. 0 or 1: every victim is written.
  std::uint32_t ssd_admit_after = 0;
  // Note [SSD admission]: true: writes to SSD spend a credit the driver grants
  // (add_ssd_credit, at the drives' rated write rate); without credit a victim is dropped.
  bool ssd_write_budget = false;
  // Note [Cache-aware admission]: a queued request may be passed over by at most this many
  // later ones that have more of their prompt cached; 0: the queue is FIFO.
  std::uint32_t max_bypass = 0;
  std::array<std::uint64_t, kTiers> capacity_slots{};  // per tier; device must be > 0
  // Home tier of each layer group (size geometry.groups(), device or host).
  // Empty: the design's default, default_homes(groups, 4 layers).
  std::vector<Tier> home;
  // Note [Overcommit]: referenced slots <= overcommit * capacity_slots[device]; 0 = no cap.
  double overcommit = 1.5;
  EvictionPolicy policy = EvictionPolicy::lru;
  double lfu_half_life = 1000;  // admissions; Note [Eviction order]
  // Slots pinned prefixes may hold at most (Note [Pinned prefixes]); 0 = pinning off.
  std::uint64_t pin_budget_slots = 0;
  // Note [DRAM emergency]: host use above high raises it, at or below low clears it.
  double emergency_high = 0.95, emergency_low = 0.90;
  // Note [Promoting DRAM hits]: move a hit's DRAM slots whose home is HBM into
  // HBM at admission when HBM has a free or evictable slot.
  bool promote_host_hits = true;
  // Per-request KV for the queue limit before any request was admitted.
  std::uint64_t expected_request_tokens = 2048;
  std::uint64_t min_queue = 1;  // the queue limit never goes below this

  void validate() const;            // throws InputError naming the field
  std::vector<Tier> homes() const;  // `home`, or the default when empty
  // The design's default: groups holding the first `hbm_layers` layers live in
  // HBM, the rest in DRAM (a group straddling the boundary goes to HBM).
  static std::vector<Tier> default_homes(const KvGeometry& g, std::uint32_t hbm_layers = 4);
};

// Content-addressed keys of a prompt's full blocks (Note [Block keys]).
std::vector<std::uint64_t> block_keys(const std::vector<workload::PromptSegment>& prompt,
                                      std::uint32_t block_tokens);

// A prompt's shareable token blocks under a reuse mode (Note [Segment reuse]). exact: the full
// blocks of the packed prompt (keys = block_keys). blend: each segment starts a new block, so
// a segment's blocks hold its tokens alone and can be found by content wherever it sits.
// Every shareable block but the last prompt block when that one is partial: it is the
// request's own, decode writes on into it.
struct PromptBlocks {
  std::vector<std::uint64_t> keys;     // chain keys: equal exactly when all content before is
  std::vector<std::uint64_t> content;  // blend: the segment block's own content; exact: = keys
  std::vector<std::uint32_t> start;    // first prompt token of the block
  std::vector<std::uint32_t> tokens;   // prompt tokens in it (<= block_tokens)
  std::uint32_t tail = 0;              // prompt tokens in the private last block
  std::uint64_t blocks(std::uint64_t output_tokens, std::uint32_t block_tokens) const;
};
PromptBlocks prompt_blocks(const std::vector<workload::PromptSegment>& prompt,
                           std::uint32_t block_tokens, Reuse reuse);

using RequestId = std::uint64_t;
using TokenBlockId = std::uint64_t;  // serial, never reused
using BlockId = std::uint64_t;       // one physical block: token block and layer group
inline constexpr std::uint32_t kMaxGroups = 256;
constexpr BlockId block_id(TokenBlockId tb, std::uint32_t group) {
  return tb * kMaxGroups + group;
}

// What the driver must carry out (Note [Two-phase actions] in block_manager.cpp): each action
// is prepared by a decision and completed by the driver with BlockManager::complete().
struct Action {
  enum class Kind : std::uint8_t { allocate, move, free };
  // abort: freeing the blocks of an admission rolled back (Note [Two-phase actions]).
  enum class Reason : std::uint8_t { admit, evict, promote, spill, finish, abort };
  Kind kind = Kind::allocate;
  Reason reason = Reason::admit;
  BlockId block = 0;
  Tier from = Tier::device;  // move, free
  Tier to = Tier::device;    // allocate, move
  std::uint64_t bytes = 0;   // the group's real bytes
  std::uint64_t seq = 0;     // the manager's ticket, for complete()
  // Actions that must be completed before this one starts (0 = none): [0] the previous
  // action on the same slot, [1] the action vacating the slot this one takes.
  std::array<std::uint64_t, 2> after{};
  bool operator==(const Action&) const = default;
};
std::string_view to_string(Action::Kind k);
std::string_view to_string(Action::Reason r);

// How the driver completed an action. failed: nothing happened (the block is where it was);
// lost: the block's data is gone (an SSD copy that no longer reads back).
enum class Outcome : std::uint8_t { ok, failed, lost };
// Allocations and moves up from SSD: an admission holds only once they are done.
bool admission_critical(const Action& a);

struct Admission {
  RequestId id = 0;
  std::uint32_t blocks = 0;                       // token blocks of prompt + output
  std::uint32_t prompt_full_blocks = 0;           // shareable ones
  std::uint32_t hit_blocks = 0;                   // leading shareable blocks found cached
  std::uint64_t hit_tokens = 0;                   // their prompt tokens
  std::uint32_t hit_blocks_by_tier[kTiers] = {};  // by the lowest tier a slot was in
  std::uint32_t adopted_blocks = 0;  // cached blocks after a miss (Note [Adopted blocks])
  std::uint32_t new_blocks = 0;      // full prompt blocks created (now cached)
  std::uint32_t private_blocks = 0;  // the partial last block and decode blocks
  std::uint32_t promoted_slots = 0;  // moved up from SSD for this request
  // Moved up from DRAM into HBM for this request (Note [Promoting DRAM hits]).
  std::uint32_t promoted_host_slots = 0;
  // Note [Segment reuse]: blocks after the hit run whose segment content is cached after
  // another context. Each gets a new block of its own (counted in new_blocks) that the driver
  // fills from the source's slots, re-rotates, and partly recomputes.
  struct Blend {
    std::uint32_t index = 0;  // logical token block of the request
    TokenBlockId source = 0;  // cached block it copies, referenced until prefilled()
  };
  std::vector<Blend> blends;
  std::uint64_t blend_tokens = 0;  // prompt tokens in those blocks
};

enum class SubmitResult : std::uint8_t {
  admitted,
  queued,
  refused_queue_full,  // the caller still owns the request and may submit it again
  too_large,           // can never fit, even alone (Note [Never lost])
  // An action of its admission failed and the admission was rolled back (Note [Two-phase
  // actions]): nothing of it remains, the caller still owns it and may submit it again.
  aborted,
};
std::string_view to_string(SubmitResult r);

struct TierUse {
  std::uint64_t capacity = 0, used = 0;
  std::uint64_t locked = 0;  // slots of referenced or pinned blocks: not evictable
  std::uint64_t peak = 0;
};

struct KvAlert {
  bool emergency = false;                // true: entered, false: left
  std::uint64_t used = 0, capacity = 0;  // host slots
};

struct KvStats {
  std::uint64_t submitted = 0, admitted = 0, queued = 0, refused_queue_full = 0,
                refused_too_large = 0, finished = 0;
  std::uint64_t prompt_tokens = 0;  // of admitted requests
  std::uint64_t lookup_blocks = 0;  // full prompt blocks looked up
  std::uint64_t hit_blocks = 0, hit_tokens = 0, adopted_blocks = 0;
  std::uint64_t blend_blocks = 0, blend_tokens = 0;  // Note [Segment reuse]
  std::uint64_t ssd_declined_slots = 0;              // Note [SSD admission]: dropped, not written
  std::uint64_t hit_blocks_by_tier[kTiers] = {};
  std::uint64_t new_blocks = 0, private_blocks = 0;
  std::uint64_t promoted_slots = 0, promoted_host_slots = 0;
  std::uint64_t demoted_slots[kTiers] = {};  // by the tier they left
  std::uint64_t dropped_blocks = 0;          // cached token blocks forgotten
  std::uint64_t spilled_slots = 0, spilled_bytes = 0;
  std::uint64_t alerts = 0;  // emergency entries
  std::uint64_t peak_referenced_slots = 0, peak_running = 0, peak_queue = 0;
  // Note [Two-phase actions]: actions the driver completed as failed or lost, actions
  // cancelled because one they waited for failed, admissions rolled back, cached blocks
  // dropped because their data was lost or never allocated.
  std::uint64_t failed_actions = 0, cancelled_actions = 0, aborted_admissions = 0,
                damaged_blocks = 0;
};

class BlockManager {
 public:
  explicit BlockManager(KvConfig config);  // validates

  // A new request: admitted now if nothing waits ahead of it and it fits,
  // else queued if the queue has room (Note [Admission queue]).
  SubmitResult submit(RequestId id, const workload::ServeRequest& r, Admission* out = nullptr);
  // The request is done: its private blocks are freed, its prompt blocks stay
  // cached. Then queued requests are admitted in order while they fit; their
  // admissions are returned. invalid_argument for an unknown id.
  std::vector<Admission> finish(RequestId id);
  // The request's prefill is done: the sources of its blends (Admission::blends) are no
  // longer read and become evictable. finish() does it too. No-op for an unknown id.
  void prefilled(RequestId id);
  // The cached blocks the request's blends still read (empty once prefilled).
  const std::vector<TokenBlockId>& blend_sources(RequestId id) const;

  // Note [DRAM emergency]: moves cold DRAM blocks to SSD, at most budget_bytes
  // (the driver gives rate * elapsed time, ~1 GB/s). Returns bytes moved.
  std::uint64_t spill(std::uint64_t budget_bytes);

  // Pins the full blocks of this prompt prefix (Note [Pinned prefixes]),
  // now and whenever they are created. false (nothing pinned) if the pin
  // budget would be exceeded.
  bool pin_prefix(const std::vector<workload::PromptSegment>& prefix);

  // Note [SSD admission]: grants `bytes` of SSD writes, holding at most `cap` unspent.
  void add_ssd_credit(std::uint64_t bytes, std::uint64_t cap);
  std::uint64_t ssd_credit() const { return ssd_credit_; }

  // Leading full blocks of this prompt that are cached now (no side effects).
  std::uint32_t cached_prefix_blocks(const workload::ServeRequest& r) const;

  // The request's block table: token block i -> its token block id; physical
  // block of group g = block_id(tb, g), in tier slot_tier(tb, g).
  const std::vector<TokenBlockId>& table(RequestId id) const;
  Tier slot_tier(TokenBlockId tb, std::uint32_t group) const;
  // What compute reads for this request, per layer group: slots in each tier
  // (decode fetches only its own blocks; layer-wise prefetch goes group by group).
  std::vector<std::array<std::uint32_t, kTiers>> slots_by_group(RequestId id) const;

  // Note [Two-phase actions]. The actions prepared since the last call; the driver carries
  // each out once every action in its `after` is completed, and reports it with complete().
  std::vector<Action> take_prepared();
  // Completes a prepared action. ok commits it; failed or lost rolls it back (the slot stays
  // where it was) with every action that waited for it, whose seqs are returned: the driver
  // must not carry those out. invalid_argument for an unknown seq, logic_error for one
  // completed before an action it waits for.
  std::vector<std::uint64_t> complete(std::uint64_t seq, Outcome outcome);
  // Once every admission-critical action of the requests admitted since the last settle()
  // is completed: rolls back each admission that did not get all its slots in memory (a
  // failed allocation or promotion). Requests admitted from the queue go back to its front
  // in order; those admitted by submit() are returned (their submit counts as aborted).
  // Damaged cached blocks nobody references are dropped. logic_error if called too early.
  std::vector<RequestId> settle();
  // For drivers whose actions cannot fail (the simulator, tests): take_prepared(), each
  // completed ok in order, then settle().
  std::vector<Action> take_actions();
  // Admits queued requests that fit now (what finish() does after freeing); for a driver
  // whose queued admissions were rolled back while nothing runs.
  std::vector<Admission> admit_waiting();
  std::size_t pending_actions() const { return ops_.size(); }
  // The driver found a slot's data gone outside any action (an SSD copy at rest that no
  // longer reads back): its token block is dropped once nobody references it, so no later
  // request hits it. No-op for a block already gone.
  void lost(BlockId block);
  void on_alert(std::function<void(const KvAlert&)> fn) { alert_ = std::move(fn); }

  bool running(RequestId id) const { return requests_.contains(id); }
  std::size_t running_count() const { return requests_.size(); }
  std::size_t queue_length() const { return queue_.size(); }
  std::vector<RequestId> queued_ids() const;
  std::uint64_t queue_limit() const;  // Note [Admission queue]
  bool emergency() const { return emergency_; }
  TierUse use(Tier t) const;
  std::uint64_t referenced_slots() const { return referenced_slots_; }
  std::uint64_t overcommit_limit_slots() const;  // 0: none
  std::size_t cached_blocks() const { return cache_.size(); }
  const KvStats& stats() const { return st_; }
  const KvConfig& config() const { return cfg_; }

  // Recomputes every counter from the blocks; throws std::logic_error on a mismatch.
  void check_invariants() const;

 private:
  struct TokenBlock {
    std::uint64_t key = 0;      // chain key; meaningful when cached
    std::uint64_t content = 0;  // Note [Segment reuse]: the segment block's content key
    bool cached = false;    // in cache_ (a full prompt block); else private
    bool pinned = false;
    std::uint32_t index = 0;      // position in the sequence
    std::uint32_t refs = 0;       // running requests using it
    BlockUse use;                 // what the eviction policy keeps of it
    double prio = 0;              // eviction priority: lower goes first
    std::vector<Tier> tier;       // per group: where it rests once its actions are done
    std::vector<std::uint8_t> absent;  // per group: its allocation failed (no slot held)
    bool damaged = false;  // a slot is absent or its data was lost: dropped when unreferenced
  };
  struct Victim {  // one evictable slot
    double prio;
    std::uint32_t index;
    TokenBlockId tb;
    std::uint32_t group;
    bool operator<(const Victim& o) const;
  };
  struct Pending {
    RequestId id;
    std::vector<std::uint64_t> keys;  // shareable prompt blocks (PromptBlocks)
    std::vector<std::uint64_t> content;
    std::vector<std::uint32_t> tokens;
    std::uint64_t prompt_tokens;
    std::uint32_t blocks;  // prompt + output
    std::uint32_t bypassed = 0;  // Note [Cache-aware admission]
    bool blend = true;  // Note [Segment reuse]: fits() clears it when only a plain admission fits
  };
  // A prepared action not completed yet (Note [Two-phase actions]).
  struct Op {
    Action a;
    TokenBlockId tb = 0;
    std::uint32_t g = 0;
    std::uint64_t claim = 0;    // a take: the pending leave whose vacancy it uses
    std::uint64_t claimer = 0;  // a leave: the take that uses its vacancy
    std::uint64_t prev = 0, next = 0;  // pending actions on the same slot
  };
  struct Fresh {  // admitted since the last settle()
    Pending p;
    Admission a;
    bool from_queue;
    std::vector<TokenBlockId> created;  // cached blocks it made, whose KV it is to compute
  };
  struct Need {
    std::uint64_t mem_slots = 0;  // new locks in HBM + DRAM
    std::uint64_t new_refs = 0;   // slots that become referenced
  };

  Pending make_pending(RequestId id, const workload::ServeRequest& r) const;
  bool too_large(const Pending& p) const;
  Need need_of(const Pending& p) const;
  bool fits(Pending& p) const;  // sets p.blend (Note [Segment reuse])
  bool fits_as_is(const Pending& p) const;
  Admission admit(const Pending& p, bool from_queue);
  void account(const Pending& p, const Admission& a, bool add);  // admission counters
  void admit_queued(std::vector<Admission>& out);
  std::uint64_t cached_tokens(const Pending& p) const;  // what an admission now would reuse
  void touch(const std::vector<TokenBlockId>& chain, bool tick = true);

  TokenBlockId create(std::uint32_t index, bool cached, std::uint64_t key,
                      std::uint64_t content = 0);
  // Note [Segment reuse]: a cached block holding this content after another context, the
  // one in the highest tier; 0 when none or when reuse is exact.
  TokenBlockId blend_source(std::uint64_t content) const;
  void release_sources(RequestId id);
  bool ssd_admits(const TokenBlock& b, std::uint32_t g) const;  // Note [SSD admission]
  Tier take_slot(std::uint32_t g);  // a free memory slot for group g, evicting if needed
  void place(TokenBlockId tb, std::uint32_t g, Action::Reason why);  // promote from SSD
  bool promote_host(TokenBlockId tb, std::uint32_t g);               // DRAM -> HBM if HBM has room
  bool make_room(Tier t, std::uint64_t n);
  void evict_slot(const Victim& v, Tier t);
  void move_slot(TokenBlockId tb, std::uint32_t g, Tier to, Action::Reason why);
  void drop(TokenBlockId tb, Action::Reason why);
  void emit(Action a, TokenBlockId tb, std::uint32_t g);  // registers a prepared action
  void revert(std::uint64_t seq, std::vector<std::uint64_t>& cancelled);
  void cancel(std::uint64_t seq, std::vector<std::uint64_t>& cancelled);
  // A free whose slot is in `to` after all (the move before it failed).
  void rehome_free(std::uint64_t seq, Tier to, std::vector<std::uint64_t>& cancelled);
  void retier(TokenBlockId tb, std::uint32_t g, Tier to);  // a reverted move: slot back
  void damage(TokenBlockId tb);
  void uncredit(int t, std::uint64_t seq);
  void ref(TokenBlock& b, TokenBlockId id);
  void unref(TokenBlock& b, TokenBlockId id);
  bool evictable(const TokenBlock& b) const {
    return b.cached && b.refs == 0 && !b.pinned && !b.damaged;
  }
  void list(const TokenBlock& b, TokenBlockId id);
  void unlist(const TokenBlock& b, TokenBlockId id);
  bool locked(const TokenBlock& b) const { return b.refs > 0 || b.pinned; }
  void lock_delta(const TokenBlock& b, int delta);  // b's slots become (un)locked
  std::uint64_t free_slots(Tier t) const { return cap_[idx(t)] - used_[idx(t)]; }
  std::uint64_t mem_capacity() const { return cap_[0] + cap_[1]; }
  std::uint64_t per_request_slots() const;
  void check_emergency();
  static int idx(Tier t) { return static_cast<int>(t); }

  KvConfig cfg_;
  std::uint32_t groups_;
  std::vector<Tier> homes_;
  std::array<std::uint64_t, kTiers> cap_{}, used_{}, locked_{}, peak_{};
  std::uint64_t referenced_slots_ = 0;
  std::unordered_map<TokenBlockId, TokenBlock> blocks_;
  std::unordered_map<std::uint64_t, TokenBlockId> cache_;  // chain key -> block
  std::unordered_set<std::uint64_t> pins_;                 // pinned chain keys
  std::array<std::set<Victim>, kTiers> victims_;
  std::unordered_map<RequestId, std::vector<TokenBlockId>> requests_;
  std::unordered_map<RequestId, std::vector<TokenBlockId>> sources_;  // blend sources held
  // Note [Segment reuse]: cached blocks by content key (blend only).
  std::unordered_map<std::uint64_t, std::vector<TokenBlockId>> by_content_;
  std::unordered_map<std::uint64_t, std::uint32_t> seen_;  // Note [SSD admission]
  std::uint64_t ssd_credit_ = 0;                           // bytes, with ssd_write_budget
  std::deque<Pending> queue_;
  std::vector<Action> actions_;  // prepared, not taken yet
  // Note [Two-phase actions]: pending actions by seq; the last pending action per slot; per
  // tier, pending leaves (moves out, frees), those a take has claimed, and the unclaimed ones
  // in order. used_ counts slots where blocks rest once everything completes.
  std::unordered_map<std::uint64_t, Op> ops_;
  std::unordered_map<BlockId, std::uint64_t> slot_last_;
  std::array<std::uint64_t, kTiers> leaving_{}, claimed_{};
  std::array<std::deque<std::uint64_t>, kTiers> credits_;
  std::vector<Fresh> fresh_;
  std::vector<TokenBlockId> damaged_;  // damaged blocks still referenced, or not yet dropped
  std::uint64_t next_seq_ = 1;
  TokenBlockId next_tb_ = 1;
  std::unique_ptr<Eviction> eviction_;  // Note [Eviction order]
  std::uint64_t tick_ = 0;            // one per admission: LRU recency, LFU decay
  std::uint64_t admitted_slots_ = 0;  // sum of admitted requests' slots, for the mean
  bool emergency_ = false;
  std::function<void(const KvAlert&)> alert_;
  KvStats st_;
};

}  // namespace u3m::kv
