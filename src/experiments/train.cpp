#include "u3m/experiments/train.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>

#include "u3m/engine/replay.hpp"
#include "u3m/experiments/train_policy.hpp"
#include "u3m/sim/cost.hpp"
#include "u3m/sim/sim_transport.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/analytic.hpp"
#include "u3m/workload/generate.hpp"

namespace u3m::experiments {

using engine::Tier;

const std::vector<std::string>& train_policy_names() {
  static const std::vector<std::string> names = {"hbm-only", "static-offload", "lru", "u3m",
                                                 "oracle"};
  return names;
}

void TrainScenario::validate() const {
  shape.validate("--model");
  train.validate();
  if (cards == 0) input_error("--cards", "must be >= 1");
  if (steps < 2) input_error("--steps", "must be >= 2 (the first step warms up)");
  const auto& n = train_policy_names();
  if (std::find(n.begin(), n.end(), policy) == n.end())
    input_error("--policy",
                "unknown policy '{}' (expected hbm-only, static-offload, lru, u3m or oracle)",
                policy);
}

namespace {

// SSD space per card: an assumption (one 3.84 TB data drive per card, as the
// profiles' drives_per_node = cards_per_node says), rounded down to 3.5 TB.
constexpr std::uint64_t kSsdPerCard = 3'500'000'000'000ull;

}  // namespace

namespace {

// One simulation with the optimizer placed as asked (for hbm-only and lru
// always the device, for static-offload always the host).
TrainResult simulate_once(const TrainScenario& s, bool host_optimizer) {
  TrainResult r;
  r.policy = s.policy;
  r.recompute_layers =
      s.train.recompute ? s.shape.layers : std::min(s.train.recompute_layers, s.shape.layers);
  workload::TrainConfig cfg = s.train;
  cfg.steps = s.steps;
  cfg.zero3_ranks = s.cards;
  r.params = workload::analytic::param_count(s.shape);
  trace::Trace t;
  workload::generate_train(s.shape, cfg, t);
  const std::vector<sim::Step> steps = sim::build_steps(t);
  r.trace_events = t.events.size();

  const sim::HwProfile& hw = s.hw;
  const double launch = hw.device.launch_overhead.si;
  auto device_time = [&hw, launch](const trace::Op& op) {
    if (op.cls ==
        trace::OpClass::collective)  // ZeRO-3 all-gather / reduce-scatter on the card link
      return static_cast<double>(op.bytes) / hw.peer_link.bandwidth_practical.si +
             hw.peer_link.latency.si + launch;
    return sim::op_cost(hw, op).total_s;
  };
  // A host Adam step streams master, m, v, gradient and weight once: bound
  // by the card's share of DRAM bandwidth.
  auto host_time = [&hw, launch](const trace::Op& op) {
    return static_cast<double>(op.bytes) / hw.host.dram_bandwidth.si + launch;
  };
  sim::SimOptions o;
  o.device_budget = static_cast<std::uint64_t>(hw.device.hbm_capacity.si);
  o.host_budget = static_cast<std::uint64_t>(hw.host.dram_capacity.si);
  o.links = sim::links_from_profile(hw, kSsdPerCard);
  TrainPolicy pol = make_train_policy(s.policy, {t, steps, host_optimizer, o.links});
  r.optimizer_on_host = pol.optimizer_on_host;
  o.prefetch = pol.prefetch;
  o.victim_score = pol.victim;
  o.home_tier = pol.home;
  const bool host_opt_on = pol.optimizer_on_host;
  o.op_tier = [host_opt_on](const trace::Op& op) {
    return host_opt_on && op.phase == trace::Phase::optimizer ? Tier::host : Tier::device;
  };
  o.op_time = [&, host_opt_on](const trace::Op& op) {
    return host_opt_on && op.phase == trace::Phase::optimizer ? host_time(op) : device_time(op);
  };
  r.footprint = engine::trace_footprint(t);
  if (r.footprint > o.device_budget + o.host_budget + kSsdPerCard) {  // nothing makes this fit
    r.why = fmt::format(
        "the step needs {:.1f} GB per card at once; HBM + DRAM + SSD hold {:.1f} GB",
        double(r.footprint) / 1e9, double(o.device_budget + o.host_budget + kSsdPerCard) / 1e9);
    return r;
  }
  r.sim = sim::simulate_trace(t, steps, o);
  if (!r.sim.ok()) {
    r.why = r.sim.first_error;
    return r;
  }
  r.fits = true;
  // The reported step: the last iteration, from the end of the one before.
  const auto& ends = r.sim.iteration_end_ns;
  const std::uint32_t last = s.steps - 1;
  // Infinite HBM needs no recompute: a checkpointed layer's second forward
  // (the generator's ".recompute" ops) is a price paid for memory, so it
  // counts as loss, not as ideal work.
  double ideal = 0;
  for (const trace::Op& op : t.ops) {
    if (op.iteration == last && !op.name.ends_with(".recompute")) ideal += device_time(op);
  }
  r.ideal_step_s = ideal;
  r.step_s = ends.size() > last && last > 0
                 ? static_cast<double>(ends[last] - ends[last - 1]) * 1e-9
                 : static_cast<double>(r.sim.total_ns) * 1e-9;
  r.loss = r.step_s > 0 ? std::max(0.0, 1.0 - ideal / r.step_s) : 0.0;
  r.tokens_per_s = r.step_s > 0 ? double(s.cards) * double(cfg.micro_batches) *
                                      double(cfg.tokens_per_micro_batch()) / r.step_s
                                : 0.0;
  r.stall_s = static_cast<double>(r.sim.stall_ns) * 1e-9;
  double busy = 0;
  for (const auto& l : r.sim.links) busy += static_cast<double>(l.busy_ns);
  r.hidden_fraction =
      busy > 0 ? std::clamp(1.0 - static_cast<double>(r.sim.stall_ns) / busy, 0.0, 1.0) : 1.0;
  return r;
}

}  // namespace

// Note [Optimizer placement]
// On the device an Adam step is bound by HBM bandwidth, but its state must
// then live on the device or cross the host link both ways every step; on
// the host it is bound by DRAM bandwidth and only gradients and weights
// cross. Which wins depends on how much of the state fits, so u3m and the
// oracle simulate both placements (the simulation is cheap) and keep the
// faster one that fits: a planning decision made once per scenario.
//
// Note [Swap or recompute]
// Activations that do not fit in HBM either leave it (swapped to DRAM in
// forward, back in backward: twice their bytes on the host link, hidden only
// while the link has slack) or are recomputed in backward (a second forward
// of the layer: FLOPs that are never hidden). Which costs less depends on the
// layer's bytes per FLOP, the link, and what else the link carries, so u3m and
// the oracle decide by simulated cost, per scenario, among checkpointing no
// layer, the first half, or all of them (the first layers' activations wait
// longest for backward, so they are checkpointed first), unless the user
// asked for --recompute. The baselines do what they are told.
TrainResult simulate_training(const TrainScenario& s) {
  s.validate();
  if (s.policy == "hbm-only" || s.policy == "lru") return simulate_once(s, false);
  if (s.policy == "static-offload") return simulate_once(s, true);
  std::vector<std::uint32_t> choices = {s.train.recompute_layers};
  if (!s.train.recompute && s.train.recompute_layers == 0)
    choices = {0, s.shape.layers / 2, s.shape.layers};
  std::optional<TrainResult> best;
  std::uint64_t events = 0;
  for (std::uint32_t k : choices) {
    TrainScenario x = s;
    x.train.recompute_layers = k;
    for (bool host : {false, true}) {
      TrainResult r = simulate_once(x, host);
      events += r.trace_events;
      if (!best || (r.fits && (!best->fits || r.step_s < best->step_s))) best = std::move(r);
    }
  }
  best->trace_events = events;
  return *best;
}

CardFailure CardFailure::parse(std::string_view text, std::uint32_t cards, std::string_view flag) {
  const std::size_t at = text.find('@');
  auto number = [&](std::string_view part, const char* what) {
    std::uint32_t v = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc{} || end != part.data() + part.size())
      input_error(flag, "'{}': {} '{}' is not a non-negative integer (expected K@STEP, e.g. 1@10)",
                  text, what, part);
    return v;
  };
  if (at == std::string_view::npos)
    input_error(flag, "'{}' is not K@STEP (card index @ step, e.g. 1@10)", text);
  CardFailure f;
  f.card = number(text.substr(0, at), "card");
  f.step = number(text.substr(at + 1), "step");
  if (cards < 2)
    input_error(flag, "a failed card's shards need a surviving neighbour: --cards must be >= 2");
  if (f.card >= cards)
    input_error(flag, "card {} does not exist: cards are 0..{}", f.card, cards - 1);
  if (f.step < 1) input_error(flag, "step must be >= 1 (the step before which the card fails)");
  return f;
}

