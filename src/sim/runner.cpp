#include "u3m/sim/runner.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

#include "u3m/engine/steps.hpp"
#include "u3m/sim/cost.hpp"
#include "u3m/sim/sim_host.hpp"
#include "u3m/sim/sim_stack.hpp"
#include "u3m/sim/virtual_time.hpp"
#include "u3m/util/error.hpp"

namespace u3m::sim {

using engine::Access;
using engine::Lease;
using engine::Tier;

namespace {

std::uint64_t seconds_to_ns(double s, const trace::Op& op) {
  if (!std::isfinite(s) || s < 0)
    input_error("simulate", "op '{}': compute time {} s is not a finite number >= 0", op.name, s);
  return static_cast<std::uint64_t>(std::llround(s * 1e9));
}

OpTimeFn compute_model(const SimOptions& o) {
  if (o.op_time) return o.op_time;
  if (o.hw) {
    return [hw = *o.hw](const trace::Op& op) { return op_cost(hw, op).total_s; };
  }
  if (o.flop_rate > 0 || o.mem_bandwidth > 0 || o.op_overhead_s > 0) {
    return [f = o.flop_rate, b = o.mem_bandwidth, c = o.op_overhead_s](const trace::Op& op) {
      return (f > 0 && op.flops > 0 ? op.flops / f : 0.0) +
             (b > 0 ? static_cast<double>(op.bytes) / b : 0.0) + c;
    };
  }
  input_error("simulate",
              "no compute model: give op_time, a hardware profile, or flop_rate / mem_bandwidth");
}

// "layer_12.attn.q_proj" -> "layer_*.attn.q_proj": one family per op kind.
// Built in `key` (reused: op names outgrow the small-string buffer).
void family_key(const std::string& name, std::string& key) {
  auto digit = [&name](std::size_t i) {
    return std::isdigit(static_cast<unsigned char>(name[i])) != 0;
  };
  key.clear();
  std::size_t from = 0;  // start of the run not copied yet
  for (std::size_t i = 0; i + 1 < name.size(); ++i) {
    if (name[i] != '_' || !digit(i + 1)) continue;
    key.append(name, from, i + 1 - from);
    key += '*';
    std::size_t j = i + 1;
    while (j < name.size() && digit(j)) ++j;
    from = j;
    i = j - 1;
  }
  key.append(name, from);
}

}  // namespace

TraceTables::TraceTables(const trace::Trace& trace, const std::vector<Step>& steps)
    : footprint(engine::trace_footprint(trace)),
      bytes(trace.tensors.size()),
      need(steps.size()),
      family_of_op(trace.ops.size()),
      trace_(&trace),
      steps_(&steps) {
  for (std::size_t t = 0; t < trace.tensors.size(); ++t) bytes[t] = trace.tensors[t].bytes;
  for (std::size_t j = 0; j < steps.size(); ++j) {
    for (const Touch& t : steps[j].touches) need[j] += bytes[t.tensor];
  }
  std::unordered_map<std::string, std::uint32_t> index;
  std::string key;
  for (std::size_t o = 0; o < trace.ops.size(); ++o) {
    family_key(trace.ops[o].name, key);
    auto [it, inserted] = index.try_emplace(key, static_cast<std::uint32_t>(index.size()));
    if (inserted) families.push_back(it->first);
    family_of_op[o] = it->second;
  }
}

void TraceTables::check(const trace::Trace& trace, const std::vector<Step>& steps) const {
  if (&trace != trace_ || &steps != steps_) {
    input_error("CardSpec::tables", "built for another trace or steps than this card's");
  }
}

namespace {

// Note [Simulation loop]
// Each step acquires every tensor it touches on the device with try_acquire
// (a write lease if it writes the tensor or the tensor holds no data yet, as
// replay does), which never blocks: a busy answer has scheduled the demand
// fetch or the eviction that makes room. While any is busy, the card waits
// for its transport's next completion (which lets the engine start more);
// that time is stall. Then the op's compute time passes, with transfers
// completing meanwhile (overlap; completions due exactly at its end run
// before it ends), and the leases are released. A step that can make no
// progress (nothing granted, nothing in flight, no eviction made) cannot run
// within the budgets: the run stops and says why.
//
// The prefetch hook runs once the step holds its leases, not before: the
// room a prefetch makes is taken from least recently used copies, and
// before the acquire the step's own inputs (often a copy an earlier
// prefetch brought, touched only when it landed) rank among the oldest, so
// prefetching first evicted exactly what the step was about to read.
//
// The loop is a state machine per card (Card::advance runs what it can at
// the current instant and says what it waits for: its transport's next
// completion, the end of its compute, or a barrier), and one driver
// (simulate_cards) moves the clock for all cards: Note [Cards] in runner.hpp.
class Simulation final : public policy::StepContext {
 public:
  enum class Wait { event, compute, barrier, done };

