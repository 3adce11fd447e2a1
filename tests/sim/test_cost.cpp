// The roofline: compute-bound ops pay FLOPs at the achievable rate, memory-
// bound ops pay bytes at HBM bandwidth, every op pays the launch overhead.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "u3m/sim/cost.hpp"
#include "u3m/sim/profile.hpp"

namespace {

using u3m::sim::HwProfile;
using u3m::sim::op_cost;

TEST(OpCost, GemmOn910bIsComputeBound) {
  const HwProfile hw = u3m::sim::load_profile("ascend-910b-32g");
  // A 4096^3 fp16 GEMM: 2*4096^3 FLOPs, reads two 32 MiB operands, writes one.
  const double flops = 2.0 * 4096 * 4096 * 4096;
  const double bytes = 3.0 * 4096 * 4096 * 2;
  const auto c = op_cost(hw, flops, bytes);
  EXPECT_FALSE(c.memory_bound());
  // 137.4 GFLOP at 354 TFLOPS x 0.6 = 0.647 ms, plus 10 us.
  EXPECT_NEAR(c.compute_s, 137.438953472e9 / (354e12 * 0.6), 1e-12);
  EXPECT_NEAR(c.total_s, 0.647e-3 + 10e-6, 1e-6);
  EXPECT_DOUBLE_EQ(c.total_s, c.compute_s + c.overhead_s);
}

TEST(OpCost, ElementwiseIsMemoryBound) {
  const HwProfile hw = u3m::sim::load_profile("nvidia-h200");
  // Adds two 64 MiB fp16 tensors: 32 Mi FLOPs, 192 MiB moved.
  const double bytes = 3.0 * (64 << 20);
  const auto c = op_cost(hw, 32.0 * (1 << 20), bytes);
  EXPECT_TRUE(c.memory_bound());
  EXPECT_DOUBLE_EQ(c.memory_s, bytes / 4.8e12);
  EXPECT_DOUBLE_EQ(c.total_s, c.memory_s + 5e-6);
}

TEST(OpCost, UnknownCountsCostOnlyTheLaunch) {
  const HwProfile hw = u3m::sim::load_profile("ascend-910b-64g");
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    const auto c = op_cost(hw, bad, bad);
    EXPECT_EQ(c.compute_s, 0);
    EXPECT_EQ(c.memory_s, 0);
    EXPECT_DOUBLE_EQ(c.total_s, hw.device.launch_overhead.si);
  }
}

TEST(OpCost, RidgeSeparatesTheRegimes) {
  const HwProfile hw = u3m::sim::load_profile("ascend-910b-32g");
  const double ridge = u3m::sim::ridge_intensity(hw);
  EXPECT_NEAR(ridge, 354e12 * 0.6 / 1.6e12, 1e-9);  // 132.75 FLOP/byte
  const double bytes = 1 << 30;
  const auto at = op_cost(hw, ridge * bytes, bytes);
  EXPECT_NEAR(at.compute_s, at.memory_s, 1e-12);
  EXPECT_TRUE(op_cost(hw, ridge * bytes * 0.9, bytes).memory_bound());
  EXPECT_FALSE(op_cost(hw, ridge * bytes * 1.1, bytes).memory_bound());
}

TEST(OpCost, TraceOpOverloadUsesItsCounts) {
  const HwProfile hw = u3m::sim::load_profile("nvidia-h200");
  u3m::trace::Op op;
  op.flops = 1e12;
  op.bytes = 1ull << 32;
  const auto a = op_cost(hw, op);
  const auto b = op_cost(hw, 1e12, static_cast<double>(1ull << 32));
  EXPECT_EQ(a.total_s, b.total_s);
  EXPECT_EQ(a.memory_bound(), b.memory_bound());
}

TEST(OpCost, FasterDeviceIsNeverSlower) {
  const HwProfile slow = u3m::sim::load_profile("ascend-910b-32g");
  const HwProfile fast = u3m::sim::load_profile("nvidia-h200");
  for (double flops : {0.0, 1e6, 1e9, 1e12, 1e15})
    for (double bytes : {0.0, 1e3, 1e6, 1e9})
      EXPECT_LE(op_cost(fast, flops, bytes).total_s, op_cost(slow, flops, bytes).total_s)
          << flops << " " << bytes;
}

}  // namespace