// Note [Card failure]
// ZeRO-3 gives each of N cards one shard of the weights, gradients and
// optimizer state. When card K fails, its shard moves to its neighbour
// (K+1 mod N) over the card-to-card link, and training goes on with N-1
// cards, each still running its own micro-batches (the global batch shrinks
// by 1/N; keeping it would add 1/(N-1) more compute to every card, a choice
// the user makes, not the memory system). Every card then waits at each
// collective for the neighbour, which holds two shards: twice the sharded
// state in its tiers and twice the optimizer work. So the step time after the
// failure is the neighbour's, simulated with zero3_shards = 2 (with 2 cards:
// unsharded, alone) under the same
// policy (which re-plans, e.g. where the optimizer runs). The move itself
// costs the shard's bytes at the link's practical bandwidth; we assume the
// shard is readable (a peer's redundant copy, as the design assumes), not
// reloaded from a checkpoint.
FailoverResult simulate_failover(const TrainScenario& s, const CardFailure& f) {
  s.validate();
  FailoverResult r;
  r.failure = f;
  r.neighbour = (f.card + 1) % s.cards;
  r.before = simulate_training(s);
  TrainScenario after = s;
  if (s.cards == 2) {
    after.cards = 1;  // the survivor holds the whole state: no sharding left
  } else {
    after.train.zero3_shards = 2;
  }
  after.train.zero3_ranks = after.cards;  // as simulate_training sets it, for validate()
  r.after = simulate_training(after);
  workload::TrainConfig one = s.train;
  one.zero3_ranks = s.cards;
  const workload::analytic::TrainBytes b = workload::analytic::train_bytes(s.shape, one);
  r.moved_bytes = b.param_bytes + b.grad_bytes + b.optimizer_bytes;
  r.move_s =
      double(r.moved_bytes) / s.hw.peer_link.bandwidth_practical.si + s.hw.peer_link.latency.si;
  if (r.before.fits && r.after.fits && r.before.step_s > 0) {
    r.slowdown = r.after.step_s / r.before.step_s - 1;
    r.tokens_per_s_after = r.after.step_s > 0
                               ? r.before.tokens_per_s * double(s.cards - 1) / double(s.cards) *
                                     r.before.step_s / r.after.step_s
                               : 0;
    r.run_s_no_failure = double(f.step + kFailoverRunSteps) * r.before.step_s;
    r.run_s = double(f.step) * r.before.step_s + r.move_s + kFailoverRunSteps * r.after.step_s;
  }
  return r;
}