  Simulation(const trace::Trace& trace, const std::vector<Step>& steps, const TraceTables& tables,
             engine::Engine& eng, VirtualTime& vt, const SimTransport& transport,
             const SimOptions& o, OpTimeFn op_time, policy::TieringPolicy& policy, SimReport& rep)
      : trace_(trace),
        steps_(steps),
        tables_(tables),
        bytes_(tables.bytes),
        eng_(eng),
        vt_(vt),
        transport_(transport),
        o_(o),
        op_time_(std::move(op_time)),
        policy_(policy),
        rep_(rep),
        n_(o.max_steps ? std::min<std::size_t>(o.max_steps, steps.size()) : steps.size()),
        registered_(trace.tensors.size(), 0),
        has_data_(trace.tensors.size(), 0),
        removing_(trace.tensors.size(), 0),
        families_(tables.families.size()) {}

  const std::vector<Step>& steps() const override { return steps_; }
  const trace::Trace& trace() const override { return trace_; }
  const engine::Engine& engine() const override { return eng_; }
  std::uint64_t now_ns() const override { return vt_.now_ns(); }
  Tier step_tier(std::size_t step) const override {
    return policy_.op_tier(trace_.ops[steps_[step].op]);
  }
  void prefetch(std::uint32_t t) override {
    if (!(registered_[t] && has_data_[t] && !removing_[t])) return;
    record(policy::DriverCall::Kind::prefetch, t);
    eng_.prefetch(id(t), Tier::device);
  }
  void demote(std::uint32_t t, Tier from) override {
    if (!(registered_[t] && has_data_[t] && !removing_[t])) return;
    record(policy::DriverCall::Kind::demote, t, from);
    eng_.evict(id(t), from);
  }
  void publish(std::span<const engine::Engine::ScoreUpdate> scores) override {
    if (o_.log)
      for (const auto& u : scores) {
        record(policy::DriverCall::Kind::publish, tensor_of(u.id));
        o_.log->back().score = u.scores.device;
      }
    eng_.publish_scores(scores);
  }

  // Runs what the card can at the current instant (no time passes) and says
  // what it waits for.
  Wait advance() {
    for (;;) {
      switch (phase_) {
        case Phase::done:
          return Wait::done;
        case Phase::barrier:
          return Wait::barrier;
        case Phase::computing:
          if (!solo_) return Wait::compute;  // the driver calls end_compute()
          vt_.run_until(end_);               // alone on the clock: what the driver would do
          end_compute();
          continue;
        case Phase::next:
          if (j_ == n_ || rep_.errors) {
            phase_ = Phase::done;
            rep_.total_ns = vt_.now_ns();
            return Wait::done;
          }
          begin_step();
          continue;
        case Phase::materializing:
          if (waiting_ && transport_.completed() == seen_) return Wait::event;
          waiting_ = false;
          if (!materialize_pass()) return Wait::event;
          continue;
        case Phase::acquiring:
          if (waiting_ && transport_.completed() == seen_) return Wait::event;
          waiting_ = false;
          if (!acquire_pass()) return Wait::event;
          continue;
      }
    }
  }

