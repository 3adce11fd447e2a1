// Runs a trace through the real runtime (u3m::engine::Engine) on virtual
// time: the device pool over fake addresses, SimHost, SimTransport's modelled
// links, and a compute-time model per op. The engine makes every decision
// (what to evict, which fetch goes first) exactly as in a real run; the
// simulator only supplies time. Nothing is ever dereferenced.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "u3m/engine/engine.hpp"
#include "u3m/engine/run_observer.hpp"
#include "u3m/engine/steps.hpp"
#include "u3m/mem/pool.hpp"
#include "u3m/policy/tiering.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/sim/sim_transport.hpp"
#include "u3m/trace/model.hpp"

namespace u3m::sim {

// ---- the trace as a sequence of ops ----------------------------------------

// The units a trace runs in (include/u3m/engine/steps.hpp), shared with real
// replay.
using engine::build_steps;
using engine::Step;
using engine::Touch;

// ---- hooks ------------------------------------------------------------------

// Seconds of compute for one op.
using OpTimeFn = std::function<double(const trace::Op&)>;

// ---- options and report -----------------------------------------------------

struct SimOptions {
  // Device budget in bytes; 0 = device_fraction of the trace's footprint.
  std::uint64_t device_budget = 0;
  double device_fraction = 0.5;
  // 0 = twice the footprint: everything fits in host below its watermarks
  // (with exactly the footprint, a full host sits above its 90% watermark
  // and drops host copies of data the device holds, which then must be
  // written back again).
  std::uint64_t host_budget = 0;
  // Links and the SSD tier (links.ssd_capacity; 0 = no SSD tier). Required:
  // fill from links_from_profile() or by hand.
  SimTransportConfig links;
  // Watermarks, link slots and rate caps; the capacities are set from the budgets.
  engine::EngineConfig engine{};

  // Compute time: `op_time` if set; else the roofline of `hw` (cost.hpp);
  // else flops / flop_rate + bytes / mem_bandwidth + op_overhead_s (each
  // term only when its rate is > 0). InputError if none is given.
  OpTimeFn op_time;
  std::optional<HwProfile> hw;
  double flop_rate = 0, mem_bandwidth = 0, op_overhead_s = 0;

  // The tiering policy (policy/tiering.hpp): prefetch, demotion, home and
  // op tiers, the eviction order. Not owned; it must outlive the run, and a
  // policy's state is one card's: each card needs its own. Null: the
  // lookahead policy over `lookahead` ops.
  policy::TieringPolicy* policy = nullptr;
  // Appends what the run asks of the engine (Note [Driver calls] in
  // policy/tiering.hpp); null = nothing recorded.
  policy::DriverLog* log = nullptr;
  // Told the card's ops, stalls and step ends on virtual time (the card is
  // its number in the run); null = none.
  engine::RunObserver* observer = nullptr;
  unsigned lookahead = 4;
  std::uint64_t max_steps = 0;  // 0 = all
};

struct SimLinkReport {
  std::uint64_t transfers = 0, bytes = 0, failures = 0;
  std::uint64_t busy_ns = 0;   // the link carried bytes (SimLinkStats)
  std::uint64_t queue_ns = 0;  // transfers waited for the link
};

struct SimReport {
  std::uint64_t steps = 0, tensors = 0;
  std::uint64_t footprint = 0;  // engine::trace_footprint: the device an untiered run needs
  std::uint64_t device_budget = 0, host_budget = 0, ssd_capacity = 0;
  // Virtual time: the run ends when the last step's compute ends.
  std::uint64_t total_ns = 0;
  std::uint64_t compute_ns = 0;  // sum of op times: the time with infinite device memory
  std::uint64_t stall_ns = 0;    // compute waited for data or room
  // Waited at collectives for the other cards (simulate_cards; 0 for one card).
  std::uint64_t barrier_ns = 0;
  std::uint64_t collectives = 0;  // collective ops run (each a barrier across the cards)
  std::uint64_t drain_ns =
      0;  // transfers (write-backs, late prefetches) running on after the last step
  std::array<SimLinkReport, kNumLinks> links{};
  std::uint64_t peak_device = 0, peak_host = 0, peak_ssd = 0;
  std::uint64_t events = 0;    // virtual-time events run (on the clock all cards share)
  engine::EngineStats engine;  // evictions, hits/misses, prefetches, per-link counts
  std::uint64_t errors = 0;    // steps that could not run; the run stops at the first
  std::string first_error;
  std::string links_label;  // SimTransportConfig::describe(), for "simulated with ..."
  // Virtual time at which each iteration of job 0 finished its last op
  // (index = trace::Op::iteration), so a caller can take the steady-state step.
  std::vector<std::uint64_t> iteration_end_ns;

