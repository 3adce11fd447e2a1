// The training experiments of issue 5: one training step of a LLaMA-shaped
// model simulated under a tiering policy (`u3m train sim`), and the capacity
// sweep that finds, per policy, the largest model that trains within a
// throughput-loss bound (`u3m train capacity`). The simulator runs the real
// engine on virtual time (src/sim); this layer only wires workload, policy
// and profile together. docs/training.md explains the policies and figures.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "u3m/engine/run_observer.hpp"
#include "u3m/observe/band.hpp"
#include "u3m/policy/design_seed.hpp"
#include "u3m/policy/tiering.hpp"
#include "u3m/policy/u3m.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/sim/runner.hpp"
#include "u3m/workload/config.hpp"
#include "u3m/workload/shape.hpp"

namespace u3m::experiments {

// The names of policy::tiering_policies(), in order.
const std::vector<std::string>& train_policy_names();

// How the N cards of a ZeRO-3 job are simulated (Note [Card models] in
// train.cpp): `symmetric` simulates one card of N (its SSD link a static
// 1/N share of the cards' drives; the others assumed to do the same);
// `separate` simulates all N on one clock (sim::simulate_cards): collectives
// are barriers and the cards' SSD traffic shares one link. separate costs N
// simulations.
enum class CardModel { symmetric, separate };
// "symmetric" | "separate"; InputError naming `flag` otherwise.
CardModel parse_card_model(std::string_view text, std::string_view flag);
const char* to_string(CardModel m);

struct TrainScenario {
  workload::ModelShape shape;
  workload::TrainConfig train;  // zero3_ranks is set from `cards`
  sim::HwProfile hw;
  std::uint32_t cards = 4;
  std::string policy = "u3m";
  std::uint32_t steps = 3;  // simulated; the last one is reported (the first warms up)
  // Told the ops, stalls, transfers and occupancy of the run reported (the
  // settings the search chose, run once more), on virtual time; null = none.
  engine::RunObserver* observer = nullptr;
  CardModel card_model = CardModel::symmetric;
  policy::U3mPolicyOptions u3m{};  // the u3m policy's knobs (docs/policy.md); other policies ignore them
  policy::DesignSeedOptions design{};  // the design-seed policy's (its 30 s period)
  // Note [One settings search] in train.cpp: true (the default), every
  // policy runs the same search over recompute depth and, where the policy
  // can run it either way, the optimizer's placement, and keeps the fastest
  // setting that fits; false: exactly train.recompute_layers (or recompute)
  // and host_optimizer, where the policy allows it.
  bool search = true;
  bool host_optimizer = false;  // with search = false
  bool device_home = false;     // with search = false (PolicyInputs::device_home)
  void validate() const;   // throws InputError naming the field
};

// One simulated card of a result.
struct CardResult {
  std::uint32_t card = 0;    // its index among the job's cards
  std::uint32_t shards = 1;  // ZeRO-3 shards it holds (2: a failed card's neighbour)
  double step_s = 0;         // its last step, from its own iteration ends
  double barrier_s = 0;      // waited at collectives for the other cards (whole run)
  double stall_s = 0;        // waited for data or room (whole run)
  double compute_s = 0;      // its ops' compute (whole run)
};

struct TrainResult {
  std::string policy;
  bool fits = false;            // the step ran within the card's HBM (and host) budgets
  std::string why;              // when it does not fit
  std::uint64_t params = 0;     // the whole model's parameters
  std::uint64_t footprint = 0;  // per card, most bytes live at once (untiered need)
  double step_s = 0;            // the last simulated step
  double ideal_step_s = 0;      // the same step with infinite HBM, ops on the device
  double loss = 0;              // 1 - ideal / step
  double tokens_per_s = 0;      // all cards
  double stall_s = 0;           // compute waited for data, over the whole run
  double hidden_fraction = 0;   // transfer time overlapped with compute
  bool optimizer_on_host = false;
  bool device_home = false;  // loaded state created on the device (PolicyInputs::device_home)
  std::uint32_t recompute_layers = 0;  // checkpointed layers (Note [Swap or recompute])
  // The whole run of the card that finished the last step last (separate:
  // the straggler; symmetric: the one card simulated).
  sim::SimReport sim;
  std::uint32_t sim_card = 0;  // the card `sim` reports (CardResult::card)
  // The u3m policy's own decisions on that card (recalibrations, demotions,
  // final thresholds and window); empty for the other policies.
  std::optional<policy::U3mPolicyStats> u3m_policy;
  // Likewise for the design-seed policy.
  std::optional<policy::DesignSeedStats> design_seed;
  // That card's HBM use against the design's [75%, 90%] band over the whole
  // run (warm-up step included), with its series (Note [Band series]).
  observe::BandReport hbm_band;
  CardModel card_model = CardModel::symmetric;
  std::vector<CardResult> cards;  // every simulated card (symmetric: one)
  // The SSD link (h2s + s2h) all cards share (separate), or the one card's
  // static share (symmetric): bytes and busy time over the whole run.
  std::uint64_t ssd_link_bytes = 0;
  double ssd_link_busy_s = 0;
  std::uint64_t trace_events = 0;  // trace events simulated (all simulations run for this result)
};

TrainResult simulate_training(const TrainScenario& s);

// `--fail-card K@STEP`: card K fails before step STEP (Note [Card failure]
// in train.cpp).
struct CardFailure {
  std::uint32_t card = 0;
  std::uint32_t step = 1;
  // "K@STEP", e.g. "2@10"; InputError naming `flag` on bad syntax or range.
  static CardFailure parse(std::string_view text, std::uint32_t cards, std::string_view flag);
};

struct FailoverResult {
  CardFailure failure;
  std::uint32_t neighbour = 0;  // the card that takes the failed card's shards
  TrainResult before;           // every card, before the failure
  // After, under the scenario's card model: separate, the N-1 surviving
  // cards (the neighbour with two shards; the others' barrier waits show it);
  // symmetric, the neighbour alone (the slowest card).
  TrainResult after;
  // With separate cards, also the symmetric estimate (the neighbour alone),
  // to compare; not simulated (fits = false, why empty) otherwise.
  TrainResult after_symmetric;
  double slowdown_symmetric = 0;  // after_symmetric.step_s / before.step_s - 1
  std::uint64_t moved_bytes = 0;  // the failed card's sharded state
  double move_s = 0;              // moving it over the card-to-card link
  double slowdown = 0;            // after.step_s / before.step_s - 1
  double tokens_per_s_after = 0;  // the N-1 surviving cards
  // A run of failure.step + kFailoverRunSteps steps, with and without the failure.
  double run_s = 0, run_s_no_failure = 0;
};
inline constexpr std::uint32_t kFailoverRunSteps = 100;

FailoverResult simulate_failover(const TrainScenario& s, const CardFailure& f);

// The llama family for the sweep: shapes from ~1B to ~70B parameters, in
// order of size (heads of 128, SwiGLU ffn = 8/3 d rounded to 256, GQA 8).
std::vector<workload::ModelShape> llama_family();
// The family's rules at any depth and width (d a multiple of 128): heads of
// 128, kv_heads gcd(heads, 8), ffn = 8/3 d rounded up to 256, vocab 32000; named
// "llama-L<layers>-d<width>".
workload::ModelShape llama_shape(std::uint32_t layers, std::uint32_t d_model);
// Every family-rule shape with d_model / layers in [90, 130] (the range of
// the named family) and parameters in [lo, hi], in order of parameters.
std::vector<workload::ModelShape> llama_ladder(std::uint64_t lo, std::uint64_t hi);
// A family shape by name (llama-1b .. llama-70b, llama-L<l>-d<d>), else a
// workload preset; InputError listing the presets when neither.
workload::ModelShape find_model(const std::string& name);

struct CapacityRow {
  std::string policy;
  std::uint64_t max_params = 0;  // 0: not even the smallest fits
  std::string model;             // the shape that reached it
  double loss = 0;
  double step_s = 0;
  std::uint32_t recompute_layers = 0;  // the settings that reached it
  bool optimizer_on_host = false;
  bool device_home = false;
  // The smallest shape tried above max_params that failed (0: none), so
  // the capacity is resolved to next_params / max_params.
  std::uint64_t next_params = 0;
  std::vector<TrainResult> tried;  // every shape simulated, in order
};

// Note [Physical bound] in train.cpp: the largest family-rule shape whose
// unavoidable host-link and SSD traffic and host Adam time per step, at
// the best recompute depth and optimizer placement, leave the step within
// the loss bound, whatever the schedule; and the same with no overlap at
// all (every transfer added to the step), the stricter reading.
struct BoundShape {
  std::uint64_t params = 0;  // 0: not even the smallest shape
  std::string model;
  double loss = 0;                 // the lower bound on its loss
  std::uint32_t recompute_layers = 0;
  bool optimizer_on_host = false;
  double ideal_s = 0, compute_s = 0;  // ideal step; with recompute
  std::uint64_t footprint = 0;        // per card, at that recompute depth
  std::uint64_t h2d = 0, d2h = 0, ssd = 0;  // unavoidable bytes per step, per card (ssd: reads)
  std::uint64_t ssd_write = 0;
  double host_adam_s = 0;
  std::string binding;             // what the next shape exceeds
};
struct PhysicalBound {
  BoundShape overlapped;  // transfers may overlap compute fully: no schedule beats it
  BoundShape serial;      // transfers add to the step
};
PhysicalBound physical_bound(const TrainScenario& base, double max_loss);
// The overlapped bound at the scenario's own shape: the least loss any
// schedule can have there (params 0: no recompute depth and placement of
// the search can run it).
BoundShape bound_at(const TrainScenario& s);

// For each policy, walks the family upward, then bisects between the last
// shape within the bound and the first beyond it over llama_ladder until
// the two are within `resolution` (0.02: 2%) of each other. `progress` is
// called per simulated shape.
std::vector<CapacityRow> training_capacity(
    const TrainScenario& base, const std::vector<std::string>& policies, double max_loss,
    const std::function<void(const std::string&)>& progress = {}, double resolution = 0.02);

}  // namespace u3m::experiments
