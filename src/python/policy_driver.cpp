#include "policy_driver.hpp"

#include <algorithm>
#include <chrono>

namespace u3m::python {

using mem::Tier;

// The policy's view of the run (policy::StepContext). The engine knows
// recorder tensor t (trace tensor t) as StepContext::engine_id(t), as in
// replay, so what a policy asks of the engine by that id (residency) holds.
class PolicyDriver::Context final : public policy::StepContext {
 public:
  explicit Context(PolicyDriver& d) : d_(d) {}
  const std::vector<engine::Step>& steps() const override { return d_.steps_; }
  const trace::Trace& trace() const override { return d_.trace_; }
  const engine::Engine& engine() const override { return d_.eng_; }
  std::uint64_t now_ns() const override { return d_.now_ns(); }
  Tier step_tier(std::size_t step) const override {
    return d_.policy_->op_tier(d_.trace_.ops[d_.steps_[step].op]);
  }
  using policy::StepContext::prefetch;
  void prefetch(std::uint32_t t, Tier to) override {
    // The engine skips a tensor with no data or already there.
    if (d_.live_[t]) d_.eng_.prefetch(engine_id(t), to);
  }
  void demote(std::uint32_t t, Tier from) override {
    if (d_.live_[t]) d_.eng_.evict(engine_id(t), from);
  }
  void publish(std::span<const engine::Engine::ScoreUpdate> scores) override {
    d_.eng_.publish_scores(scores);  // ids not registered now are skipped
  }

 private:
  PolicyDriver& d_;
};

PolicyDriver::PolicyDriver(engine::Engine& e, PolicyDriverOptions o)
    : eng_(e), opt_(std::move(o)), ctx_(std::make_unique<Context>(*this)) {
  if (opt_.record) policy::find_tiering_policy(opt_.policy, "policy");  // InputError: unknown name
  t0_ns_ = now_ns();
}

PolicyDriver::~PolicyDriver() = default;

std::uint64_t PolicyDriver::now_ns() const {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count()) -
         t0_ns_;
}

mem::Status PolicyDriver::add(std::uint64_t id, std::uint64_t bytes, std::string_view name,
                              trace::Role role) {
  const std::uint32_t t = rec_.tensor(id, name, bytes, role);
  if (live_.size() <= t) live_.resize(t + 1, 0);
  engine::Engine::Scores scores{};
  if (policy_ && t < trace_.tensors.size()) scores = policy_->initial_scores(t, cursor_);
  const mem::Status s = eng_.add(policy::StepContext::engine_id(t), bytes, scores);
  if (mem::ok(s)) live_[t] = 1;
  return s;
}

std::uint64_t PolicyDriver::engine_id(std::uint64_t id) const {
  const std::int64_t t = rec_.index_of(id);
  return t < 0 ? 0 : policy::StepContext::engine_id(static_cast<std::uint32_t>(t));
}

mem::Status PolicyDriver::remove(std::uint64_t id) {
  const std::int64_t t = rec_.index_of(id);
  if (t < 0) return mem::Status::not_found;
  if (live_[t]) {
    live_[t] = 0;
    if (opt_.record) rec_.free(static_cast<std::uint32_t>(t), now_ns());
  }
  return eng_.remove(policy::StepContext::engine_id(static_cast<std::uint32_t>(t)));
}

Tier PolicyDriver::tier(trace::Phase phase) const {
  if (!policy_) return Tier::device;
  trace::Op op;
  op.phase = phase;
  op.cls = phase == trace::Phase::optimizer ? trace::OpClass::optimizer : trace::OpClass::other;
  return policy_->op_tier(op);
}

void PolicyDriver::accessed(std::uint64_t id, bool write, trace::Phase phase) {
  if (!opt_.record) return;
  const std::int64_t t = rec_.index_of(id);
  if (t < 0) return;  // never added
  const std::uint64_t now = now_ns();
  rec_.access(static_cast<std::uint32_t>(t), write, phase, now);
  ++st_.accesses;
  if (!policy_ || !on_trace_) return;
  if (cursor_ >= steps_.size() || static_cast<std::size_t>(t) >= trace_.tensors.size() ||
      steps_[cursor_].touches.front().tensor != static_cast<std::uint32_t>(t)) {
    on_trace_ = false;  // Note [Policy on a real run]: the rest of the step without it
    ++st_.diverged;
    return;
  }
  policy_->on_step(cursor_++, *ctx_);
  ++st_.policy_steps;
  st_.policy_s += static_cast<double>(now_ns() - now) * 1e-9;
}

void PolicyDriver::end_step() {
  ++st_.steps;
  if (!opt_.record) return;
  rec_.end_step(now_ns());
  const bool whole = policy_ && on_trace_ && period_ > 0 && cursor_ > 0 && cursor_ % period_ == 0;
  if (whole && cursor_ + period_ <= steps_.size()) return;  // the next iteration of the trace
  rebuild();
}

void PolicyDriver::rebuild() {
  const std::uint64_t t0 = now_ns();
  policy_.reset();  // it refers to trace_ and steps_
  steps_.clear();
  std::size_t n = 0;
  for (const OnlineRecorder::Record& r : rec_.last_step()) n += !r.free;
  on_trace_ = false;
  cursor_ = 0;
  period_ = 0;
  if (n == 0) {
    eng_.set_victim_order(engine::Engine::VictimOrder::lru);
    return;
  }
  const unsigned repeats =
      opt_.repeats ? opt_.repeats
                   : static_cast<unsigned>(std::clamp<std::size_t>((std::size_t{1} << 18) / n, 4, 256));
  trace_ = rec_.build(repeats);
  steps_ = engine::build_steps(trace_);
  period_ = steps_.size() / repeats;
  policy_ = policy::make_tiering_policy(opt_.policy,
                                        {.trace = trace_,
                                         .steps = steps_,
                                         .host_optimizer = opt_.host_optimizer,
                                         .h2d = {},
                                         .s2h = {},
                                         .has_ssd = opt_.has_ssd,
                                         .lookahead = opt_.lookahead,
                                         .device_home = false,  // home tiers are unused here
                                         .u3m = {},
                                         .window_log = nullptr},
                                        "policy");
  eng_.set_victim_order(policy_->victim_order());
  std::vector<engine::Engine::ScoreUpdate> first;
  for (std::uint32_t t = 0; t < trace_.tensors.size(); ++t)
    if (live_[t]) first.push_back({policy::StepContext::engine_id(t), policy_->initial_scores(t, 0)});
  eng_.publish_scores(first);
  on_trace_ = true;
  ++st_.policies;
  st_.trace_ops = steps_.size();
  st_.build_s += static_cast<double>(now_ns() - t0) * 1e-9;
}

}  // namespace u3m::python
