// `u3m bench copy`: bandwidth of device-emu's memcpy_async + synchronize_stream
// for host->device and device->host copies, next to plain memcpy between the
// very same buffers, measured in the same run (the machine's own limit).
//
// Note [Measuring copies on a shared machine]
// Backend and reference alternate in short slices (rounds), so a neighbour's
// burst of load hits both alike; each figure is the median over rounds. Every
// backend copy is followed by synchronize_stream, so the figure includes the
// hand-off to the copy engine and back, as a caller that waits would see it.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "u3m/mem/device_emu.hpp"
#include "u3m/mem/host.hpp"
#include "u3m/util/error.hpp"

namespace u3m::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

struct CopyBenchArgs {
  bool json = false;
  std::string sizes = "64K,1M,4M,16M,64M";
  double seconds = 5;
  int rounds = 7;
  double throttle_gbps = 0;
  double spin_us = 50;
  std::string chunk = "4M";
};

// Runs `one` (one copy of `bytes`) repeatedly for about `slice` seconds, at
// least twice; returns GB/s (1e9 bytes/s).
template <typename F>
double measure(F&& one, std::uint64_t bytes, double slice) {
  auto t0 = Clock::now();
  std::uint64_t n = 0;
  double elapsed = 0;
  do {
    one();
    ++n;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (elapsed < slice || n < 2);
  return double(bytes) * double(n) / elapsed / 1e9;
}

void check(mem::Status s, const char* what) {
  if (!mem::ok(s))
    throw std::runtime_error(fmt::format("bench copy: {}: {}", what, mem::to_string(s)));
}

void run_copy_bench(const CopyBenchArgs& a) {
  std::vector<std::uint64_t> sizes = parse_size_list(a.sizes, "--sizes", 64ull << 30);
  if (a.seconds <= 0) input_error("--seconds", "must be > 0, got {}", a.seconds);
  if (a.rounds < 1) input_error("--rounds", "must be >= 1, got {}", a.rounds);
  if (a.throttle_gbps < 0) input_error("--throttle-gbps", "must be >= 0, got {}", a.throttle_gbps);
  if (a.spin_us < 0) input_error("--spin-us", "must be >= 0, got {}", a.spin_us);
  std::uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());

  mem::DeviceEmuOptions dopt;
  dopt.capacity = (max_size + 2 * MiB) / (2 * MiB) * (2 * MiB);
  dopt.throttle_bytes_per_s[static_cast<int>(mem::CopyKind::h2d)] = a.throttle_gbps * 1e9;
  dopt.throttle_bytes_per_s[static_cast<int>(mem::CopyKind::d2h)] = a.throttle_gbps * 1e9;
  dopt.spin_ns = static_cast<std::uint64_t>(a.spin_us * 1e3);
  if (a.spin_us == 0) dopt.sync_spin_ns = 0;
  dopt.chunk_bytes = parse_size(a.chunk, "--chunk", 64ull << 30);
  mem::DeviceEmuBackend dev(dopt);
  mem::HostBackend host({.capacity = max_size});
  void* dbuf = nullptr;
  void* hbuf = nullptr;
  check(dev.allocate(max_size, &dbuf), "device allocate");
  check(host.allocate(max_size, &hbuf), "host allocate");
  // Touch every page first, so neither side measures page faults.
  std::memset(hbuf, 0x5A, max_size);
  std::memset(dbuf, 0xA5, max_size);
  mem::Stream stream;
  check(dev.create_stream(&stream), "create stream");

  struct Op {
    const char* name;
    mem::CopyKind kind;
    void* dst;
    const void* src;
  };
  const Op ops[] = {{"h2d", mem::CopyKind::h2d, dbuf, hbuf},
                    {"d2h", mem::CopyKind::d2h, hbuf, dbuf}};
  const double slice = a.seconds / double(sizes.size() * 2 * 2 * a.rounds);

  nlohmann::json results = nlohmann::json::array();
  for (std::uint64_t size : sizes) {
    for (const Op& op : ops) {
      auto backend = [&] {
        check(dev.memcpy_async(op.dst, size, op.src, size, op.kind, stream), "memcpy_async");
        check(dev.synchronize_stream(stream), "synchronize_stream");
      };
      auto reference = [&] { std::memcpy(op.dst, op.src, size); };
      backend();  // warm the engine and the caches alike for both
      reference();
      std::vector<double> b, r;
      for (int i = 0; i < a.rounds; ++i) {
        b.push_back(measure(backend, size, slice));
        r.push_back(measure(reference, size, slice));
      }
      double bw = median(b), ref = median(r);
      results.push_back({{"op", op.name},
                         {"size", size},
                         {"bandwidth_gbps", bw},
                         {"reference_gbps", ref},
                         {"ratio", bw / ref}});
    }
  }
  check(dev.destroy_stream(stream), "destroy stream");
  check(dev.free(dbuf), "device free");
  check(host.free(hbuf), "host free");

  const std::string where = machine();
  const bool pinned = host.capabilities().pinned;
  const std::string method = fmt::format(
      "device-emu memcpy_async + synchronize_stream on one stream vs plain memcpy between the same "
      "buffers; {} alternating rounds of ~{:.0f} ms each, median; GB/s = 1e9 bytes/s",
      a.rounds, slice * 1e3);
  if (a.json) {
    nlohmann::json out;
    out["machine"] = where;
    out["figures"] = "measured on " + where;
    out["method"] = method;
    out["backend"] = "device-emu";
    out["host_buffer_pinned"] = pinned;
    out["throttle_gbps"] = a.throttle_gbps;  // 0 = unthrottled
    out["spin_us"] = a.spin_us;
    out["chunk_bytes"] = dopt.chunk_bytes;
    out["seconds"] = a.seconds;
    out["results"] = results;
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("u3m bench copy: measured on {}\n{}\n", where, method);
  fmt::print("host buffer pinned: {}; link throttle: {}; hand-off spin: {} us; chunk: {}\n\n",
             pinned ? "yes" : "no (mlock refused)",
             a.throttle_gbps > 0 ? fmt::format("{} GB/s per direction", a.throttle_gbps)
                                 : std::string("none"),
             a.spin_us, human_bytes(dopt.chunk_bytes));
  fmt::print("{:<4} {:>8} {:>14} {:>13} {:>7}\n", "op", "size", "device-emu GB/s", "memcpy GB/s",
             "ratio");
  for (const auto& r : results)
    fmt::print("{:<4} {:>8} {:>14.2f} {:>13.2f} {:>6.0f}%\n", r["op"].get<std::string>(),
               human_bytes(r["size"].get<std::uint64_t>()), r["bandwidth_gbps"].get<double>(),
               r["reference_gbps"].get<double>(), 100 * r["ratio"].get<double>());
}

}  // namespace

