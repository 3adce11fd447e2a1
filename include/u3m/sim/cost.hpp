// Compute cost of one operator on a profiled device: a roofline.
//
//   time = max(flops / (peak_flops * matmul_efficiency), bytes / hbm_bandwidth)
//          + launch_overhead
//
// A pure function of the profile and the op; the simulator charges it on its
// virtual clock. The efficiency factor applies to every op: non-GEMM ops move
// many bytes per FLOP, so their time is set by the memory term anyway.
#pragma once

#include "u3m/sim/profile.hpp"
#include "u3m/trace/model.hpp"

namespace u3m::sim {

struct OpCost {
  double compute_s = 0;   // flops at the achievable rate
  double memory_s = 0;    // bytes at HBM bandwidth
  double overhead_s = 0;  // launch overhead
  double total_s = 0;     // max(compute_s, memory_s) + overhead_s
  bool memory_bound() const { return memory_s > compute_s; }
};

// flops and bytes as in trace::Op: 0 means unknown and costs nothing beyond the
// launch overhead; negative or non-finite counts are treated as unknown.
OpCost op_cost(const HwProfile& hw, double flops, double bytes);
inline OpCost op_cost(const HwProfile& hw, const trace::Op& op) {
  return op_cost(hw, op.flops, static_cast<double>(op.bytes));
}

// Note [Peer-link cost]
// The one place the simulator prices traffic between cards. A ZeRO-3
// all-gather or reduce-scatter is a collective op whose bytes the trace
// records as what the card moves; it costs those bytes over the peer link
// plus one launch. A tensor-parallel all-reduce of a message of M bytes
// over N cards is a reduce-scatter then an all-gather, each card sending M/N
// to every peer in parallel: 2 * (latency + M / (N * peer bandwidth)).
double collective_s(const HwProfile& hw, std::uint64_t bytes);
double all_reduce_s(const HwProfile& hw, double message_bytes, std::uint32_t cards);

// Arithmetic intensity (FLOP per byte) above which an op is compute bound.
double ridge_intensity(const HwProfile& hw);

}  // namespace u3m::sim
