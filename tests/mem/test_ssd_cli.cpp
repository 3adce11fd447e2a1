// End to end: `u3m bench ssd` runs, reports labelled measured figures with the
// fio references (sequential and random at the same queue depth) computed from
// them, and rejects bad options, and a region the disk cannot hold, with a
// clear error. The runs use small explicit regions: the default is 8 GiB.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

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

// A tiny run (2 rounds of 0.05 s over 4 MiB, queue depth 4) that still goes
// through every step: both sides, every size and op, the per-pair ratios and
// their medians.
TEST(BenchSsdCli, JsonReportsEveryOpAndSizeWithPairedReference) {
  u3m::mem::testing::ScratchDir dir;
  CliRun r =
      u3m("bench ssd --json --sizes 64K,1M --rounds 2 --seconds 0.05 --region 4M --qd 4 --dir " +
          dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j.at("measured").get<bool>());
  EXPECT_NE(j.at("machine").get<std::string>().find("cores"), std::string::npos);
  EXPECT_NE(j.at("method").get<std::string>().find("same queue depth"), std::string::npos);
  EXPECT_EQ(j.at("checksum_failures").get<int>(), 0);
  // Both sides' I/O buffers are huge-page backed by default (Note [Huge-page
  // buffers] in cmd_bench_ssd.cpp), and the report says so.
  EXPECT_TRUE(j.at("huge_page_buffers").get<bool>());
  EXPECT_NE(j.at("method").get<std::string>().find("transparent huge pages"), std::string::npos);
  EXPECT_EQ(j.at("direct_io").get<bool>(), u3m::mem::testing::dir_supports_direct_io(dir));
  EXPECT_TRUE(j.at("verify_writes").get<bool>());  // the store's default, and the method says so
  EXPECT_NE(j.at("method").get<std::string>().find("every put is read back"), std::string::npos);
  const auto& res = j.at("results");
  ASSERT_EQ(res.size(), 4u);  // write and read for each of the two sizes
  const std::pair<const char*, std::uint64_t> want[] = {
      {"write", 64 * 1024}, {"read", 64 * 1024}, {"write", 1 << 20}, {"read", 1 << 20}};
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(res[i].at("op"), want[i].first);
    EXPECT_EQ(res[i].at("size").get<std::uint64_t>(), want[i].second);
    EXPECT_EQ(res[i].at("io_bytes").get<std::uint64_t>(), want[i].second);  // both <= 1 MiB
    EXPECT_EQ(res[i].at("queue_depth").get<unsigned>(), 4u);
    double bw = res[i].at("bandwidth_gbps").get<double>();
    EXPECT_GT(bw, 0);
    auto store = res[i].at("store_gbps_samples").get<std::vector<double>>();
    ASSERT_EQ(store.size(), 2u);
    EXPECT_NEAR(bw, (store[0] + store[1]) / 2, 1e-9);  // median of two
    // The engine never has more than --qd I/Os in flight.
    double depth = res[i].at("store_mean_depth").get<double>();
    EXPECT_GE(depth, 1.0);
    EXPECT_LE(depth, 4.0);
    if (have_fio()) {
      auto fio = res[i].at("reference_gbps_samples").get<std::vector<double>>();
      auto ratios = res[i].at("ratio_samples").get<std::vector<double>>();
      ASSERT_EQ(fio.size(), 2u);
      ASSERT_EQ(ratios.size(), 2u);
      for (int k = 0; k < 2; ++k) EXPECT_NEAR(ratios[k], store[k] / fio[k], 1e-9);
      EXPECT_NEAR(res[i].at("ratio").get<double>(), (ratios[0] + ratios[1]) / 2, 1e-9);
      EXPECT_DOUBLE_EQ(res[i].at("ratio_min").get<double>(), std::min(ratios[0], ratios[1]));
      EXPECT_DOUBLE_EQ(res[i].at("ratio_max").get<double>(), std::max(ratios[0], ratios[1]));
      // The random job at the same depth, beside the sequential one.
      auto rnd = res[i].at("random_reference_gbps_samples").get<std::vector<double>>();
      auto rnd_ratios = res[i].at("random_ratio_samples").get<std::vector<double>>();
      ASSERT_EQ(rnd.size(), 2u);
      for (int k = 0; k < 2; ++k) EXPECT_NEAR(rnd_ratios[k], store[k] / rnd[k], 1e-9);
      EXPECT_NEAR(res[i].at("random_ratio").get<double>(), (rnd_ratios[0] + rnd_ratios[1]) / 2,
                  1e-9);
    } else {
      EXPECT_TRUE(res[i].at("reference_gbps").is_null());
      EXPECT_TRUE(res[i].at("ratio").is_null());
      EXPECT_TRUE(res[i].at("random_ratio").is_null());
    }
  }
  EXPECT_EQ(j.at("config").at("region_bytes").get<std::uint64_t>(), 4u << 20);
  // Nothing left behind in the measured directory.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(BenchSsdCli, TextWithoutFioSaysReferenceNa) {
  u3m::mem::testing::ScratchDir dir;
  CliRun r = u3m("bench ssd --no-fio --sizes 64K --rounds 1 --seconds 0.05 --region 1M --dir " +
                 dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("measured on"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("reference: n/a (skipped (--no-fio))"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fio rand"), std::string::npos) << r.output;
}

TEST(BenchSsdCli, JsonWithoutFioHasNullReference) {
  u3m::mem::testing::ScratchDir dir;
  CliRun r =
      u3m("bench ssd --json --no-fio --sizes 64K --rounds 1 --seconds 0.05 --region 1M "
          "--dir " +
          dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j.at("reference").is_null());
  EXPECT_EQ(j.at("reference_note"), "skipped (--no-fio)");
  for (const auto& res : j.at("results")) {
    EXPECT_GT(res.at("bandwidth_gbps").get<double>(), 0);
    EXPECT_TRUE(res.at("ratio").is_null());
  }
}

TEST(BenchSsdCli, NoThpUsesSmallPagesAndSaysSo) {
  u3m::mem::testing::ScratchDir dir;
  CliRun r =
      u3m("bench ssd --json --no-fio --no-thp --sizes 64K --rounds 1 --seconds 0.05 --region 1M "
          "--dir " +
          dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_FALSE(j.at("huge_page_buffers").get<bool>());
  EXPECT_NE(j.at("method").get<std::string>().find("4 KiB pages (--no-thp) on both sides"),
            std::string::npos);
  EXPECT_EQ(j.at("checksum_failures").get<int>(), 0);
}

TEST(BenchSsdCli, NoVerifyWritesSkipsTheReadBackAndSaysSo) {
  u3m::mem::testing::ScratchDir dir;
  CliRun r =
      u3m("bench ssd --json --no-fio --no-verify-writes --sizes 64K --rounds 1 --seconds 0.05 "
          "--region 1M --dir " +
          dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_FALSE(j.at("verify_writes").get<bool>());
  EXPECT_NE(j.at("method").get<std::string>().find("not read back (--no-verify-writes)"),
            std::string::npos);
  EXPECT_EQ(j.at("checksum_failures").get<int>(), 0);  // gets still verify every extent
}

TEST(BenchSsdCli, BadSizeIsAClearError) {
  CliRun r = u3m("bench ssd --sizes 64K,12Q --no-fio");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--sizes item 2: '12Q' is not a size"), std::string::npos) << r.output;
  r = u3m("bench ssd --sizes 1000 --no-fio");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("not a multiple of 4 KiB"), std::string::npos) << r.output;
  r = u3m("bench ssd --rounds 0 --no-fio");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--rounds"), std::string::npos) << r.output;
  r = u3m("bench ssd --seconds 0 --no-fio");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--seconds"), std::string::npos) << r.output;
  r = u3m("bench ssd --region 12Q --no-fio");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--region"), std::string::npos) << r.output;
}

// statvfs first: a region the file system cannot hold is one line naming
// --region, the space needed and the space free, before anything is written.
TEST(BenchSsdCli, RegionPastTheFreeSpaceIsAClearError) {
  u3m::mem::testing::ScratchDir dir;
  CliRun r = u3m("bench ssd --no-fio --region 1000000G --dir " + dir.path());
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("--region: 1000000 GiB needs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("free in " + dir.path()), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
