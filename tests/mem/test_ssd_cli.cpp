// End to end: `u3m bench ssd` runs, reports labelled measured figures with the
// fio reference computed from them, and rejects bad options with a clear error.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_testing.hpp"
#include "test_ssd_util.hpp"

namespace {

using u3m::testing::CliRun;
CliRun u3m(const std::string& args) {
  return u3m::testing::run_cli(args);
}

bool have_fio() {
  return std::system("command -v fio >/dev/null 2>&1") == 0;
}

TEST(BenchSsdCli, JsonReportsEveryOpAndSizeWithTheReference) {
  u3m::mem::testing::ScratchDir dir;
  CliRun r = u3m("bench ssd --json --sizes 64K,1M --total-mb 4 --repeat 1 --dir " + dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j.at("measured").get<bool>());
  EXPECT_NE(j.at("machine").get<std::string>().find("cores"), std::string::npos);
  EXPECT_EQ(j.at("checksum_failures").get<int>(), 0);
  EXPECT_EQ(j.at("direct_io").get<bool>(), u3m::mem::testing::dir_supports_direct_io(dir));
  const auto& res = j.at("results");
  ASSERT_EQ(res.size(), 4u);  // write and read for each of the two sizes
  const std::pair<const char*, std::uint64_t> want[] = {
      {"write", 64 * 1024}, {"read", 64 * 1024}, {"write", 1 << 20}, {"read", 1 << 20}};
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(res[i].at("op"), want[i].first);
    EXPECT_EQ(res[i].at("size").get<std::uint64_t>(), want[i].second);
    double bw = res[i].at("bandwidth_gbps").get<double>();
    EXPECT_GT(bw, 0);
    if (have_fio()) {
      double ref = res[i].at("reference_gbps").get<double>();
      EXPECT_GT(ref, 0);
      EXPECT_NEAR(res[i].at("ratio").get<double>(), bw / ref, 1e-9);
    } else {
      EXPECT_TRUE(res[i].at("reference_gbps").is_null());
    }
  }
  // Nothing left behind in the measured directory.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(BenchSsdCli, TextWithoutFioSaysReferenceNa) {
  u3m::mem::testing::ScratchDir dir;
  CliRun r = u3m("bench ssd --no-fio --sizes 64K --total-mb 1 --repeat 1 --dir " + dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("measured on"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("reference: n/a (skipped (--no-fio))"), std::string::npos) << r.output;
}

TEST(BenchSsdCli, BadSizeIsAClearError) {
  CliRun r = u3m("bench ssd --sizes 64K,12Q --no-fio");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--sizes item 2: '12Q' is not a size"), std::string::npos) << r.output;
  r = u3m("bench ssd --sizes 1000 --no-fio");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("not a multiple of 4 KiB"), std::string::npos) << r.output;
}

}  // namespace
