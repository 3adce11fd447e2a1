// Replays a trace through the real runtime with a device budget smaller than
// the trace's footprint, with real bytes: every write fills the tensor with a
// pattern unique to (tensor, version), every read checks it. A tiering policy
// (policy/tiering.hpp) decides, as in the simulator: by default the lookahead
// policy (the trace is its own predictor over a lookahead of ops). The steps
// run through the one step driver (drive/step_driver.hpp), as in the simulator.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "u3m/engine/engine.hpp"
#include "u3m/engine/run_observer.hpp"
#include "u3m/engine/stack_spec.hpp"
#include "u3m/mem/fault_spec.hpp"
#include "u3m/mem/pool.hpp"
#include "u3m/mem/ssd_store.hpp"
#include "u3m/policy/tiering.hpp"
#include "u3m/trace/model.hpp"

namespace u3m::drive {

using engine::EngineStats;

struct ReplayOptions {
  // Device budget in bytes; 0 = `device_fraction` of the footprint.
  std::uint64_t device_budget = 0;
  double device_fraction = 0.5;
  // Host budget; 0 = twice the footprint (everything fits in host, below its watermark).
  std::uint64_t host_budget = 0;
  // SSD tier: a store file in this directory ("" = no SSD tier), of this size
  // (0 = twice the footprint + 64 MiB).
  std::string ssd_dir;
  std::uint64_t ssd_capacity = 0;
  // The tiering policy, one of policy::tiering_policies() (the objects `u3m
  // train sim` drives); "lookahead" prefetches the tensors of the op
  // `lookahead` ops ahead (0 = none).
  std::string policy = "lookahead";
  unsigned lookahead = 4;
  bool host_optimizer = false;  // u3m and belady: optimizer steps on the host tier
  policy::U3mPolicyOptions u3m{};
  policy::DesignSeedOptions design{};  // the design-seed policy's knobs
  // Appends what the replay asks of the engine (Note [Driver calls] in
  // policy/tiering.hpp); null = nothing recorded.
  policy::DriverLog* log = nullptr;
  // Told the replay's ops, stalls and step ends on its wall clock (seconds
  // since the replay began); null = none.
  engine::RunObserver* observer = nullptr;
  double h2d_gbps = 0, d2h_gbps = 0;  // emulated link throttle, 0 = memcpy speed
  // The device pool (`--pool-config`); capacity 0 = Note [Device arena] in
  // engine/stack_spec.hpp.
  mem::PoolConfig pool = engine::StackSpec::default_pool();
  std::uint64_t max_events = 0;  // 0 = all
  // Seconds of device compute per op (Note [Compute in replay]); empty = none:
  // the replay runs as fast as the memory stack lets it.
  std::function<double(const trace::Op&)> op_time;
  // Bytes between the 8-byte words written and checked: 8 = every byte.
  // Larger strides sample (every stride-th word plus the last word and the
  // tail), which still catches a stale version or another tensor's data in
  // every sampled word, for timed runs whose checks would outlast the ops.
  std::uint64_t check_stride = 8;
  // Faults injected under the SSD tier (needs ssd_dir); empty = none.
  mem::FaultSpec ssd_faults;
};

struct ReplayReport {
  std::string policy;
  std::uint64_t events = 0, ops = 0, tensors = 0;
  std::uint64_t footprint = 0;  // most bytes live at once (the device an untiered run needs)
  std::uint64_t device_budget = 0, host_budget = 0, ssd_capacity = 0;
  std::uint64_t bytes_written = 0, bytes_verified = 0, mismatches = 0;
  std::uint64_t errors = 0;  // acquires that failed
  std::string first_error;
  // The replay stopped at an op that can never get its tensors (the budgets
  // are too small for it): first_error says which and why.
  bool out_of_memory = false;
  double wall_s = 0;
  // Wall time, from the start of the replay, at which each iteration of job 0
  // finished its last op (index = trace::Op::iteration), like
  // sim::SimReport::iteration_end_ns, so "step time" means the same on both.
  std::vector<double> iteration_end_s;
  double stall_s = 0;    // time spent in acquire (waiting for data or room)
  double compute_s = 0;  // sum of op_time over the ops run
  // Ops whose own CPU work (data checks and fills, prefetch calls) outlasted
  // their compute time, and by how much in all: time the replay added that a
  // device would not.
  std::uint64_t overrun_ops = 0;
  double overrun_s = 0;
  double oversleep_s = 0;  // summed lateness of the compute wait's wake-ups
  EngineStats engine;
  mem::SsdStoreStats ssd;  // zeros without an SSD tier
  std::string ssd_notice;  // what the store said when it opened (a file it discarded), or ""
  // Faults injected by kind (ReplayOptions::ssd_faults; index = mem::IoFault).
  std::uint64_t faults_injected[mem::kIoFaultKinds] = {};
  mem::TierReport device, host;
  mem::PoolStats pool;
  std::string pool_config;  // the device pool's configuration as built (PoolConfig::describe)
  bool ok() const { return mismatches == 0 && errors == 0; }
};

// Progress callback: events done, events total.
using ReplayProgress = std::function<void(std::uint64_t, std::uint64_t)>;

// Throws InputError for a trace that cannot be replayed (a tensor of 0 bytes,
// an SSD directory that cannot hold the store).
ReplayReport replay_trace(const trace::Trace& trace, const ReplayOptions& options,
                          const ReplayProgress& progress = {});

// The fixed cost of one host<->device transfer on the stack a replay with
// these options builds (device-emu with its throttle, the transport, their
// threads and timer slack): the median round trip of `bytes`-sized
// transfers, alternating h2d and d2h, each issued alone, minus bytes / rate.
// A measurement for the simulator's link latency (the sim-versus-real check).
double transfer_overhead_s(const ReplayOptions& options, std::uint64_t bytes = 4096,
                           int reps = 200);


}  // namespace u3m::drive
