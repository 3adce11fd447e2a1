// u3m (formerly "u3m-seq"): the default predictor.
//
// Note [u3m-seq]
// Mixed training+serving streams are interleavings of a few jobs, and each
// job is highly regular *in its own op sequence*: a training step repeats
// the previous one; a decode step repeats the previous decode step, except
// that each request's KV blocks are new tensors. A global recency or reuse
// model (lru, markov-reuse, the design's EMA) blurs the jobs together, and a
// global replay (trace-replay) breaks at the first interleaving change. So:
// 1. Per job, per iteration shape: the op steps of the job's last iteration
//    are recorded as slots (op signature + tensors read/written). Shapes are
//    keyed by the signature of the iteration's first op, so a job that
//    alternates kinds of iteration (train/generate, prefill/decode) keeps one
//    record per kind ("mode detection per job" without thresholds).
// 2. A replay pointer per job follows the job's ops through the record,
//    resynchronising on the op signature within resync_window slots, so
//    inserted or skipped ops (a prefill inside a decode step) do not derail it.
// 3. Live groups: tensors are grouped by (job, role, layer). A step that
//    touched every live member of a group also records "the group's live
//    members" (once the group is older than the current iteration);
//    replaying it names members born since (the KV blocks of
//    requests that arrived after the recorded step). This is "the op at this
//    slot reads the KV blocks of the live requests for this layer", learned
//    rather than hard-coded.
// 4. Lifetimes: a freed tensor is replayed only if it has been re-allocated
//    after a free before, or was allocated in the recorded iteration
//    (activations are, every step; the KV blocks of a finished request, born
//    iterations earlier, never come back).
// 5. Interleaving: the global stream is a sequence of runs of one job. Each
//    job's previous run and successor predict how the next H steps split
//    between jobs. A job whose last two runs each began with an iteration
//    (time-sharing at iteration granularity, e.g. one training step, then N
//    serving steps) is predicted to run for as many iterations as last time,
//    whatever their op counts; otherwise for as many op steps as last time.
//    A run counted in op steps that has outlived its predecessor is taken
//    to continue.
// 6. Relocation: an index op signature -> (record, slot) per job lets an
//    iteration that begins with an op no record begins with (iteration 0
//    began with a one-off init op), or an op far off the pointer, continue
//    from where that op was recorded. A job whose ops match nothing recorded
//    (a kind of iteration never seen) is "lost" and predicts nothing, until
//    its next run if its runs begin iterations: that begins its next
//    iteration, which the records tell.
// 7. Replaced transients: a matched step whose recorded transients are at
//    least half replaced (in place of what the recorded op bore it bore one
//    of another size, or left a freed recorded transient untouched) means the
//    iteration's shapes changed (a serving batch grew or shrank): the
//    record's transients not seen again are withheld until the next matched
//    step with recorded transients judges otherwise (Note [Named by birth]).
// 8. Freshness: wrapping into the next iteration of the kind in progress,
//    the slots already executed in this iteration replace the record's.
// 9. Successor: the kind of iteration that follows a kind is the most
//    frequent one seen, not the last (one arrival-driven prefill must not
//    make every decode step predict a prefill next).
// 10. Anchoring: where the signature is ambiguous or unknown, the tensors a
//    step touched place it in the record, and an inserted op that touches
//    what the slot just behind touched keeps the job in step (Note
//    [Anchoring on tensors]).
// Everything is O(1) amortised per event; predict() is O(H + answer);
// predict_window_delta is O(H) + the entering slots (Note [Incremental window]).
#include "u3m/predict/seq.hpp"

#include <xxhash.h>

#include <cstring>

