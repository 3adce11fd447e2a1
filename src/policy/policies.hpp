// The factories behind the registry (registry.cpp), one per policy file.
#pragma once

#include <memory>

#include "u3m/policy/heat.hpp"
#include "u3m/policy/placement.hpp"
#include "u3m/policy/tiering.hpp"

namespace u3m::policy {

std::unique_ptr<TieringPolicy> make_hbm_only(const PolicyInputs& in);
std::unique_ptr<TieringPolicy> make_static_offload(const PolicyInputs& in);
std::unique_ptr<TieringPolicy> make_zero_offload(const PolicyInputs& in);
std::unique_ptr<TieringPolicy> make_zero_infinity(const PolicyInputs& in);
std::unique_ptr<TieringPolicy> make_lru(const PolicyInputs& in);
std::unique_ptr<TieringPolicy> make_lookahead(const PolicyInputs& in);
std::unique_ptr<TieringPolicy> make_u3m(const PolicyInputs& in);
std::unique_ptr<TieringPolicy> make_belady(const PolicyInputs& in);
std::unique_ptr<TieringPolicy> make_design_seed(const PolicyInputs& in);

// The design's seed placement (PlacementRules::named("design-seed")).
const PlacementRules& seed_rules();
// Where the tiered policies create loaded state: the seed rules' tier, DRAM
// for what they send to the SSD (the engine spills it there under pressure).
Tier seed_home(const trace::Tensor& x);
// seed_home, or with PolicyInputs::device_home the device, except the state
// a host optimizer works on (DRAM).
Tier tiered_home(const trace::Tensor& x, bool device_home, bool host_optimizer);

// The tensors whose victim score changed during a step, each once, and
// their publication after it (Note [Published victim scores] in
// engine.hpp): a score is a key the policy computes, published for the
// device and the host copy alike.
class ChangedScores {
 public:
  void mark(std::uint32_t t) {
    if (stamp_.size() <= t) stamp_.resize(static_cast<std::size_t>(t) + 1, 0);
    if (stamp_[t] == step_) return;
    stamp_[t] = step_;
    changed_.push_back(t);
  }
  template <class Score>
  void publish(StepContext& ctx, Score score) {
    updates_.clear();
    for (std::uint32_t t : changed_) {
      const double s = score(t);
      updates_.push_back({StepContext::engine_id(t), {s, s}});
    }
    changed_.clear();
    ++step_;
    ctx.publish(updates_);
  }

 private:
  std::vector<std::uint32_t> changed_;
  std::vector<std::uint64_t> stamp_;
  std::uint64_t step_ = 1;
  std::vector<engine::Engine::ScoreUpdate> updates_;
};

// The thresholds both heat policies (u3m, design-seed) set at the end of
// their first iteration, the profile: calibrate() over the heat
// (`heat_of(tensor)`) of every tensor that holds data then, against the
// engine's device and host capacities.
template <class HeatOf>
Thresholds calibrate_on_held(const StepContext& ctx, HeatOf heat_of) {
  const engine::Engine& eng = ctx.engine();
  std::vector<HeatSample> samples;
  for (std::uint32_t i = 0; i < ctx.trace().tensors.size(); ++i) {
    const auto r = eng.residency(StepContext::engine_id(i));
    if (!r || !(r->valid[0] || r->valid[1] || r->valid[2])) continue;  // holds no data
    samples.push_back({heat_of(i), ctx.trace().tensors[i].bytes});
  }
  return calibrate(std::move(samples), eng.config().device.capacity, eng.config().host.capacity);
}

// State a policy rests on the SSD (Adam v for design-seed, the optimizer
// state for zero-infinity): queued when it is used, then sent on from DRAM
// once it is off the device, idle and not on the SSD already (the engine
// creates and fetches into memory, so the SSD is reached in two moves).
class SsdHoming {
 public:
  void queue(std::uint32_t tensor);  // again while queued: no-op
  // Sends what is ready, except tensors with hold[t] set (null: none);
  // returns how many it sent. What is not ready stays queued.
  std::size_t pass(StepContext& ctx, const std::vector<std::uint8_t>* hold = nullptr);

 private:
  std::vector<std::uint32_t> pending_;
  std::vector<std::uint8_t> queued_;
};

// Note [Layer-ahead streaming] in u3m.cpp: by step, the next ZeRO-3 gather
// step (SIZE_MAX: none); and at a gather step, the prefetch of the weight
// shards the next gather reads. u3m and belady both stream.
std::vector<std::size_t> next_gathers(const trace::Trace& t, const std::vector<Step>& steps);
void stream_layer_ahead(std::size_t step, const std::vector<std::size_t>& next, StepContext& ctx);

}  // namespace u3m::policy
