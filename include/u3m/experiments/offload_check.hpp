// The simulated side of the PyTorch sim-versus-real check (issue 16 item 6;
// docs/pytorch.md, "Sim versus real"): a trace captured from real PyTorch
// training (u3m.torch.capture) is rewritten as u3m.torch.offload runs it and
// simulated with a machine profile at the offload's device budget. The real
// side, real PyTorch training under the offload, is timed in Python
// (python/u3m_capture/simcheck.py); nothing here sleeps or reads a real time.
#pragma once

#include <cstdint>
#include <string>

#include "u3m/sim/profile.hpp"
#include "u3m/sim/runner.hpp"
#include "u3m/trace/model.hpp"

namespace u3m::experiments {

// Note [Offload view]
// u3m.torch.offload does not tier every tensor a PyTorch step touches. It
// manages the model's state (parameters, gradients, optimizer state) and the
// activations autograd saves for backward; every other tensor is a transient
// in torch's own memory, outside the budget. And a forward or backward op
// never computes on a lease: its unit copies a parameter out of the engine
// (a gather), a saved activation is copied in when packed and out when
// unpacked, a gradient is copied in after AccumulateGrad. Only the optimizer
// step computes on the leases themselves. So the view keeps every captured
// op and its compute, and:
//  - keeps a tensor if its role is param, grad or optimizer state, if it is
//    never freed in the trace (state the capture names otherwise: an
//    optimizer's step count, momentum, a buffer), or if a forward op writes it
//    and a backward op reads it (saved); every other tensor goes, and an op
//    left with none touches a 1-byte scratch tensor (it still computes);
//  - outside the optimizer phase, moves a kept tensor's accesses onto copy
//    ops of class copy named `u3m.offload.gather|store|lease <tensor>` that
//    move 2 x its bytes (a memcpy reads and writes):
//    a gather before the op, once per tensor, phase and iteration (a unit
//    gathers its parameters once per pass; a tensor the pass wrote is still
//    in torch's memory), and a store after each write, which reads the
//    scratch tensor (its source), so it costs compute even when it creates;
//  - in the optimizer phase, keeps the accesses and adds before the first
//    one, once per tensor and iteration, a copy-class lease op of 0 bytes:
//    each engine access, copied or leased, costs the hooks and the lease.
// What it leaves out: units gather a block's parameters together at its
// entry, not just before their first op; small parameters are copied
// however small; the Python hooks' own time is one op overhead per copy.
trace::Trace offload_view(const trace::Trace& captured);

struct OffloadSimOptions {
  std::uint64_t budget_bytes = 0;  // the offload's device budget; required
  std::uint64_t host_bytes = 0;    // 0 = max(8 x the view's footprint, 256 MiB), as the offload's default
  std::string policy = "u3m";      // policy::tiering_policies()
  unsigned lookahead = 16;         // the offload's default
  // Seconds each copy-class op (gather, store, lease) costs beyond its bytes:
  // the offload's hooks, lease and copy call (measured by python/u3m_capture/simcheck.py on a
  // calibration model, never on the checked one). < 0: the profile's per-op
  // overhead.
  double access_overhead_s = -1;
};

struct OffloadSim {
  double step_s = 0;          // steady step (steady_step of the iteration ends)
  double compute_step_s = 0;  // the same iterations, compute alone (copies included)
  double captured_compute_step_s = 0;  // the captured ops alone: untiered, as simulated
  std::uint64_t managed_bytes = 0;  // the view's footprint
  std::uint64_t ops = 0, copy_ops = 0;
  sim::SimReport report;
};

// Simulates offload_view(captured) on `hw`: compute is sim::op_cost of each op
// (its roofline plus the profile's per-op overhead; a copy op's overhead is
// access_overhead_s), the host link is the profile's, no SSD. InputError for a bad budget or a trace of fewer than 2
// iterations.
OffloadSim simulate_offload(const trace::Trace& captured, const sim::HwProfile& hw,
                            const OffloadSimOptions& o);

}  // namespace u3m::experiments