  // At a barrier: since when. The driver releases every card at once.
  std::uint64_t barrier_since() const { return barrier_since_; }
  void leave_barrier() {
    rep_.barrier_ns += vt_.now_ns() - barrier_since_;
    start_compute();
  }
  std::uint64_t compute_end() const { return end_; }
  // The only card on the clock: it moves the clock itself where the driver
  // would (a run_until to the end of compute, a run_next while it waits),
  // which spares the driver a round per step on the hot single-card path.
  void set_solo(bool solo) { solo_ = solo; }
  // The op's compute time has passed (the driver ran every event due by then).
  void end_compute() {
    const Step& s = steps_[j_];
    const trace::Op& op = trace_.ops[s.op];
    if (op.job == 0) {
      if (rep_.iteration_end_ns.size() <= op.iteration)
        rep_.iteration_end_ns.resize(op.iteration + 1, 0);
      rep_.iteration_end_ns[op.iteration] = vt_.now_ns();
    }
    release_leases(true);
    for (std::uint32_t t : s.frees) {
      if (registered_[t] && !removing_[t]) {
        record(policy::DriverCall::Kind::free, t);
        removing_[t] = 1;
        removals_.push_back(t);
      }
    }
    retry_removals();
    finish_step();
  }
  // Another card failed: the run stops here, with this card's leases returned.
  void abort() {
    if (phase_ == Phase::done) return;
    release_leases(false);
    phase_ = Phase::done;
    rep_.total_ns = vt_.now_ns();
  }

  // A freed tensor may still be moving (a write-back in flight): the engine
  // answers busy, and the removal is retried after later steps.
  void retry_removals() {
    std::size_t kept = 0;
    for (std::uint32_t t : removals_) {
      if (!removing_[t]) continue;  // touched again: ensure() took it back
      if (eng_.remove(id(t)) == engine::Status::busy) {
        removals_[kept++] = t;
        continue;
      }
      registered_[t] = has_data_[t] = removing_[t] = 0;
    }
    removals_.resize(kept);
  }

  std::vector<OpFamilyReport> families() const {
    std::vector<OpFamilyReport> out;
    for (std::size_t f = 0; f < families_.size(); ++f) {
      if (families_[f].steps == 0) continue;  // no step of it ran (materialized ones do not count)
      out.push_back(families_[f]);
      out.back().name = tables_.families[f];
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
      return a.missed_bytes != b.missed_bytes ? a.missed_bytes > b.missed_bytes : a.name < b.name;
    });
    return out;
  }

 private:
  enum class Phase { next, materializing, acquiring, barrier, computing, done };
  static engine::TensorId id(std::uint32_t t) { return engine_id(t); }

  void record(policy::DriverCall::Kind k, std::uint32_t t, Tier tier = Tier::device,
              bool write = false) {
    if (o_.log) o_.log->push_back({k, static_cast<std::uint32_t>(j_), t, tier, write});
  }

  bool creates_only(std::size_t j) const {
    const Step& s = steps_[j];
    if (s.touches.empty()) return false;
    for (const Touch& t : s.touches) {
      // A tensor freed and not yet removed holds no data (ensure() will say so).
      if (!t.writes || (has_data_[t.tensor] && !removing_[t.tensor])) return false;
      if (!policy_.home_tier(trace_.tensors[t.tensor])) return false;  // no home: a step as any
    }
    return true;
  }

  void begin_step() {
    waiting_ = false;
    if (creates_only(j_)) {
      phase_ = Phase::materializing;
      mat_i_ = 0;
      mat_ensured_ = false;
      return;
    }
    const Step& s = steps_[j_];
    const trace::Op& op = trace_.ops[s.op];
    tier_ = policy_.op_tier(op);
    fam_ = &families_[tables_.family_of_op[s.op]];
    ++fam_->steps;
    leases_.assign(s.touches.size(), Lease{});
    missed_.assign(s.touches.size(), 0);
    held_ = 0;
    since_grant_ = 0;
    for (const Touch& t : s.touches) {
      ensure(t.tensor);
      record(policy::DriverCall::Kind::acquire, t.tensor, tier_, t.writes || !has_data_[t.tensor]);
    }
    t0_ = vt_.now_ns();
    phase_ = Phase::acquiring;
    if (tier_ == Tier::device) {
      if (tables_.need[j_] > rep_.device_budget)
        acquire_failed(cannot_place("together they exceed the budget"));
    }
  }

