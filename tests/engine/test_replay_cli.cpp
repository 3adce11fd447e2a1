// `u3m run replay` end to end: a generated training trace replayed through
// the real runtime under budgets below its footprint, every byte checked.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_testing.hpp"
#include "mem/test_ssd_util.hpp"

namespace {

using u3m::testing::run_cli;

class ReplayCli : public ::testing::Test {
 protected:
  void SetUp() override {
    trace_ = dir_.file("tiny.u3mt");
    auto r = run_cli("trace gen --model tiny --workload train --steps 1 -o " + trace_);
    ASSERT_EQ(r.status, 0) << r.output;
  }
  nlohmann::json replay(const std::string& args) {
    auto r = run_cli("run replay " + trace_ + " --json " + args, /*with_stderr=*/false);
    EXPECT_EQ(r.status, 0) << r.output;
    return nlohmann::json::parse(r.output);
  }
  u3m::mem::testing::ScratchDir dir_;
  std::string trace_;
};

TEST_F(ReplayCli, HalfTheFootprintOnTheDeviceKeepsEveryByte) {
  auto j = replay("--device-fraction 0.5");
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["mismatches"], 0);
  EXPECT_EQ(j["errors"], 0);
  const auto footprint = j["footprint_bytes"].get<std::uint64_t>();
  const auto budget = j["device_budget_bytes"].get<std::uint64_t>();
  EXPECT_LT(budget, footprint);
  EXPECT_LE(j["device"]["peak_bytes"].get<std::uint64_t>(), budget);
  EXPECT_GT(j["bytes_verified"].get<std::uint64_t>(), 0u);
  EXPECT_GT(j["links"]["d2h"]["bytes"].get<std::uint64_t>(), 0u);
  EXPECT_GT(j["links"]["h2d"]["bytes"].get<std::uint64_t>(), 0u);
  EXPECT_GT(j["evictions"].get<std::uint64_t>(), 0u);
  EXPECT_TRUE(j["pool"].contains("fragmentation"));
  EXPECT_TRUE(j["device"].contains("time_to_oom_s"));
}

TEST_F(ReplayCli, SmallHostBudgetSpillsToTheSsdTier) {
  auto j = replay("--device-fraction 0.4 --host-budget 4M --ssd-dir " + dir_.path());
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_GT(j["links"]["h2s"]["bytes"].get<std::uint64_t>(), 0u);
  EXPECT_GT(j["links"]["s2h"]["bytes"].get<std::uint64_t>(), 0u);
  EXPECT_LE(j["host"]["peak_bytes"].get<std::uint64_t>(), 4u << 20);
}

TEST_F(ReplayCli, TextReportSaysMeasuredAndOk) {
  auto r = run_cli("run replay " + trace_);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("measured on"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("-> OK"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("time to OOM"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fragmentation"), std::string::npos) << r.output;
}

TEST_F(ReplayCli, BadOptionsAreClearErrors) {
  auto r = run_cli("run replay " + trace_ + " --device-fraction 1.5");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--device-fraction"), std::string::npos) << r.output;
  r = run_cli("run replay " + trace_ + " --device-budget 12Q");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--device-budget"), std::string::npos) << r.output;
  r = run_cli("run replay /nonexistent.u3mt");
  EXPECT_NE(r.status, 0);
}

}  // namespace
