// End to end: `u3m bench copy --json` reports every requested (op, size) with
// figures consistent with its raw rounds, on device-emu and, through the test
// doubles, on the cuda and acl backends; `u3m doctor` lists the backends with
// their reasons; bad input fails with one line naming the option (exit 2).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "cli_testing.hpp"

#include <cstdlib>

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
  const CliRun r = run(
      "bench copy --backend device-emu --json --sizes 64K,1MiB --seconds 0.2 --rounds 3", false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_NE(j["figures"].get<std::string>().find("measured on"), std::string::npos);
  EXPECT_TRUE(j.contains("machine"));
  EXPECT_TRUE(j.contains("method"));
  EXPECT_TRUE(j["caller_runs_queued"].get<bool>());
  EXPECT_EQ(j["backend"], "device-emu");
  EXPECT_FALSE(j["test_double"].get<bool>());
  EXPECT_TRUE(j["profile"].is_null());  // device-emu: no link limit unless --profile
  EXPECT_NE(j["reference"].get<std::string>().find("memcpy"), std::string::npos);
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
  const std::set<std::pair<std::string, std::uint64_t>> want = {{"h2d", 65536},   {"d2h", 65536},
                                                                {"d2d", 65536},   {"h2d", 1048576},
                                                                {"d2h", 1048576}, {"d2d", 1048576}};
  EXPECT_EQ(seen, want);
}

// Who runs the copies, by --path: the caller itself (sync), or the engine
// thread alone (engine).
TEST(BenchCopyCli, PathDecidesWhoRunsTheCopies) {
  for (const auto& [path, share] : {std::pair{"sync", 1.0}, std::pair{"engine", 0.0}}) {
    const CliRun r = run(
        std::string(
            "bench copy --backend device-emu --json --sizes 64K --seconds 0.1 --rounds 1 --path ") +
            path,
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
      run("bench copy --backend device-emu --json --sizes 1M --ops h2d,d2h --seconds 0.2 --rounds "
          "1 --throttle-gbps 1",
          false);
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
  r = run("bench copy --backend tpu");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.output,
            "u3m: error: --backend: unknown backend 'tpu' (choose auto, device-emu, cuda, acl)\n");
  r = run("bench copy --ops h2d,x2y");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--ops: item 2: 'x2y'"), std::string::npos) << r.output;
}

// Sets environment variables for the CLI runs of one test (children inherit).
class ScopedEnv {
 public:
  void set(const char* name, const std::string& value) {
    setenv(name, value.c_str(), 1);
    names_.push_back(name);
  }
  ~ScopedEnv() {
    for (const char* n : names_) unsetenv(n);
  }

 private:
  std::vector<const char*> names_;
};

// The cuda and acl backends through their test doubles: the same bench, the
// runtime's own copy as the reference, the profile's link limit beside it,
// and the figures labelled as the double's.
TEST(BenchCopyCli, AcceleratorBackendsRunThroughTheirDoubles) {
  ScopedEnv env;
  env.set("U3M_CUDART_LIBRARY", U3M_CUDA_DOUBLE);
  env.set("U3M_CUDA_DRIVER_LIBRARY", U3M_CUDA_DOUBLE);
  env.set("U3M_ACL_LIBRARY", U3M_ACL_DOUBLE);
  struct Want {
    const char* backend;
    const char* reference;
    const char* profile;
    double link_gbps;      // the profile's practical host link
    double hbm_half_gbps;  // d2d: half the profile's HBM bandwidth (read + write)
  };
  for (const Want& w : {Want{"cuda", "cudaMemcpy", "nvidia-h200", 50, 2400},
                        Want{"acl", "aclrtMemcpy", "ascend-910b-32g", 25, 800}}) {
    const CliRun r = run(std::string("bench copy --json --sizes 64K,1M --seconds 0.2 --rounds 3 "
                                     "--backend ") +
                             w.backend,
                         false);
    ASSERT_EQ(r.status, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j["backend"], w.backend);
    EXPECT_TRUE(j["test_double"].get<bool>());
    EXPECT_NE(j["figures"].get<std::string>().find("test double"), std::string::npos);
    EXPECT_NE(j["reference"].get<std::string>().find(w.reference), std::string::npos);
    EXPECT_EQ(j["path"], "async");
    EXPECT_TRUE(j["host_buffer_pinned"].get<bool>());
    EXPECT_EQ(j["profile"]["name"], w.profile);
    ASSERT_EQ(j["results"].size(), 6u);  // h2d, d2h, d2d at two sizes
    for (const auto& res : j["results"]) {
      const double bw = res["bandwidth_gbps"];
      EXPECT_GT(bw, 0);
      EXPECT_GT(res["reference_gbps"].get<double>(), 0);
      EXPECT_TRUE(res["caller_ran_share"].is_null());
      const double link = res["link_limit_gbps"];
      EXPECT_DOUBLE_EQ(link, res["op"] == "d2d" ? w.hbm_half_gbps : w.link_gbps);
      EXPECT_DOUBLE_EQ(res["vs_link"].get<double>(), bw / link);
    }
  }
  // auto prefers acl, the design's first target.
  const CliRun r = run("bench copy --json --sizes 64K --ops h2d --seconds 0.05 --rounds 1", false);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["backend"], "acl");
}

