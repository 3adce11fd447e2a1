// The tiering policies (issue 15): what decides, per step, what to prefetch,
// what to demote, where loaded state rests, where an op runs and in which
// order the engine evicts. The simulator and real replay drive the very same
// objects, so a simulated result describes the code that runs for real.
// Decision code: time comes in from the driver (StepContext::now_ns).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "u3m/engine/engine.hpp"
#include "u3m/engine/steps.hpp"
#include "u3m/mem/link.hpp"
#include "u3m/policy/prefetch.hpp"
#include "u3m/trace/model.hpp"

namespace u3m::predict {
class WindowLog;
}

namespace u3m::policy {

using engine::Step;
using engine::Touch;
using mem::Tier;

// What a policy sees and may do at a step; the driver (simulator or real
// replay) implements it.
class StepContext {
 public:
  virtual ~StepContext() = default;
  virtual const std::vector<Step>& steps() const = 0;
  virtual const trace::Trace& trace() const = 0;
  // The engine's view (residency, stats, config), for policies that look first.
  virtual const engine::Engine& engine() const = 0;
  // The driver's clock now (the step's compute has not started yet).
  virtual std::uint64_t now_ns() const = 0;
  // The tier step `step` runs in (TieringPolicy::op_tier of its op).
  virtual Tier step_tier(std::size_t step) const = 0;
  // The id the engine knows tensor `tensor` (an index into Trace::tensors) by.
  static engine::TensorId engine_id(std::uint32_t tensor) { return engine::TensorId{tensor} + 1; }
  static std::uint32_t tensor_of(engine::TensorId id) { return static_cast<std::uint32_t>(id - 1); }
  // Brings the tensor's data to `to` (the device, or DRAM for a host op) at
  // prefetch priority; no-op for a tensor that holds no data now (never
  // written, or freed).
  virtual void prefetch(std::uint32_t tensor, Tier to) = 0;
  void prefetch(std::uint32_t tensor) { prefetch(tensor, Tier::device); }
  // Moves the tensor's data out of `from` (to the next tier down, at
  // write-back priority); no-op for a tensor that holds no data.
  virtual void demote(std::uint32_t tensor, Tier from) = 0;
  // Publishes victim scores to the engine (Note [Published victim scores] in
  // engine.hpp), keyed by trace tensor; no-op for tensors not registered.
  virtual void publish(std::span<const engine::Engine::ScoreUpdate> scores) = 0;
};

// Note [Driver calls]
// What a driver asks of the engine, step by step: the first ask for each
// tensor a step touches (in its tier, for writing or reading), the policy's
// prefetches and demotions that reach the engine, the scores it publishes
// and the tensors the step frees. Not the retries of an ask or of a removal,
// nor the engine's own moves: those follow the clock, which the simulator
// and a real run do not share. The step driver (drive::StepDriver) appends
// to a DriverLog when given one, so a test can check that it runs a trace and
// a policy alike under virtual and real time (tests/drive/test_differential.cpp).
// The log is written by the driver at the calls it makes, not by a wrapper
// around the engine: it shows that the two waiters and the policy agree, not
// that the engine's own choices (victims, the order of completions) do; those
// follow the clock.
struct DriverCall {
  enum class Kind : std::uint8_t { acquire, prefetch, demote, publish, free };
  Kind kind = Kind::acquire;
  std::uint32_t step = 0;
  std::uint32_t tensor = 0;
  Tier tier = Tier::device;  // acquire, prefetch: the tier asked for; demote: the tier left
  bool write = false;        // acquire: a write lease
  double score = 0;          // publish: the device score published
  bool operator==(const DriverCall&) const = default;
};
using DriverLog = std::vector<DriverCall>;
// The log with every published score set to 0: for comparing the calls of a
// policy whose scores are keys of the driver's clock (u3m's heat).
DriverLog without_scores(DriverLog log);
std::string_view to_string(DriverCall::Kind k);

// The u3m policy's knobs (docs/policy.md has the measured effect of each).
struct U3mPolicyOptions {
  // Note [Recalibration in runs] in u3m.cpp. On: with the fixed prefetch
  // window it leaves the simulated step time and capacity of the design
  // scenario unchanged; with jit_prefetch it cost capacity (docs/policy.md).
  bool recalibrate = true;
  // Seconds of the driver's clock between recalibrations; 0 = a tenth of the
  // first iteration's duration (the design's 30 s is for hour-long jobs; a
  // simulated step is 0.2-80 s and a run is 3 steps).
  double recalibrate_period_s = 0;
  // Also demote device copies colder than `hot` at each recalibration (the
  // design's band keeping). Off: in the capacity sweep it only moved bytes
  // that came back (grad-accum 8 from the device: 8.2% loss against 3.7%
  // at llama-L43-d4480; docs/policy.md). DRAM-to-SSD demotions stay.
  bool demote_device = false;
  // true: prefetch just in time for the link (Note [Just-in-time prefetch]
  // in prefetch.hpp); false: prefetch whatever enters a fixed 16-op window.
  // Off by default: on the host-link-bound design scenario it is 1-3% slower
  // (simulated, docs/policy.md), because an idle link is lost time there and
  // the wider window it needs shields more tensors from eviction.
  bool jit_prefetch = false;
  // Note [Layer-ahead streaming] in u3m.cpp: at each ZeRO-3 gather, prefetch
  // the weight shards the next gather reads (one layer ahead).
  bool stream_layer_ahead = true;
  JitConfig jit{};
};

// The design-seed policy's knobs (Note [Design seed] in design_seed.cpp).
struct DesignSeedOptions {
  // Seconds of the driver's clock between recalibrations: the design's 30 s.
  double recalibrate_period_s = 30;
  // The predictor whose window it prefetches (a make_predictor() name): the
  // design's per-class EMA. Its answers follow the driver's clock.
  std::string predictor = "design-ema";
};

// What a policy may know when it is made. References: they must outlive the
// policy.
struct PolicyInputs {
  const trace::Trace& trace;
  const std::vector<Step>& steps;  // engine::build_steps(trace)
  // u3m and belady: run the optimizer step on the host (the caller tries
  // both: Note [Optimizer placement] in experiments/train.cpp).
  bool host_optimizer = false;
  // The card's links as the policy plans with them (its backlog view).
  mem::LinkModel h2d, s2h;
  bool has_ssd = false;
  unsigned lookahead = 4;  // the lookahead policy's ops ahead
  // lru, u3m and belady: create loaded state on the device (as hbm-only
  // does; what does not fit spills by the policy's victim order) instead of
  // the seed rules' tiers; optimizer state a host optimizer works on stays
  // in DRAM. The training experiments' settings search tries both.
  bool device_home = false;
  U3mPolicyOptions u3m{};
  DesignSeedOptions design{};
  // The predictor of a policy that reads one (PolicyInfo::predictor), shared by every policy made for this trace
  // (Note [Shared window log] in predict/window_log.hpp): made with
  // make_window_log(trace). Null: the policy makes one of its own.
  std::shared_ptr<predict::WindowLog> window_log = nullptr;
};

// The window log a policy reads: `predictor` (a make_predictor() name; the
// u3m policy's, u3m-seq, by default) on `t`.
std::shared_ptr<predict::WindowLog> make_window_log(const trace::Trace& t,
                                                    std::string_view predictor = "u3m-seq");

// Note [Tiering policy]
// A policy makes five decisions; the driver asks for them and carries them
// out, and the engine underneath is the same for every policy:
//  * victim_order / initial_scores / StepContext::publish: the eviction
//    order, as scores the engine reads (it never calls the policy);
//  * home_tier: where a tensor rests when a step that only creates tensors
//    (a job's init: loaded weights, optimizer state) makes it, created there
//    one at a time; nullopt: such steps run like any other, on the device;
//  * op_tier: where an op runs, its tensors acquired in that tier (a
//    ZeRO-Offload optimizer step runs on the host);
//  * on_step: once a step holds its tensors (pinned, so room made now cannot
//    be taken from them), what to prefetch and demote.
class TieringPolicy {
 public:
  virtual ~TieringPolicy() = default;
  virtual std::string_view name() const = 0;
  virtual engine::Engine::VictimOrder victim_order() const {
    return engine::Engine::VictimOrder::lru;
  }
  // Scores of `tensor` when the driver registers it, before step `step` uses it.
  virtual engine::Engine::Scores initial_scores(std::uint32_t /*tensor*/,
                                                std::size_t /*step*/) const {
    return {};
  }
  virtual std::optional<Tier> home_tier(const trace::Tensor&) const { return std::nullopt; }
  // Whether optimizer steps run on the host (op_tier's default follows it).
  virtual bool optimizer_on_host() const { return false; }
  virtual Tier op_tier(const trace::Op& op) const;
  virtual void on_step(std::size_t step, StepContext& ctx) = 0;
};

// Where an op runs: an optimizer step on the host when the optimizer is
// placed there, every other op on the device. The one placement rule: the
// policies' default op_tier, the traffic bound and the physical bound
// (experiments/) all ask it.
inline Tier tier_of_op(const trace::Op& op, bool optimizer_on_host) {
  return optimizer_on_host && op.phase == trace::Phase::optimizer ? Tier::host : Tier::device;
}

inline Tier TieringPolicy::op_tier(const trace::Op& op) const {
  return tier_of_op(op, optimizer_on_host());
}

// Prefetches the tensors of the steps k ahead of `step` that run on the
// device: each step once, k steps ahead; the first step also covers the k
// steps no earlier step reached. The trace-replay baseline's prefetch (the
// trace is its own predictor), used by the policies that look ahead.
void prefetch_ahead(std::size_t step, unsigned k, StepContext& ctx);

// Master weights, Adam m or v: the state a host optimizer step works on.
bool optimizer_role(trace::Role r);

// The one list of policies: the CLI (`train sim --policy`, `run replay
// --policy`), Python and the tests read it.
struct PolicyInfo {
  std::string_view name;
  std::string_view help;  // one line
  std::function<std::unique_ptr<TieringPolicy>(const PolicyInputs&)> make;
  // The optimizer placements it runs (PolicyInputs::host_optimizer): the
  // training experiments' settings search tries each one it allows.
  bool device_optimizer = true, host_optimizer = true;
  // Whether it honours PolicyInputs::device_home (the search tries both).
  bool places_home = false;
  // The predictor whose window it reads (PolicyInputs::window_log); empty: none.
  std::string_view predictor = {};
};
const std::vector<PolicyInfo>& tiering_policies();
// "hbm-only | static-offload | ...", for --help.
std::string tiering_policy_choices();
// InputError naming `flag` and the choices for an unknown name.
const PolicyInfo& find_tiering_policy(std::string_view name, std::string_view flag = "--policy");
std::unique_ptr<TieringPolicy> make_tiering_policy(std::string_view name, const PolicyInputs& in,
                                                   std::string_view flag = "--policy");

}  // namespace u3m::policy
