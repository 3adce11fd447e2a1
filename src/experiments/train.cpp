#include "u3m/experiments/train.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <tuple>
#include <unordered_set>

#include <fmt/format.h>

#include "u3m/engine/steps.hpp"
#include "u3m/experiments/traffic_bound.hpp"
#include "u3m/observe/fanout.hpp"
#include "u3m/policy/tiering.hpp"
#include "u3m/policy/u3m.hpp"
#include "u3m/sim/cost.hpp"
#include "u3m/sim/sim_transport.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/analytic.hpp"
#include "u3m/workload/generate.hpp"

namespace u3m::experiments {

using engine::Tier;

const std::vector<std::string>& train_policy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const policy::PolicyInfo& p : policy::tiering_policies()) n.emplace_back(p.name);
    return n;
  }();
  return names;
}

void TrainScenario::validate() const {
  shape.validate("--model");
  train.validate(workload::kTrainSimFlags);
  if (cards == 0) input_error("--cards", "must be >= 1");
  if (steps < 2) input_error("--steps", "must be >= 2 (the first step warms up)");
  policy::find_tiering_policy(policy, "--policy");
  // A finite period that fits in a uint64 of nanoseconds (about 584 years).
  if (!(u3m.recalibrate_period_s >= 0 && u3m.recalibrate_period_s <= 1e9))
    input_error("--recalibrate-period",
                "must be in [0, 1e9] seconds (0 = a tenth of the first step), got {}",
                u3m.recalibrate_period_s);
}

namespace {

// SSD space per card: an assumption (one 3.84 TB data drive per card, as the
// profiles' drives_per_node = cards_per_node says), rounded down to 3.5 TB.
constexpr std::uint64_t kSsdPerCard = 3'500'000'000'000ull;
// The device watermarks of a run started on the device (PolicyInputs::device_home).
constexpr double kFullHigh = 1.0, kFullLow = 0.97;

}  // namespace

CardModel parse_card_model(std::string_view text, std::string_view flag) {
  if (text == "symmetric") return CardModel::symmetric;
  if (text == "separate") return CardModel::separate;
  input_error(flag, "unknown card model '{}' (expected separate or symmetric)", text);
}

const char* to_string(CardModel m) {
  return m == CardModel::separate ? "separate" : "symmetric";
}

