// u3m (formerly "u3m-seq"), the default predictor: per-job sequence replay keyed by op slot,
// with live-group expansion and a learned job-interleaving model. See
// docs/prediction.md and Note [u3m-seq] in src/predict/seq.cpp.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "u3m/predict/mode_switch.hpp"
#include "u3m/predict/predictor.hpp"

namespace u3m::predict {

struct SeqParams {
  // How far ahead (in recorded slots) an observed op may resynchronise the
  // replay pointer; ops not found within it count as insertions.
  std::uint32_t resync_window = 64;
  // An unmatched op that touches what one of the last anchor_back recorded
  // slots touched is in step (an inserted op: Note [Anchoring on tensors]).
  std::uint32_t anchor_back = 8;
  // Recorded iteration shapes kept per job, keyed by the signature of the
  // iteration's first op (training steps, prefill and decode steps differ).
  std::uint32_t records_per_job = 4;
  // A step that touched every live member of a tensor group (same job, role
  // and layer; at least min_group members) is recorded as "the live members
  // of that group", so the replay names tensors born since (new KV blocks).
  std::uint32_t min_group = 2;
  // Group members not accessed for this many iterations of their job are
  // dropped from the group (a stand-in for free events a trace may lack).
  std::uint32_t stale_iterations = 2;
  // A run counted in op steps (a job whose runs do not begin iterations)
  // longer than this many times its previous run is assumed to continue.
  // 1: past its predicted end it goes on, rather than being predicted to end
  // at every step until it does (issue 17; was 2, applied to every run).
  std::uint32_t overrun_factor = 1;
  // Consecutive ops of a job that match nothing recorded after which the job
  // is "lost": nothing is predicted for it until an op matches again.
  std::uint32_t lost_after = 2;
  // A job whose last two runs (next to another job) began a different number
  // of iterations is predicted to go on rather than to stop where the last
  // run stopped (issue 17: random time-sharing).
  bool steady_runs_only = true;
  // The design's mode-switch detector and thrash guard (mode_switch.hpp): an
  // applied switch restarts the current run's length count, as the design
  // re-warms after a switch. Off: it did not help on the corpus
  // (docs/prediction.md, "Mode switches").
  bool mode_detector = false;
  ModeSwitchParams mode;
};

class SeqPredictor final : public Predictor {
 public:
  explicit SeqPredictor(SeqParams p = {});
  std::string_view name() const override { return "u3m"; }
  std::int64_t mode_switches() const override {
    return p_.mode_detector ? std::int64_t(mode_.switches()) : -1;
  }
  // Time only feeds ns_per_op(); the answers follow the event sequence.
  bool answers_depend_on_time() const override { return false; }
  void observe(const Access& a) override;
  void step_done() override;
  void predict(std::uint32_t horizon_ops, std::vector<Predicted>& out) override;
  // O(H) bookkeeping + the entering slots' tensors (Note [Incremental window]).
  void predict_window_delta(std::uint32_t horizon_ops, std::vector<Predicted>& entered,
                            std::vector<std::uint32_t>& left) override;

