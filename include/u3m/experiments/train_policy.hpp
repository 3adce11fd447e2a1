// The five training policies of `u3m train sim`: what differs between them,
// as hooks the simulator calls (the engine underneath is the same).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "u3m/engine/engine.hpp"
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
//             prefetch what enters the predictor's window (u3m-seq, online).
// oracle      as u3m, but victims by Belady (farthest next use, from the
//             trace) and a perfect lookahead of 8 ops: the upper bound.
struct TrainPolicy {
  bool optimizer_on_host = false;
  std::function<engine::Tier(const trace::Tensor&)> home;  // where loaded state rests
  engine::Engine::VictimScore victim;
  sim::PrefetchHook prefetch;
};

// What a policy may know when it is made. References: they must outlive the
// policy's hooks (the simulation).
struct TrainPolicyInputs {
  const trace::Trace& trace;
  const std::vector<sim::Step>& steps;   // sim::build_steps(trace)
  bool host_optimizer = false;           // u3m and oracle: run the optimizer step on the host
  const sim::SimTransportConfig& links;  // the card's links
};

// One of train_policy_names(); InputError naming --policy for another.
TrainPolicy make_train_policy(const std::string& name, const TrainPolicyInputs& in);

// Master weights, Adam m or v: the state a host optimizer step works on.
bool optimizer_role(trace::Role r);

}  // namespace u3m::experiments
