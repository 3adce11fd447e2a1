// The driver of the PyTorch path (issue 16 item 4): u3m.torch.offload asks
// the engine for its tensors through it, and a tiering policy of
// policy::tiering_policies(), the objects `train sim` and `run replay` drive,
// decides prefetch, demotion, eviction order and the tier an op runs in.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "online_recorder.hpp"
#include "u3m/engine/engine.hpp"
#include "u3m/engine/steps.hpp"
#include "u3m/policy/tiering.hpp"

namespace u3m::python {

struct PolicyDriverOptions {
  std::string policy = "u3m";  // a tiering_policies() name
  unsigned lookahead = 4;      // the lookahead policy's ops ahead (PolicyInputs::lookahead)
  bool host_optimizer = false;  // u3m and belady: optimizer accesses on the host tier
  unsigned repeats = 0;         // iterations of the policy's trace; 0 = Note [Policy on a real run]
  bool record = true;           // false: no recorder and no policy (engine LRU), for benchmarks
  bool has_ssd = false;         // the engine has an SSD tier (u3m demotes DRAM to it)
};

struct PolicyDriverStats {
  std::uint64_t steps = 0;         // training steps ended
  std::uint64_t accesses = 0;      // accesses recorded
  std::uint64_t policy_steps = 0;  // policy on_step calls
  std::uint64_t diverged = 0;      // steps whose accesses left the policy's trace
  std::uint64_t policies = 0;      // policies made (one per rebuild)
  std::uint64_t trace_ops = 0;     // ops in the current policy's trace
  double policy_s = 0;             // wall time in on_step
  double build_s = 0;              // wall time making traces and policies
};

// Note [Policy on a real run]
// A policy is made for a trace (PolicyInputs), and a real run has none ahead
// of time. The driver records each training step (Note [Online recording]);
// at the end of the first one it makes the policy over the recorded step
// repeated `repeats` times, and from then on each access is the trace's next
// op: the policy's on_step runs once the access holds its lease, as in
// replay (Note [Replay under a budget] in drive/replay.cpp). A step whose
// accesses leave the trace (another tensor than the next op's) runs the rest
// of its accesses without the policy, and at its end the policy is made
// again over that step: the latest recording is the trace. Near the end of
// the repeated trace the policy is made again too, so a policy's state
// (u3m's heat, thresholds) lives `repeats` steps; repeats = 2^18 ops' worth
// of steps (4 to 256), a few MB of trace.
//
// Identity: the policy names tensors by trace index and asks the engine
// about StepContext::engine_id(index) (residency, in u3m's demotion pass), so
// the driver registers recorder tensor t (trace tensor t: the recorder keeps
// one index per stable id for the run) as engine_id(t); the caller's stable
// ids are translated at each call.
//
// Placement: op_tier decides where each access is leased (the optimizer
// phase on the host under a host optimizer). home_tier is not used: the
// offload creates parameters before any step exists, and every other tensor
// is created by a step that also reads (run on the device, as replay does).
// The first step, before any policy, runs under the engine's LRU order, on
// the device.
class PolicyDriver {
 public:
  PolicyDriver(engine::Engine& e, PolicyDriverOptions o);
  ~PolicyDriver();
  PolicyDriver(const PolicyDriver&) = delete;  // the policy's context refers to it
  PolicyDriver& operator=(const PolicyDriver&) = delete;

  // The caller names a tensor by `id`, a stable id (the same every step);
  // the engine knows it as engine_id(id) (Note [Policy on a real run]).
  // Registers a tensor with the engine (its first scores from the policy).
  mem::Status add(std::uint64_t id, std::uint64_t bytes, std::string_view name, trace::Role role);
  // busy: call again later (the free is recorded once); not_found: never added.
  mem::Status remove(std::uint64_t id);
  // The engine's id of an added tensor; 0 for one never added.
  std::uint64_t engine_id(std::uint64_t id) const;
  // The tier an access of `phase` leases in.
  mem::Tier tier(trace::Phase phase) const;
  // The access of an added tensor holds its lease now: recorded, then the
  // policy decides.
  void accessed(std::uint64_t id, bool write, trace::Phase phase);
  void end_step();

  const PolicyDriverOptions& options() const { return opt_; }
  const PolicyDriverStats& stats() const { return st_; }
  const policy::TieringPolicy* policy() const { return policy_.get(); }

 private:
  class Context;
  std::uint64_t now_ns() const;
  void rebuild();

  engine::Engine& eng_;
  PolicyDriverOptions opt_;
  OnlineRecorder rec_;
  std::vector<std::uint8_t> live_;  // per recorder tensor: registered and not freed
  trace::Trace trace_;
  std::vector<engine::Step> steps_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<policy::TieringPolicy> policy_;
  std::size_t period_ = 0;  // ops per iteration of trace_
  std::size_t cursor_ = 0;  // the trace's next op
  bool on_trace_ = false;
  std::uint64_t t0_ns_ = 0;
  PolicyDriverStats st_;
};

}  // namespace u3m::python
