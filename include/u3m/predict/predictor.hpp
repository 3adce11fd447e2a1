// Access predictors: fed one access event at a time, they answer which tensors
// will be accessed within the next horizon and roughly when.
//
// Note [Predictor contract]
// - Online: a predictor sees only what already happened. It is fed the events
//   of one op step (see below) through observe(), then step_done(), then it
//   may be asked predict(). The oracle is the one exception: it is built from
//   the whole trace and exists only as the upper bound.
// - No wall clock: all time comes from the events (Access::time_ns), so the
//   same code runs in real runs (wall-time events) and in the simulator
//   (virtual-time events).
// - Cost: observe() and step_done() are O(1) amortised per event; predict()
//   is O(|answer|) plus O(horizon) bookkeeping.
// - Identity: a tensor is named by its dense index (Access::tensor), the index
//   the tensor registry / trace gives it. A predictor can only name tensors it
//   has been told about, i.e. that appeared in some earlier event.
//
// Note [Window delta]
// A policy does not need the whole predicted set recomputed at every op: it
// keeps its own schedule and needs what *enters* the window [now, now+H).
// predict_window_delta reports that, and what left the window (a tensor
// whose predicted accesses all lie in the past or were withdrawn), so the
// policy's set equals the predicted window without re-reading it. The benchmark
// reports observe alone, observe + delta (what a policy pays) and observe +
// full predict(64) per step.
//
// Note [Op steps]
// The unit of "time" for horizons is the op step: a maximal run of
// consecutive events that belong to the same op record. Decision points sit
// between steps. A step's index is assigned by the feeder (TraceFeed for
// traces; the runtime's recorder online), so every predictor and the
// evaluator agree on it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "u3m/trace/model.hpp"

namespace u3m::predict {

// One access event with the context a predictor may use.
struct Access {
  std::uint64_t time_ns = 0;
  std::uint64_t step = 0;       // op-step index, 0,1,2,... (Note [Op steps])
  std::uint64_t op_sig = 0;     // stable signature of the op (name, class, phase, layer, job)
  std::uint32_t tensor = 0;     // dense tensor index
  std::uint32_t job = 0;        // the op's job
  std::uint32_t iteration = 0;  // the op's iteration within its job
  std::int32_t layer = trace::kNoLayer;         // the op's layer
  std::int32_t tensor_layer = trace::kNoLayer;  // the tensor's layer
  std::uint32_t tensor_job = 0;
  std::uint64_t bytes = 0;  // the tensor's size
  trace::EventKind kind = trace::EventKind::read;
  trace::OpClass cls = trace::OpClass::other;
  trace::Phase phase = trace::Phase::other;
  trace::Role role = trace::Role::other;
};

// read and write need the tensor's data resident: they are what the metrics
// call an access (alloc and free are information, not accesses).
inline bool is_access(trace::EventKind k) {
  return k == trace::EventKind::read || k == trace::EventKind::write;
}

// One predicted tensor. ops_ahead estimates how many op steps from the
// decision point until its next access: 0 means the very next step.
struct Predicted {
  std::uint32_t tensor = 0;
  std::uint32_t ops_ahead = 0;
};

class Predictor {
 public:
  virtual ~Predictor() = default;
  virtual std::string_view name() const = 0;
  // Feeds one event of the current step.
  virtual void observe(const Access& a) = 0;
  // The current step is complete; the next call to predict() is a decision
  // point before the next step.
  virtual void step_done() {}
  // Replaces `out` with the tensors predicted to be accessed within the next
  // `horizon_ops` steps (ops_ahead < horizon_ops), each at most once.
  virtual void predict(std::uint32_t horizon_ops, std::vector<Predicted>& out) = 0;
  // The incremental form a policy uses (Note [Window delta]): replaces
  // `entered` with the tensors in the predicted window now that were not in
  // it at the previous call (with their ops_ahead), and `left` with those
  // that were and are not now. Call it at every decision point with the same
  // horizon. The default computes predict() and diffs (O(answer)); a
  // predictor may override it with a cheaper exact or documented near-exact
  // form.
  virtual void predict_window_delta(std::uint32_t horizon_ops, std::vector<Predicted>& entered,
                                    std::vector<std::uint32_t>& left);
  // Online estimate of the event-time span of one op step, in ns, so that a
  // policy can turn ops_ahead into a next-access time estimate:
  // now + (ops_ahead + 0.5) * ns_per_op().
  double ns_per_op() const { return ns_per_op_; }
  // Whether predict()'s answers may depend on the events' times, not only on
  // the sequence of events (WindowLog shares them across runs when not).
  virtual bool answers_depend_on_time() const { return true; }
  // Mode switches its own detector applied so far (the design's detector,
  // docs/prediction.md); -1 for a predictor without one.
  virtual std::int64_t mode_switches() const { return -1; }

 protected:
  // Call from observe(): keeps ns_per_op_ as an EMA of step-start spacing.
  void track_time(const Access& a);

 private:
  double ns_per_op_ = 0;
  std::uint64_t last_step_ = UINT64_MAX, last_step_time_ = 0;
  // Default predict_window_delta: the last answer's generation per tensor.
  std::vector<Predicted> delta_full_, delta_prev_;
  std::vector<std::uint64_t> delta_mark_;
  std::uint64_t delta_gen_ = 0;
};

// Pre-digested form of a trace for feeding predictors: each event as an
// Access with its step number, and per-step event ranges.
class TraceFeed {
 public:
  explicit TraceFeed(const trace::Trace& t);
  const trace::Trace& trace() const { return *trace_; }
  std::size_t num_steps() const { return step_begin_.size() - 1; }
  std::size_t num_events() const { return trace_->events.size(); }
  // Events [step_begin(s), step_begin(s+1)) form step s.
  std::size_t step_begin(std::size_t s) const { return step_begin_[s]; }
  // Event `event_index` as an Access; `step` is the step it belongs to.
  Access access_at(std::size_t event_index, std::size_t step) const;
  const trace::Op& step_op(std::size_t s) const;
  // Feeds steps [0, n) to p (observe each event, then step_done).
  void feed(Predictor& p, std::size_t first_step, std::size_t end_step) const;

 private:
  const trace::Trace* trace_;
  std::vector<std::size_t> step_begin_;  // size num_steps + 1
  std::vector<std::uint64_t> op_sig_;    // per op record
};

std::uint64_t op_signature(const trace::Op& op);

// Names accepted by make_predictor, default first.
const std::vector<std::string>& predictor_names();
inline constexpr std::string_view kDefaultPredictor = "u3m";

// Note [Predictor names]
// Issue 17 renamed the predictors: the default (per-job sequence replay) is
// "u3m", the design's per-class EMA is "design-ema". The old name "u3m-seq"
// stays accepted as an alias of "u3m". The old "u3m" meant the design's EMA;
// that meaning is gone (the name is the default's now).
// The canonical name of `name` (itself, or what an alias stands for), and
// whether `name` is a deprecated alias.
std::string_view canonical_predictor_name(std::string_view name, bool* deprecated = nullptr);

// Builds a predictor by name; throws u3m::InputError for an unknown name.
// `feed` is needed only by "oracle" (it reads the future), else may be null.
std::unique_ptr<Predictor> make_predictor(std::string_view name, const TraceFeed* feed = nullptr);

}  // namespace u3m::predict