TEST(BenchCopyCli, UnavailableBackendIsOneLineAndAutoFallsBack) {
  ScopedEnv env;
  env.set("U3M_CUDART_LIBRARY", "/nonexistent/libcudart.so");
  env.set("U3M_ACL_LIBRARY", "/nonexistent/libascendcl.so");
  CliRun r = run("bench copy --backend cuda --sizes 64K");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("backend cuda unavailable: cuda: no CUDA runtime library"),
            std::string::npos)
      << r.output;
  r = run("bench copy --json --sizes 64K --ops h2d --seconds 0.05 --rounds 1", false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["backend"], "device-emu");
  ASSERT_EQ(j["auto_passed_over"].size(), 2u);
  EXPECT_NE(j["auto_passed_over"][0].get<std::string>().find("/nonexistent/libascendcl.so"),
            std::string::npos);
  EXPECT_NE(j["auto_passed_over"][1].get<std::string>().find("/nonexistent/libcudart.so"),
            std::string::npos);
}

TEST(BenchCopyCli, DeviceEmuOptionsAreRefusedElsewhere) {
  ScopedEnv env;
  env.set("U3M_CUDART_LIBRARY", U3M_CUDA_DOUBLE);
  env.set("U3M_CUDA_DRIVER_LIBRARY", U3M_CUDA_DOUBLE);
  CliRun r = run("bench copy --backend cuda --throttle-gbps 1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--throttle-gbps: applies to device-emu only"), std::string::npos)
      << r.output;
  r = run("bench copy --backend cuda --path engine");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--path: engine"), std::string::npos) << r.output;
}

TEST(BenchCopyCli, ProfileLinkLimitForDeviceEmu) {
  const CliRun r =
      run("bench copy --backend device-emu --profile nvidia-h200 --json --sizes 64K "
          "--ops d2h --seconds 0.05 --rounds 1",
          false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["profile"]["name"], "nvidia-h200");
  EXPECT_DOUBLE_EQ(j["results"][0]["link_limit_gbps"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(j["results"][0]["link_theoretical_gbps"].get<double>(), 63.0);
}

// doctor: every backend with its state and reason, the system probes, and
// one-line errors for bad flags. --python /nonexistent keeps it fast (no
// torch import) except in the one test of the torch line.
TEST(DoctorCli, JsonListsEveryBackendWithItsReason) {
  ScopedEnv env;
  env.set("U3M_CUDART_LIBRARY", U3M_CUDA_DOUBLE);
  env.set("U3M_CUDA_DRIVER_LIBRARY", U3M_CUDA_DOUBLE);
  env.set("U3M_ACL_LIBRARY", "/nonexistent/libascendcl.so");
  const CliRun r = run("doctor --json --python /nonexistent/python3", false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["backends"].size(), 3u);
  EXPECT_EQ(j["backends"][0]["name"], "device-emu");
  EXPECT_TRUE(j["backends"][0]["available"].get<bool>());
  const auto& cuda = j["backends"][1];
  EXPECT_EQ(cuda["name"], "cuda");
  EXPECT_TRUE(cuda["available"].get<bool>()) << cuda.dump();
  EXPECT_TRUE(cuda["test_double"].get<bool>());
  EXPECT_TRUE(cuda["vmm"].get<bool>());
  EXPECT_NE(cuda["detail"].get<std::string>().find("test double"), std::string::npos);
  const auto& acl = j["backends"][2];
  EXPECT_EQ(acl["name"], "acl");
  EXPECT_FALSE(acl["available"].get<bool>());
  EXPECT_NE(acl["detail"].get<std::string>().find("acl: no AscendCL library"), std::string::npos);
  EXPECT_TRUE(j["io"]["io_uring"].contains("ok"));
  EXPECT_TRUE(j["io"]["o_direct"].contains("detail"));
  EXPECT_TRUE(j["memory"]["mlock"].contains("can_lock"));
  EXPECT_TRUE(j["memory"]["membarrier"].contains("ok"));
  EXPECT_TRUE(j["memory"]["huge_pages"].contains("transparent"));
  EXPECT_EQ(j["torch"]["status"], "not found");
  EXPECT_EQ(j["ssd"]["dir"], "/tmp");
  EXPECT_GT(j["ssd"]["free_bytes"].get<std::uint64_t>(), 0u);
}

TEST(DoctorCli, TextNamesTorchAndTheSsdDirectory) {
  ScopedEnv env;
  env.set("U3M_CUDART_LIBRARY", "/nonexistent/libcudart.so");
  env.set("U3M_ACL_LIBRARY", "/nonexistent/libascendcl.so");
  const CliRun r = run("doctor");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("cuda       unavailable cuda: no CUDA runtime library"),
            std::string::npos)
      << r.output;
  // Debian's python3-torch where it is installed, else "not found": either way one line.
  const bool found = r.output.find("torch      not found") != std::string::npos ||
                     r.output.find("via /usr/bin/python3") != std::string::npos ||
                     r.output.find("torch      not importable") != std::string::npos;
  EXPECT_TRUE(found) << r.output;
  EXPECT_NE(r.output.find("ssd dir    /tmp ("), std::string::npos) << r.output;
}

TEST(DoctorCli, BadFlagsExit2NamingTheFlag) {
  CliRun r = run("doctor --jsn");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("--jsn"), std::string::npos) << r.output;
  r = run("doctor --ssd-dir /nonexistent/dir --python /nonexistent");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.output, "u3m: error: --ssd-dir: /nonexistent/dir: not a directory\n");
}

}  // namespace
