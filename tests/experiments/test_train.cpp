// The training experiments: policies on a tiny model with a shrunken HBM,
// and the CLI's JSON for sim and capacity on the design's scenario.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_testing.hpp"
#include "u3m/experiments/train.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/shape.hpp"

namespace u3m::experiments {
namespace {

TrainScenario tiny(const std::string& policy, double hbm_fraction_of_footprint,
                   std::uint32_t seq_len = 256) {
  TrainScenario s;
  s.shape = workload::preset("tiny");
  s.hw = sim::load_profile("ascend-910b-32g");
  s.cards = 1;
  s.train.seq_len = seq_len;
  s.policy = policy;
  // Size HBM from the untiered run's need.
  TrainScenario probe = s;
  probe.policy = "lru";
  const std::uint64_t need = simulate_training(probe).footprint;
  s.hw.device.hbm_capacity.si = hbm_fraction_of_footprint * static_cast<double>(need);
  return s;
}

TEST(TrainSim, HbmOnlyFitsOrSaysWhy) {
  TrainResult big = simulate_training(tiny("hbm-only", 1.5));
  ASSERT_TRUE(big.fits) << big.why;
  EXPECT_DOUBLE_EQ(big.loss, 0.0);
  EXPECT_EQ(big.sim.links[0].bytes + big.sim.links[1].bytes, 0u);  // nothing moved
  TrainResult small = simulate_training(tiny("hbm-only", 0.6));
  EXPECT_FALSE(small.fits);
  EXPECT_FALSE(small.why.empty());
}

TEST(TrainSim, TieredPoliciesRunBelowTheFootprintAndTheOracleLeads) {
  TrainResult lru = simulate_training(tiny("lru", 0.6));
  TrainResult u3m = simulate_training(tiny("u3m", 0.6));
  TrainResult oracle = simulate_training(tiny("oracle", 0.6));
  for (const TrainResult* r : {&lru, &u3m, &oracle}) {
    ASSERT_TRUE(r->fits) << r->policy << ": " << r->why;
    EXPECT_LE(r->sim.peak_device, static_cast<std::uint64_t>(0.6 * double(r->footprint)) + 1);
    EXPECT_GT(r->sim.links[0].bytes + r->sim.links[1].bytes, 0u) << r->policy;
    EXPECT_GE(r->step_s, r->ideal_step_s);
    EXPECT_GE(r->loss, 0.0);
  }
  EXPECT_LE(oracle.step_s, lru.step_s * 1.001);
  // Deterministic: the same scenario gives the same step.
  EXPECT_EQ(simulate_training(tiny("u3m", 0.6)).step_s, u3m.step_s);
}

TEST(TrainSim, BadScenarioNamesTheField) {
  TrainScenario s = tiny("lru", 1.0);
  s.policy = "fifo";
  EXPECT_THROW(simulate_training(s), InputError);
  s.policy = "lru";
  s.steps = 1;
  try {
    simulate_training(s);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--steps"), std::string::npos);
  }
}

TEST(TrainSim, U3mChoosesSwapOrRecomputeByCostAndTheIdealNeverRecomputes) {
  TrainScenario s = tiny("u3m", 0.5, 2048);  // activations dominate the footprint
  const TrainResult chosen = simulate_training(s);
  ASSERT_TRUE(chosen.fits) << chosen.why;
  for (std::uint32_t k : {1u, s.shape.layers}) {
    TrainScenario forced = s;
    forced.train.recompute_layers = k;
    const TrainResult r = simulate_training(forced);
    EXPECT_EQ(r.recompute_layers, k);
    // Infinite HBM recomputes nothing, whatever the scenario checkpoints.
    EXPECT_DOUBLE_EQ(r.ideal_step_s, chosen.ideal_step_s);
    if (r.fits) EXPECT_LE(chosen.step_s, r.step_s) << k << " layers checkpointed";
  }
  TrainScenario none = s;
  none.policy = "lru";  // never recomputes unless told
  EXPECT_EQ(simulate_training(none).recompute_layers, 0u);
}

TEST(TrainFailover, ParseNamesTheFlagAndTheProblem) {
  CardFailure f = CardFailure::parse("2@7", 4, "--fail-card");
  EXPECT_EQ(f.card, 2u);
  EXPECT_EQ(f.step, 7u);
  for (const char* bad : {"2", "x@3", "1@", "@3", "1@-2", "4@3", "1@0", "1@3x"}) {
    try {
      CardFailure::parse(bad, 4, "--fail-card");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--fail-card"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(CardFailure::parse("0@1", 1, "--fail-card"), InputError);  // no neighbour
}

TEST(TrainFailover, TheNeighbourCarriesTwoShardsAndEveryCardWaitsForIt) {
  TrainScenario s;
  s.shape = workload::preset("tiny");
  s.hw = sim::load_profile("ascend-910b-32g");
  s.cards = 4;
  s.train.seq_len = 256;
  s.policy = "lru";
  const FailoverResult r = simulate_failover(s, CardFailure::parse("3@5", 4, "--fail-card"));
  ASSERT_TRUE(r.before.fits) << r.before.why;
  ASSERT_TRUE(r.after.fits) << r.after.why;
  EXPECT_EQ(r.neighbour, 0u);  // wraps around
  // The moved shard is one card's sharded state; the neighbour's trace holds
  // two of them, so its optimizer work and footprint grow.
  EXPECT_GT(r.moved_bytes, 0u);
  EXPECT_GT(r.after.footprint, r.before.footprint);
  EXPECT_GT(r.after.ideal_step_s, r.before.ideal_step_s);
  EXPECT_GE(r.after.step_s, r.before.step_s);
  EXPECT_NEAR(r.slowdown, r.after.step_s / r.before.step_s - 1, 1e-12);
  EXPECT_NEAR(
      r.move_s,
      double(r.moved_bytes) / s.hw.peer_link.bandwidth_practical.si + s.hw.peer_link.latency.si,
      1e-12);
  // Three cards remain, each slower.
  EXPECT_NEAR(r.tokens_per_s_after, r.before.tokens_per_s * 0.75 * r.before.step_s / r.after.step_s,
              1e-6);
  EXPECT_GT(r.run_s, r.run_s_no_failure);
}

TEST(TrainCli, SimJsonEmbedsScenarioProfileAndVersion) {
  auto r = u3m::testing::run_cli("train sim --model llama-1b --policy u3m --json", false);
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["scenario"]["hw"], "ascend-910b-32g");
  EXPECT_EQ(j["scenario"]["policy"], "u3m");
  EXPECT_TRUE(j["scenario"].contains("version"));
  EXPECT_TRUE(j["profile"]["device"]["hbm_capacity"].contains("source"));
  EXPECT_TRUE(j["result"]["fits"].get<bool>());
}

TEST(TrainCli, CapacityReportsEveryPolicyAgainstHbmOnly) {
  auto r = u3m::testing::run_cli("train capacity --json", false);
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  const auto base = j["policies"]["hbm-only"]["max_params"].get<std::uint64_t>();
  EXPECT_GT(base, 0u);
  for (const char* p : {"static-offload", "lru", "u3m", "oracle"}) {
    ASSERT_TRUE(j["policies"].contains(p)) << p;
    EXPECT_LE(j["policies"][p]["loss"].get<double>(), 0.05) << p;
  }
  // Tiering never loses capacity against HBM alone: a shape that fits in HBM
  // needs no transfers, whatever the policy.
  EXPECT_GE(j["policies"]["u3m"]["max_params"].get<std::uint64_t>(), base);
  EXPECT_GE(j["policies"]["oracle"]["max_params"].get<std::uint64_t>(), base);
  auto bad = u3m::testing::run_cli("train capacity --policies u3m,fifo");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("fifo"), std::string::npos);
}

}  // namespace
}  // namespace u3m::experiments
