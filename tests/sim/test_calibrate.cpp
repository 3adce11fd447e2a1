// calibrate's pieces: the GEMM it times is a correct GEMM, the profile it
// builds from measurements is valid and says where each number came from, and
// bad options are clear errors. (The end-to-end run is in test_hw_cli.)
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "u3m/sim/calibrate.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/util/error.hpp"

namespace {

TEST(Calibrate, BlockedGemmMatchesNaive) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1, 1);
  for (int n : {1, 7, 64, 65, 130}) {
    std::vector<float> a(n * n), b(n * n), c(n * n, 123.0f), want(n * n, 0.0f);
    for (auto& x : a) x = d(rng);
    for (auto& x : b) x = d(rng);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int k = 0; k < n; ++k) s += double(a[i * n + k]) * b[k * n + j];
        want[i * n + j] = static_cast<float>(s);
      }
    u3m::sim::sgemm_blocked(n, a.data(), b.data(), c.data());
    for (int i = 0; i < n * n; ++i) ASSERT_NEAR(c[i], want[i], 1e-4 * n) << "n=" << n << " i=" << i;
  }
}

u3m::sim::Measurements sample() {
  u3m::sim::Measurements m;
  m.memcpy_bytes_per_s = 10.5e9;
  m.gemm_flops = 3.25e9;
  m.link_bytes_per_s = 8.125e9;
  m.link_latency_s = 3.5e-6;
  m.op_overhead_s = 4.25e-6;
  m.ssd_read_bytes_per_s = 1.5e9;
  m.ssd_write_bytes_per_s = 0.75e9;
  m.ssd_read_latency_s = 90e-6;
  m.ssd_write_latency_s = 30e-6;
  m.ssd_direct_io = true;
  m.dram_bytes = 16ull << 30;
  m.ssd_fs_bytes = 500'000'000'000;
  return m;
}

TEST(Calibrate, ProfileFromMeasurementsIsValidAndSourced) {
  u3m::sim::CalibrateOptions o;
  o.host = "testbox, 2 cores";
  o.date = "2025-01-02";
  o.hbm_capacity = 2ull << 30;
  const auto p0 = u3m::sim::profile_from_measurements(sample(), o);
  // Through the file format, as `u3m hw calibrate` writes it.
  const auto p = u3m::sim::parse_profile(u3m::sim::to_toml(p0), "local.toml");
  EXPECT_EQ(p.name, "local");
  EXPECT_DOUBLE_EQ(p.device.hbm_bandwidth.si, 21e9);  // traffic: 2 x bytes copied
  EXPECT_DOUBLE_EQ(p.device.peak_flops.si, 3.25e9);
  EXPECT_DOUBLE_EQ(p.device.matmul_efficiency.si, 1);
  EXPECT_DOUBLE_EQ(p.device.launch_overhead.si, 4.25e-6);
  EXPECT_DOUBLE_EQ(p.device.hbm_capacity.si, double(2ull << 30));
  EXPECT_DOUBLE_EQ(p.host_link.bandwidth_practical.si, 8.125e9);
  EXPECT_DOUBLE_EQ(p.host_link.latency.si, 3.5e-6);
  EXPECT_DOUBLE_EQ(p.ssd.read_bandwidth.si, 1.5e9);
  EXPECT_DOUBLE_EQ(p.ssd.write_latency.si, 30e-6);
  EXPECT_DOUBLE_EQ(p.host.dram_capacity.si, double(16ull << 30));
  EXPECT_DOUBLE_EQ(p.ssd.capacity.si, 500e9);
  EXPECT_NEAR(p.ssd.rated_dwpd(), 1.0, 1e-9);  // the stated assumption
  const std::string by = "on testbox, 2 cores by u3m hw calibrate, 2025-01-02";
  for (const auto& f : u3m::sim::param_fields()) {
    const std::string& s = f.at(p).source;
    if (f.section == "ssd" && (f.key == "endurance" || f.key == "warranty")) {
      // A directory does not tell its drive's rating: an assumption that says so.
      EXPECT_EQ(s.rfind("assumption, not measured", 0), 0u) << f.key << ": " << s;
      continue;
    }
    EXPECT_NE(s.find(by), std::string::npos) << f.key << ": " << s;
    if (f.key == "hbm_capacity")
      EXPECT_EQ(s.rfind("setting, not a measurement", 0), 0u) << s;
    else if (f.section == "network" || f.section == "pool")  // one machine has neither
      EXPECT_EQ(s.rfind("not measured " + by, 0), 0u) << f.key << ": " << s;
    else
      EXPECT_EQ(s.rfind("measured " + by, 0), 0u) << f.key << ": " << s;
  }
}

TEST(Calibrate, ValuesKeepFourSignificantDigits) {
  u3m::sim::CalibrateOptions o;
  o.host = "h";
  o.date = "d";
  auto m = sample();
  m.gemm_flops = 3.14159265e9;
  const auto p = u3m::sim::profile_from_measurements(m, o);
  EXPECT_EQ(p.device.peak_flops.value, 3.142);
  EXPECT_EQ(p.device.peak_flops.unit, "GFLOPS");
}

TEST(Calibrate, BadOptionsAreInputErrors) {
  u3m::sim::CalibrateOptions o;
  o.seconds = 0;
  EXPECT_THROW(u3m::sim::measure_machine(o), u3m::InputError);
  o.seconds = 1;
  o.dir = "/nonexistent/u3m-calibrate";
  try {
    u3m::sim::measure_machine(o);
    FAIL() << "no error";
  } catch (const u3m::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--dir: '/nonexistent/u3m-calibrate' is not a directory"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