std::vector<workload::ModelShape> llama_family() {
  // name, layers, d_model, heads, kv_heads, ffn, vocab
  struct S {
    const char* name;
    std::uint32_t l, d, h, kv, ffn, vocab;
  };
  static const S shapes[] = {
      {"llama-1b", 22, 2048, 16, 8, 5632, 32000},   {"llama-2b", 24, 2560, 20, 4, 6912, 32000},
      {"llama-3b", 28, 3072, 24, 8, 8192, 32000},   {"llama-5b", 32, 3584, 28, 4, 9728, 32000},
      {"llama-7b", 32, 4096, 32, 8, 11008, 32000},  {"llama-10b", 40, 4608, 36, 4, 12288, 32000},
      {"llama-13b", 40, 5120, 40, 8, 13824, 32000}, {"llama-17b", 48, 5120, 40, 8, 13824, 32000},
      {"llama-22b", 48, 6144, 48, 8, 16384, 32000}, {"llama-30b", 60, 6656, 52, 4, 17920, 32000},
      {"llama-40b", 60, 7680, 60, 4, 20480, 32000}, {"llama-52b", 64, 8192, 64, 8, 22016, 32000},
      {"llama-70b", 80, 8192, 64, 8, 28672, 32000},
  };
  std::vector<workload::ModelShape> out;
  for (const S& x : shapes) {
    workload::ModelShape m;
    m.name = x.name;
    m.layers = x.l;
    m.d_model = x.d;
    m.heads = x.h;
    m.kv_heads = x.kv;
    m.ffn = x.ffn;
    m.vocab = x.vocab;
    out.push_back(m);
  }
  return out;
}

workload::ModelShape find_model(const std::string& name) {
  for (const workload::ModelShape& m : llama_family())
    if (m.name == name) return m;
  return workload::preset(name);
}

std::vector<CapacityRow> training_capacity(
    const TrainScenario& base, const std::vector<std::string>& policies, double max_loss,
    const std::function<void(const std::string&)>& progress) {
  if (!(max_loss >= 0 && max_loss < 1))
    input_error("--max-loss", "must be in [0, 1), got {}", max_loss);
  std::vector<CapacityRow> rows;
  for (const std::string& p : policies) {
    CapacityRow row;
    row.policy = p;
    int misses = 0;
    for (const workload::ModelShape& m : llama_family()) {
      TrainScenario s = base;
      s.shape = m;
      s.policy = p;
      if (progress) progress(fmt::format("{} {}", p, m.name));
      TrainResult r = simulate_training(s);
      row.tried.push_back(r);
      if (!r.fits) break;  // bigger shapes need more memory still
      if (r.loss <= max_loss) {
        misses = 0;
        row.max_params = r.params;
        row.model = m.name;
        row.loss = r.loss;
        row.step_s = r.step_s;
      } else if (++misses >= 2) {
        break;  // two sizes in a row over the bound: the loss only grows from here
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace u3m::experiments
