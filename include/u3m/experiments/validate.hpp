// The sim-versus-real check of issue 5 (docs/training.md, "Sim versus
// real"): one small training workload run twice,
//   - for real on this machine: drive::replay_trace, the runtime over
//     device-emu with a device budget below the footprint, host<->device
//     copies throttled to a link rate, each op sleeping for its compute time;
//   - in the simulator: sim::simulate_trace, the same engine on virtual time,
//     with the same trace, budgets, lookahead and compute times, and links
//     modelled from the `local` profile (`u3m hw calibrate`) at that rate;
// both run by the one step driver (drive::StepDriver), with its real-time
// and its virtual-time waiter, and the step times and the decisions (the
// driver's logs) compared. Nothing here is a speed goal; the error is a
// measured figure for the docs, not a test assertion.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "u3m/drive/replay.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/sim/runner.hpp"
#include "u3m/sim/sim_transport.hpp"

namespace u3m::experiments {

struct CheckConfig {
  std::string model = "tiny-mha";  // a workload preset (workload::preset)
  std::uint32_t seq_len = 2048, micro_batch = 1;
  std::uint32_t steps = 3;       // training iterations; the first warms up
  double device_fraction = 0.5;  // device budget / footprint, in (0, 1]
  double link_gbps = 2;          // host<->device, each direction (GB/s)
  unsigned lookahead = 4;        // ops prefetched ahead; 0 = demand fetches only
  // The tiering policy both sides run (policy::tiering_policies()); the
  // lookahead policy uses `lookahead`.
  std::string policy = "lookahead";
  std::string label() const;  // "tiny-mha seq 2048, device 50%, 2 GB/s, lookahead 4" (or the policy)
  void validate() const;         // throws InputError naming the field
};

// Four configurations that differ in budget, link rate and lookahead, each
// about two seconds of real time (Note [Check configurations]).
std::vector<CheckConfig> default_check_configs();

struct CheckSetup {
  // The `local` profile: compute times (its roofline) and link latency.
  sim::HwProfile local;
  // Multiplies every op's roofline time (both sides alike): a knob to make
  // compute long or short against the link, not a fit to the results.
  double compute_scale = 0.2;
  // The simulated links' latency; < 0 = measure it per configuration with
  // drive::transfer_overhead_s at that configuration's throttle (the fixed
  // cost of one transfer on the real stack, Note [Check links]).
  double link_latency_s = -1;
  // The real run writes and checks one 8-byte word per this many bytes
  // (drive::ReplayOptions::check_stride): a device would not spend host CPU
  // on checks, so they should fit inside the ops' compute (Note [Compute
  // in replay] in src/drive/replay.cpp). 8 = every byte.
  std::uint64_t check_stride = 512;
};

// Compute seconds per op: the roofline of `local` (sim::op_cost) x scale.
sim::OpTimeFn check_op_time(const sim::HwProfile& local, double scale);

// The simulator's links for a configuration: d2h and h2d at the lower of the
// throttle and the profile's measured copy bandwidth (device-emu copies are
// no faster than memcpy, throttled or not), with `latency_s`; no SSD.
sim::SimTransportConfig check_links(const CheckConfig& c, const sim::HwProfile& local,
                                    double latency_s);

// The steady-state step from per-iteration end times: the mean of iterations
// 1..n-1 ((end[n-1] - end[0]) / (n-1)); the first iteration warms up. 0 when
// fewer than 2 iterations ran.
double steady_step(const std::vector<double>& iteration_end_s);

struct CheckSide {
  double step_s = 0;   // steady_step
  double total_s = 0;  // the whole run (real: until the last op; sim: virtual)
  double stall_s = 0;  // compute waited for data or room, whole run
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0, evictions = 0;
  // Host<->device transfers (both directions) and their summed durations from
  // start to completion, as the engine counts them on its own clock: the
  // same definition on both sides, so the mean shows the per-transfer cost.
  std::uint64_t transfers = 0;
  double transfer_s = 0;
  std::vector<double> iteration_end_s;
};

struct CheckResult {
  CheckConfig config;
  std::uint64_t footprint = 0, device_budget = 0;
  double compute_step_s = 0;  // compute per step, the same on both sides
  CheckSide real, sim;
  double error = 0;  // sim step / real step - 1
  // The real run's own checks: every byte read was the last version written.
  bool data_ok = false;
  std::uint64_t bytes_verified = 0;
  std::string first_error;  // from either side
  // Time the real replay added that a device would not (Note [Compute in
  // replay] in src/drive/replay.cpp).
  double overrun_s = 0, oversleep_s = 0;
  double link_latency_s = 0;  // the simulated links' latency (measured unless given)
  // The decisions compared (Note [Driver calls] in policy/tiering.hpp): both
  // sides' logs of what they asked of the engine, and the first call where
  // they differ ("" = none). Policies that read the clock (u3m's
  // recalibration and link-time prefetch) may differ by design.
  std::uint64_t sim_calls = 0, real_calls = 0;
  bool same_decisions = false;
  std::string first_difference;
  std::string links_label;    // the simulator's links, for "simulated with ..."
};

// Runs one configuration both ways. Throws InputError for a bad configuration.
CheckResult run_check(const CheckConfig& c, const CheckSetup& setup);

}  // namespace u3m::experiments
