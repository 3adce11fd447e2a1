// `u3m bench copy`: copy bandwidth of a device backend (--backend
// auto|device-emu|cuda|acl) for host->device, device->host and
// device->device copies, next to a physical reference measured in the same
// run between the very same buffers, and the link limit of a hardware
// profile beside both:
//   - cuda / acl: the runtime's own synchronous copy (cudaMemcpy /
//     aclrtMemcpy) between the same pinned host buffer (cudaHostAlloc /
//     aclrtMallocHost) and device buffers: the driver's own peak, which u3m's
//     streams must reach;
//   - device-emu: plain memcpy between the same buffers: the emulated
//     device's "link" is this machine's memory bandwidth.
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
// --path picks the backend side: sync is memcpy_sync, the path the runtime's
// transfers take (Note [Synchronous copies] in device_emu.cpp); async is
// memcpy_async + synchronize_stream on a stream of the backend's own (for
// device-emu the waiting caller runs queued copies itself when the engine has
// not started them, Note [A waiting caller runs the copy]); engine
// (device-emu only) leaves every copy to the engine thread, hand-offs
// included. auto is sync on device-emu and async on cuda and acl, where the
// stream is what u3m adds over the runtime's own copy. On device-emu all
// three are its own work around the same memcpy; the share of copies the
// calling thread ran is reported per figure.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "u3m/mem/backend_registry.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/util/error.hpp"

namespace u3m::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB;

struct CopyBenchArgs {
  bool json = false;
  std::string backend = "auto";
  int device = 0;
  std::string sizes = "64K,1M,4M,16M,64M";
  std::string ops = "h2d,d2h,d2d";
  double seconds = 10;
  int rounds = 41;
  std::string path = "auto";  // auto | sync | async | engine
  std::string profile;        // "" = by backend; "none" = no link limit
  // device-emu only:
  double throttle_gbps = 0;
  double spin_us = 50;
  std::string chunk = "4M";
  std::vector<CLI::Option*> emu_only;  // set when given, for the check below
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

void check(mem::Status s, const char* what, const mem::OpenedBackend& b) {
  if (mem::ok(s)) return;
  std::string detail = b.accel != nullptr ? b.accel->last_error() : std::string();
  throw std::runtime_error(fmt::format("bench copy: {}: {}{}", what, mem::to_string(s),
                                       detail.empty() ? "" : " (" + detail + ")"));
}

std::vector<mem::CopyKind> parse_ops(const std::string& list) {
  std::vector<mem::CopyKind> out;
  std::size_t start = 0, item = 1;
  for (;;) {
    std::size_t end = list.find(',', start);
    std::string op = list.substr(start, end == std::string::npos ? end : end - start);
    if (op == "h2d")
      out.push_back(mem::CopyKind::h2d);
    else if (op == "d2h")
      out.push_back(mem::CopyKind::d2h);
    else if (op == "d2d")
      out.push_back(mem::CopyKind::d2d);
    else
      input_error("--ops", "item {}: '{}' is not h2d, d2h or d2d", item, op);
    if (end == std::string::npos) break;
    start = end + 1;
    ++item;
  }
  return out;
}

// The link a copy kind crosses in the profile, in GB/s: the host link per
// direction for h2d/d2h; for d2d half the HBM bandwidth, since a copy reads
// and writes each byte and datasheets count both (Note [Profile numbers]).
struct LinkLimit {
  double practical = 0, theoretical = 0;
  std::string what;
};
LinkLimit link_limit(const sim::HwProfile& p, mem::CopyKind k) {
  if (k == mem::CopyKind::d2d)
    return {p.device.hbm_bandwidth.si / 2e9, p.device.hbm_bandwidth.si / 2e9,
            "HBM / 2 (read + write)"};
  return {p.host_link.bandwidth_practical.si / 1e9, p.host_link.bandwidth_theoretical.si / 1e9,
          p.host_link.kind};
}

void run_copy_bench(const CopyBenchArgs& a) {
  if (!mem::is_backend_choice(a.backend))
    input_error("--backend", "unknown backend '{}' (choose {})", a.backend,
                mem::backend_choices_text());
  std::vector<std::uint64_t> sizes = parse_size_list(a.sizes, "--sizes", 64ull << 30);
  const std::vector<mem::CopyKind> kinds = parse_ops(a.ops);
  if (a.seconds <= 0) input_error("--seconds", "must be > 0, got {}", a.seconds);
  if (a.rounds < 1) input_error("--rounds", "must be >= 1, got {}", a.rounds);
  if (a.throttle_gbps < 0) input_error("--throttle-gbps", "must be >= 0, got {}", a.throttle_gbps);
  if (a.spin_us < 0) input_error("--spin-us", "must be >= 0, got {}", a.spin_us);
  if (a.device < 0) input_error("--device", "must be >= 0, got {}", a.device);
  const std::uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());

