// `u3m run replay` end to end: a generated training trace replayed through
// the real runtime under budgets below its footprint, every byte checked.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_testing.hpp"
#include "mem/test_ssd_util.hpp"
#include "u3m/policy/tiering.hpp"

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

// Issue 14's reproducer: a host budget below one tensor ended in a hang. Now
// the replay stops at once, exit 2, naming the op, the tensor and the tiers.
TEST_F(ReplayCli, BudgetsThatCannotHoldAnOpExitTwoAtOnce) {
  for (const char* host : {"1", "4K", "64K", "1M", "4M"}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = run_cli("run replay " + trace_ + " --host-budget " + host);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << host;
    EXPECT_EQ(r.status, 2) << host << ": " << r.output;
    EXPECT_NE(r.output.find("no progress is possible"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("--host-budget"), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;  // one line
  }
}

// Faults of every class but misdirection under the SSD tier: the replay still
// reads back every byte it wrote, and reports what it caught.
TEST_F(ReplayCli, SsdFaultsAreCaughtAndNothingIsLost) {
  auto j = replay("--device-fraction 0.4 --host-budget 4M --ssd-dir " + dir_.path() +
                  " --ssd-faults eio_on_write=0.05,short_write=0.05,bit_flip_on_read=0.05,"
                  "eio_on_read=0.05,lost_write=0.05,torn_write=0.05,seed=9");
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["mismatches"], 0);
  EXPECT_EQ(j["lost_tensors"], 0);
  std::uint64_t injected = 0;
  for (const auto& [k, v] : j["faults"]["injected"].items()) injected += v.get<std::uint64_t>();
  EXPECT_GT(injected, 0u);
  EXPECT_GT(j["faults"]["store"]["write_verify_failures"].get<std::uint64_t>(), 0u);
  auto r = run_cli("run replay " + trace_ + " --ssd-dir " + dir_.path() +
                   " --ssd-faults lost_write=1.5");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--ssd-faults"), std::string::npos) << r.output;
}

// A replay killed with SIGKILL leaves its SSD file behind; the next replay in
// that directory discards it, says so, and runs correct.
TEST_F(ReplayCli, AStoreLeftByAKilledReplayIsDiscardedAndSaidSo) {
  const std::string long_trace = dir_.file("long.u3mt");
  ASSERT_EQ(run_cli("trace gen --model tiny --workload train --steps 40 -o " + long_trace).status,
            0);
  const std::string args = "run replay " + long_trace +
                           " --device-fraction 0.3 --host-budget 2M --h2d-gbps 0.05 --d2h-gbps "
                           "0.05 --ssd-dir " +
                           dir_.path();
  const std::string cmd =
      "timeout -s KILL 0.5 " + std::string(U3M_BIN_PATH) + " " + args + " >/dev/null 2>&1";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 137) << "the replay was not killed mid-run";
  ASSERT_TRUE(std::filesystem::exists(dir_.path() + "/u3m-replay.ssd"));
  auto r = run_cli(args + " --max-events 2000");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("u3m: note:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("discarded"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("-> OK"), std::string::npos) << r.output;
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
  r = run_cli("run replay " + trace_ + " --policy fifo");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--policy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("u3m"), std::string::npos) << r.output;  // the choices
  r = run_cli("run replay " + trace_ + " --pool-config thread_cache_blocks:8");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--pool-config"), std::string::npos) << r.output;
}

// Every registered policy runs for real on the tiny trace with every byte
// checked; the ones that may evict also under half the footprint. The pool
// configuration reaches the device pool.
TEST_F(ReplayCli, EveryPolicyRunsForRealAndThePoolConfigArrives) {
  for (const u3m::policy::PolicyInfo& info : u3m::policy::tiering_policies()) {
    const std::string p(info.name);
    auto j = replay("--device-fraction 1 --policy " + p);
    EXPECT_EQ(j["policy"], p);
    EXPECT_TRUE(j["ok"].get<bool>()) << p << ": " << j["first_error"];
  }
  for (const char* p : {"lru", "lookahead", "u3m", "design-seed", "belady"}) {
    auto j = replay(std::string("--device-fraction 0.5 --policy ") + p);
    EXPECT_TRUE(j["ok"].get<bool>()) << p << ": " << j["first_error"];
    EXPECT_GT(j["evictions"].get<std::uint64_t>(), 0u) << p;
  }
  auto j = replay("--pool-config expandable_segments:false,alignment:4096");
  const std::string pc = j["pool_config"];
  EXPECT_NE(pc.find("expandable_segments:false"), std::string::npos) << pc;
  EXPECT_NE(pc.find("alignment:4096"), std::string::npos) << pc;
  // As built: the arena rule filled in the capacity (Note [Device arena]).
  EXPECT_EQ(pc.find("capacity:0,"), std::string::npos) << pc;
}

}  // namespace
