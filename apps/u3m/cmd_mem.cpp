// u3m mem plan: a static memory plan from a trace, compared with the dynamic
// pool replaying the same allocations (docs/memory.md ("Pool allocator")).
#include <fstream>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "u3m/mem/static_plan.hpp"
#include "u3m/trace/io.hpp"
#include "u3m/util/error.hpp"

namespace u3m::cli {
namespace {

struct PlanArgs {
  std::string trace;
  bool json = false;
  std::string pool_config;
  std::uint32_t samples = 256;
  std::string offsets;
};

std::string mib(std::uint64_t b) {
  return fmt::format("{:.2f} MiB", double(b) / double(mem::MiB));
}

void write_offsets(const mem::StaticPlan& p, const trace::Trace& t, const std::string& path) {
  std::ofstream out(path);
  if (!out) input_error(path, "cannot open for writing");
  out << "tensor,occurrence,start_event,end_event,bytes,size,offset\n";
  for (std::size_t i = 0; i < p.lifetimes.size(); ++i) {
    const mem::Lifetime& l = p.lifetimes[i];
    out << fmt::format("{},{},{},{},{},{},{}\n", t.tensors[l.tensor].name, l.occurrence, l.start,
                       l.end, l.bytes, p.sizes[i], p.offsets[i]);
  }
  if (!out) input_error(path, "write failed");
}

void run_plan(const PlanArgs& a) {
  mem::PoolConfig config = mem::PoolConfig::parse(a.pool_config, "--pool-config");
  if (a.samples == 0) input_error("--samples", "must be >= 1");
  trace::Trace t = trace::load_trace(a.trace);
  mem::PlanComparison c = mem::compare_static_dynamic(t, config, a.samples, a.trace);
  if (!a.offsets.empty()) write_offsets(c.plan, t, a.offsets);
  const mem::StaticPlan& p = c.plan;
  const char* figures =
      "computed from the trace, not measured: the static plan is an offline placement; the pool "
      "rows replay the trace's alloc/free order through DevicePool over a virtual address space "
      "(2 MiB granularity, nothing touched)";
  if (a.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& r : c.rows) {
      rows.push_back({{"allocator", r.name},
                      {"peak_bytes", r.peak_bytes},
                      {"fragmentation_at_max_live", r.fragmentation_at_max_live},
                      {"mean_fragmentation", r.mean_fragmentation},
                      {"source_calls", r.source_calls},
                      {"status", std::string(mem::to_string(r.status))}});
    }
    nlohmann::json out = {{"trace", a.trace},
                          {"figures", figures},
                          {"algorithm", p.algorithm},
                          {"pool_config", config.describe()},
                          {"alignment", p.alignment},
                          {"events", p.events},
                          {"lifetimes", p.lifetimes.size()},
                          {"max_live_bytes", p.max_live_bytes},
                          {"max_live_event", p.max_live_event},
                          {"fragmentation_samples", c.samples},
                          {"results", rows}};
    if (!a.offsets.empty()) out["offsets_file"] = a.offsets;
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("u3m mem plan {}: {} events, {} tensor lifetimes\n", a.trace, p.events,
             p.lifetimes.size());
  fmt::print("figures {}\n", figures);
  fmt::print("static plan: {}\n", p.algorithm);
  fmt::print("most bytes live at once (lower bound for any allocator): {} at event {}\n\n",
             mib(p.max_live_bytes), p.max_live_event);
  fmt::print("{:<28} {:>14} {:>10} {:>14} {:>14} {:>8}\n", "allocator", "peak", "vs bound",
             "frag@max-live", "mean frag", "calls");
  for (const auto& r : c.rows) {
    fmt::print("{:<28} {:>14} {:>9.3f}x {:>14.3f} {:>14.3f} {:>8}{}\n", r.name, mib(r.peak_bytes),
               p.max_live_bytes ? double(r.peak_bytes) / double(p.max_live_bytes) : 0.0,
               r.fragmentation_at_max_live, r.mean_fragmentation, r.source_calls,
               mem::ok(r.status) ? "" : fmt::format("  ({})", mem::to_string(r.status)));
  }
  fmt::print(
      "\nfragmentation = 1 - largest free / free bytes, within the arena (static) or the "
      "reserved segments (pool); mean over {} evenly spaced events\n",
      c.samples);
  if (!a.offsets.empty()) fmt::print("offset table written to {}\n", a.offsets);
}

}  // namespace

void add_mem_commands(CLI::App& app) {
  auto* mem_cmd = app.add_subcommand("mem", "Device memory pool tools");
  mem_cmd->require_subcommand(1);
  auto args = std::make_shared<PlanArgs>();
  auto* plan = mem_cmd->add_subcommand(
      "plan",
      "Static memory plan from a trace (offsets by tensor lifetime), compared with the dynamic "
      "pool on peak bytes and fragmentation");
  plan->add_option("trace", args->trace, "Trace file (.u3mt, .jsonl, PyTorch ET)")->required();
  plan->add_flag("--json", args->json, "Print JSON");
  plan->add_option("--pool-config", args->pool_config,
                   "Pool configuration for the dynamic rows, e.g. alignment:512");
  plan->add_option("--samples", args->samples, "Events sampled for the mean fragmentation")
      ->capture_default_str();
  plan->add_option("--offsets", args->offsets,
                   "Write the per-lifetime offset table here (CSV: tensor, occurrence, "
                   "start_event, end_event, bytes, size, offset)");
  plan->callback([args] { run_plan(*args); });
}

}  // namespace u3m::cli
