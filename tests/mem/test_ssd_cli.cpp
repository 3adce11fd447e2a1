// End to end: `u3m bench ssd` runs, reports labelled measured figures with the
// fio reference computed from them, and rejects bad options with a clear error.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_ssd_util.hpp"

namespace {

struct CliRun {
  int rc;
  std::string out;
};

CliRun u3m(const std::string& args) {
  const char* bin = std::getenv("U3M_BIN");
  if (!bin || !*bin) bin = U3M_BIN_PATH;
  std::string cmd = std::string(bin) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, ""};
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

bool have_fio() {
  return std::system("command -v fio >/dev/null 2>&1") == 0;
}

TEST(BenchSsdCli, JsonReportsEveryOpAndSizeWithTheReference) {
  u3m::mem::testing::ScratchDir dir;
  CliRun r = u3m("bench ssd --json --sizes 64K,1M --total-mb 4 --repeat 1 --dir " + dir.path());
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
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
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("measured on"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("reference: n/a (skipped (--no-fio))"), std::string::npos) << r.out;
}

TEST(BenchSsdCli, BadSizeIsAClearError) {
  CliRun r = u3m("bench ssd --sizes 64K,12Q --no-fio");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("--sizes item 2: '12Q' is not a size"), std::string::npos) << r.out;
  r = u3m("bench ssd --sizes 1000 --no-fio");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("not a multiple of 4 KiB"), std::string::npos) << r.out;
}

}  // namespace
