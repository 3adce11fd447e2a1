// End to end: `u3m bench alloc --json` reports every requested size with
// consistent figures; bad input fails with a message naming the option.
#include <set>
#include <string>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "cli_testing.hpp"

namespace {

using u3m::testing::CliRun;
CliRun run(const std::string& args, bool with_stderr = true) {
  return u3m::testing::run_cli(args, with_stderr);
}

TEST(BenchAllocCli, JsonHasOneResultPerSize) {
  const CliRun r = run("bench alloc --json --sizes 512,64K --seconds 0.06 --rounds 1", false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_NE(j["figures"].get<std::string>().find("measured on"), std::string::npos);
  EXPECT_NE(j["pool_config"].get<std::string>().find("fast_cache_blocks:32"), std::string::npos);
  std::set<std::uint64_t> sizes;
  for (const auto& res : j["results"]) {
    sizes.insert(res["size"].get<std::uint64_t>());
    const double ns = res["ns_per_op"], ref = res["reference_ns_per_op"], ratio = res["ratio"];
    EXPECT_GT(ns, 0);
    EXPECT_NEAR(ratio, ref / ns, 1e-9 * ratio);
  }
  EXPECT_EQ(sizes, (std::set<std::uint64_t>{512, 65536}));
}

TEST(BenchAllocCli, TakesAPoolConfig) {
  const CliRun r = run(
      "bench alloc --json --sizes 4K --seconds 0.03 --rounds 1 --pool-config fast_cache_blocks:0",
      false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_NE(j["pool_config"].get<std::string>().find("fast_cache_blocks:0"), std::string::npos);
}

TEST(BenchAllocCli, BadInputNamesTheOption) {
  CliRun r = run("bench alloc --seconds 0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--seconds"), std::string::npos) << r.output;
  r = run("bench alloc --pool-config alignment:3");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("alignment"), std::string::npos) << r.output;
  // The thread cache is gone (docs/memory.md, "What the pool leaves out"): its keys are unknown.
  r = run("bench alloc --pool-config thread_cache_blocks:0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("unknown key 'thread_cache_blocks'"), std::string::npos) << r.output;
}

}  // namespace
