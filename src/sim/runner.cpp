#include "u3m/sim/runner.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "u3m/drive/step_driver.hpp"
#include "u3m/engine/steps.hpp"
#include "u3m/sim/cost.hpp"
#include "u3m/sim/sim_host.hpp"
#include "u3m/sim/sim_stack.hpp"
#include "u3m/sim/virtual_time.hpp"
#include "u3m/util/error.hpp"

namespace u3m::sim {

using engine::Tier;

namespace {

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

}  // namespace

TraceTables::TraceTables(const trace::Trace& trace, const std::vector<Step>& steps)
    : footprint(engine::trace_footprint(trace)),
      bytes(trace.tensors.size()),
      need(steps.size()),
      trace_(&trace),
      steps_(&steps) {
  for (std::size_t t = 0; t < trace.tensors.size(); ++t) bytes[t] = trace.tensors[t].bytes;
  for (std::size_t j = 0; j < steps.size(); ++j) {
    for (const Touch& t : steps[j].touches) need[j] += bytes[t.tensor];
  }
}

void TraceTables::check(const trace::Trace& trace, const std::vector<Step>& steps) const {
  if (&trace != trace_ || &steps != steps_) {
    input_error("CardSpec::tables", "built for another trace or steps than this card's");
  }
}

namespace {

using drive::StepDriver;

// Note [Virtual waiter]
// The simulator is the step driver's virtual-time waiter (Note [Step
// driver] in drive/step_driver.hpp). A card whose driver waits for a change
// waits for its own transport's next completion; with nothing of its own in
// flight it asks again at once if its last pass got further, and otherwise
// asks the engine whether anything can still change (Engine::check_progress,
// the engine's no-progress rule): no ends the card's run, a write-back
// back-off ending later is waited for on the clock like a compute end.
// simulate_cards moves the one clock all cards share to the earliest
// completion a card waits for or compute end, and opens a barrier once every
// card still running has reached it (Note [Cards] in runner.hpp).
class VirtualWaiter {
 public:
  enum class Wait { event, until, compute, barrier, done };
  VirtualWaiter(StepDriver& d, engine::Engine& eng, const SimTransport& transport,
                const VirtualTime& vt)
      : d_(d), eng_(eng), transport_(transport), vt_(vt) {}

  // Runs the card as far as it goes at the current instant.
  Wait advance() {
    for (;;) {
      if (event_ && transport_.completed() == seen_) return Wait::event;
      if (until_ && vt_.now_ns() < *until_) return Wait::until;
      event_ = false;
      until_.reset();
      switch (d_.advance()) {
        case StepDriver::Wait::done:
          return Wait::done;
        case StepDriver::Wait::barrier:
          return Wait::barrier;
        case StepDriver::Wait::compute:
          return Wait::compute;
        case StepDriver::Wait::change:
          break;
      }
      if (transport_.in_flight() > 0) {  // the next completion: stall
        event_ = true;
        seen_ = transport_.completed();
        continue;
      }
      if (d_.progressed()) continue;
      std::uint64_t wake = ~0ull;
      const std::uint64_t epoch = eng_.epoch();
      if (eng_.check_progress(&wake) == engine::Status::out_of_memory) {
        d_.no_progress(engine::Engine::last_failure());
        continue;
      }
      if (wake != ~0ull && wake > vt_.now_ns()) {
        until_ = wake;
        continue;
      }
      // check_progress started or evicted something (a change of its own).
      if (eng_.epoch() == epoch && transport_.in_flight() == 0)
        throw std::logic_error("simulate: the engine can change, but nothing is scheduled");
    }
  }
  // Wait::until: when the card wants to be asked again.
  std::uint64_t until() const { return *until_; }

 private:
  StepDriver& d_;
  engine::Engine& eng_;
  const SimTransport& transport_;
  const VirtualTime& vt_;
  bool event_ = false;  // waits for a completion of its transport after seen_
  std::uint64_t seen_ = 0;
  std::optional<std::uint64_t> until_;
};

// One card's objects: the same pool setup as drive::replay_trace, over fake
// addresses. Members in construction order (each refers to those above).
struct Card {
  Card(const CardSpec& spec, std::uint32_t label, const TraceTables& tables, VirtualTime& vt,
       SharedLinks* ssd, bool barriers)
      : options(spec.options),
        tables(tables),
        stack(stack_spec(budgets(spec, tables)), vt, ssd, options.links.ssd_shared),
        transport(stack.transport),
        eng(stack.engine),
        driver(spec.trace, spec.steps, eng, vt, policy_of(spec), driver_options(label, barriers)),
        waiter(driver, eng, transport, vt) {
    eng.set_victim_order(policy_of(spec).victim_order());
  }

