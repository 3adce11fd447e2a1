// Co-location traces: both jobs present with their own tensors and counters,
// and the structure of the two switch patterns.
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "u3m/util/error.hpp"
#include "u3m/workload/analytic.hpp"
#include "u3m/workload/generate.hpp"
#include "workload_testing.hpp"

namespace u3m::workload {
namespace {

using testing::CheckingSink;

MixedConfig small_mixed(MixedConfig::Pattern p) {
  MixedConfig c;
  c.pattern = p;
  c.train.steps = 2;
  c.train.micro_batch_size = 1;
  c.train.seq_len = 16;
  c.infer.block_tokens = 4;
  c.rounds = 2;
  c.rollout_batch = 3;
  c.max_new_tokens = 5;
  return c;
}

PoissonConfig small_requests(std::uint32_t count, double rate) {
  PoissonConfig p;
  p.count = count;
  p.rate_per_s = rate;
  p.prompt = LengthDist::uniform(4, 12);
  p.output = LengthDist::uniform(2, 9);
  p.seed = 5;
  return p;
}

// Consecutive runs of ops by job, ignoring the two init ops.
std::vector<std::pair<std::uint32_t, std::set<std::uint32_t>>> job_runs(const trace::Trace& t) {
  std::vector<std::pair<std::uint32_t, std::set<std::uint32_t>>> runs;
  for (const auto& o : t.ops) {
    if (o.phase == trace::Phase::other) continue;
    if (runs.empty() || runs.back().first != o.job) runs.push_back({o.job, {}});
    runs.back().second.insert(o.iteration);
  }
  return runs;
}

TEST(Mixed, AlternateRunsRolloutsThenTrainingStepsEachRound) {
  const MixedConfig c = small_mixed(MixedConfig::Pattern::alternate);
  PoissonSource src(small_requests(100, 1.0));
  CheckingSink sink;
  const GenResult r = generate_mixed(preset("tiny"), c, src, sink);
  ASSERT_TRUE(sink.errors.empty()) << sink.errors.front();
  const trace::Trace& t = sink.t;
  ASSERT_EQ(t.jobs, (std::vector<std::string>{"train-0", "infer-0"}));
  const auto runs = job_runs(t);
  // infer, train, infer, train: rollouts of round k precede its T steps.
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].first, 1u);
  EXPECT_EQ(runs[1].first, 0u);
  EXPECT_EQ(runs[1].second, (std::set<std::uint32_t>{0, 1}));
  EXPECT_EQ(runs[3].second, (std::set<std::uint32_t>{2, 3}));
  // Rollouts are capped at max_new_tokens: at most one prefill + 4 decodes
  // per round when the whole batch is admitted at once.
  EXPECT_LE(runs[0].second.size(), 5u);
  EXPECT_EQ(r.requests_completed, 2 * c.rollout_batch);
  EXPECT_EQ(r.train_steps, 4u);
  // Each job's tensors carry its own job index.
  std::set<std::uint32_t> train_jobs, infer_jobs;
  for (const auto& x : t.tensors)
    (x.name.starts_with("train-0.") ? train_jobs : infer_jobs).insert(x.job);
  EXPECT_EQ(train_jobs, std::set<std::uint32_t>{0});
  EXPECT_EQ(infer_jobs, std::set<std::uint32_t>{1});
  EXPECT_EQ(t.find_meta("mixed.pattern"), "alternate");
}

TEST(Mixed, TimeshareInterleavesServingAtTrainingLayerBoundaries) {
  MixedConfig c = small_mixed(MixedConfig::Pattern::timeshare);
  // Dense arrivals (every ~100 us nominal) so requests wait during training.
  PoissonSource src(small_requests(12, 10000.0));
  CheckingSink sink;
  const GenResult r = generate_mixed(preset("tiny"), c, src, sink);
  ASSERT_TRUE(sink.errors.empty()) << sink.errors.front();
  const trace::Trace& t = sink.t;
  EXPECT_EQ(r.requests_completed, 12u);
  EXPECT_EQ(r.train_steps, 2u);
  // Serving ran inside a training step: a train step's ops surround infer ops.
  int inside = 0;
  const trace::Op* prev_train = nullptr;
  std::set<std::string> switch_points;
  for (std::size_t i = 0; i + 1 < t.ops.size(); ++i) {
    const auto& o = t.ops[i];
    if (o.phase == trace::Phase::other) continue;
    if (o.job == 0) {
      if (prev_train && &t.ops[i - 1] != prev_train && t.ops[i - 1].job == 1 &&
          prev_train->iteration == o.iteration)
        ++inside;
      prev_train = &o;
    }
    if (o.job == 0 && t.ops[i + 1].job == 1) {
      const std::string n = o.name;
      switch_points.insert(n.substr(n.rfind('.') + 1));
    }
  }
  EXPECT_GT(inside, 0);
  // Switches happen only where a layer unit ends.
  const std::set<std::string> boundaries = {"embed", "ffn_residual", "loss", "bwd", "adam"};
  for (const auto& s : switch_points) EXPECT_TRUE(boundaries.count(s)) << s;
  // Iteration counters are per job.
  std::set<std::uint32_t> train_iters;
  std::uint32_t max_infer = 0;
  for (const auto& o : t.ops) {
    if (o.job == 0)
      train_iters.insert(o.iteration);
    else
      max_infer = std::max(max_infer, o.iteration);
  }
  EXPECT_EQ(train_iters, (std::set<std::uint32_t>{0, 1}));
  EXPECT_EQ(max_infer + 1, r.infer_iterations);
}

TEST(Mixed, CountingSinkSeparatesJobs) {
  const MixedConfig c = small_mixed(MixedConfig::Pattern::alternate);
  PoissonSource src(small_requests(100, 1.0));
  CheckingSink check;
  CountingSink count(&check);
  generate_mixed(preset("tiny"), c, src, count);
  EXPECT_GT(count.peak(0, trace::Role::activation), 0u);
  EXPECT_EQ(count.peak(0, trace::Role::kv), 0u);
  EXPECT_GT(count.peak(1, trace::Role::kv), 0u);
  EXPECT_EQ(count.peak(1, trace::Role::grad), 0u);
  EXPECT_EQ(count.events(), check.t.events.size());
  EXPECT_EQ(count.ops(), check.t.ops.size());
}

}  // namespace
}  // namespace u3m::workload