  // A step that only creates tensors, with a home for each: created one at a
  // time where they rest (TieringPolicy::home_tier). False: waits for a completion.
  bool materialize_pass() {
    const Step& s = steps_[j_];
    for (; mat_i_ < s.touches.size(); ++mat_i_, mat_ensured_ = false) {
      const Touch& t = s.touches[mat_i_];
      if (!mat_ensured_) {
        ensure(t.tensor);
        record(policy::DriverCall::Kind::acquire, t.tensor,
               *policy_.home_tier(trace_.tensors[t.tensor]), true);
      }
      mat_ensured_ = true;
      Lease l;
      for (;;) {
        const engine::Status st = eng_.try_acquire(
            id(t.tensor), *policy_.home_tier(trace_.tensors[t.tensor]), Access::write, &l);
        if (mem::ok(st)) break;
        if (st != engine::Status::busy || transport_.in_flight() == 0) {
          fail(fmt::format("step {}: cannot create '{}' in its home tier: {}", j_,
                           trace_.tensors[t.tensor].name, mem::to_string(st)));
          return true;
        }
        if (!solo_) return wait();
        vt_.run_next();
      }
      eng_.release(l);
      has_data_[t.tensor] = 1;
    }
    finish_step();
    return true;
  }

  // Note [No progress]: the step's own tensors can evict each other when
  // they fit only without the space the others' copies take in flight, so
  // fetches complete forever and nothing is granted. A bound on completions
  // without a grant ends such a step with an error instead of a hang; it is
  // far above any real wait (the queues ahead of a demand fetch).
  static constexpr std::uint64_t kMaxEventsWithoutGrant = 200'000;

  // One pass over the step's tensors. False: waits for a completion.
  bool acquire_pass() {
    const Step& s = steps_[j_];
    const trace::Op& op = trace_.ops[s.op];
    for (;;) {
      const std::uint64_t evictions = eng_.evictions();
      bool granted = false;
      for (std::size_t i = 0; i < s.touches.size(); ++i) {
        if (leases_[i]) continue;
        const Touch& t = s.touches[i];
        const Access a = t.writes || !has_data_[t.tensor] ? Access::write : Access::read;
        const engine::Status st = eng_.try_acquire(id(t.tensor), tier_, a, &leases_[i]);
        if (mem::ok(st)) {
          ++held_;
          granted = true;
        } else if (st == engine::Status::busy) {
          if (!missed_[i]) fam_->missed_bytes += bytes_[t.tensor];
          missed_[i] = 1;
        } else {
          acquire_failed(fmt::format("step {} op '{}' tensor '{}': {}", j_, op.name,
                                     trace_.tensors[t.tensor].name, mem::to_string(st)));
          return true;
        }
      }
      if (held_ == s.touches.size()) {
        acquired();
        return true;
      }
      since_grant_ = granted ? 0 : since_grant_ + 1;
      if (since_grant_ > kMaxEventsWithoutGrant) {
        acquire_failed(
            cannot_place("they keep evicting each other (no progress in 200,000 events)"));
        return true;
      }
      if (transport_.in_flight() > 0) {  // the next completion: stall
        if (!solo_) return wait();
        vt_.run_next();  // alone on the clock, every event is this card's
        continue;
      }
      if (!granted && eng_.evictions() == evictions) {
        acquire_failed(cannot_place("nothing is in flight and nothing more can be evicted"));
        return true;
      }
    }
  }

  bool wait() {
    waiting_ = true;
    seen_ = transport_.completed();
    return false;
  }

  // Holds its tensors: the stall ends, the hook runs with them pinned
  // (Note [Simulation loop]), then a collective waits for the other cards.
  void acquired() {
    add_stall();
    policy_.on_step(j_, *this);
    if (trace_.ops[steps_[j_].op].cls == trace::OpClass::collective) {
      ++rep_.collectives;
      if (solo_) return start_compute();  // nobody to wait for
      barrier_since_ = vt_.now_ns();
      phase_ = Phase::barrier;
      return;
    }
    start_compute();
  }

  void start_compute() {
    const trace::Op& op = trace_.ops[steps_[j_].op];
    const std::uint64_t dt = seconds_to_ns(op_time_(op), op);
    rep_.compute_ns += dt;
    fam_->compute_ns += dt;
    end_ = vt_.now_ns() + dt;
    phase_ = Phase::computing;
  }

  void add_stall() {
    rep_.stall_ns += vt_.now_ns() - t0_;
    fam_->stall_ns += vt_.now_ns() - t0_;
  }

  void acquire_failed(std::string why) {
    add_stall();
    release_leases(false);
    fail(std::move(why));
  }

