// WindowLog (Note [Shared window log]): every reader gets exactly the answers
// a predictor of its own would give, whether it replays the record or forks.
#include <gtest/gtest.h>

#include "u3m/predict/window_log.hpp"
#include "u3m/workload/generate.hpp"

namespace u3m::predict {
namespace {

// A mixed training + serving trace: groups, KV blocks born and freed, job
// interleavings: the predictor's state is far from trivial.
trace::Trace mixed_trace() {
  workload::MixedConfig cfg;
  cfg.pattern = workload::MixedConfig::Pattern::timeshare;
  cfg.train.seq_len = 128;
  cfg.infer.max_batch = 8;
  workload::PoissonConfig pc;
  pc.seed = 5;
  pc.count = 6;
  pc.prompt = workload::LengthDist::uniform(32, 128);
  pc.output = workload::LengthDist::uniform(4, 16);
  workload::PoissonSource src(pc);
  trace::Trace t;
  workload::generate_mixed(workload::preset("tiny"), cfg, src, t);
  return t;
}

struct Answer {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> entered;  // tensor, ops_ahead
  std::vector<std::uint32_t> left;
  bool operator==(const Answer&) const = default;
};

Answer copy(const WindowLog::Delta& d) {
  Answer a;
  for (const Predicted& p : d.entered) a.entered.push_back({p.tensor, p.ops_ahead});
  a.left.assign(d.left.begin(), d.left.end());
  return a;
}

// A call as a run makes it: step, horizon, time.
struct Call {
  std::size_t step;
  std::uint32_t horizon;
  std::uint64_t now_ns;
};

// What a predictor of the caller's own answers to `calls`.
std::vector<Answer> private_answers(const TraceFeed& feed, std::string_view name,
                                    const std::vector<Call>& calls) {
  auto p = make_predictor(name, &feed);
  std::vector<Answer> out;
  std::vector<Predicted> entered;
  std::vector<std::uint32_t> left;
  for (const Call& c : calls) {
    for (std::size_t e = feed.step_begin(c.step); e < feed.step_begin(c.step + 1); ++e) {
      Access a = feed.access_at(e, c.step);
      a.time_ns = c.now_ns;
      p->observe(a);
    }
    p->step_done();
    p->predict_window_delta(c.horizon, entered, left);
    out.push_back(copy({entered, left}));
  }
  return out;
}

class WindowLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t_ = mixed_trace();
    log_ = std::make_shared<WindowLog>(t_, "u3m");
    n_ = log_->feed().num_steps();
    ASSERT_GT(n_, 200u);
  }
  std::vector<Call> every_step(std::uint64_t ns_per_step) const {
    std::vector<Call> c;
    for (std::size_t j = 0; j < n_; ++j) c.push_back({j, 16, j * ns_per_step});
    return c;
  }
  trace::Trace t_;
  std::shared_ptr<WindowLog> log_;
  std::size_t n_ = 0;
};

TEST_F(WindowLogTest, ReadersOfTheSameCallsShareOnePredictor) {
  // Two runs on different clocks (u3m's answers do not read time),
  // interleaved as cards are: both get their private predictor's answers.
  const std::vector<Call> a = every_step(1000), b = every_step(1700);
  const std::vector<Answer> want = private_answers(log_->feed(), "u3m", a);
  ASSERT_EQ(want, private_answers(log_->feed(), "u3m", b));
  WindowLog::Reader ra(log_), rb(log_);
  std::size_t nonempty = 0;
  for (std::size_t i = 0; i < n_; ++i) {
    const Answer got_a = copy(ra.step(a[i].step, a[i].horizon, a[i].now_ns));
    EXPECT_EQ(got_a, want[i]) << "reader a, call " << i;
    const Answer got_b = copy(rb.step(b[i].step, b[i].horizon, b[i].now_ns));
    EXPECT_EQ(got_b, want[i]) << "reader b, call " << i;
    nonempty += !want[i].entered.empty();
  }
  EXPECT_GT(nonempty, n_ / 4);  // the answers say something
  EXPECT_FALSE(ra.forked());
  EXPECT_FALSE(rb.forked());
  EXPECT_EQ(log_->computed(), n_);  // once per call, not once per reader
}

TEST_F(WindowLogTest, AReaderThatSkipsAStepOrChangesHorizonForks) {
  std::vector<Call> skip, wide;
  for (std::size_t j = 0; j < n_; ++j) {
    if (j != 50) skip.push_back({j, 16, 0});
    wide.push_back({j, j < 120 ? 16u : 40u, 0});
  }
  const std::vector<Call> plain = every_step(0);
  const std::vector<Answer> want_plain = private_answers(log_->feed(), "u3m", plain);
  const std::vector<Answer> want_skip = private_answers(log_->feed(), "u3m", skip);
  const std::vector<Answer> want_wide = private_answers(log_->feed(), "u3m", wide);
  ASSERT_NE(want_skip, std::vector<Answer>(want_plain.begin(), want_plain.end() - 1));
  WindowLog::Reader rp(log_), rs(log_), rw(log_);
  for (std::size_t i = 0; i < n_; ++i) {
    EXPECT_EQ(copy(rp.step(plain[i].step, 16, 0)), want_plain[i]) << "plain, call " << i;
    if (i < skip.size()) {
      EXPECT_EQ(copy(rs.step(skip[i].step, 16, 0)), want_skip[i]) << "skip, call " << i;
    }
    EXPECT_EQ(copy(rw.step(wide[i].step, wide[i].horizon, 0)), want_wide[i]) << "wide, call " << i;
    if (i == 49) {
      EXPECT_FALSE(rs.forked());
    }
    if (i == 119) {
      EXPECT_FALSE(rw.forked());
    }
  }
  EXPECT_FALSE(rp.forked());
  EXPECT_TRUE(rs.forked());
  EXPECT_TRUE(rw.forked());
}

TEST_F(WindowLogTest, ATimedPredictorForksOnAnotherClock) {
  // The design's EMA predictor reads time: same clock shares, another forks.
  auto log = std::make_shared<WindowLog>(t_, "design-ema");
  const std::vector<Call> a = every_step(1000), b = every_step(1700);
  const std::vector<Answer> want_a = private_answers(log->feed(), "design-ema", a);
  const std::vector<Answer> want_b = private_answers(log->feed(), "design-ema", b);
  WindowLog::Reader r1(log), r2(log), r3(log);
  for (std::size_t i = 0; i < n_; ++i) {
    EXPECT_EQ(copy(r1.step(a[i].step, 16, a[i].now_ns)), want_a[i]) << "r1, call " << i;
    EXPECT_EQ(copy(r2.step(a[i].step, 16, a[i].now_ns)), want_a[i]) << "r2, call " << i;
    EXPECT_EQ(copy(r3.step(b[i].step, 16, b[i].now_ns)), want_b[i]) << "r3, call " << i;
  }
  EXPECT_FALSE(r1.forked());
  EXPECT_FALSE(r2.forked());
  EXPECT_TRUE(r3.forked());
}

}  // namespace
}  // namespace u3m::predict