namespace u3m::predict {

SeqPredictor::SeqPredictor(SeqParams p) : p_(p), mode_(p.mode) {}

SeqPredictor::Job& SeqPredictor::job(std::uint32_t j) {
  if (j >= jobs_.size()) jobs_.resize(j + 1);
  return jobs_[j];
}

bool SeqPredictor::fresh(std::uint32_t t, const Group& g) const {
  return ts_[t].last_iter + p_.stale_iterations >= jobs_[g.job].iter_count;
}

SeqPredictor::Where SeqPredictor::locate(const Job& jb, std::uint64_t sig) const {
  auto it = jb.where.find(sig);
  if (it == jb.where.end()) return {-1, 0};
  const Where w = it->second;  // validate: the record may have been replaced since
  if (w.rec < static_cast<int>(jb.records.size()) && w.pos < jb.records[w.rec].slots.size() &&
      jb.records[w.rec].slots[w.pos].sig == sig)
    return w;
  return {-1, 0};
}

SeqPredictor::Where SeqPredictor::find_record(const Job& jb, std::uint64_t first_sig) const {
  for (int i = 0; i < static_cast<int>(jb.records.size()); ++i)
    if (jb.records[i].first_sig == first_sig) return {i, 0};
  // No iteration began with this op, but one may contain it (an iteration
  // whose recorded first op was a one-off, e.g. the job's init).
  if (Where w = locate(jb, first_sig); w.rec >= 0) return w;
  // Else the most recently used shape is the best guess.
  int best = -1;
  for (int i = 0; i < static_cast<int>(jb.records.size()); ++i)
    if (best < 0 || jb.records[i].used > jb.records[best].used) best = i;
  return {best, 0};
}

void SeqPredictor::store_record(Job& jb, std::uint64_t next_first_sig, bool across_runs) {
  if (jb.cur.slots.empty()) return;
  using Counts = std::vector<std::pair<std::uint64_t, std::uint32_t>>;
  Counts& counts = (across_runs ? jb.run_succ : jb.kind_succ)[jb.cur.first_sig];
  std::size_t i = 0;
  while (i < counts.size() && counts[i].first != next_first_sig) ++i;
  if (i == counts.size()) counts.push_back({next_first_sig, 0});
  ++counts[i].second;
  // The most frequent successor; ties go to the latest (the one just counted).
  auto most_frequent = [](const Counts& c, std::size_t latest) {
    std::size_t best = latest < c.size() ? latest : 0;
    for (std::size_t k = 0; k < c.size(); ++k)
      if (c[k].second > c[best].second) best = k;
    return c[best].first;
  };
  auto within = jb.kind_succ.find(jb.cur.first_sig);
  auto across = jb.run_succ.find(jb.cur.first_sig);
  jb.cur.has_next_run = across != jb.run_succ.end();
  if (jb.cur.has_next_run)
    jb.cur.next_run_sig = most_frequent(across->second, across_runs ? i : SIZE_MAX);
  // Without a within-run successor yet, the run-start kind is the best guess.
  jb.cur.has_next = true;
  jb.cur.next_sig = within != jb.kind_succ.end()
                        ? most_frequent(within->second, across_runs ? SIZE_MAX : i)
                        : jb.cur.next_run_sig;
  jb.cur.used = ++uses_;
  int slot = -1;
  for (int i = 0; i < static_cast<int>(jb.records.size()); ++i)
    if (jb.records[i].first_sig == jb.cur.first_sig) slot = i;
  if (slot < 0 && jb.records.size() < p_.records_per_job) {
    jb.records.push_back(std::move(jb.cur));
  } else {
    if (slot < 0) {  // evict the least recently used shape
      slot = 0;
      for (int i = 1; i < static_cast<int>(jb.records.size()); ++i)
        if (jb.records[i].used < jb.records[slot].used) slot = i;
    }
    jb.records[slot] = std::move(jb.cur);
  }
  if (slot < 0) slot = static_cast<int>(jb.records.size()) - 1;
  const Record& r = jb.records[slot];
  for (std::uint32_t k = static_cast<std::uint32_t>(r.slots.size()); k-- > 0;)
    jb.where[r.slots[k].sig] = {slot, k};  // backwards: the first occurrence wins
  jb.cur = Record{};
}

void SeqPredictor::start_iteration(Job& jb, std::uint64_t first_sig) {
  jb.cur = Record{};
  jb.cur.first_sig = first_sig;
  jb.cur.iter_count = jb.iter_count;
  jb.cur.version = ++versions_;
  const Where w = find_record(jb, first_sig);
  jb.ref = w.rec;
  jb.pos = w.pos;
  jb.shape_changed = false;
  jb.born_of = 0;  // nothing of this iteration is matched yet
  jb.renamed = false;
  if (jb.ref >= 0) jb.records[jb.ref].used = ++uses_;
}

void SeqPredictor::begin_step(const Access& a) {
  if (open_) step_done();
  open_ = true;
  step_ = a.step;
  step_job_ = a.job;
  step_sig_ = a.op_sig;
  Job& jb = job(a.job);
  if (a.job != run_job_) {
    if (run_job_ != UINT32_MAX) {
      Job& prev = jobs_[run_job_];
      prev.last_run = run_len_;
      prev.prev_run_iters = prev.last_run_iters;
      prev.last_run_iters = run_iters_;
      prev.prev_aligned = prev.last_aligned;
      prev.last_aligned = run_aligned_;
      prev.succ = a.job;
    }
    run_job_ = a.job;
    run_len_ = 0;
    run_iters_ = 0;
    run_aligned_ = false;
  }
  if (p_.mode_detector && mode_.step(a.cls, a.time_ns)) {
    run_len_ = 0;  // a new mode: its length so far says nothing
    run_iters_ = 0;
    run_aligned_ = false;
  }
  ++run_len_;
  const bool new_iteration = !jb.started || a.iteration != jb.iteration;
  if (new_iteration) {
    ++run_iters_;
    if (run_len_ == 1) run_aligned_ = true;
    if (jb.started) store_record(jb, a.op_sig, run_len_ == 1);
    jb.started = true;
    jb.iteration = a.iteration;
    ++jb.iter_count;
    start_iteration(jb, a.op_sig);
  }
  step_new_iter_ = new_iteration;
  const auto at = static_cast<std::uint32_t>(jb.cur.entries.size());
  const auto born = static_cast<std::uint32_t>(jb.cur.born.size());
  jb.cur.slots.push_back({a.op_sig, at, at});
  jb.cur.slot_births.push_back({born, born});
}

// Note [Anchoring on tensors]
// Which recorded slot a step is follows from its signature and from the
// tensors it touched. The signature alone misleads where an iteration's ops
// repeat (an optimizer's per-parameter sequence) and their labels differ
// between iterations (the recorder gives an optimizer op the layer of the
// state it touches, state iteration 0 creates unnamed): the nearest slot with
// the signature is then another parameter's. And ops get inserted: with
// zero_grad(set_to_none=False), iteration 1's backward accumulates (add_)
// into the gradients iteration 0's ops produced; counted as misses, they made
// the job lost for stretches of the iteration, and a recorded add_ further
// on dragged the pointer there. So, unless the expected slot has the
// signature, the nearest slot within resync_window with the signature is
// taken if it shares a tensor with the step; else the nearer of the first
// slot up to it that shares one and one of the last anchor_back slots that
// does (an inserted op, just after the op whose tensor it touches: the
// pointer stays); else it. Without the signature in the window: wherever it
// was recorded (another shape of iteration), else the nearer sharing slot
// ahead or behind as above, else a miss. Tensors never place an iteration's
// first op: a kind of iteration never seen reads tensors (weights) that other
// kinds read too.
void SeqPredictor::match_step(Job& jb) {
  step_rec_ = -1;
  auto touched = [&](const Record& r, std::size_t k) {
    const Slot& sl = r.slots[k];
    for (std::uint32_t i = sl.begin; i < sl.end; ++i) {
      const std::uint32_t e = r.entries[i];
      if (!(e & kGroupBit) && ts_[e].step_stamp == step_) return true;
    }
    return false;
  };
  auto take = [&](int rec, std::size_t k) {
    step_rec_ = rec;
    step_pos_ = static_cast<std::uint32_t>(k);
    jb.ref = rec;
    jb.pos = step_pos_ + 1;
    jb.misses = 0;
  };
  // The first slot in [pos, end) that touched one of the step's tensors.
  auto by_tensor = [&](const Record& r, std::size_t end) -> std::int64_t {
    if (step_new_iter_) return -1;
    for (std::size_t k = jb.pos; k < end; ++k)
      if (touched(r, k)) return static_cast<std::int64_t>(k);
    return -1;
  };
  // How far behind the pointer (1 = the slot just executed), within
  // anchor_back, the nearest slot that touched one of the step's tensors is;
  // 0 if none.
  auto behind = [&](const Record& r) -> std::size_t {
    if (step_new_iter_) return 0;
    const std::size_t back = std::min<std::size_t>(jb.pos, p_.anchor_back);
    for (std::size_t d = 1; d <= back; ++d)
      if (touched(r, jb.pos - d)) return d;
    return 0;
  };
  // The nearer of a slot ahead sharing a tensor and one behind (an inserted
  // op: the pointer stays); false if neither.
  auto by_tensors = [&](const Record& r, std::size_t up_to) {
    const std::int64_t t = by_tensor(r, up_to);
    const std::size_t b = behind(r);
    if (b > 0 && (t < 0 || b <= static_cast<std::size_t>(t) - jb.pos)) {
      jb.misses = 0;
      return true;
    }
    if (t < 0) return false;
    take(jb.ref, static_cast<std::size_t>(t));
    return true;
  };
  std::size_t end = 0;
  if (jb.ref >= 0) {
    const Record& r = jb.records[jb.ref];
    end = std::min<std::size_t>(r.slots.size(), jb.pos + p_.resync_window);
    std::size_t k = jb.pos;
    while (k < end && r.slots[k].sig != step_sig_) ++k;
    if (k < end) {
      // The signature's nearest slot, unless it shares no tensor with the
      // step and a slot up to it does (another repetition of the sequence),
      // or one just behind does (an inserted op with a recorded signature).
      if (k == jb.pos || touched(r, k) || !by_tensors(r, k)) take(jb.ref, k);
      return;
    }
  }
  // Not in the window: wherever it was recorded, unless that is behind the
  // pointer in this very record (another parameter's op of a relabelled
  // sequence, iterations ago in the loop) and the step's tensors place it.
  const Where w = locate(jb, step_sig_);
  const bool back = w.rec >= 0 && w.rec == jb.ref && w.pos + p_.resync_window < jb.pos;
  if (w.rec >= 0 && !back) return take(w.rec, w.pos);
  if (jb.ref >= 0 && by_tensors(jb.records[jb.ref], end)) return;
  if (w.rec >= 0) return take(w.rec, w.pos);
  // An op never recorded: an insertion, or (first op of an iteration) a kind
  // of iteration never seen, whose future the records cannot tell.
  jb.misses = step_new_iter_ ? p_.lost_after : jb.misses + 1;
}

void SeqPredictor::join_group(std::uint32_t t, const Access& a) {
  TensorState& s = ts_[t];
  s.last_iter = job(a.tensor_job).iter_count;
  if (s.group != UINT32_MAX) return;
  if (s.key_group == UINT32_MAX || s.key_job != a.tensor_job || s.key_layer != a.tensor_layer ||
      s.key_role != a.role) {
    // The key's bytes, packed: a struct would hash its padding, which is
    // indeterminate, so equal keys could land in different groups.
    const auto role = static_cast<std::uint8_t>(a.role);
    unsigned char k[sizeof a.tensor_job + sizeof a.tensor_layer + sizeof role];
    std::memcpy(k, &a.tensor_job, sizeof a.tensor_job);
    std::memcpy(k + sizeof a.tensor_job, &a.tensor_layer, sizeof a.tensor_layer);
    std::memcpy(k + sizeof a.tensor_job + sizeof a.tensor_layer, &role, sizeof role);
    const std::uint64_t key = XXH64(k, sizeof k, 0);
    auto [it, inserted] = group_index_.try_emplace(key, static_cast<std::uint32_t>(groups_.size()));
    if (inserted) {
      groups_.emplace_back();
      groups_.back().job = a.tensor_job;
      groups_.back().born_iter = jobs_[a.tensor_job].iter_count;
    }
    s.key_group = it->second;
    s.key_job = a.tensor_job;
    s.key_layer = a.tensor_layer;
    s.key_role = a.role;
  }
  Group& g = groups_[s.key_group];
  s.group = s.key_group;
  s.slot_in_group = static_cast<std::uint32_t>(g.members.size());
  g.members.push_back(t);
}

void SeqPredictor::leave_group(std::uint32_t t) {
  TensorState& s = ts_[t];
  if (s.group == UINT32_MAX) return;
  Group& g = groups_[s.group];
  std::uint32_t last = g.members.back();
  g.members[s.slot_in_group] = last;
  ts_[last].slot_in_group = s.slot_in_group;
  g.members.pop_back();
  s.group = s.slot_in_group = UINT32_MAX;
}

void SeqPredictor::observe(const Access& a) {
  track_time(a);
  if (!open_ || a.step != step_) begin_step(a);
  if (a.tensor >= ts_.size()) ts_.resize(a.tensor + 1);
  TensorState& s = ts_[a.tensor];
  s.bytes = a.bytes;
  if (a.kind == trace::EventKind::free) {
    s.dead = true;
    leave_group(a.tensor);
    return;
  }
  if (s.dead) {
    s.dead = false;
    s.reborn = true;
  }
  if (a.kind == trace::EventKind::alloc) {
    Record& cur = jobs_[a.job].cur;
    SlotBirths& sb = cur.slot_births.back();
    s.alloc_iter = jobs_[a.job].iter_count;
    s.alloc_job = a.job;
    s.birth = {static_cast<std::uint32_t>(cur.slots.size() - 1), sb.end - sb.begin};
    cur.born.push_back(a.tensor);
    ++sb.end;
  }
  join_group(a.tensor, a);
  if (!is_access(a.kind)) return;
  if (s.step_stamp == step_) return;
  s.step_stamp = step_;
  step_tensors_.push_back(a.tensor);
  Group& g = groups_[s.group];
  if (g.touch_stamp != step_ + 1) {  // +1: stamp 0 means never
    g.touch_stamp = step_ + 1;
    g.touched = 0;
    step_groups_.push_back(s.group);
  }
  ++g.touched;
}

void SeqPredictor::step_done() {
  if (!open_) return;
  open_ = false;
  Job& jb = jobs_[step_job_];
  match_step(jb);
  if (step_rec_ >= 0) learn_births(jb);
  if (step_rec_ >= 0) {
    // A transient of the recorded step (allocated in the recorded iteration)
    // that this step did not touch, and that has been freed since, has been
    // replaced (e.g. serving activations whose batch changed): the record's
    // other transients are stale too. One still alive has not (a gradient
    // iteration 0 created, accumulated into from then on).
    // Most of them, not one: a trace whose naming is not quite stable (a
    // hidden result of an ET op renamed by a recycled storage id) must not
    // make the rest of the iteration look replaced.
    const Record& r = jb.records[step_rec_];
    const Slot& sl = r.slots[step_pos_];
    std::uint32_t transients = 0, untouched = 0;
    for (std::uint32_t k = sl.begin; k < sl.end; ++k) {
      const std::uint32_t e = r.entries[k];
      if (e & kGroupBit) continue;
      // Only what this op bore tells (Note [Named by birth]): a batch that
      // changed shows first where its activations are born; a read of an
      // earlier birth that went elsewhere is a loop that ended sooner.
      const std::uint32_t born_at = r.entry_birth[k].slot;
      if (born_at != UINT32_MAX && born_at != step_pos_) continue;
      const std::uint32_t now = born_now(jb, r, k);
      if (now == kNone) continue;  // it bore fewer (a shorter loop): nothing replaced
      if (now == e) {              // bore the recorded tensor again
        ++transients;
        continue;
      }
      // Not a transient of the record (born in another iteration, or by another job).
      if (ts_[e].alloc_iter != r.iter_count || ts_[e].alloc_job != step_job_) continue;
      ++transients;
      // What it bore in the recorded one's place stands in for it unless it
      // is of another size: a replacement (a batch that changed, a KV tensor
      // that grew).
      const bool kept = now != kUnborn
                            ? ts_[now].step_stamp == step_ && ts_[now].bytes == ts_[e].bytes
                            : ts_[e].step_stamp == step_;
      untouched += !kept && ts_[e].dead;
    }
    if (transients > 0) jb.shape_changed = untouched > 0 && 2 * untouched >= transients;
  }
  Record& rec = jb.cur;
  const auto this_slot = static_cast<std::uint32_t>(rec.slots.size() - 1);
  for (std::uint32_t t : step_tensors_) {
    rec.entries.push_back(t);
    const TensorState& ts = ts_[t];
    const bool here = ts.alloc_job == step_job_ && ts.alloc_iter == jb.iter_count;
    rec.entry_birth.push_back(here ? ts.birth : Birth{});
    if (here && ts.birth.slot != this_slot) {
      std::uint32_t& last = rec.slot_births.back().last;
      last = last == UINT32_MAX ? ts.birth.slot : std::max(last, ts.birth.slot);
    }
  }
  for (std::uint32_t gi : step_groups_) {
    Group& g = groups_[gi];
    if (g.touched < p_.min_group) continue;
    if (g.touched != g.members.size() && 2 * g.touched >= g.members.size()) {
      // Drop members that stopped being used (traces without free events).
      for (std::size_t i = 0; i < g.members.size();)
        if (!fresh(g.members[i], g))
          leave_group(g.members[i]);
        else
          ++i;
    }
    // A group still being discovered (created in this iteration) is not yet
    // known to be whole: touching all of it proves nothing.
    if (g.touched == g.members.size() && g.born_iter < jobs_[g.job].iter_count) {
      rec.entries.push_back(kGroupBit | gi);
      rec.entry_birth.push_back({});
    }
  }
  rec.slots.back().end = static_cast<std::uint32_t>(rec.entries.size());
  step_tensors_.clear();
  step_groups_.clear();
}

// Note [Named by birth]
// A record names the tensors a slot touched by identity. Where identities
// are positional (the ET importer names a tensor by the op path and the
// occurrence that bore it), a loop whose trip count varies renames them: an
// LSTM over a longer sequence bears more per-time-step activations, and its
// backward, walking the time steps in reverse, reads at its j-th step what
// the recorded iteration read at another. Replaying the identities then
// names the wrong time step's tensors, and the recorded ones that the new
// iteration never bore looked like a replaced batch (item 7), withholding
// the rest of the iteration. So a recorded entry that was born in the
// recorded iteration is also kept as where it was born: the slot and its
// rank among that slot's allocations. Once this iteration has run the slot
// that matched that birth slot, the entry names what this iteration bore
// there, at the recorded rank plus a shift: the shift is learned per birth
// slot from the steps since (an op that read rank q in the record and reads
// rank q' now: q' - q), 0 until one is seen. With stable names that is the
// recorded tensor itself, so nothing changes; where names moved it is the
// tensor the op will read. Optimizer state the recorded iteration created
// and that lives on keeps its identity. Slots past the iteration in progress
// keep their identities: their births have not happened.
// Item 7 follows: of the recorded entries born in the recorded iteration,
// only those the matched op bore itself, or whose birth is not known (no
// alloc event), are judged (a batch that changed shows where its
// activations are born); a recorded tensor borne again, or one of the same
// size in its place, is kept (a renaming, not a replacement); fewer births (a
// shorter loop) judge nothing. The verdict is taken again at every matched
// step with entries to judge, so a step whose only judged entries are alive
// or borne again ends it: an LSTM's stack over the time steps changes size
// with the sequence, the steps after it bear what the record did.
void SeqPredictor::learn_births(Job& jb) {
  const Record& r = jb.records[step_rec_];
  if (r.version != jb.born_of) {  // a record newly followed: nothing matched in it yet
    jb.born_of = r.version;
    jb.matched_at.assign(r.slots.size(), UINT32_MAX);
    jb.shift.assign(r.slots.size(), 0);
    ++jb.shift_epoch;
  }
  // Only the same op bears the same tensors: a slot matched by its tensors
  // (another op) names nothing by birth.
  const Slot& sl = r.slots[step_pos_];
  if (sl.sig != step_sig_) return;
  jb.matched_at[step_pos_] = static_cast<std::uint32_t>(jb.cur.slots.size() - 1);
  // Bore other tensors than the record's slot: the slots reading them name
  // others than the recorded ones (the window names them anew).
  if (!jb.renamed) {
    const SlotBirths& was = r.slot_births[step_pos_];
    const SlotBirths& now = jb.cur.slot_births.back();
    jb.renamed = now.end - now.begin != was.end - was.begin ||
                 !std::equal(r.born.begin() + was.begin, r.born.begin() + was.end,
                             jb.cur.born.begin() + now.begin);
  }
  // The same op: its tensors come in the recorded order (first touch).
  const std::size_t n = std::min<std::size_t>(sl.end - sl.begin, step_tensors_.size());
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t k = sl.begin + static_cast<std::uint32_t>(i);
    if (r.entries[k] & kGroupBit) break;
    const Birth b = r.entry_birth[k];
    if (b.slot == UINT32_MAX || jb.matched_at[b.slot] == UINT32_MAX) continue;
    const TensorState& ts = ts_[step_tensors_[i]];
    if (ts.alloc_job != step_job_ || ts.alloc_iter != jb.iter_count ||
        ts.birth.slot != jb.matched_at[b.slot])
      continue;
    const auto d = static_cast<std::int32_t>(ts.birth.rank) - static_cast<std::int32_t>(b.rank);
    if (jb.shift[b.slot] != d) {
      jb.shift[b.slot] = d;
      ++jb.shift_epoch;
    }
  }
}

