// The evaluator's arithmetic, on traces small enough to score by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

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
  // Recall over all accesses (the headline): A B A B = 800 bytes, 4 tensors;
  // hits 200 bytes, 2.
  EXPECT_DOUBLE_EQ(h.recall(), 200.0 / 800.0);
  EXPECT_DOUBLE_EQ(h.recall_count(), 2.0 / 4.0);
  // Known tensors only: decision 0 knows nothing, decision 1 knows A but B
  // comes (first touch), decision 2 A (hit), decision 3 B: 100 of 400 bytes.
  EXPECT_DOUBLE_EQ(h.recall_known(), 100.0 / 400.0);
  EXPECT_DOUBLE_EQ(h.recall_known_count(), 1.0 / 2.0);
  // The first touches (A at 0, B at 1) are 400 of the 800 accessed bytes.
  EXPECT_DOUBLE_EQ(h.recall_ceiling(), 400.0 / 800.0);
  EXPECT_DOUBLE_EQ(h.recall_ceiling_count(), 2.0 / 4.0);
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
  // A decision's context is the step before it (Note [No future in the
  // query]): decision 0 and the 4 after iteration 0's steps are warm-up; that
  // iteration 0 is over shows only at step 4, which has not run at decision 4.
  EXPECT_EQ(r.warmup_steps, 5u);
  EXPECT_EQ(r.warmup_events, 5u);
  EXPECT_EQ(horizon(r, "8").sums.decisions, 7u);
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
  // The span (6) is known once step 6 (iteration 1's first op) has run, so
  // decisions 0..6 use the fallback; after warm-up every window of 6 steps
  // holds both tensors, both long known.
  EXPECT_EQ(r.iteration_fallback_decisions, 7u);
  EXPECT_DOUBLE_EQ(h.recall(), 1.0);
  EXPECT_DOUBLE_EQ(h.precision(), 1.0);
  EXPECT_EQ(h.sums.decisions, 17u);
}

// Records what the evaluator asks; predicts nothing.
class SpyPredictor final : public Predictor {
 public:
  std::vector<std::uint32_t> asked;  // the horizon of each call, in order
  std::string_view name() const override { return "spy"; }
  void observe(const Access&) override {}
  void predict(std::uint32_t h, std::vector<Predicted>& out) override {
    asked.push_back(h);
    out.clear();
  }
  void predict_window_delta(std::uint32_t h, std::vector<Predicted>& entered,
                            std::vector<std::uint32_t>& left) override {
    asked.push_back(h);
    entered.clear();
    left.clear();
  }
};

TEST(Eval, QueryIgnoresTheFuture) {
  // Five steps of job 0's iteration 0, then from step 5 on three different
  // futures: iteration 1 begins, iteration 0 goes on, or job 1 runs. What the
  // predictor is asked at decisions 0..5 (and whether the evaluator counts
  // them as warm-up) must not depend on which.
  auto make = [](int variant) {
    TraceMaker m;
    m.t.job("job-1");
    std::uint32_t a = m.tensor("a", 8), b = m.tensor("b", 8, trace::Role::activation, 1);
    for (int k = 0; k < 5; ++k) m.op("x" + std::to_string(k), OpClass::matmul, 0, {a});
    for (int k = 0; k < 12; ++k) {
      if (variant == 0) m.op("x" + std::to_string(k % 5), OpClass::matmul, 1 + k / 5, {a});
      if (variant == 1) m.op("y", OpClass::matmul, 0, {a});
      if (variant == 2) m.op("s", OpClass::attn_decode, 0, {b}, 1);
    }
    return m.t;
  };
  for (bool delta : {false, true}) {
    SCOPED_TRACE(delta ? "window delta" : "predict");
    std::vector<std::vector<std::uint32_t>> asked;
    std::vector<std::vector<bool>> warm;
    for (int v = 0; v < 3; ++v) {
      trace::Trace t = make(v);
      TraceFeed feed(t);
      SpyPredictor spy;
      EvalOptions opt;
      opt.horizons = {2};  // below the iteration span, so the iteration horizon is what is asked
      opt.warmup_iterations = 1;
      opt.window_delta = delta ? 2 : 0;
      warm.emplace_back();
      opt.on_decision = [&](std::size_t, const std::vector<Predicted>&, bool w) {
        warm.back().push_back(w);
      };
      evaluate(feed, spy, opt);
      ASSERT_EQ(spy.asked.size(), feed.num_steps());
      spy.asked.resize(6);
      warm.back().resize(6);
      asked.push_back(spy.asked);
    }
    EXPECT_EQ(asked[0], asked[1]);
    EXPECT_EQ(asked[0], asked[2]);
    EXPECT_EQ(warm[0], warm[1]);
    EXPECT_EQ(warm[0], warm[2]);
  }
}

TEST(Eval, OracleReachesTheCeilingAndNoMore) {
  // Every iteration reads the weight w and a fresh activation (a first
  // touch): the oracle names every known tensor, so its recall over all
  // accesses is exactly the ceiling bytes(A_known)/bytes(A), below 1.
  TraceMaker m;
  std::uint32_t w = m.tensor("w", 300);
  for (std::uint32_t it = 0; it < 6; ++it) {
    std::uint32_t act = m.tensor("act" + std::to_string(it), 100, trace::Role::activation);
    m.op("mm", OpClass::matmul, it, {w, act});
    m.op("norm", OpClass::norm, it, {act});
  }
  EvalResult r = testing::run(m.t, "oracle");
  for (const HorizonMetrics& h : r.horizons) {
    SCOPED_TRACE(h.horizon);
    EXPECT_DOUBLE_EQ(h.precision(), 1.0);
    EXPECT_DOUBLE_EQ(h.recall_known(), 1.0);
    EXPECT_DOUBLE_EQ(h.recall(), h.recall_ceiling());
    EXPECT_DOUBLE_EQ(h.recall_count(), h.recall_ceiling_count());
    EXPECT_LT(h.recall_ceiling(), 1.0);
  }
}

TEST(Eval, PoolingAddsSumsAndRejectsOtherHorizons) {
  TraceMaker m;
  std::uint32_t a = m.tensor("a", 8);
  for (std::uint32_t it = 0; it < 4; ++it) m.op("x", OpClass::matmul, it, {a});
  EvalResult one = testing::run(m.t, "lru"), pooled;
  accumulate(pooled, one);
  accumulate(pooled, one);
  EXPECT_EQ(pooled.events, 2 * one.events);
  EXPECT_DOUBLE_EQ(horizon(pooled, "8").sums.act_bytes, 2 * horizon(one, "8").sums.act_bytes);
  EvalOptions other;
  other.horizons = {4};
  EXPECT_THROW(accumulate(pooled, testing::run(m.t, "lru", other)), std::invalid_argument);
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