  // 1 - T_infinite / T: the share of throughput lost to tiering, where
  // T_infinite is the compute time alone.
  double throughput_loss() const {
    return total_ns == 0 ? 0.0
                         : 1.0 - static_cast<double>(compute_ns) / static_cast<double>(total_ns);
  }
  bool ok() const { return errors == 0; }
};

// ---- several cards ----------------------------------------------------------

// Note [Trace tables]
// What every step reads of the trace, derived once per trace and shared by
// the cards that run it (a training run's cards mostly run one trace): each
// tensor's size in a flat array (a trace::Tensor is a cache line of its
// own), each step's device bytes and the footprint. Only
// the figures the runner reads move here; no decision changes. A caller that
// simulates one trace several times (train's two optimizer placements)
// builds them once and passes them in CardSpec::tables.
struct TraceTables {
  // Both must outlive the tables.
  TraceTables(const trace::Trace& trace, const std::vector<Step>& steps);
  // Throws InputError unless built from these very objects (a trace of the
  // same shape with other sizes, e.g. another ZeRO-3 shard count, would
  // pass a size check and give wrong figures).
  void check(const trace::Trace& trace, const std::vector<Step>& steps) const;
  std::uint64_t footprint;                  // engine::trace_footprint
  std::vector<std::uint64_t> bytes;         // by tensor
  std::vector<std::uint64_t> need;          // by step: the bytes of its touches

 private:
  const trace::Trace* trace_;
  const std::vector<Step>* steps_;
};

// One card of a multi-card run: its own trace (ranks may differ, e.g. a card
// holding two ZeRO-3 shards after a failure), its steps (build_steps(trace))
// and its options, policy included: a policy's state (predictor, heat) is
// per card, so each card needs a policy of its own. `trace` and `steps` must
// outlive the simulation.
struct CardSpec {
  const trace::Trace& trace;
  const std::vector<Step>& steps;
  SimOptions options;
  // The card's number in messages; kIndex = its index in the specs (a
  // failover's survivors are not numbered 0..N-2).
  static constexpr std::uint32_t kIndex = UINT32_MAX;
  std::uint32_t id = kIndex;
  // Prebuilt for (trace, steps), outliving the simulation; null: built here.
  const TraceTables* tables = nullptr;
  std::uint32_t label(std::size_t index) const {
    return id == kIndex ? static_cast<std::uint32_t>(index) : id;
  }
};

struct CardsReport {
  std::vector<SimReport> cards;  // by card; each card's links are its own traffic
  std::uint64_t total_ns = 0;    // the last card's last step
  bool shared_ssd = false;
  // Every card's SSD traffic on the shared link (h2s and s2h; zero when not shared).
  std::array<SimLinkReport, kNumLinks> ssd{};
  std::uint64_t events = 0;
  std::uint64_t errors = 0;  // the run stops at the first error of any card
  std::string first_error;   // "card K: ..."
  bool ok() const { return errors == 0; }
};

// Note [Cards]
// N cards on one virtual clock, each with its own engine, device pool, host
// and host link (PCIe is per card), running its own trace under its own
// hooks. Two things couple them:
//  * collectives are barriers: the k-th collective op (OpClass::collective)
//    of every card starts when every card still running has acquired the
//    tensors of its k-th collective; matched by ordinal, not by step, since
//    the traces may differ. Each card then takes its op time (the op's time
//    on the card-to-card link). The time a card waits there is barrier_ns,
//    apart from stall_ns (waiting for data). A card that has finished its
//    trace no longer holds the others back.
//  * with share_ssd, the SSD links of every card book on one SharedLinks:
//    the cards' drives pooled into one FIFO link (every card's options must
//    then give the same h2s/s2h models, the pooled bandwidth).
// Each card runs the one step driver (drive::StepDriver, Note [Step driver]
// in drive/step_driver.hpp), which stops where it would wait; the simulator
// is its virtual-time waiter (Note [Virtual waiter] in runner.cpp) and moves
// the clock to the earliest event or end of compute. One card is
// simulate_trace exactly (it is implemented as one card). InputError for bad
// options, as simulate_trace, naming the card.
CardsReport simulate_cards(const std::vector<CardSpec>& cards, bool share_ssd);

// Throws InputError for a trace that cannot be simulated (a tensor of 0
// bytes) or options that do not work (no compute model, bad links).
SimReport simulate_trace(const trace::Trace& trace, const SimOptions& options);
// The same with the trace's steps already built (`steps` must be
// build_steps(trace)), for callers that need them anyway (a policy's
// lookahead): building them is a noticeable share of a short simulation.
SimReport simulate_trace(const trace::Trace& trace, const std::vector<Step>& steps,
                         const SimOptions& options);

}  // namespace u3m::sim