  mem::OpenOptions oo;
  oo.device = a.device;
  oo.host_capacity = max_size;
  mem::DeviceEmuOptions& dopt = oo.emu;
  dopt.capacity = (2 * max_size + 2 * MiB) / (2 * MiB) * (2 * MiB);
  dopt.throttle_bytes_per_s[static_cast<int>(mem::CopyKind::h2d)] = a.throttle_gbps * 1e9;
  dopt.throttle_bytes_per_s[static_cast<int>(mem::CopyKind::d2h)] = a.throttle_gbps * 1e9;
  dopt.spin_ns = static_cast<std::uint64_t>(a.spin_us * 1e3);
  if (a.spin_us == 0) dopt.sync_spin_ns = 0;
  dopt.caller_runs_queued = a.path != "engine";
  dopt.chunk_bytes = parse_size(a.chunk, "--chunk", 64ull << 30);

  mem::OpenedBackend b;
  std::string why;
  if (!mem::ok(mem::open_backend(a.backend, oo, &b, &why)))
    throw std::runtime_error(fmt::format("bench copy: backend {} unavailable: {}", a.backend, why));
  const bool emu = b.name == "device-emu";
  if (!emu) {
    for (const CLI::Option* o : a.emu_only)
      if (o->count() > 0)
        input_error(o->get_name(), "applies to device-emu only (the backend is {})", b.name);
    if (a.path == "engine")
      input_error("--path", "engine is device-emu's copy thread; {} has none", b.name);
  }
  const std::string path = a.path != "auto" ? a.path : emu ? "sync" : "async";
  auto* dev_emu = emu ? static_cast<mem::DeviceEmuBackend*>(b.device.get()) : nullptr;
  mem::DeviceBackend& dev = *b.device;

  std::optional<sim::HwProfile> profile;
  const std::string profile_name = !a.profile.empty() ? a.profile
                                   : b.name == "cuda" ? "nvidia-h200"
                                   : b.name == "acl"  ? "ascend-910b-32g"
                                                      : "none";
  if (profile_name != "none") profile = sim::load_profile(profile_name);

  void* dbuf = nullptr;
  void* dbuf2 = nullptr;
  void* hbuf = nullptr;
  check(dev.allocate(max_size, &dbuf), "device allocate", b);
  check(dev.allocate(max_size, &dbuf2), "device allocate", b);
  check(b.host->allocate(max_size, &hbuf), "host allocate", b);
  // Touch every page first, so neither side measures page faults.
  std::memset(hbuf, 0x5A, max_size);
  if (emu) {
    std::memset(dbuf, 0xA5, max_size);
    std::memset(dbuf2, 0xA5, max_size);
  } else {
    check(b.accel->raw_memcpy(dbuf, max_size, hbuf, max_size, mem::CopyKind::h2d), "fill", b);
    check(b.accel->raw_memcpy(dbuf2, max_size, hbuf, max_size, mem::CopyKind::h2d), "fill", b);
  }
  mem::Stream stream;
  check(dev.create_stream(&stream), "create stream", b);