namespace {

// A simulated card: its index among the job's cards and its ZeRO-3 shards.
struct CardSlot {
  std::uint32_t card = 0, shards = 1;
};

// The cards a scenario simulates when none are given: symmetric, card 0
// alone; separate, every card with one shard.
std::vector<CardSlot> default_cards(const TrainScenario& s) {
  std::vector<CardSlot> out;
  const std::uint32_t n = s.card_model == CardModel::separate ? s.cards : 1;
  for (std::uint32_t c = 0; c < n; ++c) out.push_back({c, s.train.zero3_shards});
  return out;
}

// Note [Card models]
// symmetric: one card of N is simulated; ZeRO-3's collectives are timed ops
// on its card-to-card link, and its SSD link is a static 1/N share of the N
// cards' drives. Every card is assumed to do the same at the same time.
// separate: the N cards run on one clock (Note [Cards] in runner.hpp): each
// waits at every collective for the slowest, and their SSD traffic queues on
// one link with the N cards' drives pooled. For identical cards in phase the
// two agree: the barriers cost nothing and N cards contending for N drives'
// bandwidth get a 1/N share each. They differ where the cards differ (a
// failed card's neighbour with two shards: the others wait for it at every
// collective) or run out of phase (a card whose SSD transfer finds the link
// idle gets all N drives' bandwidth).
//
// The cards' traces: one per shard count (cards with the same shards run the
// same trace). Generated once per scenario and shared by both optimizer
// placements, which simulate the same trace, with what is derived from the
// trace alone: the runner's tables, footprint included (Note [Trace tables]
// in sim/runner.hpp), and the u3m policy's predictor answers (Note [Shared
// window log] in predict/window_log.hpp), read by every card and both
// placements.
struct Workload {
  std::uint32_t shards = 1;
  trace::Trace t;
  std::vector<sim::Step> steps;
  std::unique_ptr<sim::TraceTables> tables;        // of (t, steps)
  std::shared_ptr<predict::WindowLog> window_log;  // for a policy that reads a predictor
};
struct Workloads {
  std::vector<std::unique_ptr<Workload>> loads;
  std::vector<const Workload*> of;  // by card
  std::uint64_t events = 0;         // trace events of all cards: what one simulation runs
};

Workloads make_workloads(const TrainScenario& s, const std::vector<CardSlot>& slots) {
  Workloads out;
  workload::TrainConfig cfg = s.train;
  cfg.steps = s.steps;
  cfg.zero3_ranks = s.cards;
  for (const CardSlot& c : slots) {
    auto it = std::find_if(out.loads.begin(), out.loads.end(),
                           [&c](const auto& w) { return w->shards == c.shards; });
    if (it == out.loads.end()) {
      auto w = std::make_unique<Workload>();
      w->shards = c.shards;
      workload::TrainConfig x = cfg;
      x.zero3_shards = c.shards;
      workload::generate_train(s.shape, x, w->t);
      w->steps = sim::build_steps(w->t);
      w->tables = std::make_unique<sim::TraceTables>(w->t, w->steps);
      const std::string_view predictor = policy::find_tiering_policy(s.policy).predictor;
      if (!predictor.empty()) w->window_log = policy::make_window_log(w->t, predictor);
      out.loads.push_back(std::move(w));
      it = out.loads.end() - 1;
    }
    out.of.push_back(it->get());
    out.events += (*it)->t.events.size();
  }
  return out;
}

// An op's time on the device: ZeRO-3 all-gather / reduce-scatter on the
// card link (Note [Peer-link cost]), the rest the profile's roofline.
double device_op_s(const sim::HwProfile& hw, const trace::Op& op) {
  if (op.cls == trace::OpClass::collective) return sim::collective_s(hw, op.bytes);
  return sim::op_cost(hw, op).total_s;
}

// A host Adam step streams master, m, v, gradient and weight once: bound
// by the card's share of DRAM bandwidth.
double host_op_s(const sim::HwProfile& hw, const trace::Op& op) {
  return static_cast<double>(op.bytes) / hw.host.dram_bandwidth.si +
         hw.device.launch_overhead.si;
}

// One simulation with the optimizer placed as asked (for hbm-only and lru
// always the device, for static-offload always the host), of the cards
// given (each its own trace by shard count, its own policy hooks).
TrainResult simulate_once(const TrainScenario& s, bool host_optimizer, bool device_home,
                          const std::vector<CardSlot>& slots, const Workloads& work) {
  TrainResult r;
  r.policy = s.policy;
  r.card_model = s.card_model;
  r.recompute_layers = std::min(s.train.recompute_layers, s.shape.layers);
  r.params = workload::analytic::param_count(s.shape);
  const bool separate = s.card_model == CardModel::separate;
  const auto& loads = work.loads;
  const auto& load_of = work.of;
  r.trace_events = work.events;

  const sim::HwProfile& hw = s.hw;
  auto device_time = [&hw](const trace::Op& op) { return device_op_s(hw, op); };
  auto host_time = [&hw](const trace::Op& op) { return host_op_s(hw, op); };
  sim::SimOptions o;
  o.device_budget = static_cast<std::uint64_t>(hw.device.hbm_capacity.si);
  o.host_budget = static_cast<std::uint64_t>(hw.host.dram_capacity.si);
  if (device_home) {
    // Started as hbm-only is, HBM may fill as far as hbm-only's pinned state
    // does: evict only when full (to 97%), not above the design's 90% (to
    // 80%), whose burst headroom a training step's fixed schedule does not
    // need.
    o.engine.device.high_watermark = kFullHigh;
    o.engine.device.low_watermark = kFullLow;
  }
  // separate: every card's SSD link is the same pooled link (Note [Card
  // models]). The policy plans with a card's static share either way (what a
  // card can count on when all are in phase), so both models decide alike.
  const sim::SimTransportConfig share = sim::links_from_profile(hw, kSsdPerCard);
  o.links = separate
                ? sim::links_from_profile(hw, kSsdPerCard, static_cast<std::uint32_t>(slots.size()))
                : share;
  const std::uint64_t room = o.device_budget + o.host_budget + kSsdPerCard;
  for (const auto& w : loads) r.footprint = std::max(r.footprint, w->tables->footprint);
  if (r.footprint > room) {  // nothing makes this fit
    r.why =
        fmt::format("the step needs {:.1f} GB per card at once; HBM + DRAM + SSD hold {:.1f} GB",
                    double(r.footprint) / 1e9, double(room) / 1e9);
    return r;
  }
  std::vector<sim::CardSpec> specs;
  // A policy per card: a policy's heat state is the card's own, and so are
  // its predictor's answers (read from the trace's shared log, Note [Shared
  // window log], which gives each reader what its own predictor would).
  std::vector<std::unique_ptr<policy::TieringPolicy>> policies;
  observe::TierBand band;  // HBM use against the design's band, every card
  observe::Fanout watch;
  watch.add(&band);
  if (s.observer) watch.add(s.observer);
  for (std::size_t c = 0; c < slots.size(); ++c) {
    const Workload& w = *load_of[c];
    policy::PolicyInputs in{.trace = w.t,
                            .steps = w.steps,
                            .host_optimizer = host_optimizer,
                            .h2d = share.links[static_cast<int>(engine::Link::h2d)],
                            .s2h = share.links[static_cast<int>(engine::Link::s2h)],
                            .has_ssd = share.ssd_capacity > 0,
                            .device_home = device_home,
                            .u3m = s.u3m,
                            .design = s.design,
                            .window_log = w.window_log};
    policies.push_back(policy::make_tiering_policy(s.policy, in));
    const policy::TieringPolicy& pol = *policies.back();
    r.optimizer_on_host = pol.optimizer_on_host();
    r.device_home = device_home;
    sim::SimOptions co = o;
    co.policy = policies.back().get();
    co.observer = &watch;
    co.op_time = [&pol, device_time, host_time](const trace::Op& op) {
      return pol.op_tier(op) == Tier::host ? host_time(op) : device_time(op);
    };
    specs.push_back(sim::CardSpec{w.t, w.steps, std::move(co), slots[c].card, w.tables.get()});
  }
  sim::CardsReport run = sim::simulate_cards(specs, /*share_ssd=*/separate);
  if (!run.ok()) {
    for (std::size_t c = 0; c < run.cards.size(); ++c) {
      if (run.cards[c].ok()) continue;
      r.why = slots.size() > 1 ? run.first_error : run.cards[c].first_error;
      r.sim = run.cards[c];  // the card that failed
      r.sim_card = slots[c].card;
      break;
    }
    return r;
  }
  r.fits = true;
  // The job's step: the last iteration ends when every card has ended it.
  const std::uint32_t last = s.steps - 1;
  auto end_of = [&run](std::size_t c, std::uint32_t it) -> std::uint64_t {
    const auto& e = run.cards[c].iteration_end_ns;
    return it < e.size() ? e[it] : 0;
  };
  std::size_t slowest = 0;
  std::uint64_t end_last = 0, end_before = 0;
  for (std::size_t c = 0; c < run.cards.size(); ++c) {
    if (end_of(c, last) > end_last) {
      end_last = end_of(c, last);
      slowest = c;
    }
    if (last > 0) end_before = std::max(end_before, end_of(c, last - 1));
  }
  r.sim = run.cards[slowest];
  r.sim_card = slots[slowest].card;
  // Read after the run: the policy filled them in.
  if (const policy::U3mPolicyStats* u = policy::u3m_stats(*policies[slowest])) r.u3m_policy = *u;
  if (const policy::DesignSeedStats* d = policy::design_seed_stats(*policies[slowest]))
    r.design_seed = *d;
  r.hbm_band = band.report(static_cast<int>(slots[slowest].card));
  // Infinite HBM needs no recompute: a checkpointed layer's second forward
  // (the generator's ".recompute" ops) is a price paid for memory, so it
  // counts as loss, not as ideal work. The job's ideal is its slowest card's.
  double ideal = 0;
  for (const auto& w : loads) {
    double x = 0;
    for (const trace::Op& op : w->t.ops) {
      if (op.iteration == last && !op.name.ends_with(".recompute")) x += device_time(op);
    }
    ideal = std::max(ideal, x);
  }
  r.ideal_step_s = ideal;
  r.step_s = end_last > 0 && last > 0 ? static_cast<double>(end_last - end_before) * 1e-9
                                      : static_cast<double>(run.total_ns) * 1e-9;
  r.loss = r.step_s > 0 ? std::max(0.0, 1.0 - ideal / r.step_s) : 0.0;
  r.tokens_per_s = r.step_s > 0 ? double(s.cards) * double(s.train.micro_batches) *
                                      double(s.train.tokens_per_micro_batch()) / r.step_s
                                : 0.0;
  r.stall_s = static_cast<double>(r.sim.stall_ns) * 1e-9;
  double busy = 0;
  for (const auto& l : r.sim.links) busy += static_cast<double>(l.busy_ns);
  r.hidden_fraction =
      busy > 0 ? std::clamp(1.0 - static_cast<double>(r.sim.stall_ns) / busy, 0.0, 1.0) : 1.0;
  for (std::size_t c = 0; c < run.cards.size(); ++c) {
    const sim::SimReport& x = run.cards[c];
    CardResult cr;
    cr.card = slots[c].card;
    cr.shards = slots[c].shards;
    cr.step_s = last > 0 ? static_cast<double>(end_of(c, last) - end_of(c, last - 1)) * 1e-9
                         : static_cast<double>(x.total_ns) * 1e-9;
    cr.barrier_s = static_cast<double>(x.barrier_ns) * 1e-9;
    cr.stall_s = static_cast<double>(x.stall_ns) * 1e-9;
    cr.compute_s = static_cast<double>(x.compute_ns) * 1e-9;
    r.cards.push_back(cr);
  }
  for (engine::Link l : {engine::Link::h2s, engine::Link::s2h}) {
    const auto li = static_cast<int>(l);
    const sim::SimLinkReport& x = separate ? run.ssd[li] : run.cards[0].links[li];
    r.ssd_link_bytes += x.bytes;
    r.ssd_link_busy_s += static_cast<double>(x.busy_ns) * 1e-9;
  }
  return r;
}

}  // namespace