  drive::DriverOptions driver_options(std::uint32_t label, bool barriers) {
    drive::DriverOptions d;
    d.max_steps = options.max_steps;
    d.log = options.log;
    d.observer = options.observer;
    d.card = static_cast<int>(label);
    d.barriers = barriers;
    d.step_limit_bytes = report.device_budget;
    d.op_time = compute_model(options);
    d.tensor_bytes = &tables.bytes;
    d.step_bytes = &tables.need;
    return d;
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
    const drive::DriverReport& d = driver.report();
    rep.steps = d.steps;
    rep.total_ns = d.total_ns;
    rep.compute_ns = d.compute_ns;
    rep.stall_ns = d.stall_ns;
    rep.barrier_ns = d.barrier_ns;
    rep.collectives = d.collectives;
    rep.errors = d.errors;
    rep.first_error = d.first_error;
    rep.iteration_end_ns = d.iteration_end_ns;
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
  const TraceTables& tables;
  SimStack stack;
  SimTransport& transport;
  engine::Engine& eng;
  StepDriver driver;
  VirtualWaiter waiter;
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
      cards.push_back(std::make_unique<Card>(specs[c], specs[c].label(c), *tables_of[c], vt,
                                             share_ssd ? &ssd : nullptr, specs.size() > 1));
    } catch (const InputError& e) {
      if (specs.size() == 1) throw;
      input_error("simulate_cards", "card {}: {}", specs[c].label(c), e.what());
    }
  }

  using Wait = VirtualWaiter::Wait;
  std::vector<Wait> wait(cards.size());
  for (;;) {
    bool all_done = true, failed = false, all_at_barrier = true;
    for (std::size_t c = 0; c < cards.size(); ++c) {
      wait[c] = cards[c]->waiter.advance();
      if (wait[c] != Wait::done) all_done = false;
      if (wait[c] != Wait::done && wait[c] != Wait::barrier) all_at_barrier = false;
      failed = failed || cards[c]->driver.report().errors;
    }
    if (failed) {
      for (auto& card : cards) card->driver.abort();
      break;
    }
    if (all_done) break;
    if (all_at_barrier) {  // every card still running reached the collective
      for (std::size_t c = 0; c < cards.size(); ++c) {
        if (wait[c] == Wait::barrier) cards[c]->driver.leave_barrier();
      }
      continue;
    }
    // The clock moves to the earliest completion, end of compute or end of
    // a back-off; a completion due exactly when compute ends runs first.
    std::optional<std::uint64_t> end;
    auto due = [&](std::size_t c) -> std::optional<std::uint64_t> {
      if (wait[c] == Wait::compute) return cards[c]->driver.compute_end();
      if (wait[c] == Wait::until) return cards[c]->waiter.until();
      return std::nullopt;
    };
    for (std::size_t c = 0; c < cards.size(); ++c) {
      const std::optional<std::uint64_t> t = due(c);
      if (t && (!end || *t < *end)) end = t;
    }
    bool event_waiter = false;
    for (Wait w : wait) event_waiter = event_waiter || w == Wait::event;
    // Nobody reacts to a completion before the compute ends: run them all
    // at once (a run_until, the hot path of one card computing).
    const std::optional<std::uint64_t> next = event_waiter ? vt.next_time() : std::nullopt;
    if (next && (!end || *next <= *end)) {
      vt.run_next();
    } else if (end) {
      vt.run_until(*end);
      for (std::size_t c = 0; c < cards.size(); ++c) {
        if (wait[c] == Wait::compute && cards[c]->driver.compute_end() == *end)
          cards[c]->driver.end_compute();
      }
    } else {
      // A card waiting for a completion has one in flight (else it asks
      // the engine), and barriers open once every running card is there.
      throw std::logic_error("simulate_cards: cards wait, but nothing is scheduled");
    }
  }
  for (const auto& card : cards)
    out.total_ns = std::max(out.total_ns, card->driver.report().total_ns);
  vt.run_all();
  for (auto& card : cards) card->driver.retry_removals();
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