  auto buffers = [&](mem::CopyKind k) {
    switch (k) {
      case mem::CopyKind::h2d:
        return std::pair<void*, const void*>{dbuf, hbuf};
      case mem::CopyKind::d2h:
        return std::pair<void*, const void*>{hbuf, dbuf};
      default:
        return std::pair<void*, const void*>{dbuf2, dbuf};
    }
  };
  const double slice = a.seconds / double(sizes.size() * kinds.size() * 2 * a.rounds);

  nlohmann::json results = nlohmann::json::array();
  for (std::uint64_t size : sizes) {
    for (mem::CopyKind kind : kinds) {
      auto [dst, src] = buffers(kind);
      std::function<void()> backend = [&, dst = dst, src = src, kind = kind] {
        if (path == "sync") {
          check(dev.memcpy_sync(dst, size, src, size, kind), "memcpy_sync", b);
          return;
        }
        check(dev.memcpy_async(dst, size, src, size, kind, stream), "memcpy_async", b);
        check(dev.synchronize_stream(stream), "synchronize_stream", b);
      };
      std::function<void()> reference = [&, dst = dst, src = src, kind = kind] {
        if (emu)
          std::memcpy(dst, src, size);
        else
          check(b.accel->raw_memcpy(dst, size, src, size, kind), "reference copy", b);
      };
      backend();  // warm the engine and the caches alike for both
      reference();
      std::vector<double> bw, ref, ratios;
      const mem::DeviceEmuRunStats ran0 = emu ? dev_emu->run_stats() : mem::DeviceEmuRunStats{};
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
        bw.push_back(x);
        ref.push_back(y);
        ratios.push_back(x / y);
        rounds.push_back({x, y});
      }
      std::vector<double> sorted = ratios;
      std::sort(sorted.begin(), sorted.end());
      nlohmann::json r = {{"op", std::string(mem::to_string(kind))},
                          {"size", size},
                          {"bandwidth_gbps", median(bw)},
                          {"reference_gbps", median(ref)},
                          {"ratio", median(ratios)},
                          {"ratio_q1_q3", {quantile(sorted, 0.25), quantile(sorted, 0.75)}},
                          {"caller_ran_share", nullptr},
                          {"link_limit_gbps", nullptr},
                          {"link_theoretical_gbps", nullptr},
                          {"vs_link", nullptr},
                          {"rounds_gbps", rounds}};
      if (emu) {
        const mem::DeviceEmuRunStats ran1 = dev_emu->run_stats();
        const double by_caller = double(ran1.by_caller - ran0.by_caller);
        const double by_all = by_caller + double(ran1.by_engine - ran0.by_engine);
        r["caller_ran_share"] = by_all > 0 ? by_caller / by_all : 0.0;
      }
      if (profile) {
        const LinkLimit l = link_limit(*profile, kind);
        r["link_limit_gbps"] = l.practical;
        r["link_theoretical_gbps"] = l.theoretical;
        r["vs_link"] = median(bw) / l.practical;
      }
      results.push_back(std::move(r));
    }
  }
  check(dev.destroy_stream(stream), "destroy stream", b);
  check(dev.free(dbuf), "device free", b);
  check(dev.free(dbuf2), "device free", b);
  check(b.host->free(hbuf), "host free", b);

  const std::string where = machine();
  const bool pinned = b.host->capabilities().pinned;
  const bool on_double = b.accel != nullptr && b.accel->info().test_double;
  std::string backend_detail = "device-emu (emulated in host memory)";
  std::string host_alloc = pinned ? "mmap + mlock" : "mmap (mlock refused: pageable)";
  std::string reference_text =
      "plain memcpy between the same buffers: an emulated device's physical reference is this "
      "machine's memory bandwidth";
  if (!emu) {
    const mem::AccelInfo& i = b.accel->info();
    backend_detail =
        fmt::format("{}: {}, {}{}", i.name, i.device_name, i.library,
                    on_double ? " [u3m test double over host memory, not hardware]" : "");
    const bool cuda = b.name == "cuda";
    host_alloc = cuda ? "cudaHostAlloc" : "aclrtMallocHost";
    reference_text = fmt::format(
        "the runtime's own synchronous {} between the same pinned buffers (the driver's peak)",
        cuda ? "cudaMemcpy" : "aclrtMemcpy");
  }
  const char* path_text =
      path == "sync" ? "memcpy_sync (a synchronous copy on the calling thread, as the runtime's "
                       "transfer workers copy)"
      : path == "engine"
          ? "memcpy_async + synchronize_stream on one stream, the copy engine thread running every "
            "copy"
          : (emu ? "memcpy_async + synchronize_stream on one stream (a waiting caller runs queued "
                   "copies itself: by caller / caller_ran_share)"
                 : "memcpy_async + synchronize_stream on a stream of u3m's own");
  const std::string method = fmt::format(
      "{} {} vs {}; {} rounds of one ~{:.0f} ms slice each, order swapped every round; bandwidths "
      "are medians over rounds, ratio the median of each round's backend/reference; GB/s = 1e9 "
      "bytes/s",
      b.name, path_text, reference_text, a.rounds, slice * 1e3);
  const std::string figures =
      on_double
          ? "measured on " + where + " through the u3m test double (host memory, not hardware)"
          : "measured on " + where;
  nlohmann::json prof = nullptr;
  if (profile)
    prof = {{"name", profile->name},
            {"origin", profile->origin},
            {"host_link", profile->host_link.kind},
            {"host_link_practical_gbps", profile->host_link.bandwidth_practical.si / 1e9},
            {"host_link_theoretical_gbps", profile->host_link.bandwidth_theoretical.si / 1e9},
            {"hbm_gbps", profile->device.hbm_bandwidth.si / 1e9},
            {"note", "nominal figures from the profile, not measured"}};
  if (a.json) {
    nlohmann::json out;
    out["machine"] = where;
    out["figures"] = figures;
    out["method"] = method;
    out["backend"] = b.name;
    out["backend_detail"] = backend_detail;
    out["test_double"] = on_double;
    out["auto_passed_over"] = b.passed_over;
    out["reference"] = reference_text;
    out["host_buffer"] = host_alloc;
    out["host_buffer_pinned"] = pinned;
    out["profile"] = prof;
    out["throttle_gbps"] = a.throttle_gbps;  // 0 = unthrottled
    out["spin_us"] = a.spin_us;
    out["chunk_bytes"] = dopt.chunk_bytes;
    out["path"] = path;
    out["caller_runs_queued"] = emu ? nlohmann::json(dopt.caller_runs_queued) : nullptr;
    out["seconds"] = a.seconds;
    out["results"] = results;
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("u3m bench copy: {}\nbackend {}\n{}\n", figures, backend_detail, method);
  for (const std::string& p : b.passed_over) fmt::print("auto passed over: {}\n", p);
  if (emu)
    fmt::print(
        "host buffer: {}; link throttle: {}; hand-off spin: {} us; chunk: {}; waiting caller "
        "runs queued copies: {}\n",
        host_alloc,
        a.throttle_gbps > 0 ? fmt::format("{} GB/s per direction", a.throttle_gbps)
                            : std::string("none"),
        a.spin_us, human_bytes(dopt.chunk_bytes), dopt.caller_runs_queued ? "yes" : "no");
  else
    fmt::print("host buffer: {} (pinned)\n", host_alloc);
  if (profile)
    fmt::print(
        "link limit: profile {} (nominal, not measured): host link {} {:.1f} GB/s practical, "
        "{:.1f} GB/s theoretical per direction; d2d limit HBM {:.0f} GB/s / 2\n",
        profile->name, profile->host_link.kind, profile->host_link.bandwidth_practical.si / 1e9,
        profile->host_link.bandwidth_theoretical.si / 1e9, profile->device.hbm_bandwidth.si / 1e9);
  else
    fmt::print("link limit: none (no --profile; device-emu's physical reference is memcpy)\n");
  fmt::print("\n{:<4} {:>8} {:>13} {:>14} {:>6} {:>13} {:>10} {:>8} {:>10}\n", "op", "size",
             "backend GB/s", "reference GB/s", "ratio", "ratio q1-q3", "link GB/s", "vs link",
             "by caller");
  auto pct = [](const nlohmann::json& v) {
    return v.is_null() ? std::string("n/a") : fmt::format("{:.0f}%", 100 * v.get<double>());
  };
  for (const auto& r : results) {
    const auto& q = r["ratio_q1_q3"];
    fmt::print("{:<4} {:>8} {:>13.2f} {:>14.2f} {:>5.0f}% {:>6.0f}-{:>3.0f}% {:>10} {:>8} {:>10}\n",
               r["op"].get<std::string>(), human_bytes(r["size"].get<std::uint64_t>()),
               r["bandwidth_gbps"].get<double>(), r["reference_gbps"].get<double>(),
               100 * r["ratio"].get<double>(), 100 * q[0].get<double>(), 100 * q[1].get<double>(),
               r["link_limit_gbps"].is_null()
                   ? std::string("n/a")
                   : fmt::format("{:.1f}", r["link_limit_gbps"].get<double>()),
               pct(r["vs_link"]), pct(r["caller_ran_share"]));
  }
}

}  // namespace