// Note [Optimizer placement]
// On the device an Adam step is bound by HBM bandwidth, but its state must
// then live on the device or cross the host link both ways every step; on
// the host it is bound by DRAM bandwidth and only gradients and weights
// cross. Which wins depends on how much of the state fits, so the settings
// search (Note [One settings search]) simulates both placements where the
// policy runs either (the simulation is cheap) and keeps the faster one
// that fits: a planning decision made once per scenario.
//
// Note [Swap or recompute]
// Activations that do not fit in HBM either leave it (swapped to DRAM in
// forward, back in backward: twice their bytes on the host link, hidden only
// while the link has slack) or are recomputed in backward (a second forward
// of the layer: FLOPs that are never hidden). Which costs less depends on the
// layer's bytes per FLOP, the link, and what else the link carries, so the
// search decides by simulated cost, per scenario, among checkpointing the
// first 0, L/4, L/2, 3L/4 or all L layers (the first layers' activations
// wait longest for backward, so they are checkpointed first), unless the
// user asked for --recompute.
//
// Note [One settings search]
// Every policy gets the same search, in this one function: what a user who
// runs out of HBM would try first (activation checkpointing), where the
// optimizer runs, for the placements the policy allows (PolicyInfo:
// hbm-only keeps it on the device, static- and zero-offload on the host,
// the others either), and, for the policies that tier loaded state, whether
// it starts where the seed rules put it, under the design's watermarks (evict
// above 90% of HBM), or on the device as hbm-only does, filling HBM up
// before the policy's own victim order spills the rest. Every combination
// is simulated (up to 5 x 2 x 2 = 20 runs): the step is not unimodal in the
// depth (a walk that stopped at the first slower depth missed the depth
// at which a device start fits, tested). A result records the settings it
// chose (recompute_layers, optimizer_on_host, device_home); the same
// scenario with search off
// and those settings reproduces it (tested), so no policy has a search of
// its own.
namespace {

std::vector<std::uint32_t> recompute_choices(const TrainScenario& s) {
  if (s.train.recompute) return {s.shape.layers};
  if (!s.search) return {std::min(s.train.recompute_layers, s.shape.layers)};
  if (s.train.recompute_layers > 0) return {std::min(s.train.recompute_layers, s.shape.layers)};
  const std::uint32_t l = s.shape.layers;
  std::vector<std::uint32_t> out;
  for (std::uint32_t k : {0u, l / 4, l / 2, 3 * l / 4, l})
    if (out.empty() || out.back() != k) out.push_back(k);
  return out;
}

std::vector<bool> home_choices(const TrainScenario& s) {
  const policy::PolicyInfo& p = policy::find_tiering_policy(s.policy);
  if (!p.places_home) return {false};
  if (!s.search) return {s.device_home};
  return {false, true};
}

std::vector<bool> placement_choices(const TrainScenario& s) {
  const policy::PolicyInfo& p = policy::find_tiering_policy(s.policy);
  std::vector<bool> out;
  if (!s.search) {
    // As asked, where the policy allows it; else the one it runs.
    if (s.host_optimizer ? p.host_optimizer : p.device_optimizer) return {s.host_optimizer};
    return {p.host_optimizer};
  }
  if (p.device_optimizer) out.push_back(false);
  if (p.host_optimizer) out.push_back(true);
  return out;
}

TrainResult simulate_cards_policy(const TrainScenario& s, const std::vector<CardSlot>& slots) {
  s.validate();
  const std::vector<bool> placements = placement_choices(s);
  const std::vector<bool> homes = home_choices(s);
  std::optional<TrainResult> best;
  std::uint64_t events = 0;
  for (std::uint32_t k : recompute_choices(s)) {
    TrainScenario x = s;
    x.observer = nullptr;  // the search's runs are not the one reported
    x.train.recompute = false;
    x.train.recompute_layers = k;
    const Workloads work = make_workloads(x, slots);
    for (bool host : placements) {
      for (bool home : homes) {
        TrainResult r = simulate_once(x, host, home, slots, work);
        events += r.trace_events;
        if (!best || (r.fits && (!best->fits || r.step_s < best->step_s))) best = std::move(r);
      }
    }
  }
  best->trace_events = events;
  if (s.observer) {  // the chosen settings once more, watched (the run is deterministic)
    TrainScenario x = s;
    x.train.recompute = false;
    x.train.recompute_layers = best->recompute_layers;
    simulate_once(x, best->optimizer_on_host, best->device_home, slots, make_workloads(x, slots));
  }
  return *best;
}

}  // namespace

