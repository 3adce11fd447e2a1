#include "u3m/sim/cost.hpp"

#include <algorithm>
#include <cmath>

namespace u3m::sim {

namespace {
double known(double x) {
  return std::isfinite(x) && x > 0 ? x : 0;
}
}  // namespace

OpCost op_cost(const HwProfile& hw, double flops, double bytes) {
  OpCost c;
  c.compute_s = known(flops) / (hw.device.peak_flops.si * hw.device.matmul_efficiency.si);
  c.memory_s = known(bytes) / hw.device.hbm_bandwidth.si;
  c.overhead_s = hw.device.launch_overhead.si;
  c.total_s = std::max(c.compute_s, c.memory_s) + c.overhead_s;
  return c;
}

double collective_s(const HwProfile& hw, std::uint64_t bytes) {
  return hw.peer_link.model().seconds(bytes) + hw.device.launch_overhead.si;
}

double all_reduce_s(const HwProfile& hw, double message_bytes, std::uint32_t cards) {
  const mem::LinkModel p = hw.peer_link.model();
  return 2.0 * (p.latency_s + message_bytes / (cards * p.bandwidth));
}

double ridge_intensity(const HwProfile& hw) {
  return hw.device.peak_flops.si * hw.device.matmul_efficiency.si / hw.device.hbm_bandwidth.si;
}

}  // namespace u3m::sim