void add_bench_copy_command(CLI::App& bench) {
  auto args = std::make_shared<CopyBenchArgs>();
  auto* cmd = bench.add_subcommand(
      "copy", "Measure device-emu host<->device copy bandwidth next to plain memcpy (measured)");
  cmd->add_flag("--json", args->json, "Print JSON instead of a table");
  cmd->add_option("--sizes", args->sizes, "Comma-separated copy sizes (K, M, G = KiB, MiB, GiB)")
      ->capture_default_str();
  cmd->add_option("--seconds", args->seconds, "Approximate total measuring time")
      ->capture_default_str();
  cmd->add_option("--rounds", args->rounds, "Alternating rounds per figure (median reported)")
      ->capture_default_str();
  cmd->add_option("--throttle-gbps", args->throttle_gbps,
                  "Emulated link bandwidth per direction in GB/s (0 = unthrottled)")
      ->capture_default_str();
  cmd->add_option(
         "--spin-us", args->spin_us,
         "How long an idle copy engine spins for work before sleeping (0 = no spinning at all, "
         "synchronize included)")
      ->capture_default_str();
  cmd->add_option("--chunk", args->chunk, "Copy engine chunk size (K, M, G = KiB, MiB, GiB)")
      ->capture_default_str();
  cmd->callback([args] { run_copy_bench(*args); });
}

}  // namespace u3m::cli