  void fail(std::string why) {
    ++rep_.errors;
    rep_.first_error = std::move(why);
    phase_ = Phase::next;  // advance() ends the card
  }

  void finish_step() {
    ++rep_.steps;
    ++j_;
    phase_ = Phase::next;
  }

  // leases_ is empty outside a step (its index is the step's touch).
  void release_leases(bool wrote) {
    for (std::size_t i = 0; i < leases_.size(); ++i) {
      if (!leases_[i]) continue;
      eng_.release(leases_[i]);
      if (wrote) has_data_[steps_[j_].touches[i].tensor] = 1;
    }
    leases_.clear();
  }

  std::string cannot_place(const char* why) const {
    const Step& s = steps_[j_];
    std::uint64_t need = 0;
    for (const Touch& t : s.touches) need += trace_.tensors[t.tensor].bytes;
    return fmt::format(
        "step {} op '{}': its {} tensors ({} bytes) cannot all be placed on the device: {} "
        "(device budget {} bytes, host budget {} bytes, SSD {} bytes)",
        j_, trace_.ops[s.op].name, s.touches.size(), need, why, rep_.device_budget,
        rep_.host_budget, rep_.ssd_capacity);
  }

  void ensure(std::uint32_t t) {
    if (removing_[t]) {
      // Freed, then allocated again before its removal went through: the
      // same registration serves the new tensor, whose data is undefined, so
      // its first touch is a write (which drops the stale copies).
      removing_[t] = 0;
      has_data_[t] = 0;
      return;
    }
    if (!registered_[t]) {
      eng_.add(id(t), bytes_[t], policy_.initial_scores(t, j_));
      registered_[t] = 1;
      has_data_[t] = 0;
    }
  }

  const trace::Trace& trace_;
  const std::vector<Step>& steps_;
  const TraceTables& tables_;
  const std::vector<std::uint64_t>& bytes_;  // tables_.bytes
  engine::Engine& eng_;
  VirtualTime& vt_;
  const SimTransport& transport_;
  const SimOptions& o_;
  const OpTimeFn op_time_;
  policy::TieringPolicy& policy_;
  SimReport& rep_;
  const std::size_t n_;
  std::vector<std::uint8_t> registered_, has_data_, removing_;
  std::vector<std::uint32_t> removals_;
  std::vector<OpFamilyReport> families_;  // by TraceTables family; names filled by families()

  // The step in progress.
  Phase phase_ = Phase::next;
  std::size_t j_ = 0;
  Tier tier_ = Tier::device;
  OpFamilyReport* fam_ = nullptr;
  std::vector<Lease> leases_;
  std::vector<std::uint8_t> missed_;
  std::size_t held_ = 0, mat_i_ = 0;
  bool mat_ensured_ = false;
  std::uint64_t since_grant_ = 0, t0_ = 0, end_ = 0, barrier_since_ = 0;
  bool solo_ = false;
  bool waiting_ = false;  // for a completion of this card's transport after `seen_`
  std::uint64_t seen_ = 0;
};

// One card's objects: the same pool setup as drive::replay_trace, over fake
// addresses. Members in construction order (each refers to those above).
struct Card {
  Card(const CardSpec& spec, const TraceTables& tables, VirtualTime& vt, SharedLinks* ssd)
      : options(spec.options),
        stack(stack_spec(budgets(spec, tables)), vt, ssd, options.links.ssd_shared),
        transport(stack.transport),
        eng(stack.engine),
        sim(spec.trace, spec.steps, tables, eng, vt, transport, options, compute_model(options),
            policy_of(spec), report) {
    eng.set_victim_order(policy_of(spec).victim_order());
  }

  // Fills the report's budgets; the pool's capacity follows the device budget.
  const SimReport& budgets(const CardSpec& spec, const TraceTables& tables) {
    report.tensors = spec.trace.tensors.size();
    report.footprint = tables.footprint;
    const std::uint64_t fp = std::max<std::uint64_t>(report.footprint, 1);
    report.device_budget =
        options.device_budget
            ? options.device_budget
            : std::max<std::uint64_t>(static_cast<std::uint64_t>(options.device_fraction * fp), 1);
    report.host_budget = options.host_budget ? options.host_budget : 2 * fp;
    report.ssd_capacity = options.links.ssd_capacity;
    report.links_label = options.links.describe();
    return report;
  }
  // The card's stack: the real stack's spec (Note [Device arena] in
  // engine/stack_spec.hpp), with the budgets and the modelled links.
  engine::StackSpec stack_spec(const SimReport& r) const {
    engine::StackSpec s;
    s.device_bytes = r.device_budget;
    s.host_bytes = r.host_budget;
    s.ssd_bytes = options.links.ssd_capacity;
    s.links = options.links.links;
    s.engine = options.engine;
    return s;
  }