TrainResult simulate_training(const TrainScenario& s) {
  return simulate_cards_policy(s, default_cards(s));
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
// the user makes, not the memory system). The neighbour then holds two
// shards (zero3_shards = 2: twice the sharded state in its tiers and twice
// the optimizer work; collective traffic is unchanged). With separate cards
// (Note [Card models]) the N-1 survivors are simulated together, the
// neighbour with two shards and the others with one, and the others' wait
// at the collectives shows the straggler; symmetric (and, with separate
// cards, also as the comparison) takes the neighbour's step, simulated alone,
// as every card's, since all wait for it at each collective. With 2 cards the
// survivor holds the whole state, unsharded, alone. Either way the policy
// re-plans (e.g. where the optimizer runs). The move itself costs the
// shard's bytes at the link's practical bandwidth; we assume the shard is
// readable (a peer's redundant copy, as the design assumes), not reloaded
// from a checkpoint.
FailoverResult simulate_failover(const TrainScenario& s, const CardFailure& f) {
  s.validate();
  FailoverResult r;
  r.failure = f;
  r.neighbour = (f.card + 1) % s.cards;
  r.before = simulate_training(s);
  // The neighbour alone, with two shards (the symmetric estimate).
  TrainScenario alone = s;
  alone.card_model = CardModel::symmetric;
  if (s.cards == 2) {
    alone.cards = 1;  // the survivor holds the whole state: no sharding left
  } else {
    alone.train.zero3_shards = 2;
  }
  alone.train.zero3_ranks = alone.cards;  // as simulate_training sets it, for validate()
  TrainResult symmetric = simulate_training(alone);
  if (s.card_model == CardModel::separate && s.cards > 2) {
    std::vector<CardSlot> survivors;
    for (std::uint32_t c = 0; c < s.cards; ++c) {
      if (c != f.card) survivors.push_back({c, c == r.neighbour ? 2u : 1u});
    }
    r.after = simulate_cards_policy(s, survivors);
    r.after_symmetric = std::move(symmetric);
  } else {
    r.after = std::move(symmetric);  // with 2 cards: one card either way
  }
  workload::TrainConfig one = s.train;
  one.zero3_ranks = s.cards;
  const workload::analytic::TrainBytes b = workload::analytic::train_bytes(s.shape, one);
  r.moved_bytes = b.param_bytes + b.grad_bytes + b.optimizer_bytes;
  r.move_s = s.hw.peer_link.model().seconds(r.moved_bytes);
  // The job's tokens/s on the N-1 survivors (an after-run simulated as N
  // symmetric cards would count the failed card's tokens too).
  auto survivors_tokens_per_s = [&](TrainResult& after) {
    after.tokens_per_s = after.fits && after.step_s > 0 && r.before.step_s > 0
                             ? r.before.tokens_per_s * double(s.cards - 1) / double(s.cards) *
                                   r.before.step_s / after.step_s
                             : 0;
  };
  survivors_tokens_per_s(r.after);
  if (r.after_symmetric.fits) survivors_tokens_per_s(r.after_symmetric);
  if (r.before.fits && r.after.fits && r.before.step_s > 0) {
    r.slowdown = r.after.step_s / r.before.step_s - 1;
    r.tokens_per_s_after = r.after.tokens_per_s;
    r.run_s_no_failure = double(f.step + kFailoverRunSteps) * r.before.step_s;
    r.run_s = double(f.step) * r.before.step_s + r.move_s + kFailoverRunSteps * r.after.step_s;
  }
  if (r.before.fits && r.after_symmetric.fits && r.before.step_s > 0)
    r.slowdown_symmetric = r.after_symmetric.step_s / r.before.step_s - 1;
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

workload::ModelShape llama_shape(std::uint32_t layers, std::uint32_t d_model) {
  workload::ModelShape m;
  m.name = fmt::format("llama-L{}-d{}", layers, d_model);
  m.layers = layers;
  m.d_model = d_model;
  m.heads = d_model / 128;
  m.kv_heads = std::gcd(m.heads, 8u);  // GQA 8 where the heads divide by it
  m.ffn = (8 * d_model / 3 + 255) / 256 * 256;
  m.vocab = 32000;
  return m;
}

std::vector<workload::ModelShape> llama_ladder(std::uint64_t lo, std::uint64_t hi) {
  std::vector<std::pair<std::uint64_t, workload::ModelShape>> all;
  for (std::uint32_t d = 1024; d <= 65536; d += 128) {
    for (std::uint32_t l = (d + 129) / 130; l * 90 <= d; ++l) {
      workload::ModelShape m = llama_shape(l, d);
      const std::uint64_t p = workload::analytic::param_count(m);
      if (p >= lo && p <= hi) all.emplace_back(p, std::move(m));
    }
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<workload::ModelShape> out;
  for (auto& [p, m] : all) out.push_back(std::move(m));
  return out;
}

workload::ModelShape find_model(const std::string& name) {
  for (const workload::ModelShape& m : llama_family())
    if (m.name == name) return m;
  unsigned l = 0, d = 0;
  char tail = 0;
  if (std::sscanf(name.c_str(), "llama-L%u-d%u%c", &l, &d, &tail) == 2) {
    if (l == 0 || d == 0 || d % 128 != 0 || l > 100000 || d > 1u << 20)
      input_error("--model", "'{}': layers must be >= 1 and the width a positive multiple of 128",
                  name);
    return llama_shape(l, d);
  }
  return workload::preset(name);
}

namespace {

bool within(const TrainResult& r, double max_loss) { return r.fits && r.loss <= max_loss; }

// Bisects `ladder` (ascending parameters; every shape of it lies strictly
// between a shape that passed and one that did not) until the gap is within
// `resolution`: the loss is taken as monotone in size over the ladder, as
// the memory need is.
template <class Test>
void bisect(const std::vector<workload::ModelShape>& ladder, std::uint64_t pass_params,
            std::uint64_t fail_params, double resolution, Test&& test) {
  std::size_t lo = 0, hi = ladder.size();  // candidates [lo, hi)
  while (lo < hi && double(fail_params) > double(pass_params) * (1 + resolution)) {
    // The candidate nearest the geometric mean of the bracket.
    const double target = std::sqrt(double(pass_params) * double(fail_params));
    std::size_t mid = lo;
    double best = std::numeric_limits<double>::infinity();
    for (std::size_t i = lo; i < hi; ++i) {
      const double gap =
          std::abs(std::log(double(workload::analytic::param_count(ladder[i])) / target));
      if (gap < best) {
        best = gap;
        mid = i;
      }
    }
    const std::uint64_t p = workload::analytic::param_count(ladder[mid]);
    if (test(ladder[mid])) {
      pass_params = p;
      lo = mid + 1;
    } else {
      fail_params = p;
      hi = mid;
    }
  }
}

}  // namespace

// Note [Capacity walk]
// A policy's loss need not grow with the model: design-seed loses 8.5% at
// 1.17 B (LoRA r=16) and 1.7% at 50.3 B, because the fixed latencies of its
// per-op moves (Adam v read back from the SSD at every Adam op) weigh more
// in a 0.12 s step than in a 4.4 s one. A walk that stopped at the first
// shape beyond the bound would give it no capacity at all, so the named
// family (about ten shapes) is walked whole and the largest shape within
// the bound kept; only above it, between it and the next failing named
// shape, is loss taken as monotone (the 25% ladder steps and the bisection).
std::vector<CapacityRow> training_capacity(
    const TrainScenario& base, const std::vector<std::string>& policies, double max_loss,
    const std::function<void(const std::string&)>& progress, double resolution) {
  if (!(max_loss >= 0 && max_loss < 1))
    input_error("--max-loss", "must be in [0, 1), got {}", max_loss);
  if (!(resolution > 0 && resolution < 1))
    input_error("--resolution", "must be in (0, 1), got {}", resolution);
  std::vector<CapacityRow> rows;
  for (const std::string& p : policies) {
    CapacityRow row;
    row.policy = p;
    auto keep = [&row](const workload::ModelShape& m, const TrainResult& r) {
      row.max_params = r.params;
      row.model = m.name;
      row.loss = r.loss;
      row.step_s = r.step_s;
      row.recompute_layers = r.recompute_layers;
      row.optimizer_on_host = r.optimizer_on_host;
      row.device_home = r.device_home;
    };
    auto run = [&](const workload::ModelShape& m) {
      TrainScenario s = base;
      s.shape = m;
      s.policy = p;
      if (progress) progress(fmt::format("{} {}", p, m.name));
      row.tried.push_back(simulate_training(s));
      return row.tried.back();
    };
    // Coarse: every named shape, the largest within the bound kept and the
    // first beyond it after that one (Note [Capacity walk]).
    for (const workload::ModelShape& m : llama_family()) {
      TrainResult r = run(m);
      if (within(r, max_loss)) {
        keep(m, r);
        row.next_params = 0;
      } else if (row.next_params == 0) {
        row.next_params = r.params;
      }
    }
    // Past the named family: the ladder in steps of 25%.
    for (std::uint64_t q = row.max_params; row.max_params > 0 && row.next_params == 0 &&
                                           q < 64'000'000'000'000ull;) {
      const auto one = llama_ladder(q + q / 4, q + q / 2);
      if (one.empty()) break;
      TrainResult r = run(one.front());
      if (!within(r, max_loss)) {
        row.next_params = r.params;
        break;
      }
      keep(one.front(), r);
      q = r.params;
    }
    // Fine: between the two, over the family's rules.
    if (row.max_params > 0 && row.next_params > 0) {
      const auto ladder = llama_ladder(row.max_params + 1, row.next_params - 1);
      bisect(ladder, row.max_params, row.next_params, resolution,
             [&](const workload::ModelShape& m) {
               TrainResult r = run(m);
               if (within(r, max_loss)) {
                 keep(m, r);
                 return true;
               }
               row.next_params = r.params;
               return false;
             });
    }
    rows.push_back(std::move(row));
  }
  return rows;
}


// Note [Physical bound]
// The largest model no schedule can train within the loss bound, from what
// must cross the links whatever the policy does. Per card and per step, for
// each recompute depth k of the search and each optimizer placement, two
// sets of lower bounds on each link's bytes, the larger taken:
//  1. From the footprint. F_k, the trace's footprint (the most bytes live
//     at once, with its frees at last use), H the HBM, D the host DRAM, G
//     the micro-batches, O the optimizer state (master, m, v), W the
//     gradient shard (= the trainable 16-bit weight shard). At the
//     footprint's peak, e = F_k - H bytes that are live (used again) are
//     not on the device (with a host optimizer, O lives in DRAM and is used
//     there: e = F_k - O - H). Each must come back over the host link
//     before its next use. Everything live at a micro-batch's peak except O
//     is used again within that micro-batch (its activations, weight and
//     gradient shards), so the peak costs e bytes h2d per micro-batch,
//     except what O can take: optimizer state is used once per step.
//       device optimizer: h2d >= min(e, O) + G max(0, e - O) - (the first
//                         micro-batch's peak lacks the gradients: W less),
//                         d2h >= min(e, O) (updated state written back);
//       host optimizer:   h2d >= max(G e, W) (updated weights come back),
//                         d2h >= W (gradients go to the host), and the host
//                         Adam step takes its bytes over the DRAM bandwidth.
//     What exceeds H + D crosses the SSD at least once: F_k - H - D bytes.
//  2. From the order of uses (Note [Traffic lower bound] in
//     traffic_bound.cpp): byte-granular Belady over the steady iteration
//     with HBM for h2d (and the gradients a host optimizer reads for d2h),
//     with HBM + DRAM for SSD reads, and the new data alive at the
//     iteration's end beyond H + D for SSD writes. The footprint misses
//     that a layer's weights, evicted for the next layers' activations,
//     come back in backward; Belady does not, and it covers the SSD's
//     reads as well as its writes.
// No op can run with more than H bytes of touches, and no step with more
// than H + D + SSD live. The bound's step is the largest of the compute
// (ideal plus the recomputed forward), each link's bytes over its practical
// bandwidth (the SSD's reads and writes share the drive: their times add)
// and the host Adam step: all may overlap fully (a delayed parameter update
// hides the host step too). The serial figure adds them instead: the
// issue's "traffic within max-loss x compute" reading, which a schedule
// that overlaps beats, so it is not a bound, only a yardstick. Loss = 1 -
// ideal / step, as for the simulated policies; a shape passes at the best
// (k, placement). Bisected over llama_ladder (loss taken as monotone in
// size), so the figures are lower bounds on loss for the shape named and
// the capacity an upper bound within the ladder's 2% steps.
namespace {

struct BoundEval {
  bool feasible = false;
  double loss_overlapped = 1, loss_serial = 1;
  BoundShape over, serial;
};

BoundEval bound_of(const TrainScenario& base, const workload::ModelShape& m) {
  BoundEval out;
  TrainScenario s = base;
  s.shape = m;
  s.policy = "hbm-only";  // no window log needed
  s.steps = std::max(base.steps, 2u);  // the policies' trace, whose last iteration is timed
  s.search = true;
  const std::vector<CardSlot> slots = {{0, s.train.zero3_shards}};
  workload::TrainConfig cfg = s.train;
  cfg.zero3_ranks = s.cards;
  const workload::analytic::TrainBytes tb = workload::analytic::train_bytes(m, cfg);
  const double H = s.hw.device.hbm_capacity.si, D = s.hw.host.dram_capacity.si;
  const double O = double(tb.optimizer_bytes), W = double(tb.grad_bytes);
  const double G = s.train.micro_batches;
  const sim::SimTransportConfig links = sim::links_from_profile(s.hw, kSsdPerCard);
  auto rate = [&links](engine::Link l) { return links.links[static_cast<int>(l)].bandwidth; };
  const double bw_h2d = rate(engine::Link::h2d), bw_d2h = rate(engine::Link::d2h),
               bw_ssd = rate(engine::Link::s2h), bw_ssd_write = rate(engine::Link::h2s);
  for (std::uint32_t k : recompute_choices(s)) {
    TrainScenario x = s;
    x.train.recompute = false;
    x.train.recompute_layers = k;
    const Workloads work = make_workloads(x, slots);
    const Workload& w = *work.loads.front();
    const double F = double(w.tables->footprint);
    const std::uint32_t last = x.steps - 1;
    // The most one op of the step touches (the job's init, which creates
    // state at home, is not a step's op); optimizer ops apart, as a host
    // optimizer runs them in DRAM.
    double most_op = 0, most_optimizer_op = 0;
    for (std::size_t j = 0; j < w.steps.size(); ++j) {
      const trace::Op& op = w.t.ops[w.steps[j].op];
      if (op.iteration != last) continue;
      double& most = op.phase == trace::Phase::optimizer ? most_optimizer_op : most_op;
      most = std::max(most, double(w.tables->need[j]));
    }
    if (most_op > H || F > H + D + double(kSsdPerCard)) continue;
    // The steady iteration's steps (what the simulated step time spans).
    std::size_t span_begin = w.steps.size(), span_end = 0;
    for (std::size_t j = 0; j < w.steps.size(); ++j) {
      if (w.t.ops[w.steps[j].op].iteration != last) continue;
      span_begin = std::min(span_begin, j);
      span_end = j + 1;
    }
    if (span_end == 0) continue;
    double ideal = 0;
    for (const trace::Op& op : w.t.ops)
      if (op.iteration == last && !op.name.ends_with(".recompute")) ideal += device_op_s(s.hw, op);
    const double ssd_footprint = std::max(0.0, F - H - D);
    for (bool host : {false, true}) {  // whatever a policy may choose
      if (!host && most_optimizer_op > H) continue;
      const TrafficBound tb = traffic_bound({w.t, w.steps, span_begin, span_end, host,
                                             static_cast<std::uint64_t>(H),
                                             static_cast<std::uint64_t>(D)});
      // Compute as the step driver runs it: steps that only create tensors
      // are free, optimizer steps run on the host with a host optimizer,
      // each op's time rounded to the driver's whole nanoseconds.
      double compute = 0, host_adam = 0;
      auto as_driven = [](double t) { return double(std::llround(t * 1e9)) * 1e-9; };
      for (std::size_t j = span_begin; j < span_end; ++j) {
        if (tb.creates_only[j - span_begin]) continue;
        const trace::Op& op = w.t.ops[w.steps[j].op];
        if (policy::tier_of_op(op, host) == Tier::host)
          host_adam += as_driven(host_op_s(s.hw, op));
        else
          compute += as_driven(device_op_s(s.hw, op));
      }
      BoundShape b;
      b.params = workload::analytic::param_count(m);
      b.model = m.name;
      b.recompute_layers = k;
      b.optimizer_on_host = host;
      b.ideal_s = ideal;
      b.footprint = w.tables->footprint;
      b.compute_s = compute;
      b.host_adam_s = host_adam;
      double h2d = 0, d2h = 0;
      if (host) {
        const double e = std::max(0.0, F - O - H);
        h2d = std::max(G * e - std::min(e, W), W);
        d2h = W;
      } else {
        const double e = std::max(0.0, F - H);
        h2d = std::min(e, O) + std::max(0.0, G * std::max(0.0, e - O) - std::min(e, W));
        d2h = std::min(e, O);
      }
      h2d = std::max(h2d, double(tb.h2d));
      d2h = std::max(d2h, double(tb.d2h));
      const double ssd = std::max(ssd_footprint, double(tb.ssd_read));
      b.ssd_write = tb.ssd_write;
      b.h2d = static_cast<std::uint64_t>(h2d);
      b.d2h = static_cast<std::uint64_t>(d2h);
      b.ssd = static_cast<std::uint64_t>(ssd);
      const double th2d = h2d / bw_h2d, td2h = d2h / bw_d2h,
                   tssd = ssd / bw_ssd + double(tb.ssd_write) / bw_ssd_write;
      const double over = std::max({b.compute_s, b.host_adam_s, th2d, td2h, tssd});
      const double serial = b.compute_s + b.host_adam_s + th2d + td2h + tssd;
      struct Term {
        double s;
        const char* what;
      };
      const Term terms[] = {{b.compute_s, "compute"},
                            {b.host_adam_s, "host Adam"},
                            {th2d, "h2d link"},
                            {td2h, "d2h link"},
                            {tssd, "SSD"}};
      const Term* top = &terms[0];
      for (const Term& t : terms)
        if (t.s > top->s) top = &t;
      b.binding = fmt::format("{} {:.3f} s per step (ideal {:.3f} s)", top->what, top->s, ideal);
      b.loss = over > 0 ? std::max(0.0, 1 - ideal / over) : 0;
      if (!out.feasible || b.loss < out.loss_overlapped) {
        out.loss_overlapped = b.loss;
        out.over = b;
      }
      BoundShape bs = b;
      bs.loss = serial > 0 ? std::max(0.0, 1 - ideal / serial) : 0;
      bs.binding = fmt::format("transfers and host Adam {:.3f} s added to compute {:.3f} s",
                               serial - b.compute_s, b.compute_s);
      if (!out.feasible || bs.loss < out.loss_serial) {
        out.loss_serial = bs.loss;
        out.serial = bs;
      }
      out.feasible = true;
    }
  }
  return out;
}

// The largest ladder shape passing `pass`: doubling from the smallest
// family shape, then bisection.
template <class Pass>
BoundShape largest_passing(const Pass& pass, double resolution) {
  const std::uint64_t smallest = workload::analytic::param_count(llama_family().front());
  std::optional<BoundShape> good;
  BoundShape first_fail;
  std::uint64_t fail = 0;
  for (std::uint64_t p = smallest; p < 64'000'000'000'000ull; p *= 2) {
    const auto one = llama_ladder(p, p * 2);
    if (one.empty()) continue;
    std::optional<BoundShape> r = pass(one.front());
    if (!r) {
      fail = workload::analytic::param_count(one.front());
      break;
    }
    good = r;
  }
  if (!good) return {};
  if (fail > 0) {
    bisect(llama_ladder(good->params + 1, fail - 1), good->params, fail, resolution,
           [&](const workload::ModelShape& m) {
             std::optional<BoundShape> r = pass(m);
             if (r) good = r;
             return r.has_value();
           });
  }
  return *good;
}

}  // namespace

BoundShape bound_at(const TrainScenario& s) {
  const BoundEval e = bound_of(s, s.shape);
  return e.feasible ? e.over : BoundShape{};
}

PhysicalBound physical_bound(const TrainScenario& base, double max_loss) {
  // Both searches walk the same ladder and bound_of gives both figures: each
  // shape is evaluated once.
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t,
                      std::uint32_t, bool>,
           BoundEval>
      memo;
  auto eval = [&](const workload::ModelShape& m) -> const BoundEval& {
    const auto key =
        std::tuple{m.layers, m.d_model, m.heads, m.kv_heads, m.ffn, m.vocab, m.tied_embeddings};
    auto it = memo.find(key);
    if (it == memo.end()) it = memo.emplace(key, bound_of(base, m)).first;
    return it->second;
  };
  PhysicalBound out;
  out.overlapped = largest_passing(
      [&](const workload::ModelShape& m) -> std::optional<BoundShape> {
        const BoundEval& e = eval(m);
        if (!e.feasible || e.loss_overlapped > max_loss) return std::nullopt;
        return e.over;
      },
      0.02);
  out.serial = largest_passing(
      [&](const workload::ModelShape& m) -> std::optional<BoundShape> {
        const BoundEval& e = eval(m);
        if (!e.feasible || e.loss_serial > max_loss) return std::nullopt;
        return e.serial;
      },
      0.02);
  return out;
}

}  // namespace u3m::experiments
