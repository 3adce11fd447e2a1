// Each predictor on small hand-made sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <ostream>

#include "test_util.hpp"
#include "u3m/predict/step_wheel.hpp"
#include "u3m/predict/synthetic.hpp"

namespace u3m::predict {

// The listed test names (and CTest's) show the pattern by name, not bytes.
void PrintTo(SyntheticMixed::Pattern p, std::ostream* os) {
  *os << (p == SyntheticMixed::Pattern::alternate ? "alternate" : "timeshare");
}

namespace {

using testing::horizon;
using testing::TraceMaker;
using trace::OpClass;

// A strictly periodic single-job trace: 12 iterations of the same 16 ops,
// each reading two of 24 tensors of varied sizes.
trace::Trace periodic() {
  TraceMaker m;
  std::vector<std::uint32_t> ts;
  for (int i = 0; i < 24; ++i) ts.push_back(m.tensor("t" + std::to_string(i), 1000 + 37 * i));
  for (std::uint32_t it = 0; it < 12; ++it)
    for (int k = 0; k < 16; ++k)
      m.op("op" + std::to_string(k), k % 3 ? OpClass::matmul : OpClass::norm, it,
           {ts[(3 * k) % 24], ts[(5 * k + 1) % 24]});
  return m.t;
}

TEST(Predictors, PeriodicTraceReplayAndDefaultAreExactAfterWarmup) {
  trace::Trace t = periodic();
  for (const char* name : {"trace-replay", "u3m", "oracle"}) {
    EvalResult r = testing::run(t, name);
    for (const char* h : {"8", "64", "iteration"}) {
      SCOPED_TRACE(std::string(name) + " H=" + h);
      // trace-replay learns an iteration is over only at the next one's first
      // op, so it misses one decision per re-record: ~100%, not exactly.
      EXPECT_GE(horizon(r, h).precision(), 0.99);
      // After warm-up every tensor is known: recall over all accesses.
      EXPECT_GE(horizon(r, h).recall(), 0.99);
      EXPECT_GE(horizon(r, h).recall_count(), 0.99);
    }
  }
}

TEST(Predictors, AllNamedPredictorsKeepTheContract) {
  // Note [Predictor contract], checked at every decision point: a predictor
  // names only tensors that appeared in an earlier event, each at most once,
  // within the horizon it was asked (64 here: the only horizon scored).
  trace::Trace t = periodic();
  // Tensor 23 is first touched in iteration 6: an online predictor must not
  // name it before.
  for (trace::Event& e : t.events)
    if (e.tensor == 23 && t.ops[e.op].iteration < 6) e.tensor = 22;
  TraceFeed feed(t);
  std::vector<std::size_t> first(t.tensors.size(), SIZE_MAX);
  for (std::size_t s = 0; s < feed.num_steps(); ++s)
    for (std::size_t i = feed.step_begin(s); i < feed.step_begin(s + 1); ++i)
      first[t.events[i].tensor] = std::min(first[t.events[i].tensor], s);
  for (const std::string& name : predictor_names()) {
    SCOPED_TRACE(name);
    auto p = make_predictor(name, &feed);
    EvalOptions opt;
    opt.horizons = {64};
    opt.iteration_horizon = false;
    std::size_t named = 0, violations = 0;
    std::vector<std::size_t> stamp(t.tensors.size(), SIZE_MAX);
    opt.on_decision = [&](std::size_t k, const std::vector<Predicted>& out, bool) {
      for (const Predicted& q : out) {
        ++named;
        const bool ok = q.tensor < t.tensors.size() && first[q.tensor] < k &&
                        stamp[q.tensor] != k && q.ops_ahead < 64;
        if (!ok && violations++ < 3)
          ADD_FAILURE() << "decision " << k << ": tensor " << q.tensor << " ops_ahead "
                        << q.ops_ahead;
        if (q.tensor < t.tensors.size()) stamp[q.tensor] = k;
      }
    };
    EvalResult r = evaluate(feed, *p, opt);
    EXPECT_EQ(r.predictor, name);
    EXPECT_GT(named, 0u);
    EXPECT_EQ(violations, 0u);
  }
}

TEST(Predictors, LruNamesTheRecentWorkingSet) {
  // A working set of 4 tensors cycled every 4 steps: the last 8 steps hold
  // exactly the next 8 steps' tensors.
  TraceMaker m;
  for (int i = 0; i < 4; ++i) m.tensor("t" + std::to_string(i), 64);
  for (int k = 0; k < 200; ++k)
    m.op("op", OpClass::matmul, static_cast<std::uint32_t>(k / 4),
         {static_cast<std::uint32_t>(k % 4)});
  EvalResult r = testing::run(m.t, "lru");
  // Exact except at the trace's last steps.
  EXPECT_GE(horizon(r, "8").precision(), 0.99);
  EXPECT_GE(horizon(r, "8").recall(), 0.99);
}

TEST(Predictors, MarkovReuseLearnsAConstantReuseDistance) {
  // Tensor i is used at steps i, i+8, i+16, ...: reuse distance 8 (class 3).
  TraceMaker m;
  for (int i = 0; i < 8; ++i) m.tensor("t" + std::to_string(i), 64);
  for (int k = 0; k < 400; ++k)
    m.op("op", OpClass::matmul, static_cast<std::uint32_t>(k / 8),
         {static_cast<std::uint32_t>(k % 8)});
  EvalResult r = testing::run(m.t, "markov-reuse");
  // Predicted at 12 steps (middle of [8,16)) and kept 4 more: every tensor
  // used in the next 64 steps is named, and nothing else exists.
  // (The first reuse of each tensor has no history to predict from.)
  EXPECT_GE(horizon(r, "64").recall(), 0.95);
  EXPECT_DOUBLE_EQ(horizon(r, "64").precision(), 1.0);
  EXPECT_GT(horizon(r, "8").recall(), 0.3);
}

TEST(Predictors, TraceReplayInvalidatesOnDivergence) {
  // Iterations 0-5 identical, iteration 6 swaps two ops: the record is
  // dropped (nothing predicted) until a fresh one is complete.
  TraceMaker m;
  std::vector<std::uint32_t> ts;
  for (int i = 0; i < 8; ++i) ts.push_back(m.tensor("t" + std::to_string(i), 64));
  for (std::uint32_t it = 0; it < 10; ++it)
    for (int k = 0; k < 8; ++k) {
      int kk = (it == 6 && k < 2) ? 1 - k : k;
      m.op("op" + std::to_string(kk), OpClass::matmul, it, {ts[kk]});
    }
  TraceFeed feed(m.t);
  auto p = make_predictor("trace-replay");
  std::vector<Predicted> out;
  feed.feed(*p, 0, 6 * 8);
  p->predict(8, out);
  EXPECT_EQ(out.size(), 8u);  // replaying
  feed.feed(*p, 6 * 8, 6 * 8 + 1);
  p->predict(8, out);
  EXPECT_TRUE(out.empty());             // diverged
  feed.feed(*p, 6 * 8 + 1, 8 * 8 + 1);  // iteration 7 re-recorded
  p->predict(8, out);
  EXPECT_EQ(out.size(), 8u);
}

TEST(StepWheel, SchedulesExpiresAndReschedules) {
  StepWheel w(4, 2);  // 16-step ring, 2 steps of grace
  w.schedule(1, 3, 4);
  w.schedule(2, 40, 40);  // beyond the ring
  w.schedule(3, 5, 5);
  w.cancel(3);
  auto due = [&](std::uint32_t h) {
    std::vector<std::uint32_t> v;
    w.for_each(h, [&](std::uint32_t t, std::uint64_t) { v.push_back(t); });
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(due(4), (std::vector<std::uint32_t>{1}));
  EXPECT_EQ(due(100), (std::vector<std::uint32_t>{1, 2}));
  w.advance(5);  // t1 was kept until step 4: expired
  EXPECT_EQ(due(4), (std::vector<std::uint32_t>{}));
  w.advance(30);
  EXPECT_EQ(due(16), (std::vector<std::uint32_t>{2}));
  w.schedule(2, 31, 31);  // replaces the old entry
  EXPECT_EQ(due(2), (std::vector<std::uint32_t>{2}));
  EXPECT_EQ(due(100), (std::vector<std::uint32_t>{2}));
}

// The mixed train+serve traces, both interleavings.
std::string pattern_name(SyntheticMixed::Pattern p) {
  return ::testing::PrintToString(p);
}

class Mixed : public ::testing::TestWithParam<SyntheticMixed::Pattern> {};

TEST_P(Mixed, DefaultPredictorIsAccurateAndBeatsTheBaselines) {
  SyntheticMixed sp;
  sp.pattern = GetParam();
  trace::Trace t = make_synthetic_mixed(sp);
  EvalResult seq = testing::run(t, "u3m");
  // This serving stream is deliberately irregular (requests of varied
  // length, prefill bursts), so when training resumes is uncertain by ~10
  // ops; the byte-weighted recall near that switch is where u3m loses
  // most (docs/prediction.md, "Known limits").
  for (const char* h : {"8", "64", "iteration"}) {
    SCOPED_TRACE(h);
    const HorizonMetrics& m = horizon(seq, h);
    std::printf("%s H=%s: P %.4f R %.4f R_known %.4f ceiling %.4f\n",
                pattern_name(GetParam()).c_str(), h, m.precision(), m.recall(), m.recall_known(),
                m.recall_ceiling());
    EXPECT_GE(m.precision(), 0.9);
    EXPECT_GE(m.recall_known(), 0.85);
    EXPECT_GE(m.precision_count(), 0.85);
    EXPECT_GE(m.recall_known_count(), 0.88);
  }
  double best = f1(horizon(seq, "64").precision(), horizon(seq, "64").recall());
  for (const char* base : {"lru", "markov-reuse", "trace-replay", "design-ema"}) {
    SCOPED_TRACE(base);
    EvalResult r = testing::run(t, base);
    EXPECT_GT(best, f1(horizon(r, "64").precision(), horizon(r, "64").recall()));
  }
  EvalResult o = testing::run(t, "oracle");
  EXPECT_DOUBLE_EQ(horizon(o, "64").precision(), 1.0);
  EXPECT_DOUBLE_EQ(horizon(o, "64").recall_known(), 1.0);
  // First touches (new KV blocks) exist and are reported, not hidden: the
  // oracle's recall over all accesses is the ceiling, below 1.
  EXPECT_DOUBLE_EQ(horizon(o, "64").recall(), horizon(o, "64").recall_ceiling());
  EXPECT_LT(horizon(o, "64").recall(), 1.0);
}

INSTANTIATE_TEST_SUITE_P(Patterns, Mixed,
                         ::testing::Values(SyntheticMixed::Pattern::alternate,
                                           SyntheticMixed::Pattern::timeshare),
                         [](const auto& i) { return pattern_name(i.param); });

}  // namespace
}  // namespace u3m::predict