std::uint32_t SeqPredictor::born_now(const Job& jb, const Record& r, std::uint32_t k) const {
  if (r.version != jb.born_of) return kUnborn;
  const Birth b = r.entry_birth[k];
  if (b.slot == UINT32_MAX) return kUnborn;
  // Born in the recorded iteration and alive since (optimizer state that
  // iteration created): the tensor itself, not what this one bore there.
  const TensorState& e = ts_[r.entries[k]];
  if (!e.dead && e.alloc_iter == r.iter_count && e.alloc_job == job_index(jb)) return kUnborn;
  const std::uint32_t at = jb.matched_at[b.slot];
  if (at == UINT32_MAX) return kUnborn;
  const SlotBirths& s = jb.cur.slot_births[at];
  const std::int64_t q = std::int64_t(b.rank) + jb.shift[b.slot];
  if (q < 0 || q >= std::int64_t(s.end - s.begin)) return kNone;
  return jb.cur.born[s.begin + static_cast<std::uint32_t>(q)];
}

void SeqPredictor::emit_slot(const Job& jb, const Record& r, const Slot& s, bool now,
                             std::uint32_t ahead, std::vector<Predicted>& out) {
  auto put = [&](std::uint32_t t) {
    if (out_stamp_[t] == out_stamp_now_) return;
    out_stamp_[t] = out_stamp_now_;
    out.push_back({t, ahead});
  };
  for (std::uint32_t k = s.begin; k < s.end; ++k) {
    std::uint32_t e = r.entries[k];
    if (!(e & kGroupBit)) {
      if (now) {  // born where this iteration has been: what it bore there
        const std::uint32_t b = born_now(jb, r, k);
        if (b == kNone) continue;
        if (b != kUnborn) {
          put(b);
          continue;
        }
      }
      // A freed tensor comes back if it has come back before, or if it was
      // born in the recorded iteration (training activations), not if it
      // outlived it (a finished request's KV blocks).
      const TensorState& s = ts_[e];
      const bool transient = s.alloc_iter == r.iter_count && s.alloc_job == job_index(jb);
      // After this iteration replaced a recorded transient, the record's
      // transients not yet seen again are likely replaced too.
      if (transient && jb.shape_changed && &r != &jb.cur && s.last_iter < jb.iter_count) continue;
      if (!s.dead || s.reborn || transient) put(e);
      continue;
    }
    const Group& g = groups_[e & ~kGroupBit];
    for (std::uint32_t m : g.members)
      if (fresh(m, g)) put(m);
  }
}