void add_bench_copy_command(CLI::App& bench) {
  auto args = std::make_shared<CopyBenchArgs>();
  auto* cmd = bench.add_subcommand(
      "copy",
      "Measure a device backend's copy bandwidth next to its physical reference and the "
      "profile's link limit (measured)");
  cmd->add_flag("--json", args->json, "Print JSON instead of a table");
  cmd->add_option("--backend", args->backend,
                  "Device backend: auto (acl, then cuda, then device-emu), device-emu, cuda, acl")
      ->capture_default_str();
  cmd->add_option("--device", args->device, "cuda/acl device ordinal")->capture_default_str();
  cmd->add_option("--sizes", args->sizes, "Comma-separated copy sizes (K, M, G = KiB, MiB, GiB)")
      ->capture_default_str();
  cmd->add_option("--ops", args->ops, "Comma-separated copy directions: h2d, d2h, d2d")
      ->capture_default_str();
  cmd->add_option("--seconds", args->seconds, "Approximate total measuring time")
      ->capture_default_str();
  cmd->add_option("--rounds", args->rounds, "Alternating rounds per figure (median reported)")
      ->capture_default_str();
  cmd->add_option("--path", args->path,
                  "Which copy path: auto (sync on device-emu, async on cuda/acl), sync "
                  "(memcpy_sync, the runtime's), async (memcpy_async + synchronize_stream) or "
                  "engine (device-emu's engine thread alone)")
      ->check(CLI::IsMember({"auto", "sync", "async", "engine"}))
      ->capture_default_str();
  cmd->add_option("--profile", args->profile,
                  "Hardware profile (built-in name or TOML file) whose link limit is shown; "
                  "default nvidia-h200 for cuda, ascend-910b-32g for acl, none for device-emu");
  args->emu_only.push_back(
      cmd->add_option("--throttle-gbps", args->throttle_gbps,
                      "device-emu: emulated link bandwidth per direction in GB/s (0 = unthrottled)")
          ->capture_default_str());
  args->emu_only.push_back(
      cmd->add_option("--spin-us", args->spin_us,
                      "device-emu: how long an idle copy engine spins for work before sleeping "
                      "(0 = no spinning at all, synchronize included)")
          ->capture_default_str());
  args->emu_only.push_back(
      cmd->add_option("--chunk", args->chunk,
                      "device-emu: copy engine chunk size (K, M, G = KiB, MiB, GiB)")
          ->capture_default_str());
  cmd->callback([args] { run_copy_bench(*args); });
}

}  // namespace u3m::cli
