// u3m run replay: a trace replayed through the real runtime (device-emu,
// pinned host, optional SSD tier) under a device budget smaller than its
// footprint, with every byte checked (docs/runtime.md, "Replay").
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "run_watch.hpp"
#include "u3m/config/run_config.hpp"
#include "u3m/drive/replay.hpp"
#include "u3m/observe/metrics.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/trace/io.hpp"
#include "u3m/util/error.hpp"
#include "u3m/util/version.hpp"

namespace u3m::cli {
namespace {

struct ReplayArgs {
  std::string trace;
  std::string config;  // --config FILE
  std::string device_budget, host_budget, ssd_size, ssd_faults, pool_config;
  double device_fraction = 0.5;
  drive::ReplayOptions opt;
  bool json = false;
  int metrics_port = -1;  // -1 = no metrics server
  std::string timeline;   // "" = none
  bool diagnose = false;  // --diagnose
  std::string hw;         // --hw: the profile --diagnose places ops on the roofline of ("" = none)
  const CLI::App* cmd = nullptr;  // given flags: an empty size is an error, not the default
};

nlohmann::json tier_json(const mem::TierReport& r) {
  nlohmann::json j = {{"used_bytes", r.used},
                      {"capacity_bytes", r.capacity},
                      {"peak_bytes", r.peak},
                      {"level", mem::to_string(r.level)},
                      {"warnings", r.warnings},
                      {"criticals", r.criticals},
                      {"growth_bytes_per_s", r.growth_bytes_per_s}};
  auto secs = [](double s) { return std::isinf(s) ? nlohmann::json(nullptr) : nlohmann::json(s); };
  j["time_to_oom_s"] = secs(r.time_to_oom_s);
  j["min_time_to_oom_s"] = secs(r.min_time_to_oom_s);
  return j;
}

std::string tier_line(const char* name, const mem::TierReport& r) {
  auto secs = [](double s) {
    return std::isinf(s) ? std::string("never") : fmt::format("{:.3f} s", s);
  };
  std::string oom =
      fmt::format("{} now, shortest seen {}", secs(r.time_to_oom_s), secs(r.min_time_to_oom_s));
  return fmt::format(
      "  {:<6} peak {} of {} ({:.0f}%), now {}; level {} (warnings {}, critical {}); "
      "growth {}/s; time to OOM {}\n",
      name, approx_bytes(r.peak), approx_bytes(r.capacity),
      r.capacity ? 100.0 * double(r.peak) / double(r.capacity) : 0.0, approx_bytes(r.used),
      mem::to_string(r.level), r.warnings, r.criticals, approx_bytes(r.growth_bytes_per_s), oom);
}

// What the SSD tier's checks saw (issue 14's fault classes): injected by
// kind, and detected by the store and the engine.
nlohmann::json faults_json(const drive::ReplayReport& r) {
  nlohmann::json injected = nlohmann::json::object();
  for (std::size_t k = 0; k < mem::kIoFaultKinds; ++k)
    injected[std::string(mem::fault_name(static_cast<mem::IoFault>(k)))] = r.faults_injected[k];
  const engine::EngineStats& s = r.engine;
  return {{"injected", injected},
          {"store",
           {{"write_verify_failures", r.ssd.write_verify_failures},
            {"checksum_failures", r.ssd.checksum_failures},
            {"io_errors", r.ssd.io_errors},
            {"short_writes", r.ssd.short_writes},
            {"corrupt_retired", r.ssd.corrupt_retired},
            {"scrubbed_bytes", r.ssd.scrubbed_bytes},
            {"revalidations", r.ssd.revalidations}}},
          {"engine",
           {{"io_errors", s.io_errors},
            {"no_space", s.no_space},
            {"short_io", s.short_io},
            {"corrupt_reads", s.corrupt_reads},
            {"ssd_verifies", s.ssd_verifies},
            {"ssd_verify_failures", s.ssd_verify_failures},
            {"ssd_copies_failed", s.ssd_copies_failed}}}};
}

// The config file's fields that replay reads, each overridden by its flag.
config::Binder bind_config(ReplayArgs& a) {
  config::Binder b = config_binder(a.config, a.cmd);
  drive::ReplayOptions& o = a.opt;
  auto nonzero = [](std::uint64_t v) { return v ? std::optional(v) : std::nullopt; };
  auto same = [](const auto& v) { return v; };
  b.bind(U3M_CONFIG_FIELD(device.budget), "--device-budget", o.device_budget, same, nonzero);
  b.bind(U3M_CONFIG_FIELD(device.fraction), "--device-fraction", a.device_fraction);
  b.bind(U3M_CONFIG_FIELD(host.budget), "--host-budget", o.host_budget, same, nonzero);
  b.bind(U3M_CONFIG_FIELD(ssd.dir), "--ssd-dir", o.ssd_dir);
  b.bind(U3M_CONFIG_FIELD(ssd.size), "--ssd-size", o.ssd_capacity, same, nonzero);
  b.bind(
      U3M_CONFIG_FIELD(ssd.faults), "--ssd-faults", o.ssd_faults,
      [](const std::string& v) { return mem::FaultSpec::parse(v, "tiers.ssd.faults"); },
      [](const mem::FaultSpec& f) {
        return f.empty() ? std::nullopt : std::optional(f.describe());
      });
  b.bind(U3M_CONFIG_FIELD(links.h2d_gbps), "--h2d-gbps", o.h2d_gbps);
  b.bind(U3M_CONFIG_FIELD(links.d2h_gbps), "--d2h-gbps", o.d2h_gbps);
  b.bind(
      U3M_CONFIG_FIELD(pool), "--pool-config", o.pool,
      [](const std::string& v) { return mem::PoolConfig::parse(v, "pool.config"); },
      [](const mem::PoolConfig& p) { return p.describe(); });
  b.bind(U3M_CONFIG_FIELD(policy.tiering), "--policy", o.policy);
  b.bind(U3M_CONFIG_FIELD(policy.host_optimizer), "--host-optimizer", o.host_optimizer);
  b.bind(U3M_CONFIG_FIELD(prefetch.lookahead), "--lookahead", o.lookahead);
  b.bind(U3M_CONFIG_FIELD(hw), "--hw", a.hw);
  return b;
}

int run_replay(ReplayArgs& a) {
  constexpr std::uint64_t kMax = 1ull << 40;
  drive::ReplayOptions& o = a.opt;
  auto given = [&](std::string_view flag) { return a.cmd && a.cmd->count(std::string(flag)) > 0; };
  if (given("--device-budget"))
    o.device_budget = parse_size(a.device_budget, "--device-budget", kMax);
  if (given("--host-budget")) o.host_budget = parse_size(a.host_budget, "--host-budget", kMax);
  if (given("--ssd-size")) o.ssd_capacity = parse_size(a.ssd_size, "--ssd-size", kMax);
  if (given("--ssd-faults")) o.ssd_faults = mem::FaultSpec::parse(a.ssd_faults, "--ssd-faults");
  if (given("--pool-config")) o.pool = mem::PoolConfig::parse(a.pool_config, "--pool-config");
  const config::Binder cfg = bind_config(a);
  if (!(a.device_fraction > 0 && a.device_fraction <= 1))
    input_error("--device-fraction", "must be in (0, 1], got {}", a.device_fraction);
  o.device_fraction = a.device_fraction;
  if (o.h2d_gbps < 0 || o.d2h_gbps < 0) input_error("--h2d-gbps/--d2h-gbps", "must be >= 0");
  if (!o.ssd_faults.empty() && o.ssd_dir.empty())
    input_error("--ssd-faults", "needs an SSD tier (--ssd-dir, or tiers.ssd.dir in --config)");
  policy::find_tiering_policy(o.policy, "--policy");  // before the trace is read
  if (!a.hw.empty() && !a.diagnose)
    input_error("--hw", "is read by --diagnose only; add --diagnose");
  std::optional<sim::HwProfile> hw;
  if (!a.hw.empty()) hw = sim::load_profile(a.hw);
  trace::Trace t = trace::load_trace(a.trace);
  const bool tty = isatty(STDERR_FILENO) && !a.json;
  auto progress = [&](std::uint64_t done, std::uint64_t total) {
    if (tty) fmt::print(stderr, "\r  replaying: {}/{} events", done, total);
  };
  // docs/operators.md: metrics served while the replay runs, a timeline written after it.
  observe::Metrics metrics;
  RunWatch watch(a.timeline, a.diagnose);
  if (a.metrics_port >= 0) {
    const int port = metrics.serve(a.metrics_port);
    fmt::print(stderr, "u3m: serving metrics on http://127.0.0.1:{}/metrics\n", port);
    watch.add(&metrics);
  }
  o.observer = watch.observer();
  drive::ReplayReport r = drive::replay_trace(t, o, progress);
  // Diagnosis limits: the emulated links' throttles where set; memcpy speed
  // has no known limit here.
  std::array<double, engine::kNumLinks> limit{};
  limit[static_cast<int>(engine::Link::h2d)] = o.h2d_gbps * 1e9;
  limit[static_cast<int>(engine::Link::d2h)] = o.d2h_gbps * 1e9;
  const std::optional<observe::DiagnosisReport> diag = watch.finish(
      fmt::format("wall clock, measured on {}", machine()), limit, hw ? &*hw : nullptr);
  if (tty) fmt::print(stderr, "\r\033[K");
  if (!r.ssd_notice.empty()) fmt::print(stderr, "u3m: note: {}\n", r.ssd_notice);
  if (r.out_of_memory)
    input_error(a.trace,
                "{}; the budgets cannot hold this op: raise --device-budget (or "
                "--device-fraction) or --host-budget, or add an SSD tier with --ssd-dir",
                r.first_error);
  const engine::EngineStats& s = r.engine;
  const std::string where = fmt::format("measured on {}", machine());

  if (a.json) {
    nlohmann::json links = nlohmann::json::object();
    for (int l = 0; l < engine::kNumLinks; ++l) {
      const auto& ls = s.links[l];
      links[std::string(engine::to_string(engine::Link(l)))] = {
          {"transfers", ls.transfers},
          {"bytes", ls.bytes},
          {"failures", ls.failures},
          {"retries", ls.retries},
          {"busy_s", double(ls.busy_ns) * 1e-9}};
    }
    nlohmann::json j = {{"trace", a.trace},
                        {"measured_on", machine()},
                        {"version", kVersion},
                        {"config", cfg.effective()},
                        {"diagnosis", diag ? observe::Diagnosis::to_json(*diag) : nlohmann::json(nullptr)},
                        {"events", r.events},
                        {"ops", r.ops},
                        {"tensors", r.tensors},
                        {"footprint_bytes", r.footprint},
                        {"device_budget_bytes", r.device_budget},
                        {"host_budget_bytes", r.host_budget},
                        {"ssd_capacity_bytes", r.ssd_capacity},
                        {"policy", r.policy},
                        {"pool_config", r.pool_config},
                        {"lookahead_ops", o.lookahead},
                        {"bytes_written", r.bytes_written},
                        {"bytes_verified", r.bytes_verified},
                        {"mismatches", r.mismatches},
                        {"errors", r.errors},
                        {"first_error", r.first_error},
                        {"ok", r.ok()},
                        {"wall_s", r.wall_s},
                        {"acquires", s.acquires},
                        {"hits", s.hits},
                        {"misses", s.misses},
                        {"stall_s", double(s.stall_ns) * 1e-9},
                        {"prefetches", s.prefetches},
                        {"prefetch_hits", s.prefetch_hits},
                        {"evictions", s.evictions},
                        {"clean_drops", s.clean_drops},
                        {"lost_tensors", s.lost_tensors},
                        {"lost_bytes", s.lost_bytes},
                        {"faults", faults_json(r)},
                        {"links", links},
                        {"device", tier_json(r.device)},
                        {"host", tier_json(r.host)},
                        {"pool",
                         {{"peak_reserved_bytes", r.pool.peak_reserved_bytes},
                          {"peak_allocated_bytes", r.pool.peak_allocated_bytes},
                          {"fragmentation", r.pool.fragmentation},
                          {"segments", r.pool.segments}}}};
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("replay of {}: {} events, {} ops, {} tensors, policy {} ({})\n", a.trace, r.events,
               r.ops, r.tensors, r.policy, where);
    fmt::print(
        "  footprint {} (most bytes live at once); device budget {} ({:.0f}%), host {}, SSD {}\n",
        approx_bytes(r.footprint), approx_bytes(r.device_budget),
        100.0 * double(r.device_budget) / double(std::max<std::uint64_t>(r.footprint, 1)),
        approx_bytes(r.host_budget), r.ssd_capacity ? approx_bytes(r.ssd_capacity) : "none");
    fmt::print(
        "  data: {} written, {} read back and checked, {} mismatches, {} failed acquires -> {}\n",
        approx_bytes(r.bytes_written), approx_bytes(r.bytes_verified), r.mismatches, r.errors,
        r.ok() ? "OK" : "FAILED");
    if (!r.first_error.empty()) fmt::print("  first error: {}\n", r.first_error);
    fmt::print(
        "  wall {:.2f} s; acquires {} ({} hits, {} waited {:.1f} ms in all); prefetches {} ({} "
        "used)\n",
        r.wall_s, s.acquires, s.hits, s.misses, double(s.stall_ns) * 1e-6, s.prefetches,
        s.prefetch_hits);
    fmt::print("  evictions {} ({} clean, no write-back); lost tensors {}\n", s.evictions,
               s.clean_drops, s.lost_tensors);
    if (r.ssd_capacity) {
      std::uint64_t injected = 0;
      for (std::uint64_t n : r.faults_injected) injected += n;
      fmt::print(
          "  SSD checks: {} faults injected; the store caught {} at write read-back, {} at "
          "read checksums, {} I/O errors, and retired {} corrupt copies; the engine verified "
          "{} copies before dropping their upper copy ({} failed, upper kept)\n",
          injected, r.ssd.write_verify_failures, r.ssd.checksum_failures, r.ssd.io_errors,
          r.ssd.corrupt_retired, s.ssd_verifies, s.ssd_verify_failures);
    }
    fmt::print("  {:<5} {:>10} {:>12} {:>9} {:>8}\n", "link", "transfers", "bytes", "failures",
               "busy s");
    for (int l = 0; l < engine::kNumLinks; ++l) {
      const auto& ls = s.links[l];
      fmt::print("  {:<5} {:>10} {:>12} {:>9} {:>8.3f}\n", engine::to_string(engine::Link(l)),
                 ls.transfers, approx_bytes(ls.bytes), ls.failures, double(ls.busy_ns) * 1e-9);
    }
    fmt::print("monitor (warning 85%, critical 95% of each budget):\n");
    fmt::print("{}", tier_line("device", r.device));
    fmt::print("{}", tier_line("host", r.host));
    fmt::print(
        "device pool: peak reserved {}, peak allocated {}, fragmentation now {:.3f} "
        "(1 - largest free / free), {} segments\n",
        approx_bytes(r.pool.peak_reserved_bytes), approx_bytes(r.pool.peak_allocated_bytes),
        r.pool.fragmentation, r.pool.segments);
    if (diag) fmt::print("{}", observe::Diagnosis::to_text(*diag, where + ", wall clock"));
  }
  return r.ok() ? 0 : 3;
}

}  // namespace

void add_run_commands(CLI::App& app) {
  auto* run = app.add_subcommand("run", "Run workloads through the real three-tier runtime");
  run->require_subcommand(1);
  auto a = std::make_shared<ReplayArgs>();
  auto* rp = run->add_subcommand(
      "replay",
      "Replay a trace through the runtime (device-emu HBM, pinned host, optional SSD) under a "
      "device budget below its footprint. Every write fills a tensor with a pattern unique to "
      "(tensor, version) and every read checks it; exits 3 if any byte or acquire was wrong.");
  rp->add_option("trace", a->trace, "Trace file (.u3mt or .jsonl), e.g. from 'u3m trace gen'")
      ->required()
      ->check(CLI::ExistingFile);
  rp->add_option("--config", a->config,
                 "Run config, a TOML file (docs/config.md; examples/u3m.toml): tiers, budgets, "
                 "SSD, links, pool, policy, prefetch. A flag given here wins over the file")
      ->check(CLI::ExistingFile);
  rp->add_option("--device-budget", a->device_budget,
                 "Device budget, e.g. 8M (default: see --device-fraction)");
  rp->add_option("--device-fraction", a->device_fraction,
                 "Device budget as a fraction of the footprint")
      ->capture_default_str();
  rp->add_option("--host-budget", a->host_budget, "Host budget (default: the footprint)");
  rp->add_option("--ssd-dir", a->opt.ssd_dir,
                 "Directory for the SSD tier's store file (default: no SSD tier)")
      ->check(CLI::ExistingDirectory);
  rp->add_option("--ssd-size", a->ssd_size,
                 "SSD tier size (default: twice the footprint + 64 MiB)");
  rp->add_option("--ssd-faults", a->ssd_faults,
                 "Inject SSD faults, e.g. lost_write=0.01,bit_flip_on_read=0.02,seed=3 (kinds: "
                 "eio_on_write, enospc_on_write, short_write, bit_flip_on_read, eio_on_read, "
                 "lost_write, misdirected_write, torn_write); needs --ssd-dir");
  rp->add_option("--policy", a->opt.policy,
                 "Tiering policy, the same objects 'u3m train sim' simulates: " +
                     policy::tiering_policy_choices())
      ->capture_default_str();
  rp->add_option("--lookahead", a->opt.lookahead,
                 "lookahead policy: ops ahead whose tensors are prefetched (0 = none)")
      ->capture_default_str();
  rp->add_flag("--host-optimizer", a->opt.host_optimizer,
               "u3m and belady policies: run optimizer steps on the host tier");
  rp->add_option("--pool-config", a->pool_config,
                 "Device pool configuration, key:value,... (PyTorch's PYTORCH_CUDA_ALLOC_CONF "
                 "style; keys as in docs/memory.md), e.g. expandable_segments:false");
  rp->add_option("--h2d-gbps", a->opt.h2d_gbps, "Throttle host-to-device copies (GB/s, 0 = none)");
  rp->add_option("--d2h-gbps", a->opt.d2h_gbps, "Throttle device-to-host copies (GB/s, 0 = none)");
  rp->add_option("--max-events", a->opt.max_events, "Replay only the first N events (0 = all)");
  rp->add_flag("--json", a->json, "Print one JSON object");
  rp->add_option("--metrics-port", a->metrics_port,
                 "Serve Prometheus metrics on http://127.0.0.1:PORT/metrics while the replay "
                 "runs (0 = any free port, printed on stderr; docs/operators.md)")
      ->check(CLI::Range(0, 65535));
  rp->add_flag("--diagnose", a->diagnose,
               "Bandwidth diagnosis: bytes per link (against the --h2d-gbps/--d2h-gbps throttle "
               "where set), top 10 ops by bytes moved and by stall, transfer time hidden and "
               "exposed per steady-state step, and with --hw the ops' roofline bound "
               "(docs/operators.md)");
  rp->add_option("--hw", a->hw,
                 "Hardware profile (built-in name or TOML file) whose roofline --diagnose "
                 "classifies each op by: HBM-bound or compute-bound (default: none)");
  rp->add_option("--timeline", a->timeline,
                 "Write the run's timeline as Chrome trace / Perfetto JSON (trace-event format; "
                 "docs/operators.md)");
  rp->callback([a, rp] {
    a->cmd = rp;
    int rc = run_replay(*a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace u3m::cli
