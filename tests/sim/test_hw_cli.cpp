// `u3m hw show|calibrate` end to end: listings say the figures are nominal,
// errors name file, line and field, and calibrate writes a profile that loads
// back with every figure measured on this machine.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_testing.hpp"
#include "mem/test_ssd_util.hpp"
#include "u3m/sim/profile.hpp"

namespace {

using u3m::testing::CliRun;
CliRun u3m(const std::string& args) {
  return u3m::testing::run_cli(args);
}

TEST(HwCli, ShowListsBuiltinsAsNominal) {
  CliRun r = u3m("hw show");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("nominal figures, not measured"), std::string::npos) << r.output;
  for (const char* name : {"ascend-910b-32g", "ascend-910b-64g", "nvidia-h200"})
    EXPECT_NE(r.output.find(name), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("PCIe 4.0 x16"), std::string::npos) << r.output;
}

TEST(HwCli, ShowOnePrintsEverySource) {
  CliRun r = u3m("hw show nvidia-h200");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto p = u3m::sim::load_profile("nvidia-h200");
  for (const auto& f : u3m::sim::param_fields())
    EXPECT_NE(r.output.find(f.at(p).source), std::string::npos) << f.key;
  EXPECT_NE(r.output.find("roofline ridge (computed"), std::string::npos) << r.output;
}

TEST(HwCli, ShowJson) {
  CliRun r = u3m("hw show ascend-910b-32g --json");
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j.at("device").at("hbm_bandwidth").at("si").get<double>(), 1.6e12);
  EXPECT_EQ(j.at("peer_link").at("bandwidth_theoretical").at("value").get<double>(), 56);
  r = u3m("hw show --json");
  ASSERT_EQ(r.status, 0) << r.output;
  j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j.at("nominal").get<bool>());
  EXPECT_EQ(j.at("profiles").size(), 3u);
}

TEST(HwCli, BadProfileFileIsAClearError) {
  u3m::mem::testing::ScratchDir dir;
  const std::string path = dir.file("bad.toml");
  std::string text(u3m::sim::builtin_profile_text("nvidia-h200"));
  const std::string key = "read_latency = { value = 80";
  text.replace(text.find(key), key.size(), "read_latency = { value = -80");
  std::ofstream(path) << text;
  CliRun r = u3m("hw show " + path);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find(path + ":"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("field 'ssd.read_latency': value -80 must be a finite number above zero"),
            std::string::npos)
      << r.output;
  r = u3m("hw show no-such-profile");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("neither a built-in profile"), std::string::npos) << r.output;
}

TEST(HwCli, CalibrateWritesALoadableMeasuredProfile) {
  u3m::mem::testing::ScratchDir dir;
  const std::string out = dir.file("local.toml");
  CliRun r = u3m::testing::run_cli(
      "hw calibrate --json --seconds 0.3 --hbm-capacity 1G --dir " + dir.path() + " -o " + out,
      /*with_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j.at("measured").get<bool>());
  EXPECT_NE(j.at("machine").get<std::string>().find("cores"), std::string::npos);

  const auto p = u3m::sim::load_profile(out);
  EXPECT_EQ(p.name, "local");
  EXPECT_DOUBLE_EQ(p.device.hbm_capacity.si, double(1ull << 30));
  for (const auto& f : u3m::sim::param_fields()) {
    EXPECT_GT(f.at(p).si, 0) << f.key;
    if (f.section == "ssd" && (f.key == "endurance" || f.key == "warranty"))
      EXPECT_EQ(f.at(p).source.rfind("assumption, not measured", 0), 0u) << f.at(p).source;
    else if (f.section == "network" || f.section == "pool")  // one machine has neither
      EXPECT_EQ(f.at(p).source.rfind("not measured on ", 0), 0u) << f.key << ": " << f.at(p).source;
    else if (f.key != "hbm_capacity")
      EXPECT_EQ(f.at(p).source.rfind("measured on ", 0), 0u) << f.key << ": " << f.at(p).source;
  }
  // Only the profile is left behind: the SSD test file is removed.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator{}),
            1);
  // The text report labels the figures as measured on this machine.
  r = u3m("hw calibrate --seconds 0.2 --dir " + dir.path() + " -o " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("measured on "), std::string::npos) << r.output;
}

TEST(HwCli, CalibrateRejectsBadOptions) {
  CliRun r = u3m("hw calibrate --seconds 1");
  EXPECT_NE(r.status, 0) << r.output;  // -o is required
  u3m::mem::testing::ScratchDir dir;
  r = u3m("hw calibrate --dir /nonexistent/u3m -o " + dir.file("x.toml"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--dir: '/nonexistent/u3m' is not a directory"), std::string::npos)
      << r.output;
  r = u3m("hw calibrate --seconds -1 --dir " + dir.path() + " -o " + dir.file("x.toml"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--seconds"), std::string::npos) << r.output;
}

}  // namespace