 private:
  static constexpr std::uint32_t kGroupBit = 0x80000000u;
  struct Slot {
    std::uint64_t sig;
    std::uint32_t begin, end;  // into Record::entries
  };
  // A slot's births, apart from Slot: the walk reads every slot ahead, and a
  // small Slot keeps that to one cache line per four slots.
  struct SlotBirths {
    std::uint32_t begin, end;  // into Record::born
    // The last earlier slot of the iteration whose births this one touched
    // (UINT32_MAX: none), for the window's identity of a slot named by birth.
    std::uint32_t last = UINT32_MAX;
  };
  // Where a tensor was born in its job's iteration: the slot and the rank
  // among that slot's allocations (Note [Named by birth] in seq.cpp).
  struct Birth {
    std::uint32_t slot = UINT32_MAX;  // UINT32_MAX: not born in the iteration
    std::uint32_t rank = 0;
  };
  struct Record {
    std::uint64_t first_sig = 0;
    std::uint64_t next_sig = 0;  // first op of the iteration that most often followed its kind
    bool has_next = false;
    // The same across a break: the kind of iteration that most often began
    // the job's next run after a run ended with this kind (a rollout begins
    // with a prefill although decode follows decode within it).
    std::uint64_t next_run_sig = 0;
    bool has_next_run = false;
    std::uint64_t used = 0;        // for replacement
    std::uint64_t version = 0;     // unique per recorded iteration (window identity)
    std::uint32_t iter_count = 0;  // the job's iteration count when recorded
    std::vector<Slot> slots;
    std::vector<std::uint32_t> entries;   // tensor index, or kGroupBit | group index
    std::vector<Birth> entry_birth;       // per entry (groups: none)
    std::vector<std::uint32_t> born;      // tensors each slot allocated, in order
    std::vector<SlotBirths> slot_births;  // per slot
  };
  struct Where {
    int rec;
    std::uint32_t pos;
  };
  struct Job {
    bool started = false;
    // Where each op signature occurs in the records (first occurrence in the
    // most recently stored record that has it); validated on use.
    std::unordered_map<std::uint64_t, Where> where;
    // How often each kind of iteration (first op) was followed by each kind:
    // a record's successor is the most frequent one, not merely the last.
    // Counted apart when another job ran in between (run_succ).
    std::unordered_map<std::uint64_t, std::vector<std::pair<std::uint64_t, std::uint32_t>>>
        kind_succ, run_succ;
    std::uint32_t misses = 0;    // consecutive ops that matched nothing recorded
    bool shape_changed = false;  // this iteration replaced a recorded transient
    std::uint32_t iteration = 0;
    std::uint32_t iter_count = 0;  // iterations seen, for staleness
    std::vector<Record> records;
    Record cur;
    int ref = -1;                      // record replayed this iteration, -1 if none
    std::uint32_t pos = 0;             // next expected slot in records[ref]
    std::uint64_t last_run = 0;        // length of its previous run of consecutive steps
    std::uint32_t last_run_iters = 0;  // iterations begun in that run
    std::uint32_t prev_run_iters = 0;  // and in the run before it
    bool last_aligned = false, prev_aligned = false;  // its last two runs began an iteration
    std::uint32_t succ = UINT32_MAX;                  // job that ran after its previous run
    // Note [Named by birth]: for the record this iteration follows (version
    // `born_of`), the slot of this iteration each recorded slot matched, and
    // per recorded slot the shift of the ranks of the births read since.
    std::uint64_t born_of = 0;
    std::vector<std::uint32_t> matched_at;
    std::vector<std::int32_t> shift;
    std::uint64_t shift_epoch = 0;  // bumped when a shift changes (window identity)
    bool renamed = false;           // this iteration bore other tensors than its record somewhere
  };
  struct Group {
    std::uint32_t job = 0;
    std::uint32_t born_iter = 0;  // its job's iteration count when it was created
    std::vector<std::uint32_t> members;
    std::uint32_t touched = 0;  // members touched in the current step
    std::uint64_t touch_stamp = 0;
  };
  struct TensorState {
    std::uint32_t group = UINT32_MAX;
    std::uint32_t slot_in_group = UINT32_MAX;
    std::uint32_t last_iter = 0;  // job iteration count of its last access
    std::uint64_t step_stamp = UINT64_MAX;
    bool dead = false;                      // freed and not allocated since
    bool reborn = false;                    // has been allocated again after a free
    std::uint32_t alloc_iter = UINT32_MAX;  // iteration count of the allocating op's job
    std::uint32_t alloc_job = 0;            // the allocating op's job
    std::uint64_t bytes = 0;
    Birth birth;  // in that job's iteration alloc_iter
    // The group its key (job, layer, role) hashed to when it last joined one:
    // a tensor freed and allocated again (activations, every step) rejoins
    // it without hashing. Groups are never removed, so the index stays valid.
    std::uint32_t key_group = UINT32_MAX;
    std::uint32_t key_job = 0;
    std::int32_t key_layer = 0;
    trace::Role key_role = trace::Role::other;
  };

