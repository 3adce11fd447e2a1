// TraceFeed, the predictor registry and shared helpers.
#include <cstring>
#include <utility>

#include <xxhash.h>

#include "predictors_impl.hpp"
#include "u3m/predict/predictor.hpp"
#include "u3m/predict/seq.hpp"
#include "u3m/predict/u3m_ema.hpp"
#include "u3m/util/error.hpp"

namespace u3m::predict {

void Predictor::track_time(const Access& a) {
  if (a.step == last_step_) return;
  if (last_step_ != UINT64_MAX && a.time_ns >= last_step_time_ && a.step > last_step_) {
    double per = double(a.time_ns - last_step_time_) / double(a.step - last_step_);
    // EMA with weight 1/16 on the newest sample: smooth but adapts within tens of ops.
    ns_per_op_ = ns_per_op_ == 0 ? per : ns_per_op_ + (per - ns_per_op_) / 16;
  }
  last_step_ = a.step;
  last_step_time_ = a.time_ns;
}

void Predictor::predict_window_delta(std::uint32_t horizon, std::vector<Predicted>& entered,
                                     std::vector<std::uint32_t>& left) {
  entered.clear();
  left.clear();
  std::swap(delta_prev_, delta_full_);
  predict(horizon, delta_full_);
  const std::uint64_t gen = ++delta_gen_;
  for (const Predicted& p : delta_full_) {
    if (p.tensor >= delta_mark_.size()) delta_mark_.resize(p.tensor + 1, 0);
    if (delta_mark_[p.tensor] + 1 != gen) entered.push_back(p);  // not in the previous answer
    delta_mark_[p.tensor] = gen;
  }
  for (const Predicted& p : delta_prev_)
    if (delta_mark_[p.tensor] != gen) left.push_back(p.tensor);
}

std::uint64_t op_signature(const trace::Op& op) {
  // The key's bytes, packed: a struct would hash its padding, which is
  // indeterminate, so equal ops could get different signatures.
  const auto cls = static_cast<std::uint8_t>(op.cls);
  const auto phase = static_cast<std::uint8_t>(op.phase);
  unsigned char k[sizeof cls + sizeof phase + sizeof op.layer + sizeof op.job];
  std::memcpy(k, &cls, sizeof cls);
  std::memcpy(k + sizeof cls, &phase, sizeof phase);
  std::memcpy(k + sizeof cls + sizeof phase, &op.layer, sizeof op.layer);
  std::memcpy(k + sizeof cls + sizeof phase + sizeof op.layer, &op.job, sizeof op.job);
  XXH64_hash_t h = XXH64(op.name.data(), op.name.size(), 0);
  return XXH64(k, sizeof k, h);
}

TraceFeed::TraceFeed(const trace::Trace& t) : trace_(&t) {
  op_sig_.reserve(t.ops.size());
  for (const trace::Op& o : t.ops) op_sig_.push_back(op_signature(o));
  step_begin_.reserve(t.events.size() / 2 + 2);
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const trace::Event& e = t.events[i];
    if (e.op >= t.ops.size() || e.tensor >= t.tensors.size())
      input_error("trace", "event {} refers to op {} / tensor {} beyond the {} ops / {} tensors", i,
                  e.op, e.tensor, t.ops.size(), t.tensors.size());
    if (i == 0 || t.events[i - 1].op != e.op) step_begin_.push_back(i);
  }
  step_begin_.push_back(t.events.size());
}

const trace::Op& TraceFeed::step_op(std::size_t s) const {
  return trace_->ops[trace_->events[step_begin_[s]].op];
}

void TraceFeed::feed(Predictor& p, std::size_t first_step, std::size_t end_step) const {
  for (std::size_t s = first_step; s < end_step; ++s) {
    for (std::size_t i = step_begin_[s]; i < step_begin_[s + 1]; ++i) {
      p.observe(access_at(i, s));
    }
    p.step_done();
  }
}

Access TraceFeed::access_at(std::size_t i, std::size_t step) const {
  const trace::Event& e = trace_->events[i];
  const trace::Op& o = trace_->ops[e.op];
  const trace::Tensor& t = trace_->tensors[e.tensor];
  Access a;
  a.time_ns = e.time_ns;
  a.step = step;
  a.op_sig = op_sig_[e.op];
  a.tensor = e.tensor;
  a.job = o.job;
  a.iteration = o.iteration;
  a.layer = o.layer;
  a.tensor_layer = t.layer;
  a.tensor_job = t.job;
  a.bytes = t.bytes;
  a.kind = e.kind;
  a.cls = o.cls;
  a.phase = o.phase;
  a.role = t.role;
  return a;
}

StepTensors build_step_tensors(const TraceFeed& feed) {
  const trace::Trace& t = feed.trace();
  StepTensors st;
  st.begin.reserve(feed.num_steps() + 1);
  st.tensors.reserve(t.events.size());
  std::vector<std::size_t> stamp(t.tensors.size(), SIZE_MAX);
  for (std::size_t s = 0; s < feed.num_steps(); ++s) {
    st.begin.push_back(st.tensors.size());
    for (std::size_t i = feed.step_begin(s); i < feed.step_begin(s + 1); ++i) {
      const trace::Event& e = t.events[i];
      if (!is_access(e.kind) || stamp[e.tensor] == s) continue;
      stamp[e.tensor] = s;
      st.tensors.push_back(e.tensor);
    }
  }
  st.begin.push_back(st.tensors.size());
  return st;
}

const std::vector<std::string>& predictor_names() {
  static const std::vector<std::string> names = {"u3m",          "design-ema",   "lru",
                                                 "markov-reuse", "trace-replay", "oracle"};
  return names;
}

std::string_view canonical_predictor_name(std::string_view name, bool* deprecated) {
  const bool alias = name == "u3m-seq";  // Note [Predictor names]
  if (deprecated) *deprecated = alias;
  return alias ? std::string_view("u3m") : name;
}

std::unique_ptr<Predictor> make_predictor(std::string_view requested, const TraceFeed* feed) {
  const std::string_view name = canonical_predictor_name(requested);
  if (name == "u3m") return std::make_unique<SeqPredictor>();
  if (name == "design-ema") return std::make_unique<U3mEmaPredictor>();
  if (name == "lru") return make_lru();
  if (name == "markov-reuse") return make_markov_reuse();
  if (name == "trace-replay") return make_trace_replay();
  if (name == "oracle") {
    if (!feed) input_error("predictor oracle", "needs the whole trace (it reads the future)");
    return make_oracle(*feed);
  }
  input_error("--predictors",
              "unknown predictor '{}' (known: u3m, design-ema, lru, markov-reuse, "
              "trace-replay, oracle; u3m-seq is an old name of u3m)",
              requested);
}

}  // namespace u3m::predict
