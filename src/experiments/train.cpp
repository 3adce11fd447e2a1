#include "u3m/experiments/train.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>

#include "u3m/engine/steps.hpp"
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
  std::shared_ptr<predict::WindowLog> window_log;  // u3m only
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
      if (s.policy == "u3m") w->window_log = policy::make_window_log(w->t);
      out.loads.push_back(std::move(w));
      it = out.loads.end() - 1;
    }
    out.of.push_back(it->get());
    out.events += (*it)->t.events.size();
  }
  return out;
}

// One simulation with the optimizer placed as asked (for hbm-only and lru
// always the device, for static-offload always the host), of the cards
// given (each its own trace by shard count, its own policy hooks).
TrainResult simulate_once(const TrainScenario& s, bool host_optimizer,
                          const std::vector<CardSlot>& slots, const Workloads& work) {
  TrainResult r;
  r.policy = s.policy;
  r.card_model = s.card_model;
  r.recompute_layers =
      s.train.recompute ? s.shape.layers : std::min(s.train.recompute_layers, s.shape.layers);
  r.params = workload::analytic::param_count(s.shape);
  const bool separate = s.card_model == CardModel::separate;
  const auto& loads = work.loads;
  const auto& load_of = work.of;
  r.trace_events = work.events;

  const sim::HwProfile& hw = s.hw;
  const double launch = hw.device.launch_overhead.si;
  auto device_time = [&hw](const trace::Op& op) {
    // ZeRO-3 all-gather / reduce-scatter on the card link (Note [Peer-link cost]).
    if (op.cls == trace::OpClass::collective) return sim::collective_s(hw, op.bytes);
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
  for (std::size_t c = 0; c < slots.size(); ++c) {
    const Workload& w = *load_of[c];
    policy::PolicyInputs in{.trace = w.t,
                            .steps = w.steps,
                            .host_optimizer = host_optimizer,
                            .h2d = share.links[static_cast<int>(engine::Link::h2d)],
                            .s2h = share.links[static_cast<int>(engine::Link::s2h)],
                            .has_ssd = share.ssd_capacity > 0,
                            .u3m = s.u3m,
                            .window_log = w.window_log};
    policies.push_back(policy::make_tiering_policy(s.policy, in));
    const policy::TieringPolicy& pol = *policies.back();
    r.optimizer_on_host = pol.optimizer_on_host();
    sim::SimOptions co = o;
    co.policy = policies.back().get();
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
namespace {

TrainResult simulate_cards_policy(const TrainScenario& s, const std::vector<CardSlot>& slots) {
  s.validate();
  if (s.policy == "hbm-only" || s.policy == "lru" || s.policy == "lookahead")
    return simulate_once(s, false, slots, make_workloads(s, slots));
  if (s.policy == "static-offload") return simulate_once(s, true, slots, make_workloads(s, slots));
  std::vector<std::uint32_t> choices = {s.train.recompute_layers};
  if (!s.train.recompute && s.train.recompute_layers == 0)
    choices = {0, s.shape.layers / 2, s.shape.layers};
  std::optional<TrainResult> best;
  std::uint64_t events = 0;
  for (std::uint32_t k : choices) {
    TrainScenario x = s;
    x.train.recompute_layers = k;
    const Workloads work = make_workloads(x, slots);
    for (bool host : {false, true}) {
      TrainResult r = simulate_once(x, host, slots, work);
      events += r.trace_events;
      if (!best || (r.fits && (!best->fits || r.step_s < best->step_s))) best = std::move(r);
    }
  }
  best->trace_events = events;
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