  void fill_report(const VirtualTime& vt) {
    SimReport& rep = report;
    for (int l = 0; l < kNumLinks; ++l) {
      const SimLinkStats& s = transport.link(static_cast<engine::Link>(l));
      rep.links[l] = SimLinkReport{s.transfers, s.bytes, s.failures, s.busy_ns, s.queue_ns};
    }
    // This card's transfers, not the shared clock: other cards may run on.
    rep.drain_ns = std::max(transport.last_done_ns(), rep.total_ns) - rep.total_ns;
    rep.engine = eng.stats();
    rep.peak_device = rep.engine.peak[static_cast<int>(Tier::device)];
    rep.peak_host = rep.engine.peak[static_cast<int>(Tier::host)];
    rep.peak_ssd = transport.ssd_peak();
    rep.events = vt.events_run();
    rep.op_families = sim.families();
  }

  // The card's policy: the spec's, or the lookahead policy (made once).
  policy::TieringPolicy& policy_of(const CardSpec& spec) {
    if (spec.options.policy) return *spec.options.policy;
    if (!own_policy)
      own_policy = policy::make_tiering_policy(
          "lookahead", {.trace = spec.trace, .steps = spec.steps, .lookahead = spec.options.lookahead});
    return *own_policy;
  }

  SimReport report;  // first: the members below are built from its budgets
  std::unique_ptr<policy::TieringPolicy> own_policy;
  const SimOptions options;
  SimStack stack;
  SimTransport& transport;
  engine::Engine& eng;
  Simulation sim;
};

void check_shared_ssd(const std::vector<CardSpec>& cards) {
  const SimTransportConfig& a = cards[0].options.links;
  for (std::size_t c = 1; c < cards.size(); ++c) {
    const SimTransportConfig& b = cards[c].options.links;
    for (engine::Link l : {engine::Link::h2s, engine::Link::s2h}) {
      const LinkModel& x = a.links[static_cast<int>(l)];
      const LinkModel& y = b.links[static_cast<int>(l)];
      if (x.bandwidth != y.bandwidth || x.latency_s != y.latency_s || a.ssd_shared != b.ssd_shared)
        input_error("simulate_cards",
                    "card {}: its {} link differs from card {}'s, but the SSD link is shared",
                    cards[c].label(c), engine::to_string(l), cards[0].label(0));
    }
  }
}

}  // namespace

