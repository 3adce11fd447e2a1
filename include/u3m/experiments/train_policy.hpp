// The five training policies of `u3m train sim`: what differs between them,
// as hooks the simulator calls (the engine underneath is the same).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "u3m/engine/engine.hpp"
#include "u3m/policy/prefetch.hpp"
#include "u3m/predict/window_log.hpp"
#include "u3m/sim/runner.hpp"
#include "u3m/sim/sim_transport.hpp"
#include "u3m/trace/model.hpp"

namespace u3m::experiments {

// Note [Training policies]
// All five run the same engine; they differ in three decisions:
//  * where the optimizer step runs: on the device, or on the host CPU over
//    DRAM (ZeRO-Offload), which moves gradients down and weights up instead
//    of optimizer state;
//  * the eviction order (the engine's victim score);
//  * the prefetch.
// hbm-only    device optimizer; nothing may be evicted (+inf), no prefetch:
//             it fits in HBM or it does not.
// static-offload  host optimizer (its state lives in DRAM); only optimizer
//             state may leave the device, everything else is pinned; the
//             trace's next 2 ops are prefetched (the updated weights).
// lru         device optimizer; LRU eviction; demand fetches only.
// u3m         the optimizer runs where the step is faster (Note [Optimizer
//             placement]); victims by ascending heat (MISSION.md item 2),
//             except tensors the predictor expects within its window;
//             prefetch what enters the predictor's window (u3m-seq,
//             online), or, as an option, just in time for the link (Note
//             [Just-in-time prefetch]); heat thresholds recalibrated during
//             the run demote what is colder than its tier (Note
//             [Recalibration in runs]).
// oracle      as u3m, but victims by Belady (farthest next use, from the
//             trace) and a perfect lookahead of 8 ops: the upper bound.
// What the u3m policy did in a run, for reports and tests.
struct U3mPolicyStats {
  std::uint64_t recalibrations = 0;  // threshold checks (each with a demotion pass)
  std::uint64_t demotions = 0;       // device -> DRAM and DRAM -> SSD moves asked for
  std::uint64_t jit_prefetches = 0;  // prefetches issued by the link-time rule
  double hot = 0, warm = 0;          // the thresholds at the end (0 before calibration)
  std::uint32_t horizon_ops = 0;     // the predictor's window at the end
  double max_fetch_s = 0;            // the slowest fetch (largest tensor from its home tier)
  double horizon_op_s = 0;           // the op time the window was derived from
  double mean_op_s = 0;              // the op clock at the end
};

struct TrainPolicy {
  bool optimizer_on_host = false;
  std::function<engine::Tier(const trace::Tensor&)> home;  // where loaded state rests
  engine::Engine::VictimScore victim;
  sim::PrefetchHook prefetch;
  // The u3m policy's counters, live during the run; null for the others.
  std::shared_ptr<const U3mPolicyStats> u3m_stats;
};

// The u3m policy's knobs (docs/policy.md has the measured effect of each).
struct U3mPolicyOptions {
  // Note [Recalibration in runs] in train_policy.cpp. On: with the fixed
  // prefetch window it leaves the simulated step time and capacity of the
  // design scenario unchanged; with jit_prefetch it cost capacity
  // (docs/policy.md).
  bool recalibrate = true;
  // Virtual seconds between recalibrations; 0 = a tenth of the first
  // iteration's duration (the design's 30 s is for hour-long jobs; a
  // simulated step is 0.2-80 s and a run is 3 steps).
  double recalibrate_period_s = 0;
  // true: prefetch just in time for the link (Note [Just-in-time prefetch]);
  // false: prefetch whatever enters a fixed 16-op window. Off by default:
  // on the host-link-bound design scenario it is 1-3% slower (simulated,
  // docs/policy.md), because an idle link is lost time there and the wider
  // window it needs shields more tensors from eviction.
  bool jit_prefetch = false;
  policy::JitConfig jit{};
};

// What a policy may know when it is made. References: they must outlive the
// policy's hooks (the simulation).
struct TrainPolicyInputs {
  const trace::Trace& trace;
  const std::vector<sim::Step>& steps;   // sim::build_steps(trace)
  bool host_optimizer = false;           // u3m and oracle: run the optimizer step on the host
  const sim::SimTransportConfig& links;  // the card's links
  U3mPolicyOptions u3m{};                // the u3m policy's knobs (others ignore them)
  // The u3m policy's predictor, shared by every policy made for this trace
  // (Note [Shared window log] in predict/window_log.hpp): made with
  // make_window_log(trace). Null: the policy makes one of its own.
  std::shared_ptr<predict::WindowLog> window_log = nullptr;
};

// The window log the u3m policy reads (its predictor, u3m-seq, on `t`).
std::shared_ptr<predict::WindowLog> make_window_log(const trace::Trace& t);

// One of train_policy_names(); InputError naming --policy for another.
TrainPolicy make_train_policy(const std::string& name, const TrainPolicyInputs& in);

// Master weights, Adam m or v: the state a host optimizer step works on.
bool optimizer_role(trace::Role r);

}  // namespace u3m::experiments