template <typename Visit>
void SeqPredictor::walk(std::uint32_t horizon, Visit&& visit) {
  if (run_job_ == UINT32_MAX) return;
  cursors_.resize(jobs_.size());
  for (std::size_t j = 0; j < jobs_.size(); ++j) {
    const Job& jb = jobs_[j];
    cursors_[j] = {lost(jb) ? -1 : jb.ref, jb.pos, -1, false, false};
    // Lost in an iteration that another job's run interrupted: if the job's
    // runs begin iterations, its next run begins the next one, which the
    // records tell; where it got lost does not matter.
    if (lost(jb) && j != run_job_ && jb.last_aligned && jb.started)
      if (const Where w = find_record(jb, jb.cur.first_sig); w.rec >= 0)
        cursors_[j] = {w.rec, static_cast<std::uint32_t>(jb.records[w.rec].slots.size()), -1, false,
                       false};
  }

  // How long each run lasts: in iterations (wraps of the job's record) for
  // iteration-aligned jobs, else in op steps; -1 = unlimited.
  struct RunSpec {
    std::uint64_t ops;
    std::int64_t wraps;
  };
  auto spec = [&](std::uint32_t j, bool current) -> RunSpec {
    const Job& jb = jobs_[j];
    const std::uint64_t done = current ? run_len_ : 0;
    if (jb.last_run == 0) return {horizon, -1};  // alone so far: it goes on
    if (jb.last_aligned && jb.prev_aligned && (!current || run_aligned_) && cursors_[j].rec >= 0) {
      // Counted in iterations: one that has begun more than last time goes on.
      std::int64_t left = std::int64_t(jb.last_run_iters) - (current ? run_iters_ : 0);
      if (p_.steady_runs_only && current && jb.last_run_iters != jb.prev_run_iters)
        return {horizon, -1};  // run lengths vary: it goes on
      return {horizon, left < 0 ? -1 : left};
    }
    // Counted in op steps: one that has run past its predicted end
    // (overrun_factor times the last run) goes on; it does not end "now" at
    // every step until it does.
    if (done > p_.overrun_factor * jb.last_run) return {horizon, -1};
    return {jb.last_run > done ? jb.last_run - done : 0, -1};
  };
  std::uint32_t j = run_job_;
  std::uint32_t start = 0, empty_runs = 0;  // start: steps ahead where the run begins
  bool current = true;
  while (start < horizon && empty_runs <= jobs_.size()) {
    const RunSpec rs = spec(j, current);
    const bool run_is_current = current;
    current = false;
    const Job& jb = jobs_[j];
    std::uint32_t ahead = start;
    std::uint64_t i = 0;
    std::int64_t wraps = 0;
    for (; i < rs.ops && ahead < horizon; ++i, ++ahead) {
      Cursor& c = cursors_[j];
      if (c.rec == -1) continue;  // nothing recorded (or lost) for this job
      if (c.rec == kCurrent && c.pos >= jb.cur.slots.size()) c = {c.then, c.pos, -1, true, true};
      const Record* r = c.rec == kCurrent ? &jb.cur : &jb.records[c.rec];
      if (c.pos >= r->slots.size()) {                   // into the job's next iteration
        if (rs.wraps >= 0 && wraps >= rs.wraps) break;  // the run ends with the iteration
        ++wraps;
        // A run of another job that begins at an iteration boundary begins
        // with the kind that usually begins the job's runs after this kind.
        const bool run_start = !run_is_current && i == 0;
        const Where nx = run_start && r->has_next_run ? find_record(jb, r->next_run_sig)
                         : r->has_next                ? find_record(jb, r->next_sig)
                                                      : Where{c.rec, 0};
        // The next iteration of the kind in progress: the part of it already
        // executed in this iteration is fresher than the record.
        if (!c.fresh_used && nx.pos == 0 && !jb.cur.slots.empty() &&
            jb.records[nx.rec].first_sig == jb.cur.first_sig)
          c = {kCurrent, 0, nx.rec, true, true};
        else
          c = {nx.rec, nx.pos, -1, c.fresh_used, true};
        r = c.rec == kCurrent ? &jb.cur : &jb.records[c.rec];
      }
      visit(ahead, jb, *r, c.pos++, !c.wrapped);
    }
    empty_runs = i == 0 ? empty_runs + 1 : 0;
    start = ahead;
    std::uint32_t nj = jb.succ;
    j = nj == UINT32_MAX || nj >= jobs_.size() ? j : nj;
  }
}

