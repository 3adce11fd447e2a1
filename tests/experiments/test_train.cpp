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

TrainScenario tiny(const std::string& policy, double hbm_fraction_of_footprint) {
  TrainScenario s;
  s.shape = workload::preset("tiny");
  s.hw = sim::load_profile("ascend-910b-32g");
  s.cards = 1;
  s.train.seq_len = 256;
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
