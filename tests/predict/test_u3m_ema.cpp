// The design's predictor: mode-switch detector, thrash guard, calibration.
#include <gtest/gtest.h>

#include "test_util.hpp"
#include "u3m/predict/u3m_ema.hpp"

namespace u3m::predict {
namespace {

using testing::TraceMaker;
using trace::OpClass;

// Alternating modes: "training" windows are 9 matmuls + 1 attention, "serving"
// windows 5 + 5; each segment is `ops` ops long, each op lasts op_ns.
trace::Trace modes(int segments, int ops, std::uint64_t op_ns) {
  TraceMaker m;
  m.op_ns = op_ns;
  std::uint32_t w = m.tensor("w", 64), kv = m.tensor("kv", 64);
  for (int s = 0; s < segments; ++s)
    for (int k = 0; k < ops; ++k) {
      bool attn = s % 2 == 0 ? k % 10 == 9 : k % 2 == 1;
      m.op(attn ? "attn" : "mm", attn ? OpClass::attn_decode : OpClass::matmul,
           static_cast<std::uint32_t>(s), {attn ? kv : w});
    }
  return m.t;
}

void feed_all(const trace::Trace& t, Predictor& p) {
  TraceFeed f(t);
  f.feed(p, 0, f.num_steps());
}

TEST(U3mEma, DetectorFiresOncePerSwitch) {
  // Switches 100 s apart: never more than 2 in 60 s, so no lock.
  U3mEmaPredictor p;
  feed_all(modes(5, 100, 1'000'000'000), p);
  EXPECT_EQ(p.switches(), 4u);
  EXPECT_EQ(p.guard_locks(), 0u);
  EXPECT_EQ(p.suppressed(), 0u);
}

TEST(U3mEma, ThrashGuardLocksAtTheThirdSwitchWithin60s) {
  // Segments of 20 ops at 0.5 s: switches at 10 s, 20 s, 30 s, ...
  U3mEmaPredictor p;
  trace::Trace t = modes(4, 20, 500'000'000);
  feed_all(t, p);
  EXPECT_EQ(p.switches(), 2u);
  EXPECT_EQ(p.guard_locks(), 1u);
  EXPECT_TRUE(p.locked(t.events.back().time_ns));
  EXPECT_FALSE(p.locked(t.events.back().time_ns + 61'000'000'000ull));
}

TEST(U3mEma, CalibrationDegradesAnUnpredictableClassToLru) {
  // Per 10-op window: 5 matmuls cycling over 5 tensors (interval exactly 10
  // ops: the EMA hits), 5 norms over 8 tensors picked pseudo-randomly.
  TraceMaker m;
  std::vector<std::uint32_t> mm, nm;
  for (int i = 0; i < 5; ++i) mm.push_back(m.tensor("mm" + std::to_string(i), 64));
  for (int i = 0; i < 8; ++i) nm.push_back(m.tensor("nm" + std::to_string(i), 64));
  std::uint32_t x = 12345;
  for (int k = 0; k < 2400; ++k) {
    if (k % 2 == 0) {
      m.op("mm", OpClass::matmul, 0, {mm[(k / 2) % 5]});
    } else {
      x = x * 1103515245u + 12345u;
      m.op("norm", OpClass::norm, 0, {nm[(x >> 16) % 8]});
    }
  }
  U3mEmaParams params;
  U3mEmaPredictor p(params);
  TraceFeed f(m.t);
  // After ~1 window of norm accesses below target: smoothing 0.7.
  f.feed(p, 0, 2 * params.calib_window + 80);
  EXPECT_EQ(p.class_stage(OpClass::norm), 1);
  f.feed(p, 2 * params.calib_window + 80, f.num_steps());
  EXPECT_EQ(p.class_stage(OpClass::norm), 2);
  EXPECT_EQ(p.class_stage(OpClass::matmul), 0);
  EXPECT_EQ(p.switches(), 0u);
  // In fallback the norm tensors are predicted by recency.
  std::vector<Predicted> out;
  p.predict(8, out);
  int norms = 0;
  for (const Predicted& q : out) norms += q.tensor >= 5;
  EXPECT_GT(norms, 0);
}

}  // namespace
}  // namespace u3m::predict
