// The schedule bound (Note [Schedule bound] in src/predict/bound.cpp), on a
// hand-made exchangeable schedule whose probabilities are worked out below.
#include <map>

#include <gtest/gtest.h>

#include "test_util.hpp"
#include "u3m/predict/bound.hpp"

namespace u3m::predict {
namespace {

using testing::TraceMaker;

// Jobs A and B; items A0 B0 A1 B1, each one iteration of two steps. A's steps
// touch {a, w} then {a}; B's {b, w} then {b}; w is shared.
struct Abab {
  TraceMaker m;
  std::uint32_t a, b, w;
  Abab() {
    m.t.job("job-1");
    a = m.tensor("a", 100, trace::Role::param, 0);
    b = m.tensor("b", 300, trace::Role::param, 1);
    w = m.tensor("w", 10, trace::Role::param, 0);
    for (std::uint32_t r = 0; r < 2; ++r)
      for (std::uint32_t j = 0; j < 2; ++j) {
        const std::uint32_t x = j == 0 ? a : b;
        m.op(j == 0 ? "a.first" : "b.first", trace::OpClass::matmul, r, {x, w}, j);
        m.op(j == 0 ? "a.second" : "b.second", trace::OpClass::matmul, r, {x}, j);
      }
  }
};

std::map<std::uint32_t, double> window_at(ExchangeableSchedule& s, std::size_t k,
                                          std::size_t* paths = nullptr) {
  std::vector<std::pair<std::uint32_t, double>> w;
  EXPECT_TRUE(s.window(k, w, paths));
  return {w.begin(), w.end()};
}

TEST(ScheduleBound, ItemsSplitAtIterationsButNotAtDecodeSteps) {
  TraceMaker m;
  m.t.job("serve");
  const std::uint32_t x = m.tensor("x", 8);
  m.op("train", trace::OpClass::matmul, 0, {x}, 0);
  m.op("train", trace::OpClass::matmul, 1, {x}, 0);
  m.op("prefill", trace::OpClass::matmul, 0, {x}, 1);
  m.t.ops.back().phase = trace::Phase::prefill;
  m.op("decode", trace::OpClass::matmul, 1, {x}, 1);
  m.t.ops.back().phase = trace::Phase::decode;
  m.op("prefill", trace::OpClass::matmul, 2, {x}, 1);
  m.t.ops.back().phase = trace::Phase::prefill;
  TraceFeed feed(m.t);
  const ScheduleItems s = schedule_items(feed);
  ASSERT_EQ(s.items.size(), 4u);  // train 0 | train 1 | prefill+decode | prefill
  EXPECT_EQ(s.items[2].begin, 2u);
  EXPECT_EQ(s.items[2].end, 4u);
  EXPECT_EQ(s.of_job[0].size(), 2u);
  EXPECT_EQ(s.of_job[1].size(), 2u);
}

TEST(ScheduleBound, AnInterruptedIterationsFirstPieceBelongsToTheNextItem) {
  // A capture that files a request's batch drawing under the training job:
  // train-0 iteration 0 runs one op, the request runs, then iteration 0 goes on.
  TraceMaker m;
  m.t.job("serve");
  const std::uint32_t x = m.tensor("x", 8);
  m.op("randn", trace::OpClass::other, 0, {x}, 0);
  m.op("prefill", trace::OpClass::matmul, 0, {x}, 1);
  m.op("fwd", trace::OpClass::matmul, 0, {x}, 0);
  m.op("fwd", trace::OpClass::matmul, 1, {x}, 0);
  TraceFeed feed(m.t);
  const ScheduleItems s = schedule_items(feed);
  ASSERT_EQ(s.items.size(), 3u);
  EXPECT_EQ(s.items[0].job, 1u);  // the request, with the piece before it
  EXPECT_EQ(s.items[0].begin, 0u);
  EXPECT_EQ(s.items[0].end, 2u);
  EXPECT_EQ(s.of_job[0].size(), 2u);
}

TEST(ScheduleBound, ProbabilitiesAreDrawsWithoutReplacement) {
  Abab t;
  TraceFeed feed(t.m.t);
  ExchangeableSchedule s(feed, 2);
  std::size_t paths = 0;
  EXPECT_TRUE(window_at(s, 0).empty());  // nothing seen yet
  auto q = window_at(s, 1);  // inside A0, then A1 (1/3) or B0 (2/3): w either way, b unseen
  EXPECT_EQ(q.size(), 2u);
  EXPECT_DOUBLE_EQ(q[t.a], 1.0);
  EXPECT_DOUBLE_EQ(q[t.w], 1.0);
  q = window_at(s, 2, &paths);  // A0 done: A left 1 of 3
  EXPECT_EQ(paths, 2u);
  EXPECT_NEAR(q[t.a], 1.0 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(q[t.w], 1.0);
  EXPECT_EQ(q.count(t.b), 0u);  // b's first event is step 2: not nameable before it
  q = window_at(s, 3);  // {b}, then A1's {a, w} or B1's {b, w} (1/2 each)
  EXPECT_DOUBLE_EQ(q[t.b], 1.0);
  EXPECT_DOUBLE_EQ(q[t.a], 0.5);
  EXPECT_DOUBLE_EQ(q[t.w], 1.0);
  q = window_at(s, 4);
  EXPECT_DOUBLE_EQ(q[t.a], 0.5);
  EXPECT_DOUBLE_EQ(q[t.b], 0.5);
  EXPECT_DOUBLE_EQ(q[t.w], 1.0);
  q = window_at(s, 5, &paths);  // only B is left: forced
  EXPECT_EQ(paths, 1u);
  EXPECT_DOUBLE_EQ(q[t.a], 1.0);
  EXPECT_DOUBLE_EQ(q[t.b], 1.0);
  EXPECT_DOUBLE_EQ(q[t.w], 1.0);
}

TEST(ScheduleBound, FrontierByHand) {
  Abab t;
  TraceFeed feed(t.m.t);
  ScheduleBoundOptions o;
  o.horizon = 2;
  o.warmup_iterations = 0;
  const ScheduleBound b = schedule_bound(feed, o);
  ASSERT_TRUE(b.computed) << b.why_not;
  // Sure (q = 1) bytes 1460; unsure (q, bytes): (1/2, 300), (1/2, 100) x2, (1/3, 100).
  const double known = 1460 + 150 + 50 + 50 + 100.0 / 3;
  EXPECT_NEAR(b.known_bytes, known, 1e-9);
  // R*(0.97): all sure bytes, then the fraction of (1/2, 300) that keeps 97%.
  const double h = 1460 + 0.5 * (1460 - 0.97 * 1460) / (0.97 - 0.5);
  EXPECT_NEAR(b.recall_known_at_bar, h / known, 1e-12);
  EXPECT_TRUE(b.rules_out_bar());
  // P*(0.95): the largest half, then part of the next.
  const double need = 0.95 * known;
  const double mass = 1460 + 300 + (need - 1610) / 0.5;
  EXPECT_NEAR(b.precision_at_bar, need / mass, 1e-12);
  EXPECT_EQ(b.decisions, 8u);
  EXPECT_EQ(b.items, 4u);
}

TEST(ScheduleBound, OneJobLeavesNothingUncertain) {
  TraceMaker m;
  const std::uint32_t x = m.tensor("x", 8), y = m.tensor("y", 8);
  for (std::uint32_t it = 0; it < 4; ++it) {
    m.op("f", trace::OpClass::matmul, it, {x});
    m.op("g", trace::OpClass::matmul, it, {y});
  }
  TraceFeed feed(m.t);
  const ScheduleBound b = schedule_bound(feed, {});
  ASSERT_TRUE(b.computed) << b.why_not;
  EXPECT_EQ(b.uncertain_decisions, 0u);
  EXPECT_DOUBLE_EQ(b.recall_known_at_bar, 1.0);
  EXPECT_DOUBLE_EQ(b.precision_at_bar, 1.0);
  EXPECT_FALSE(b.rules_out_bar());
}

TEST(ScheduleBound, ExpectedScoreWeighsEachAnswerByItsProbability) {
  Abab t;
  TraceFeed feed(t.m.t);
  ExpectedScore e(feed, 2, 0);
  for (std::size_t k = 0; k < feed.num_steps(); ++k)  // always a, b, w (b twice: once)
    e.on_decision(k, {{t.a, 0}, {t.b, 0}, {t.w, 1}, {t.b, 1}});
  ASSERT_TRUE(e.computed());
  const double known = 1460 + 150 + 50 + 50 + 100.0 / 3;
  EXPECT_NEAR(e.recall_known(), 1.0, 1e-12);
  // w at k = 7 is predicted one step past the end: left out, as the evaluator does.
  EXPECT_NEAR(e.precision(), known / (8 * 410 - 10), 1e-12);
}

TEST(ScheduleBound, TooManyOrdersIsReportedNotApproximated) {
  Abab t;
  TraceFeed feed(t.m.t);
  ScheduleBoundOptions o;
  o.horizon = 8;
  o.warmup_iterations = 0;
  o.max_paths = 2;
  const ScheduleBound b = schedule_bound(feed, o);
  EXPECT_FALSE(b.computed);
  EXPECT_NE(b.why_not.find("possible orders"), std::string::npos);
}

}  // namespace
}  // namespace u3m::predict
