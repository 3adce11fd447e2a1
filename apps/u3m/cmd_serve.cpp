// u3m serve sim | capacity: the serving experiments of issue 6
// (docs/serving.md). Every figure is simulated with a named hardware
// profile, never measured, and says so.
#include <algorithm>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include "cli_util.hpp"
#include "commands.hpp"
#include "run_watch.hpp"
#include "u3m/config/run_config.hpp"
#include "u3m/experiments/serve.hpp"
#include "u3m/experiments/serve_json.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/rag.hpp"

namespace u3m::cli {
namespace {

struct ServeArgs {
  std::string requests, model = "llama2-13b", hw = "ascend-910b-32g", policy = "u3m";
  std::string policies = fmt::format("{}", fmt::join(experiments::serve_default_policies(), ","));
  std::uint32_t cards = 4, limit = 0;
  double slo_ttft_ms = 0, slo_tpot_ms = 0, slo_ttft_factor = -1, rate_scale = 1;
  experiments::ServeScenario knobs;  // the remaining scenario fields, with their defaults
  bool json = false;
  std::string pool = "separate";  // --pool
  std::string config;          // --config FILE
  std::string timeline;        // serve sim --timeline OUT.json ("" = none)
  nlohmann::json config_used;  // what the run used, in the config's shape (docs/config.md)
};

// The config file's fields that serve sim and capacity read, each overridden
// by its flag; records the values used for the JSON result.
void apply_config(ServeArgs& a, const CLI::App* cmd) {
  config::Binder b = config_binder(a.config, cmd);
  b.bind(U3M_CONFIG_FIELD(hw), "--hw", a.hw);
  b.bind(
      U3M_CONFIG_FIELD(ssd.endurance_dwpd), "--ssd-dwpd", a.knobs.ssd_rated_dwpd,
      [](double v) { return v; }, [](double v) { return v > 0 ? std::optional(v) : std::nullopt; });
  if (cmd->get_name() == "sim") b.bind(U3M_CONFIG_FIELD(kv.policy), "--kv-policy", a.policy);
  a.config_used = b.effective();
}

experiments::ServeScenario scenario(const ServeArgs& a) {
  experiments::ServeScenario s = a.knobs;
  s.shape = workload::preset(a.model);
  s.hw = sim::load_profile(a.hw);
  s.cards = a.cards;
  s.policy = a.policy;
  s.rate_scale = a.rate_scale;
  s.shared_pool = a.pool == "shared";
  s.slo = {a.slo_ttft_ms, a.slo_tpot_ms, a.slo_ttft_factor};
  if (a.requests == "rag" || a.requests.starts_with("rag:")) {
    const workload::RagConfig c = parse_rag_spec(a.requests);
    s.requests_label = "RAG generator: " + c.describe();
    s.requests = workload::generate_rag(c);
  } else {
    s.requests = workload::load_requests(a.requests);
    s.requests_label = a.requests;
  }
  if (a.limit && s.requests.size() > a.limit) {
    s.requests.resize(a.limit);
    s.requests_label += fmt::format(" (first {} requests)", a.limit);
  }
  if (s.requests.empty()) input_error(a.requests, "no requests");
  s.validate();
  return s;
}

void print_header(const experiments::ServeScenario& s) {
  const experiments::ServeSlo slo = s.effective_slo();
  fmt::print("{}; not measured\n", experiments::serve_label(s));
  fmt::print("  requests: {} ({} requests)\n", s.requests_label, s.requests.size());
  fmt::print(
      "  SLOs: TTFT <= {:g} ms{}, TPOT <= {:g} ms; meets = >= {:g}% of requests meet both "
      "(unloaded on this profile: first request's prefill {:.1f} ms, decode step {:.1f} ms)\n",
      slo.ttft_ms,
      slo.ttft_prefill_factor > 0
          ? fmt::format(" or {:g}x the request's unloaded prefill if longer",
                        slo.ttft_prefill_factor)
          : "",
      slo.tpot_ms, 100 * s.meet_fraction,
      1e3 * experiments::prefill_seconds(s, s.requests.front().prompt_tokens()),
      1e3 * experiments::decode_step_seconds(s, s.requests.front().prompt_tokens()));
}

void print_row_header() {
  fmt::print("  {:<12} {:>10} {:>9} {:>20} {:>20} {:>7} {:>7} {:>6} {:>8} {:>8}\n", "policy",
             "goodput/s", "met", "TTFT p50/p90/p99 ms", "TPOT p50/p90/p99 ms", "KV hit", "saved",
             "max cc", "too big", "queued");
}

void print_row(const std::string& name, const experiments::ServeResult& r) {
  fmt::print("  {:<12} {:>10.3f} {:>8.1f}% {:>20} {:>20} {:>6.1f}% {:>6.1f}% {:>6} {:>8} {:>8}\n",
             name, r.goodput_rps, 100 * r.met_fraction,
             fmt::format("{:.0f}/{:.0f}/{:.0f}", r.ttft_ms.p50, r.ttft_ms.p90, r.ttft_ms.p99),
             fmt::format("{:.1f}/{:.1f}/{:.1f}", r.tpot_ms.p50, r.tpot_ms.p90, r.tpot_ms.p99),
             100 * r.kv_hit_rate, 100 * r.reuse_rate, r.max_concurrency, r.too_large, r.kv.queued);
}

void print_detail(const experiments::ServeResult& r) {
  auto gb = [](double b) { return fmt::format("{:.1f} GB", b / 1e9); };
  fmt::print("    {}: KV device (HBM) {} (peak {}), host (DRAM) {} (peak {}), ssd {} (peak {})\n", r.policy,
             gb(double(r.capacity_bytes[0])), gb(double(r.peak_bytes[0])),
             gb(double(r.capacity_bytes[1])), gb(double(r.peak_bytes[1])),
             gb(double(r.capacity_bytes[2])), gb(double(r.peak_bytes[2])));
  fmt::print(
      "      links: d2h {}, h2d {}, h2s {}, s2h {}; waited for DRAM KV {:.2f} s of {:.2f} s busy; "
      "hits by tier (blocks) device {} host {} ssd {}, {:.0f}% of reused tokens recomputed; slots "
      "promoted "
      "from host {}, from ssd {}; spilled {}, alerts {}\n",
      gb(double(r.links[0].bytes)), gb(double(r.links[1].bytes)), gb(double(r.links[2].bytes)),
      gb(double(r.links[3].bytes)), r.kv_wait_s, r.busy_s, r.kv.hit_blocks_by_tier[0],
      r.kv.hit_blocks_by_tier[1], r.kv.hit_blocks_by_tier[2], 100 * r.recomputed_share,
      r.kv.promoted_host_slots, r.kv.promoted_slots, gb(double(r.spilled_bytes)), r.alerts);
  const auto& w = r.ssd_wear;
  fmt::print(
      "      SSD wear: {} written, {:.2f} drive writes per day at this pace ({}the drives' "
      "rating of {:.2g})\n",
      gb(double(w.bytes_written)), w.drive_writes_per_day,
      w.drive_writes_per_day > w.rated_dwpd ? "OVER " : "within ", w.rated_dwpd);
  if (r.kv.ssd_declined_slots)
    fmt::print("      SSD admission: {} slots dropped instead of written (count or budget)\n",
               r.kv.ssd_declined_slots);
  if (r.blend_tokens) {
    const double prompt = r.kv.prompt_tokens ? double(r.kv.prompt_tokens) : 1.0;
    fmt::print(
        "      blend: {:.1f}% of prompt tokens reused at a new position ({} blocks), {:.1f}% of "
        "reused tokens recomputed; prefill skipped {:.1f}% of prompt tokens\n",
        100 * double(r.blend_tokens) / prompt, r.kv.blend_blocks, 100 * r.recomputed_share,
        100 * r.reuse_rate);
  }
  if (r.instances > 1 || r.shared_pool)
    fmt::print(
        "      {} instances, pool {}: pool {} (peak {}), hits {} blocks ({} tokens), put {} "
        "blocks, evicted {}; network rx {}, tx {}\n",
        r.instances, r.shared_pool ? "shared" : "separate", gb(double(r.pool_capacity_bytes)),
        gb(double(r.pool_peak_bytes)), r.pool_hit_blocks, r.pool_hit_tokens, r.pool_put_blocks,
        r.pool_evicted_blocks, gb(double(r.net_rx.bytes)), gb(double(r.net_tx.bytes)));
}

bool tty(const ServeArgs& a) {
  return isatty(STDERR_FILENO) && !a.json;
}

void run_sim(const ServeArgs& a) {
  experiments::ServeScenario s = scenario(a);
  RunWatch watch(a.timeline, false);
  s.observer = watch.observer();
  if (tty(a)) fmt::print(stderr, "  simulating {} requests...", s.requests.size());
  const experiments::ServeResult r = experiments::simulate_serving(s);
  if (tty(a)) fmt::print(stderr, "\r\033[K");
  watch.finish(
      fmt::format("virtual time, simulated with profile {}, model {}", s.hw.name, s.shape.name),
      {});
  if (a.json) {
    nlohmann::json j = experiments::serve_sim_json(s, r);
    j["config"] = a.config_used;
    fmt::print("{}\n", j.dump(2));
    return;
  }
  print_header(s);
  fmt::print("  arrivals scaled by {:g} (span {:.1f} s)\n", s.rate_scale, r.span_s);
  print_row_header();
  print_row(s.policy, r);
  print_detail(r);
}

void run_capacity(const ServeArgs& a) {
  ServeArgs base = a;
  base.policy = "hbm-only";
  const experiments::ServeScenario s = scenario(base);
  const std::vector<std::string> pols =
      parse_name_list(a.policies, "--policies", experiments::serve_policy_names());
  auto progress = [&](const std::string& what) {
    if (tty(a)) fmt::print(stderr, "\r\033[K  simulating {}", what);
  };
  const auto rows = experiments::serving_capacity(s, pols, progress);
  if (tty(a)) fmt::print(stderr, "\r\033[K");
  double base_goodput = 0;
  for (const auto& r : rows)
    if (r.policy == "hbm-only") base_goodput = r.at.goodput_rps;
  if (a.json) {
    nlohmann::json j = experiments::serve_capacity_json(s, rows);
    j["config"] = a.config_used;
    fmt::print("{}\n", j.dump(2));
    return;
  }
  print_header(s);
  fmt::print("  capacity: per policy, the highest arrival-rate scale meeting the SLOs\n");
  fmt::print("  {:<11} {:>10} {:>10} {:>11}\n", "policy", "rate scale", "rate/s", "vs hbm-only");
  for (const auto& r : rows) {
    if (r.rate_scale <= 0) {
      fmt::print("  {:<11} {:>10} {:>10} {:>11}\n", r.policy, "none", "-", "-");
      continue;
    }
    const std::string vs =
        base_goodput > 0 ? fmt::format("{:.2f}x", r.at.goodput_rps / base_goodput) : "n/a";
    fmt::print("  {:<11} {:>10.3f} {:>10.3f} {:>11}\n", r.policy, r.rate_scale, r.rate_rps, vs);
  }
  if (std::any_of(rows.begin(), rows.end(), [](const auto& r) { return r.rate_scale <= 0; }))
    fmt::print("  none: no rate scale tried (down to 1/1024) met the SLOs\n");
  const experiments::ServeBound bound = experiments::serving_bound(s);
  fmt::print(
      "  bound (derived, Note [Serving bound]): no KV policy exceeds {:.3f} goodput/s{}: at "
      "least {:.2f} s busy = max(decode reads {:.2f} s, unavoidable FLOPs {:.2f} s) + fixed "
      "iteration costs {:.2f} s\n",
      bound.goodput_rps,
      base_goodput > 0 ? fmt::format(" ({:.2f}x hbm-only)", bound.goodput_rps / base_goodput) : "",
      bound.busy_s, bound.memory_s, bound.compute_s, bound.fixed_s);
  fmt::print("  at each policy's capacity:\n");
  print_row_header();
  for (const auto& r : rows)
    if (r.rate_scale > 0) print_row(r.policy, r.at);
  for (const auto& r : rows)
    if (r.rate_scale > 0) print_detail(r.at);
}

void add_common(CLI::App* c, ServeArgs& a) {
  c->add_option("--config", a.config,
                "Run config, a TOML file (docs/config.md): profile.hw, kv.policy. A flag given "
                "here wins over the file")
      ->check(CLI::ExistingFile);
  c->add_option("--requests", a.requests,
                "Request trace (u3m jsonl, Mooncake jsonl, Azure csv; .gz ok), or 'rag' / "
                "'rag:KEY=V,...' for the built-in RAG generator (keys: requests, rate, system, "
                "corpus, passages, zipf, passage-len, question-len, output-len, order, turns, "
                "seed)")
      ->required();
  c->add_option("--model", a.model, "Model preset: llama2-13b, llama3-8b, tiny, tiny-mha")
      ->capture_default_str();
  c->add_option("--hw", a.hw, "Hardware profile: a built-in name (u3m hw show) or a TOML file")
      ->capture_default_str();
  c->add_option("--cards", a.cards, "Cards, serving as one tensor-parallel group")
      ->capture_default_str();
  c->add_option("--slo-ttft-ms", a.slo_ttft_ms, "TTFT SLO in ms (0: the model's default)")
      ->capture_default_str();
  c->add_option("--slo-ttft-factor", a.slo_ttft_factor,
                "A request's TTFT SLO is max(--slo-ttft-ms, this x its unloaded prefill); 0: "
                "the flat --slo-ttft-ms (default 5)");
  c->add_option("--slo-tpot-ms", a.slo_tpot_ms, "TPOT SLO in ms (0: the model's default)")
      ->capture_default_str();
  c->add_option("--limit", a.limit, "Use only the first N requests (0: all)")
      ->capture_default_str();
  c->add_option("--max-batch-tokens", a.knobs.max_batch_tokens,
                "Tokens per iteration: decodes plus prefill chunks")
      ->capture_default_str();
  c->add_option("--block-tokens", a.knobs.block_tokens, "Tokens per KV block")
      ->capture_default_str();
  c->add_option("--meet-fraction", a.knobs.meet_fraction,
                "Share of requests that must meet both SLOs")
      ->capture_default_str();
  c->add_flag("!--no-spread-ties", a.knobs.spread_ties,
              "Replay equal timestamps as one burst (default: spread them over the gap to the "
              "next timestamp, undoing coarse trace clocks such as Mooncake's 3 s steps)");
  c->add_option("--instances", a.knobs.instances,
                 "Serving instances of --cards cards each, on nodes of the profile's "
                 "cards_per_node; the trace is split by session, else round-robin")
      ->check(CLI::Range(1u, experiments::kMaxInstances))
      ->capture_default_str();
  c->add_option("--pool", a.pool,
                "shared: a KV pool of the nodes' DRAM below every instance's tiers, read and "
                "written over the profile's network; separate: each instance only its own")
      ->check(CLI::IsMember({"shared", "separate"}))
      ->capture_default_str();
  c->add_flag("--json", a.json, "One JSON object with the scenario, the profile and the version");
  c->add_option("--blend-recompute", a.knobs.blend_fraction,
                "u3m-blend: the share of a reused passage's tokens recomputed at its new "
                "position (CacheBlend's selective recompute)")
      ->capture_default_str();
  c->add_option("--ssd-admit-after", a.knobs.ssd_admit_after,
                "u3m policies: a KV block is written to SSD only once its content was looked "
                "up by this many requests (0 or 1: every victim is written)")
      ->capture_default_str();
  c->add_option("--sched-bypass", a.knobs.sched_bypass,
                "u3m policies: a queued request may be passed over at most this many times by "
                "later ones with more of their prompt cached (0: first come, first served)")
      ->capture_default_str();
  c->add_option("--ssd-dwpd", a.knobs.ssd_rated_dwpd,
                "The SSDs' rated drive writes per day, against which the run's SSD wear is "
                "reported (0: the profile's endurance / capacity / warranty)");
}

}  // namespace

void add_serve_commands(CLI::App& app) {
  auto* serve = app.add_subcommand(
      "serve", "Simulated LLM serving with the tiered KV cache (docs/serving.md)");
  serve->require_subcommand(1);
  auto a = std::make_shared<ServeArgs>();

  auto* sim = serve->add_subcommand(
      "sim",
      "Simulate serving a request trace with continuous batching under a KV policy: TTFT and "
      "TPOT percentiles, goodput under the SLOs, KV hit rate, bytes per tier and link");
  add_common(sim, *a);
  sim->add_option("--kv-policy", a->policy,
                  fmt::format("{}", fmt::join(experiments::serve_policy_names(), " | ")))
      ->capture_default_str();
  sim->add_option("--rate-scale", a->rate_scale,
                  "Divide arrival times by this (2 = twice the request rate)")
      ->capture_default_str();
  sim->add_option("--timeline", a->timeline,
                  "Write the run's timeline as Chrome trace / Perfetto JSON: each iteration on "
                  "the group's compute track, waits for KV as stalls, KV transfers per link, "
                  "tier use (docs/operators.md)");
  sim->callback([a, sim] {
    apply_config(*a, sim);
    run_sim(*a);
  });

  auto* cap = serve->add_subcommand(
      "capacity",
      "For each policy, the highest request rate (arrival times scaled) that meets the SLOs, "
      "and its goodput against hbm-only");
  add_common(cap, *a);
  cap->add_option("--policies", a->policies, "Comma-separated KV policies")->capture_default_str();
  cap->callback([a, cap] {
    apply_config(*a, cap);
    run_capacity(*a);
  });
}

}  // namespace u3m::cli
