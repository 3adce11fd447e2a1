// End to end: `u3m bench copy --json` reports every requested (op, size) with
// figures consistent with its raw rounds; bad input fails with a message
// naming the option.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "cli_testing.hpp"

namespace {

using u3m::testing::CliRun;
CliRun run(const std::string& args, bool with_stderr = true) {
  return u3m::testing::run_cli(args, with_stderr);
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];  // odd sizes only here
}

TEST(BenchCopyCli, JsonHasOneResultPerOpAndSize) {
  const CliRun r = run("bench copy --json --sizes 64K,1MiB --seconds 0.2 --rounds 3", false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_NE(j["figures"].get<std::string>().find("measured on"), std::string::npos);
  EXPECT_TRUE(j.contains("machine"));
  EXPECT_TRUE(j.contains("method"));
  EXPECT_TRUE(j["caller_runs_queued"].get<bool>());
  std::set<std::pair<std::string, std::uint64_t>> seen;
  for (const auto& res : j["results"]) {
    seen.emplace(res["op"].get<std::string>(), res["size"].get<std::uint64_t>());
    const double bw = res["bandwidth_gbps"], ref = res["reference_gbps"], ratio = res["ratio"];
    EXPECT_GT(bw, 0);
    EXPECT_GT(ref, 0);
    // Medians of the raw rounds; the ratio pairs each round's two slices.
    std::vector<double> b, rf, ratios;
    for (const auto& round : res["rounds_gbps"]) {
      b.push_back(round[0]);
      rf.push_back(round[1]);
      ratios.push_back(b.back() / rf.back());
    }
    ASSERT_EQ(ratios.size(), 3u);
    EXPECT_DOUBLE_EQ(bw, median_of(b));
    EXPECT_DOUBLE_EQ(ref, median_of(rf));
    EXPECT_DOUBLE_EQ(ratio, median_of(ratios));
    const double q1 = res["ratio_q1_q3"][0], q3 = res["ratio_q1_q3"][1];
    EXPECT_LE(q1, ratio);
    EXPECT_GE(q3, ratio);
    const double share = res["caller_ran_share"];
    EXPECT_GE(share, 0.0);
    EXPECT_LE(share, 1.0);
  }
  const std::set<std::pair<std::string, std::uint64_t>> want = {
      {"h2d", 65536}, {"d2h", 65536}, {"h2d", 1048576}, {"d2h", 1048576}};
  EXPECT_EQ(seen, want);
}

// Who runs the copies, by --path: the caller itself (sync), or the engine
// thread alone (engine).
TEST(BenchCopyCli, PathDecidesWhoRunsTheCopies) {
  for (const auto& [path, share] : {std::pair{"sync", 1.0}, std::pair{"engine", 0.0}}) {
    const CliRun r =
        run(std::string("bench copy --json --sizes 64K --seconds 0.1 --rounds 1 --path ") + path,
            false);
    ASSERT_EQ(r.status, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j["path"].get<std::string>(), path);
    for (const auto& res : j["results"]) {
      EXPECT_EQ(res["caller_ran_share"].get<double>(), share) << path;
    }
  }
}

TEST(BenchCopyCli, ThrottleShowsInTheFigures) {
  // 1 GB/s emulated link: 1 MiB copies cannot beat it (a lower-bound
  // behaviour check, with slack for the bound being per chunk).
  const CliRun r =
      run("bench copy --json --sizes 1M --seconds 0.2 --rounds 1 --throttle-gbps 1", false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["throttle_gbps"].get<double>(), 1.0);
  for (const auto& res : j["results"]) EXPECT_LE(res["bandwidth_gbps"].get<double>(), 1.25);
}

TEST(BenchCopyCli, BadSizesNameTheOption) {
  CliRun r = run("bench copy --sizes 64K,12Q");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--sizes item 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'12Q'"), std::string::npos) << r.output;
  r = run("bench copy --path dma");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--path"), std::string::npos) << r.output;
  r = run("bench copy --seconds 0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--seconds"), std::string::npos) << r.output;
}

}  // namespace
