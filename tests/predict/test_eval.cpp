// The evaluator's arithmetic, on traces small enough to score by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.hpp"
#include "u3m/util/error.hpp"

namespace u3m::predict {
namespace {

using testing::horizon;
using testing::TraceMaker;
using trace::OpClass;

// Always names tensor 0 as due at the next step.
class FixedPredictor final : public Predictor {
 public:
  std::string_view name() const override { return "fixed"; }
  void observe(const Access&) override {}
  void predict(std::uint32_t, std::vector<Predicted>& out) override {
    out.assign({{0, 0}, {0, 0}});  // a duplicate: must be counted once
  }
};

TEST(Eval, ByteAndCountWeightedByHand) {
  // Steps: A B A B, A = 100 bytes, B = 300 bytes; horizon 1.
  TraceMaker m;
  std::uint32_t a = m.tensor("a", 100), b = m.tensor("b", 300);
  m.op("x", OpClass::matmul, 0, {a});
  m.op("y", OpClass::matmul, 0, {b});
  m.op("x", OpClass::matmul, 0, {a});
  m.op("y", OpClass::matmul, 0, {b});
  TraceFeed feed(m.t);
  FixedPredictor p;
  EvalOptions opt;
  opt.horizons = {1};
  opt.iteration_horizon = false;
  opt.warmup_iterations = 0;
  EvalResult r = evaluate(feed, p, opt);
  const HorizonMetrics& h = horizon(r, "1");
  // P = {A} at 4 decisions: hits at decisions 0 and 2.
  EXPECT_DOUBLE_EQ(h.precision(), 200.0 / 400.0);
  EXPECT_DOUBLE_EQ(h.precision_count(), 2.0 / 4.0);
  // All accesses: A B A B = 800 bytes, 4 tensors; hits 200 bytes, 2.
  EXPECT_DOUBLE_EQ(h.recall_all(), 200.0 / 800.0);
  EXPECT_DOUBLE_EQ(h.recall_all_count(), 2.0 / 4.0);
  // Known tensors only: decision 0 knows nothing, decision 1 knows A but B
  // comes (first touch), decision 2 A (hit), decision 3 B: 100 of 400 bytes.
  EXPECT_DOUBLE_EQ(h.recall(), 100.0 / 400.0);
  EXPECT_DOUBLE_EQ(h.recall_count(), 1.0 / 2.0);
  EXPECT_EQ(h.sums.decisions, 4u);
  EXPECT_EQ(r.warmup_events, 0u);
}

TEST(Eval, WarmupIsExcludedAndReported) {
  TraceMaker m;
  std::uint32_t a = m.tensor("a", 8);
  for (std::uint32_t it = 0; it < 3; ++it)
    for (int k = 0; k < 4; ++k) m.op("x" + std::to_string(k), OpClass::matmul, it, {a});
  EvalOptions opt;
  opt.warmup_iterations = 1;
  EvalResult r = testing::run(m.t, "oracle", opt);
  EXPECT_EQ(r.warmup_steps, 4u);
  EXPECT_EQ(r.warmup_events, 4u);
  EXPECT_EQ(horizon(r, "8").sums.decisions, 8u);
  EXPECT_EQ(horizon(r, "8").with_warmup.decisions, 12u);
}

TEST(Eval, IterationHorizonUsesLastCompleteIteration) {
  TraceMaker m;
  std::uint32_t a = m.tensor("a", 8), b = m.tensor("b", 8);
  for (std::uint32_t it = 0; it < 4; ++it) {
    for (int k = 0; k < 5; ++k) m.op("x", OpClass::matmul, it, {a});
    m.op("y", OpClass::matmul, it, {b});
  }
  EvalOptions opt;
  opt.warmup_iterations = 1;
  EvalResult r = testing::run(m.t, "oracle", opt);
  const HorizonMetrics& h = horizon(r, "iteration");
  // After the first iteration every window of 6 steps holds both tensors.
  EXPECT_EQ(r.iteration_fallback_decisions, 6u);
  EXPECT_DOUBLE_EQ(h.recall(), 1.0);
  EXPECT_DOUBLE_EQ(h.precision(), 1.0);
  EXPECT_EQ(h.sums.decisions, 18u);
}

TEST(Eval, UnknownPredictorIsAnInputError) {
  EXPECT_THROW(make_predictor("nope"), InputError);
  EXPECT_THROW(make_predictor("oracle", nullptr), InputError);
}

TEST(Eval, FeedRejectsDanglingReferences) {
  TraceMaker m;
  m.tensor("a", 8);
  m.op("x", OpClass::matmul, 0, {0});
  m.t.events.push_back({0, 7, 0, trace::EventKind::read});
  EXPECT_THROW(TraceFeed{m.t}, InputError);
}

}  // namespace
}  // namespace u3m::predict
