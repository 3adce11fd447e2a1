// `u3m bench copy`: bandwidth of device-emu's memcpy_async + synchronize_stream
// for host->device and device->host copies, next to plain memcpy between the
// very same buffers, measured in the same run (the machine's own limit).
//
// Note [Measuring copies on a shared machine]
// Backend and reference alternate in short slices, one of each per round, so
// a neighbour's burst of load hits both alike. The ratio is the median over
// rounds of backend / reference within the round, not a ratio of medians:
// on the 2-core dev VM a 16 MiB copy (16 MiB source + 16 MiB destination, the
// size of its L3) swings 3x with other processes' cache and CPU use, and
// memcpy timed against itself with unpaired 36 ms slices and a ratio of
// medians (the old method) gave 70-119% there at load 2.5, while the paired
// median stayed at 98-103% at loads 2.5-4 (docs/memory.md). Each round swaps
// which side goes first (ABBA), so a steady drift in load favours neither.
// Both sides run the same glibc memcpy on the same buffers: its non-temporal
// threshold on that VM is 240 MiB, so neither uses streaming stores at these
// sizes, and 4 MiB engine chunks take the same path as one large copy.
// --path picks the backend side: sync (default) is memcpy_sync, the path the
// runtime's transfers take (Note [Synchronous copies] in device_emu.cpp);
// async is memcpy_async + synchronize_stream, where the waiting caller runs
// queued copies itself when the engine has not started them (Note [A waiting
// caller runs the copy]); engine leaves every copy to the engine thread,
// hand-offs included. All three are device-emu's own work around the same
// memcpy; the share of copies the calling thread ran is reported per figure.
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
  double seconds = 10;
  int rounds = 41;
  std::string path = "sync";  // sync | async | engine
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

// The q-quantile of sorted (non-empty) values, interpolating between ranks.
double quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * double(sorted.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - double(lo)) * (sorted[hi] - sorted[lo]);
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
  dopt.caller_runs_queued = a.path != "engine";
  const bool sync = a.path == "sync";
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
        if (sync) {
          check(dev.memcpy_sync(op.dst, size, op.src, size, op.kind), "memcpy_sync");
          return;
        }
        check(dev.memcpy_async(op.dst, size, op.src, size, op.kind, stream), "memcpy_async");
        check(dev.synchronize_stream(stream), "synchronize_stream");
      };
      auto reference = [&] { std::memcpy(op.dst, op.src, size); };
      backend();  // warm the engine and the caches alike for both
      reference();
      std::vector<double> b, r, ratios;
      const mem::DeviceEmuRunStats ran0 = dev.run_stats();
      nlohmann::json rounds = nlohmann::json::array();
      for (int i = 0; i < a.rounds; ++i) {
        double x = 0, y = 0;
        if (i % 2 == 0) {
          x = measure(backend, size, slice);
          y = measure(reference, size, slice);
        } else {
          y = measure(reference, size, slice);
          x = measure(backend, size, slice);
        }
        b.push_back(x);
        r.push_back(y);
        ratios.push_back(x / y);
        rounds.push_back({x, y});
      }
      const mem::DeviceEmuRunStats ran1 = dev.run_stats();
      const double by_caller = double(ran1.by_caller - ran0.by_caller);
      const double by_all = by_caller + double(ran1.by_engine - ran0.by_engine);
      std::vector<double> sorted = ratios;
      std::sort(sorted.begin(), sorted.end());
      results.push_back({{"op", op.name},
                         {"size", size},
                         {"bandwidth_gbps", median(b)},
                         {"reference_gbps", median(r)},
                         {"ratio", median(ratios)},
                         {"ratio_q1_q3", {quantile(sorted, 0.25), quantile(sorted, 0.75)}},
                         {"caller_ran_share", by_all > 0 ? by_caller / by_all : 0.0},
                         {"rounds_gbps", rounds}});
    }
  }
  check(dev.destroy_stream(stream), "destroy stream");
  check(dev.free(dbuf), "device free");
  check(host.free(hbuf), "host free");

  const std::string where = machine();
  const bool pinned = host.capabilities().pinned;
  const char* path_text =
      a.path == "sync"
          ? "device-emu memcpy_sync (the copy on the calling thread, as the runtime's transfer "
            "workers copy)"
      : a.path == "async"
          ? "device-emu memcpy_async + synchronize_stream on one stream (a waiting caller runs "
            "queued copies itself: by caller / caller_ran_share)"
          : "device-emu memcpy_async + synchronize_stream on one stream, the copy engine thread "
            "running every copy";
  const std::string method = fmt::format(
      "{} vs plain memcpy between the same buffers; {} rounds of one ~{:.0f} ms slice each, order "
      "swapped every round; bandwidths are medians over rounds, ratio the median of each round's "
      "backend/reference; GB/s = 1e9 bytes/s",
      path_text, a.rounds, slice * 1e3);
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
    out["path"] = a.path;
    out["caller_runs_queued"] = dopt.caller_runs_queued;
    out["seconds"] = a.seconds;
    out["results"] = results;
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("u3m bench copy: measured on {}\n{}\n", where, method);
  fmt::print(
      "host buffer pinned: {}; link throttle: {}; hand-off spin: {} us; chunk: {}; waiting "
      "caller runs queued copies: {}\n\n",
      pinned ? "yes" : "no (mlock refused)",
      a.throttle_gbps > 0 ? fmt::format("{} GB/s per direction", a.throttle_gbps)
                          : std::string("none"),
      a.spin_us, human_bytes(dopt.chunk_bytes), dopt.caller_runs_queued ? "yes" : "no");
  fmt::print("{:<4} {:>8} {:>15} {:>12} {:>6} {:>13} {:>10}\n", "op", "size", "device-emu GB/s",
             "memcpy GB/s", "ratio", "ratio q1-q3", "by caller");
  for (const auto& r : results) {
    const auto& q = r["ratio_q1_q3"];
    fmt::print("{:<4} {:>8} {:>15.2f} {:>12.2f} {:>5.0f}% {:>6.0f}-{:>3.0f}% {:>9.0f}%\n",
               r["op"].get<std::string>(), human_bytes(r["size"].get<std::uint64_t>()),
               r["bandwidth_gbps"].get<double>(), r["reference_gbps"].get<double>(),
               100 * r["ratio"].get<double>(), 100 * q[0].get<double>(), 100 * q[1].get<double>(),
               100 * r["caller_ran_share"].get<double>());
  }
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
  cmd->add_option("--path", args->path,
                  "Which copy path: sync (memcpy_sync, the runtime's), async (memcpy_async + "
                  "synchronize_stream; the waiting caller may run queued copies) or engine "
                  "(the same, the engine thread alone)")
      ->check(CLI::IsMember({"sync", "async", "engine"}))
      ->capture_default_str();
  cmd->callback([args] { run_copy_bench(*args); });
}

}  // namespace u3m::cli
