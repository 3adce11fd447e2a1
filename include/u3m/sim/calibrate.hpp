// `u3m hw calibrate`: measures this machine as the emulated device sees it and
// writes a `local` profile, so the simulator can be checked against real runs
// (issue 5, sim-versus-real).
//
// Note [What calibrate measures]
// On a CPU-only machine the device tier is device-emu: an arena in host memory
// reached through copy-engine threads. So
//   - HBM and DRAM bandwidth  = memcpy between large buffers, counted as
//     traffic (2 x bytes copied: each byte is read and written);
//   - host and peer link      = device-emu memcpy_async + synchronize for large
//     copies (bandwidth) and 4 KiB copies (latency);
//   - launch overhead         = one empty record_event + synchronize_event
//     round trip on device-emu, the fixed cost of any enqueued work;
//   - FLOP rate               = a blocked float32 GEMM on one thread, with
//     efficiency 1 (the measured rate is already the achieved one);
//   - SSD                     = the SSD store (io_uring, O_DIRECT where the
//     file system allows) in --dir: sequential 4 MiB puts and gets, and
//     4 KiB put/get latency;
//   - DRAM capacity           = physical memory reported by the OS;
//   - HBM capacity            = the emulated device's budget (--hbm-capacity),
//     a setting, not a measurement, and its source says so.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "u3m/sim/profile.hpp"

namespace u3m::sim {

struct CalibrateOptions {
  std::string dir = "/var/tmp";  // where the SSD test file goes
  double seconds = 10;           // total measuring time, split over the steps
  std::string_view seconds_flag = "--seconds";  // what errors call `seconds`
  std::uint64_t hbm_capacity = 4ull << 30;
  std::string host;  // machine label for sources, e.g. "box, 2 cores"
  std::string date;  // "2025-06-01"
  std::function<void(std::string_view step)> progress;  // optional
};

struct Measurements {
  double memcpy_bytes_per_s = 0;  // bytes copied per second (not traffic)
  double gemm_flops = 0;          // FLOP/s, one thread
  double link_bytes_per_s = 0;    // device-emu h2d copies
  double link_latency_s = 0;      // 4 KiB device-emu copy round trip
  double op_overhead_s = 0;       // empty event round trip
  double ssd_read_bytes_per_s = 0, ssd_write_bytes_per_s = 0;
  double ssd_read_latency_s = 0, ssd_write_latency_s = 0;
  bool ssd_direct_io = false;
  std::uint64_t ssd_fs_bytes = 0;  // size of the SSD directory's file system (0 = unknown)
  std::uint64_t dram_bytes = 0;
};

// Runs every step. Throws InputError for a bad option (e.g. --dir missing).
Measurements measure_machine(const CalibrateOptions& options);

// The `local` profile from measurements; every source names the host, the
// tool and the date.
HwProfile profile_from_measurements(const Measurements& m, const CalibrateOptions& options);

// C = A * B for row-major n x n float matrices (C overwritten). Blocked for
// cache; the compiler vectorises the inner loop. Exposed for its test.
void sgemm_blocked(int n, const float* a, const float* b, float* c);

}  // namespace u3m::sim