CardsReport simulate_cards(const std::vector<CardSpec>& specs, bool share_ssd) {
  if (specs.empty()) input_error("simulate_cards", "no cards");
  if (share_ssd) check_shared_ssd(specs);
  CardsReport out;
  out.shared_ssd = share_ssd;
  VirtualTime vt;
  SharedLinks ssd;  // outlives the transports
  // One TraceTables per distinct (trace, steps) the caller did not build,
  // before the cards that use it.
  std::vector<std::unique_ptr<TraceTables>> tables;
  std::vector<const TraceTables*> tables_of(specs.size(), nullptr);
  std::vector<std::unique_ptr<Card>> cards;
  // Destroyed before the cards: runs every scheduled completion, so an
  // engine's destructor (which waits for transfers in flight) never waits
  // on a clock nobody advances, even when a step throws.
  struct RunEmpty {
    VirtualTime& vt;
    ~RunEmpty() { vt.run_all(); }
  } run_empty{vt};
  for (std::size_t c = 0; c < specs.size(); ++c) {
    try {
      if (const TraceTables* given = specs[c].tables) {
        given->check(specs[c].trace, specs[c].steps);
        tables_of[c] = given;
      }
      for (std::size_t d = 0; d < c && !tables_of[c]; ++d) {
        if (&specs[d].trace == &specs[c].trace && &specs[d].steps == &specs[c].steps)
          tables_of[c] = tables_of[d];
      }
      if (!tables_of[c]) {
        tables.push_back(std::make_unique<TraceTables>(specs[c].trace, specs[c].steps));
        tables_of[c] = tables.back().get();
      }
      cards.push_back(
          std::make_unique<Card>(specs[c], *tables_of[c], vt, share_ssd ? &ssd : nullptr));
    } catch (const InputError& e) {
      if (specs.size() == 1) throw;
      input_error("simulate_cards", "card {}: {}", specs[c].label(c), e.what());
    }
  }

  if (cards.size() == 1) cards[0]->sim.set_solo(true);
  std::vector<Simulation::Wait> wait(cards.size());
  for (;;) {
    bool all_done = true, failed = false, all_at_barrier = true;
    for (std::size_t c = 0; c < cards.size(); ++c) {
      wait[c] = cards[c]->sim.advance();
      if (wait[c] != Simulation::Wait::done) all_done = false;
      if (wait[c] != Simulation::Wait::done && wait[c] != Simulation::Wait::barrier)
        all_at_barrier = false;
      failed = failed || cards[c]->report.errors;
    }
    if (failed) {
      for (auto& card : cards) card->sim.abort();
      break;
    }
    if (all_done) break;
    if (all_at_barrier) {  // every card still running reached the collective
      for (std::size_t c = 0; c < cards.size(); ++c) {
        if (wait[c] == Simulation::Wait::barrier) cards[c]->sim.leave_barrier();
      }
      continue;
    }
    // The clock moves to the earliest completion or end of compute; a
    // completion due exactly when compute ends runs first.
    std::optional<std::uint64_t> end;
    for (std::size_t c = 0; c < cards.size(); ++c) {
      if (wait[c] == Simulation::Wait::compute && (!end || cards[c]->sim.compute_end() < *end))
        end = cards[c]->sim.compute_end();
    }
    bool event_waiter = false;
    for (Simulation::Wait w : wait) event_waiter = event_waiter || w == Simulation::Wait::event;
    // Nobody reacts to a completion before the compute ends: run them all
    // at once (a run_until, the hot path of one card computing).
    const std::optional<std::uint64_t> next = event_waiter ? vt.next_time() : std::nullopt;
    if (next && (!end || *next <= *end)) {
      vt.run_next();
    } else if (end) {
      vt.run_until(*end);
      for (std::size_t c = 0; c < cards.size(); ++c) {
        if (wait[c] == Simulation::Wait::compute && cards[c]->sim.compute_end() == *end)
          cards[c]->sim.end_compute();
      }
    } else {
      // A card waiting for a completion has one in flight (else it ends
      // itself), and barriers open once every running card is there.
      throw std::logic_error("simulate_cards: cards wait, but nothing is scheduled");
    }
  }
  for (const auto& card : cards) out.total_ns = std::max(out.total_ns, card->report.total_ns);
  vt.run_all();
  for (auto& card : cards) card->sim.retry_removals();
  vt.run_all();

  for (std::size_t c = 0; c < cards.size(); ++c) {
    Card& card = *cards[c];
    card.fill_report(vt);
    if (card.report.errors && !out.errors) {
      out.errors = card.report.errors;
      out.first_error = fmt::format("card {}: {}", specs[c].label(c), card.report.first_error);
    }
    out.cards.push_back(card.report);
  }
  for (engine::Link l : {engine::Link::h2s, engine::Link::s2h}) {
    const SimLinkStats& s = ssd.stats[static_cast<int>(l)];
    out.ssd[static_cast<int>(l)] =
        SimLinkReport{s.transfers, s.bytes, s.failures, s.busy_ns, s.queue_ns};
  }
  out.events = vt.events_run();
  return out;
}

SimReport simulate_trace(const trace::Trace& trace, const SimOptions& o) {
  return simulate_trace(trace, build_steps(trace), o);
}

SimReport simulate_trace(const trace::Trace& trace, const std::vector<Step>& steps,
                         const SimOptions& o) {
  std::vector<CardSpec> one;
  one.push_back(CardSpec{trace, steps, o});
  return std::move(simulate_cards(one, /*share_ssd=*/false).cards[0]);
}

}  // namespace u3m::sim
