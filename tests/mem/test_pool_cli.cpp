// End to end: `u3m bench alloc --json` reports every requested size with
// consistent figures and says whether the pool had its thread cache; bad
// input fails with a message naming the option.
#include <set>
#include <string>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "cli_testing.hpp"
#include "u3m/mem/pool.hpp"

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
  // The default pool keeps one, where the kernel allows it (Note [Thread cache]).
  EXPECT_EQ(j["thread_cache"].get<bool>(), u3m::mem::DevicePool::thread_caches_supported());
  std::set<std::uint64_t> sizes;
  for (const auto& res : j["results"]) {
    sizes.insert(res["size"].get<std::uint64_t>());
    const double ns = res["ns_per_op"], ref = res["reference_ns_per_op"], ratio = res["ratio"];
    EXPECT_GT(ns, 0);
    EXPECT_GT(res["locked_ns_per_op"].get<double>(), 0);
    EXPECT_NEAR(ratio, ref / ns, 1e-9 * ratio);
  }
  EXPECT_EQ(sizes, (std::set<std::uint64_t>{512, 65536}));
}

TEST(BenchAllocCli, SaysWhenThePoolHasNoThreadCache) {
  const CliRun r =
      run("bench alloc --sizes 4K --seconds 0.03 --rounds 1 --pool-config thread_cache_blocks:0");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("NO THREAD CACHE"), std::string::npos) << r.output;
}

TEST(BenchAllocCli, BadInputNamesTheOption) {
  CliRun r = run("bench alloc --seconds 0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--seconds"), std::string::npos) << r.output;
  r = run("bench alloc --pool-config alignment:3");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("alignment"), std::string::npos) << r.output;
}

}  // namespace