  Job& job(std::uint32_t j);
  std::uint32_t job_index(const Job& jb) const {
    return static_cast<std::uint32_t>(&jb - jobs_.data());
  }
  void begin_step(const Access& a);
  void start_iteration(Job& jb, std::uint64_t first_sig);
  // The recorded slot the step just observed is (Note [Anchoring on tensors]).
  void match_step(Job& jb);
  void join_group(std::uint32_t t, const Access& a);
  void leave_group(std::uint32_t t);
  // Calls visit(ahead, job, record, slot, now) for each step ahead the plan
  // fills; `now`: the slot is in the iteration the job has in progress.
  template <typename Visit>
  void walk(std::uint32_t horizon, Visit&& visit);
  void new_stamp();
  // `now`: the slot falls in the iteration in progress of the job, so what
  // the record names by birth is what this iteration bore there.
  void emit_slot(const Job& jb, const Record& r, const Slot& s, bool now, std::uint32_t ahead,
                 std::vector<Predicted>& out);
  // The tensor this iteration bore where recorded entry `k` of `r` was born:
  // kUnborn if that slot has not run, kNone if it bore nothing there.
  static constexpr std::uint32_t kUnborn = UINT32_MAX, kNone = UINT32_MAX - 1;
  std::uint32_t born_now(const Job& jb, const Record& r, std::uint32_t k) const;
  // After match_step: which slot of this iteration the matched recorded slot
  // is, and the shifts its tensors show (Note [Named by birth]).
  void learn_births(Job& jb);
  bool fresh(std::uint32_t t, const Group& g) const;
  // The record (and slot) an iteration that begins with `first_sig` follows.
  Where find_record(const Job& jb, std::uint64_t first_sig) const;
  // The record and slot to continue from when the job's next op is `sig`
  // (rec -1 if nothing recorded matches).
  Where locate(const Job& jb, std::uint64_t sig) const;
  bool lost(const Job& jb) const { return jb.misses >= p_.lost_after; }
  // `across_runs`: another job ran between this iteration and the next.
  void store_record(Job& jb, std::uint64_t next_first_sig, bool across_runs);

  SeqParams p_;
  ModeSwitchDetector mode_;
  std::vector<Job> jobs_;
  std::vector<TensorState> ts_;
  std::vector<Group> groups_;
  std::unordered_map<std::uint64_t, std::uint32_t> group_index_;
  // Current step.
  std::uint64_t step_ = UINT64_MAX;
  std::uint32_t step_job_ = 0;
  int step_rec_ = -1;  // the recorded slot this step matched, if any
  std::uint32_t step_pos_ = 0;
  std::uint64_t step_sig_ = 0;
  bool step_new_iter_ = false;  // the step began an iteration of its job
  std::vector<std::uint32_t> step_tensors_;
  std::vector<std::uint32_t> step_groups_;
  bool open_ = false;
  // Interleaving: the current run of consecutive steps of one job.
  std::uint32_t run_job_ = UINT32_MAX;
  std::uint64_t run_len_ = 0;
  std::uint32_t run_iters_ = 0;  // iterations begun in the current run
  bool run_aligned_ = false;     // the current run began with an iteration
  std::uint64_t uses_ = 0;
  // predict() scratch.
  std::vector<std::uint32_t> out_stamp_;
  std::uint32_t out_stamp_now_ = 0;
  // rec >= 0: a record; kCurrent: the job's iteration in progress (its
  // executed prefix predicts the next iteration's), continuing with record
  // `then` at the same position.
  static constexpr int kCurrent = -2;
  struct Cursor {
    int rec;
    std::uint32_t pos;
    int then = -1;
    bool fresh_used = false;  // the in-progress iteration was replayed already
    bool wrapped = false;     // past the iteration the job has in progress
  };
  std::vector<Cursor> cursors_;
  std::uint64_t versions_ = 0;
  // predict_window_delta state (Note [Incremental window] in seq.cpp).
  struct WinKey {
    std::uint64_t version = 0;
    std::uint32_t pos = 0;
    bool filtered = false;
    std::uint64_t shifts = 0;  // the job's shift_epoch, for slots named by birth
    bool operator==(const WinKey&) const = default;
  };
  struct WinSlot {
    WinKey key;
    bool filled = false;
    std::vector<std::uint32_t> tensors;
  };
  std::vector<WinSlot> win_;  // ring indexed by absolute step % H
  std::uint64_t win_base_ = 0, win_call_ = 0;
  std::vector<std::uint32_t> win_cnt_;
  std::vector<std::uint64_t> win_left_;
  std::vector<Predicted> scratch_;
  std::vector<std::uint32_t> win_zero_;  // counts that fell to 0 in this call
};

}  // namespace u3m::predict