void SeqPredictor::new_stamp() {
  if (out_stamp_.size() < ts_.size()) out_stamp_.resize(ts_.size(), 0);
  if (++out_stamp_now_ == 0) {  // wrapped: clear so old stamps cannot collide
    std::fill(out_stamp_.begin(), out_stamp_.end(), 0);
    out_stamp_now_ = 1;
  }
}

void SeqPredictor::predict(std::uint32_t horizon, std::vector<Predicted>& out) {
  out.clear();
  new_stamp();
  walk(horizon, [&](std::uint32_t ahead, const Job& jb, const Record& r, std::uint32_t pos,
                    bool now) { emit_slot(jb, r, r.slots[pos], now, ahead, out); });
}

// Note [Incremental window]
// A policy needs what enters the horizon, not the whole set at every op. The
// window [now, now+H) is kept as one materialised slot per step ahead (the
// tensors emit_slot named when the slot entered), with a count per tensor of
// the window slots naming it. At each call the window slides (the slots now
// in the past are released) and the plan (which recorded slot lands on each
// step ahead: O(H), no tensors touched) is compared with the kept one; only
// slots whose identity (record version, position, filtering) changed are
// released and re-materialised. A tensor whose count rises from 0, and that
// was not in the previous window, has entered. In steady state that is one
// slot per step: O(H) bookkeeping + O(slot size) per op. A slot's tensors
// are fixed when it enters: KV blocks born later are named when a slot of a
// later iteration enters (the policy sees them written meanwhile).
void SeqPredictor::predict_window_delta(std::uint32_t horizon, std::vector<Predicted>& entered,
                                        std::vector<std::uint32_t>& left) {
  entered.clear();
  left.clear();
  win_zero_.clear();
  const std::uint64_t now = step_ == UINT64_MAX ? 0 : step_ + 1;
  if (win_cnt_.size() < ts_.size()) {
    win_cnt_.resize(ts_.size(), 0);
    win_left_.resize(ts_.size(), 0);
  }
  ++win_call_;
  auto release = [&](WinSlot& w) {
    for (std::uint32_t t : w.tensors)
      if (--win_cnt_[t] == 0) {
        win_left_[t] = win_call_;
        win_zero_.push_back(t);
      }
    w.tensors.clear();
    w.key = {};
    w.filled = false;
  };
  // The ring slot of absolute step s is s % H, walked with a wrapping index
  // (one division per call: a division per slot was a fifth of this call).
  auto next = [horizon](std::size_t i) { return i + 1 == horizon ? 0 : i + 1; };
  if (win_.size() != horizon) {  // (re)start with an empty window
    for (WinSlot& w : win_) release(w);
    win_.assign(horizon, WinSlot{});
  } else if (horizon > 0) {
    const std::uint64_t end = std::min<std::uint64_t>(now, win_base_ + horizon);
    std::size_t i = win_base_ < end ? win_base_ % horizon : 0;
    for (std::uint64_t s = win_base_; s < end; ++s, i = next(i)) release(win_[i]);
  }
  win_base_ = now;
  // One pass: each step ahead the plan lands on is compared with the kept
  // slot as the walk visits it (a tensor moving from one slot to another is
  // neither entered nor left: win_left_ marks what fell to 0 in this call).
  const std::size_t first = horizon > 0 ? now % horizon : 0;  // ring slot of step `now`
  std::size_t ring = first;
  std::uint32_t expect = 0;  // the next step ahead to settle
  auto settle = [&](std::uint32_t a, const WinKey& key, const Job* jb, const Record* r) {
    WinSlot& w = win_[ring];
    ring = next(ring);
    expect = a + 1;
    if (w.key == key && w.filled) return;
    release(w);
    w.key = key;
    w.filled = true;
    if (!r) return;
    new_stamp();
    scratch_.clear();
    emit_slot(*jb, *r, r->slots[key.pos], key.shifts != 0, a, scratch_);
    for (const Predicted& p : scratch_) {
      w.tensors.push_back(p.tensor);
      if (win_cnt_[p.tensor]++ == 0 && win_left_[p.tensor] != win_call_) entered.push_back(p);
    }
  };
  walk(horizon,
       [&](std::uint32_t ahead, const Job& jb, const Record& r, std::uint32_t pos, bool now) {
         while (expect < ahead) settle(expect, WinKey{}, nullptr, nullptr);  // nothing lands there
         // A slot named by birth is named anew when a shift changes, and,
         // in an iteration that bore other tensors than its record, once the
         // last earlier slot whose births it reads has run (before, it named
         // the recorded ones). With stable names neither happens.
         std::uint64_t shifts = 0;
         if (now) {
           const std::uint32_t last = r.slot_births[pos].last;
           const bool born = jb.renamed && last != UINT32_MAX && r.version == jb.born_of &&
                             jb.matched_at[last] != UINT32_MAX;
           shifts = 2 * (jb.shift_epoch + 1) + born;
         }
         settle(ahead, {r.version, pos, jb.shape_changed && &r != &jb.cur, shifts}, &jb, &r);
       });
  while (expect < horizon) settle(expect, WinKey{}, nullptr, nullptr);
  for (std::uint32_t t : win_zero_)  // fell to 0 and stayed there
    if (win_cnt_[t] == 0 && win_left_[t] == win_call_) {
      left.push_back(t);
      win_left_[t] = 0;  // once
    }
}

}  // namespace u3m::predict
