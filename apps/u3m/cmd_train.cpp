// u3m train sim | capacity | check: the training experiments of issue 5
// (docs/training.md). `sim` and `capacity` print figures simulated with a
// named hardware profile, never measured; `check` compares a measured run on
// this machine with its simulation and labels each side.
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "run_watch.hpp"
#include "u3m/config/run_config.hpp"
#include "u3m/experiments/train.hpp"
#include "u3m/experiments/train_json.hpp"
#include "u3m/experiments/validate.hpp"
#include "u3m/sim/calibrate.hpp"
#include "u3m/sim/profile_json.hpp"
#include "u3m/sim/sim_transport.hpp"
#include "u3m/util/error.hpp"
#include "u3m/util/version.hpp"
#include "u3m/workload/shape.hpp"

namespace u3m::cli {
namespace {

struct TrainArgs {
  std::string model = "llama2-13b", hw = "ascend-910b-32g", policy = "u3m";
  std::string policies = "hbm-only,static-offload,zero-offload,zero-infinity,lru,u3m,design-seed,belady";
  std::uint32_t cards = 4, steps = 3;
  workload::TrainConfig train;
  double max_loss = 0.05;
  double resolution = 0.02;        // capacity: bisect to this relative gap
  std::string full_ft = "1,8,16";  // capacity: full fine-tuning depths also swept
  std::string fail_card;           // "K@STEP"
  bool fail_card_given = false;    // an empty --fail-card is an error, not "no failure"
  // "separate" | "symmetric"; empty: the command's default (separate for
  // sim, symmetric for capacity, which runs hundreds of simulations).
  std::string card_model;
  bool recalibrate = true;
  bool stream_ahead = true;
  bool demote_device = false;
  double recalibrate_period_s = 0;
  std::string prefetch = "fixed";  // "fixed" | "link"
  bool json = false;
  std::string config;          // --config FILE
  std::string timeline;        // --timeline OUT.json (train sim)
  bool diagnose = false;       // --diagnose (train sim)
  nlohmann::json config_used;  // what the run used, in the config's shape (docs/config.md)
};

// The config file's fields that train sim and capacity read, each overridden
// by its flag; records the values used for the JSON result.
void apply_config(TrainArgs& a, const CLI::App* cmd) {
  config::Binder b = config_binder(a.config, cmd);
  b.bind(U3M_CONFIG_FIELD(hw), "--hw", a.hw);
  if (cmd->get_name() == "sim") b.bind(U3M_CONFIG_FIELD(policy.tiering), "--policy", a.policy);
  b.bind(U3M_CONFIG_FIELD(prefetch.mode), "--prefetch", a.prefetch);
  a.config_used = b.effective();
}

experiments::TrainScenario scenario(const TrainArgs& a, const char* default_card_model) {
  experiments::TrainScenario s;
  s.card_model = experiments::parse_card_model(
      a.card_model.empty() ? default_card_model : a.card_model, "--card-model");
  s.shape = experiments::find_model(a.model);
  s.hw = sim::load_profile(a.hw);
  s.cards = a.cards;
  s.steps = a.steps;
  s.train = a.train;
  s.policy = a.policy;
  s.u3m.recalibrate = a.recalibrate;
  s.u3m.stream_layer_ahead = a.stream_ahead;
  s.u3m.demote_device = a.demote_device;
  s.u3m.recalibrate_period_s = a.recalibrate_period_s;
  if (a.prefetch != "fixed" && a.prefetch != "link")
    input_error("--prefetch", "expected fixed or link, got '{}'", a.prefetch);
  s.u3m.jit_prefetch = a.prefetch == "link";
  s.validate();
  return s;
}

std::string gb(double b) {
  return fmt::format("{:.1f} GB", b / 1e9);
}

// Per card: its step, and where its waiting went (separate cards only: one
// symmetric card has nothing to wait for at the barriers).
void print_cards(const experiments::TrainResult& r) {
  if (!r.fits || r.card_model != experiments::CardModel::separate) return;
  for (const auto& c : r.cards) {
    fmt::print(
        "    card {}{}: step {:.3f} s; over the run: waited at collectives {:.3f} s, stalled for "
        "data {:.3f} s, computed {:.3f} s\n",
        c.card, c.shards > 1 ? fmt::format(" ({} shards)", c.shards) : "", c.step_s, c.barrier_s,
        c.stall_s, c.compute_s);
  }
  fmt::print("    shared SSD link (all cards' drives): {} over the run, busy {:.3f} s\n",
             gb(double(r.ssd_link_bytes)), r.ssd_link_busy_s);
}

void run_failover(const TrainArgs& a, const experiments::TrainScenario& s) {
  const auto f = experiments::CardFailure::parse(a.fail_card, s.cards, "--fail-card");
  const experiments::FailoverResult r = experiments::simulate_failover(s, f);
  if (a.json) {
    nlohmann::json j = {{"scenario", experiments::train_scenario_json(s)},
                        {"profile", sim::profile_json(s.hw)}};
    j["scenario"]["policy"] = s.policy;
    j["scenario"]["fail_card"] = {{"card", f.card}, {"step", f.step}};
    j["failover"] = {{"neighbour", r.neighbour},
                     {"moved_bytes", r.moved_bytes},
                     {"move_s", r.move_s},
                     {"slowdown", r.slowdown},
                     {"tokens_per_s_before", r.before.tokens_per_s},
                     {"tokens_per_s_after", r.tokens_per_s_after},
                     {"run_steps", f.step + experiments::kFailoverRunSteps},
                     {"run_s", r.run_s},
                     {"run_s_no_failure", r.run_s_no_failure},
                     {"before", experiments::train_result_json(r.before)},
                     {"after", experiments::train_result_json(r.after)}};
    if (!r.after_symmetric.policy.empty()) {
      j["failover"]["after_symmetric"] = experiments::train_result_json(r.after_symmetric);
      j["failover"]["slowdown_symmetric"] = r.slowdown_symmetric;
    }
    j["config"] = a.config_used;
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("simulated with profile {} ({}), not measured\n", s.hw.name, s.hw.origin);
  fmt::print("  {} on {} cards (ZeRO-3), policy {}: card {} fails before step {}\n", s.shape.name,
             s.cards, s.policy, f.card, f.step);
  auto line = [](const char* what, const experiments::TrainResult& t) {
    if (!t.fits) return fmt::format("  {:<34} does not fit: {}", what, t.why);
    return fmt::format("  {:<34} step {:.3f} s, loss {:.1f}% vs infinite HBM, optimizer on the {}",
                       what, t.step_s, 100 * t.loss, t.optimizer_on_host ? "host" : "device");
  };
  fmt::print("{}\n", line("before (every card):", r.before));
  const bool separate = r.after.card_model == experiments::CardModel::separate;
  fmt::print("{}\n",
             line(separate ? fmt::format("after ({} cards together):", s.cards - 1).c_str()
                           : fmt::format("after (card {}, two shards):", r.neighbour).c_str(),
                  r.after));
  print_cards(r.after);
  if (!r.after_symmetric.policy.empty()) {
    fmt::print("{}\n", line(fmt::format("  symmetric: card {} alone:", r.neighbour).c_str(),
                            r.after_symmetric));
    if (r.before.fits && r.after_symmetric.fits)
      fmt::print("  slowdown per step: {:.1f}% with the cards separate, {:.1f}% symmetric\n",
                 100 * r.slowdown, 100 * r.slowdown_symmetric);
  }
  fmt::print("  moving the failed card's shard ({}) over {}: {:.2f} s\n", gb(double(r.moved_bytes)),
             s.hw.peer_link.kind, r.move_s);
  if (r.before.fits && r.after.fits) {
    fmt::print(
        "  slowdown per step {:.1f}% (design expects 15-20%); tokens/s {:.0f} -> {:.0f} on {} "
        "cards ({:+.1f}%)\n",
        100 * r.slowdown, r.before.tokens_per_s, r.tokens_per_s_after, s.cards - 1,
        100 * (r.tokens_per_s_after / r.before.tokens_per_s - 1));
    fmt::print("  a run of {} steps takes {:.1f} s instead of {:.1f} s ({:+.1f}%)\n",
               f.step + experiments::kFailoverRunSteps, r.run_s, r.run_s_no_failure,
               100 * (r.run_s / r.run_s_no_failure - 1));
  }
}

void run_sim(const TrainArgs& a) {
  experiments::TrainScenario s = scenario(a, "separate");
  if (a.fail_card_given) {
    if (!a.timeline.empty()) input_error("--timeline", "is not recorded with --fail-card");
    if (a.diagnose) input_error("--diagnose", "is not made with --fail-card");
    return run_failover(a, s);
  }
  RunWatch watch(a.timeline, a.diagnose);
  s.observer = watch.observer();
  experiments::TrainResult r = experiments::simulate_training(s);
  const std::string where = fmt::format("simulated with profile {}, virtual time", s.hw.name);
  // Diagnosis: card 0 against the profile's links (one card's share of the drives).
  const sim::SimTransportConfig links = sim::links_from_profile(s.hw, 1);
  std::array<double, engine::kNumLinks> limit{};
  for (int l = 0; l < engine::kNumLinks; ++l) limit[l] = links.links[l].bandwidth;
  const std::optional<observe::DiagnosisReport> diag = watch.finish(where, limit, &s.hw);
  if (a.json) {
    nlohmann::json j = experiments::train_sim_json(s, r);
    j["config"] = a.config_used;
    if (diag) j["diagnosis"] = observe::Diagnosis::to_json(*diag);
    fmt::print("{}\n", j.dump(2));
    return;
  }
  if (diag) fmt::print("{}", observe::Diagnosis::to_text(*diag, where + ", card 0"));
  fmt::print("simulated with profile {} ({}), not measured\n", s.hw.name, s.hw.origin);
  fmt::print(
      "  {} ({:.2f} B params) on {} cards{}, micro-batch {} x {} tokens, grad-accum {}, policy "
      "{}\n",
      s.shape.name, double(r.params) / 1e9, s.cards, s.cards > 1 ? " (ZeRO-3)" : "",
      s.train.micro_batch_size, s.train.seq_len, s.train.micro_batches, s.policy);
  if (!r.fits) {
    fmt::print("  does not fit: {}\n", r.why);
    return;
  }
  fmt::print(
      "  step {:.3f} s against {:.3f} s with infinite HBM: throughput loss {:.1f}%; {:.0f} "
      "tokens/s\n",
      r.step_s, r.ideal_step_s, 100 * r.loss, r.tokens_per_s);
  fmt::print(
      "  per card: step needs {} at once; peak device {}, host {}, SSD {}; optimizer on the {}; "
      "{} of {} layers recompute their activations\n",
      gb(double(r.footprint)), gb(double(r.sim.peak_device)), gb(double(r.sim.peak_host)),
      gb(double(r.sim.peak_ssd)), r.optimizer_on_host ? "host CPU" : "device", r.recompute_layers,
      s.shape.layers);
  fmt::print("  stall {:.3f} s over {} steps; transfer time hidden behind compute {:.0f}%{}\n",
             r.stall_s, s.steps, 100 * r.hidden_fraction,
             r.card_model == experiments::CardModel::separate
                 ? fmt::format(" (card {}, the last to finish the step)", r.sim_card)
                 : "");
  const observe::BandReport& band = r.hbm_band;
  if (band.span_s() > 0)
    fmt::print(
        "  HBM use over the run: mean {:.0f}%, peak {:.0f}%; {:.0f}% of the time in the design's "
        "{:.0f}-{:.0f}% band, {:.0f}% below, {:.0f}% above (--json: the series)\n",
        100 * band.mean, 100 * band.peak, 100 * band.in_s / band.span_s(), 100 * band.low,
        100 * band.high, 100 * band.below_s / band.span_s(), 100 * band.above_s / band.span_s());
  if (r.design_seed) {
    const policy::DesignSeedStats& d = *r.design_seed;
    fmt::print(
        "  design-seed: {} recalibrations (every {:.0f} s), thresholds {} hot {:.3g} / warm "
        "{:.3g}; demotions by heat {}, by the seed rules {}; layer prefetches {}\n",
        d.recalibrations, s.design.recalibrate_period_s,
        d.calibrated ? "calibrated on the first step," : "the design's defaults (never calibrated),",
        d.hot, d.warm, d.heat_demotions, d.placement_demotions, d.layer_prefetches);
  }
  print_cards(r);
  fmt::print("  {:<5} {:>10} {:>10} {:>8}\n", "link", "bytes", "transfers", "busy s");
  for (int l = 0; l < engine::kNumLinks; ++l) {
    const auto& x = r.sim.links[l];
    fmt::print("  {:<5} {:>10} {:>10} {:>8.3f}\n", engine::to_string(engine::Link(l)),
               gb(double(x.bytes)), x.transfers, double(x.busy_ns) * 1e-9);
  }
  fmt::print("  links modelled: {}{}\n", r.sim.links_label,
             r.card_model == experiments::CardModel::separate
                 ? fmt::format("; h2s/s2h: the {} cards' drives pooled into one link they share",
                               r.cards.size())
                 : "; h2s/s2h: one card's static share of the drives");
}

// The capacity sweeps of `train capacity`: the scenario given (by default
// the design's, LoRA r=16), then full fine-tuning at each --full-ft depth.
struct CapacitySweep {
  experiments::TrainScenario s;
  std::vector<experiments::CapacityRow> rows;
  experiments::PhysicalBound bound;
  std::uint64_t base_params = 0;  // hbm-only's
};

std::vector<std::uint32_t> parse_depths(const std::string& text) {
  std::vector<std::uint32_t> out;
  if (text == "none") return out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string part = text.substr(at, comma - at);
    std::uint32_t v = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc{} || end != part.data() + part.size() || v == 0)
      input_error("--full-ft", "'{}': expected grad-accum depths >= 1, e.g. 1,8,16, or none", text);
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

std::string bound_text(const experiments::BoundShape& b) {
  if (b.params == 0) return "none";
  return fmt::format(
      "{:.2f}B ({}, loss >= {:.1f}%, {} recomputed layers, optimizer on the {}; per card per "
      "step h2d {}, d2h {}, SSD read {}, SSD write {}; {})",
      double(b.params) / 1e9, b.model, 100 * b.loss, b.recompute_layers,
      b.optimizer_on_host ? "host" : "device", gb(double(b.h2d)), gb(double(b.d2h)),
      gb(double(b.ssd)), gb(double(b.ssd_write)), b.binding);
}

nlohmann::json bound_json(const experiments::BoundShape& b) {
  return {{"params", b.params},
          {"model", b.model},
          {"loss", b.loss},
          {"recompute_layers", b.recompute_layers},
          {"optimizer_on_host", b.optimizer_on_host},
          {"ideal_step_s", b.ideal_s},
          {"compute_s", b.compute_s},
          {"footprint_bytes", b.footprint},
          {"h2d_bytes", b.h2d},
          {"d2h_bytes", b.d2h},
          {"ssd_bytes", b.ssd},
          {"ssd_write_bytes", b.ssd_write},
          {"host_adam_s", b.host_adam_s},
          {"binding", b.binding}};
}

std::string scenario_label(const experiments::TrainScenario& s) {
  return fmt::format(
      "simulated with profile {} x {} cards (ZeRO-3), {}, micro-batch {} x {} tokens, grad-accum "
      "{}, Adam, 16-bit weights; llama family (docs/training.md); not measured",
      s.hw.name, s.cards,
      s.train.lora() ? fmt::format("LoRA r={} alpha={:g}", s.train.lora_rank, s.train.lora_alpha)
                     : std::string("full fine-tuning"),
      s.train.micro_batch_size, s.train.seq_len, s.train.micro_batches);
}

// The run that reached a row's capacity (null: none fits the bound).
const experiments::TrainResult* capacity_point(const experiments::CapacityRow& r) {
  if (r.max_params == 0) return nullptr;
  for (const auto& t : r.tried)
    if (t.params == r.max_params && t.fits) return &t;
  return nullptr;
}

nlohmann::json sweep_json(const CapacitySweep& w, double max_loss) {
  nlohmann::json j = {{"label", scenario_label(w.s)},
                      {"scenario", experiments::train_scenario_json(w.s)}};
  j["scenario"]["max_loss"] = max_loss;
  j["scenario"]["family"] = "llama family (docs/training.md)";
  for (const auto& r : w.rows) {
    nlohmann::json tried = nlohmann::json::array();
    for (const auto& t : r.tried) {
      tried.push_back({{"params", t.params},
                       {"fits", t.fits},
                       {"loss", t.loss},
                       {"step_s", t.step_s},
                       {"recompute_layers", t.recompute_layers},
                       {"optimizer_on_host", t.optimizer_on_host}});
    }
    j["policies"][r.policy] = {
        {"max_params", r.max_params},
        {"model", r.model},
        {"loss", r.loss},
        {"step_s", r.step_s},
        {"recompute_layers", r.recompute_layers},
        {"optimizer_on_host", r.optimizer_on_host},
        {"device_home", r.device_home},
        {"next_params", r.next_params},
        {"gain_vs_hbm_only", w.base_params ? double(r.max_params) / double(w.base_params) : 0.0},
        {"tried", tried}};
    if (const experiments::TrainResult* at = capacity_point(r))
      j["policies"][r.policy]["hbm_band"] =
          experiments::train_result_json(*at)["hbm_band"];  // with its series
  }
  j["physical_bound"] = {{"overlapped", bound_json(w.bound.overlapped)},
                         {"serial", bound_json(w.bound.serial)}};
  return j;
}

void print_sweep(const CapacitySweep& w, double max_loss) {
  fmt::print("training capacity, {}; bound: loss <= {:.0f}%\n", scenario_label(w.s),
             100 * max_loss);
  fmt::print("  {:<15} {:>12} {:>17} {:>8} {:>8} {:>10} {:>9} {:>9} {:>6}\n", "policy",
             "max params", "model", "loss", "step s", "vs hbm-only", "recompute", "optimizer",
             "start");
  for (const auto& r : w.rows) {
    if (r.max_params == 0) {  // not even the smallest shape met the bound
      fmt::print("  {:<15} {:>12} {:>17} {:>8} {:>8} {:>10}\n", r.policy, "none", "-", "-", "-",
                 "-");
      continue;
    }
    fmt::print("  {:<15} {:>11.2f}B {:>17} {:>7.1f}% {:>8.3f} {:>9.2f}x {:>9} {:>9} {:>6}\n",
               r.policy, double(r.max_params) / 1e9, r.model, 100 * r.loss, r.step_s,
               w.base_params ? double(r.max_params) / double(w.base_params) : 0.0,
               r.recompute_layers, r.optimizer_on_host ? "host" : "device",
               r.device_home ? "device" : "seed");
  }
  fmt::print("  physical bound, the oracle (no schedule does better, Note [Physical bound]): {}\n",
             bound_text(w.bound.overlapped));
  if (w.base_params && w.bound.overlapped.params) {
    const auto best =
        std::max_element(w.rows.begin(), w.rows.end(),
                         [](const auto& x, const auto& y) { return x.max_params < y.max_params; });
    fmt::print("    = {:.2f}x hbm-only; the best policy here, {}, reaches {:.0f}% of it\n",
               double(w.bound.overlapped.params) / double(w.base_params), best->policy,
               100 * double(best->max_params) / double(w.bound.overlapped.params));
  }
  fmt::print("  serial yardstick (every transfer added to the step): {}\n",
             bound_text(w.bound.serial));
  // What limits the larger shapes: the smallest failing shape each policy tried.
  // HBM use at each capacity point against the design's band (MISSION.md item 2).
  fmt::print("  HBM use at each policy's capacity point, over the run (design band 75-90%):\n");
  for (const auto& r : w.rows) {
    const experiments::TrainResult* at = capacity_point(r);
    if (!at || at->hbm_band.span_s() <= 0) continue;
    const observe::BandReport& b = at->hbm_band;
    fmt::print("    {:<15} mean {:>3.0f}%, peak {:>3.0f}%; {:>3.0f}% of the time in the band, {:>3.0f}% "
               "below, {:>3.0f}% above\n",
               r.policy, 100 * b.mean, 100 * b.peak, 100 * b.in_s / b.span_s(),
               100 * b.below_s / b.span_s(), 100 * b.above_s / b.span_s());
  }
  fmt::print("  smallest shape tried over the bound, per policy:\n");
  for (const auto& r : w.rows) {
    const experiments::TrainResult* first = nullptr;
    for (const auto& t : r.tried)
      if (!(t.fits && t.loss <= max_loss) && (!first || t.params < first->params)) first = &t;
    if (!first) continue;
    const auto& t = *first;
    fmt::print("    {:<15} {:.2f}B params: {}\n", r.policy, double(t.params) / 1e9,
               t.fits
                   ? fmt::format("loss {:.1f}% (step {:.3f} s vs {:.3f} s ideal, stall {:.3f} s)",
                                 100 * t.loss, t.step_s, t.ideal_step_s, t.stall_s)
                   : t.why.substr(0, 110));
  }
}

void run_capacity(const TrainArgs& a, bool lora_given) {
  TrainArgs base = a;
  base.policy = "u3m";
  if (!lora_given) base.train.lora_rank = 16;  // the design's scenario
  std::vector<experiments::TrainScenario> scenarios = {scenario(base, "symmetric")};
  for (std::uint32_t ga : parse_depths(a.full_ft)) {
    TrainArgs f = base;
    f.train.lora_rank = 0;
    f.train.micro_batches = ga;
    scenarios.push_back(scenario(f, "symmetric"));
  }
  const std::vector<std::string> pols =
      parse_name_list(a.policies, "--policies", experiments::train_policy_names());
  if (!(a.max_loss >= 0 && a.max_loss < 1))
    input_error("--max-loss", "must be in [0, 1), got {}", a.max_loss);
  if (!(a.resolution > 0 && a.resolution < 1))
    input_error("--resolution", "must be in (0, 1), got {}", a.resolution);
  const bool tty = isatty(STDERR_FILENO) && !a.json;
  auto progress = [&](const std::string& what) {
    if (tty) fmt::print(stderr, "\r\033[K  simulating {}", what);
  };
  std::vector<CapacitySweep> sweeps;
  for (const experiments::TrainScenario& s : scenarios) {
    CapacitySweep w;
    w.s = s;
    w.rows = experiments::training_capacity(s, pols, a.max_loss, progress, a.resolution);
    w.bound = experiments::physical_bound(s, a.max_loss);
    for (const auto& r : w.rows)
      if (r.policy == "hbm-only") w.base_params = r.max_params;
    sweeps.push_back(std::move(w));
  }
  if (tty) fmt::print(stderr, "\r\033[K");
  if (a.json) {
    nlohmann::json j = sweep_json(sweeps.front(), a.max_loss);
    j["profile"] = sim::profile_json(sweeps.front().s.hw);
    j["full_ft"] = nlohmann::json::array();
    for (std::size_t i = 1; i < sweeps.size(); ++i)
      j["full_ft"].push_back(sweep_json(sweeps[i], a.max_loss));
    j["config"] = a.config_used;
    fmt::print("{}\n", j.dump(2));
    return;
  }
  for (std::size_t i = 0; i < sweeps.size(); ++i) {
    if (i > 0) fmt::print("\n");
    print_sweep(sweeps[i], a.max_loss);
  }
}

struct CheckArgs {
  std::string hw;  // a profile file from u3m hw calibrate; "" = calibrate now
  std::string dir = "/var/tmp";
  double calibrate_seconds = 3;
  double compute_scale = experiments::CheckSetup{}.compute_scale;
  std::uint64_t check_stride = experiments::CheckSetup{}.check_stride;
  std::string policy = "lookahead";
  bool json = false;
};

std::string load_average() {
  double l[3] = {0, 0, 0};
  if (getloadavg(l, 3) != 3) return "unknown";
  return fmt::format("{:.2f} {:.2f} {:.2f}", l[0], l[1], l[2]);
}

void run_check(const CheckArgs& a) {
  // ReplayOptions::check_stride's rule, checked before calibrating (seconds)
  // so the error names this flag.
  if (a.check_stride < 8 || a.check_stride % 8 != 0)
    input_error("--check-stride", "must be a multiple of 8 bytes, got {}", a.check_stride);
  experiments::CheckSetup setup;
  setup.compute_scale = a.compute_scale;
  setup.check_stride = a.check_stride;
  if (!(a.compute_scale >= 0 && std::isfinite(a.compute_scale)))
    input_error("--compute-scale", "must be a finite number >= 0, got {}", a.compute_scale);
  const bool tty = isatty(STDERR_FILENO) && !a.json;
  if (a.hw.empty()) {
    sim::CalibrateOptions o;
    o.dir = a.dir;
    o.seconds = a.calibrate_seconds;
    o.seconds_flag = "--calibrate-seconds";
    o.host = machine();
    o.date = fmt::format("{:%Y-%m-%d}", fmt::gmtime(std::time(nullptr)));
    if (tty)
      o.progress = [](std::string_view s) { fmt::print(stderr, "\r\033[K  calibrating: {}", s); };
    setup.local = sim::profile_from_measurements(sim::measure_machine(o), o);
  } else {
    setup.local = sim::load_profile(a.hw);
  }
  const std::string load_before = load_average();
  std::vector<experiments::CheckResult> rows;
  policy::find_tiering_policy(a.policy, "--policy");
  for (experiments::CheckConfig c : experiments::default_check_configs()) {
    c.policy = a.policy;
    if (tty) fmt::print(stderr, "\r\033[K  running {}", c.label());
    rows.push_back(experiments::run_check(c, setup));
  }
  if (tty) fmt::print(stderr, "\r\033[K");
  const std::string load_after = load_average();
  const std::string where = machine();
  bool all_ok = true;
  for (const auto& r : rows) all_ok = all_ok && r.data_ok && r.first_error.empty();
  if (a.json) {
    nlohmann::json out = nlohmann::json::array();
    auto side = [](const experiments::CheckSide& s) {
      return nlohmann::json{{"step_s", s.step_s},
                            {"total_s", s.total_s},
                            {"stall_s", s.stall_s},
                            {"h2d_bytes", s.h2d_bytes},
                            {"d2h_bytes", s.d2h_bytes},
                            {"evictions", s.evictions},
                            {"transfers", s.transfers},
                            {"transfer_s", s.transfer_s},
                            {"iteration_end_s", s.iteration_end_s}};
    };
    for (const auto& r : rows) {
      const auto& c = r.config;
      out.push_back({{"config",
                      {{"label", c.label()},
                       {"model", c.model},
                       {"seq_len", c.seq_len},
                       {"micro_batch", c.micro_batch},
                       {"steps", c.steps},
                       {"device_fraction", c.device_fraction},
                       {"link_gbps", c.link_gbps},
                       {"lookahead", c.lookahead},
                       {"policy", c.policy}}},
                     {"decisions",
                      {{"same", r.same_decisions},
                       {"sim_calls", r.sim_calls},
                       {"real_calls", r.real_calls},
                       {"first_difference", r.first_difference}}},
                     {"footprint_bytes", r.footprint},
                     {"device_budget_bytes", r.device_budget},
                     {"compute_step_s", r.compute_step_s},
                     {"real", side(r.real)},
                     {"sim", side(r.sim)},
                     {"error", r.error},
                     {"data_ok", r.data_ok},
                     {"bytes_verified", r.bytes_verified},
                     {"first_error", r.first_error},
                     {"overrun_s", r.overrun_s},
                     {"oversleep_s", r.oversleep_s},
                     {"links_model", r.links_label}});
    }
    nlohmann::json j = {{"real",
                         {{"measured_on", where},
                          {"load_average_before", load_before},
                          {"load_average_after", load_after},
                          {"how",
                           "u3m runtime over device-emu, throttled copies, each op "
                           "sleeps its compute time"}}},
                        {"sim",
                         {{"simulated_with", setup.local.name},
                          {"profile_origin", setup.local.origin},
                          {"profile", sim::profile_json(setup.local)}}},
                        {"compute_scale", a.compute_scale},
                        {"check_stride", a.check_stride},
                        {"ok", all_ok},
                        {"configs", out},
                        {"version", kVersion}};
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print(
        "sim versus real: tiny-mha training, step = mean of the iterations after the first\n");
    fmt::print(
        "  real = measured on {} (load average {} before, {} after): the u3m runtime over "
        "device-emu, copies throttled to the link rate, each op sleeps its compute time\n",
        where, load_before, load_after);
    fmt::print(
        "  sim  = simulated with profile {} ({}): the same engine on virtual time, links at the "
        "same rate plus the real stack's measured cost per transfer\n",
        setup.local.name, setup.local.origin);
    fmt::print(
        "  compute per op: the {} profile's roofline x {:g}, the same on both sides; the real run "
        "checks one word per {} B\n",
        setup.local.name, a.compute_scale, a.check_stride);
    fmt::print("  {:<53} {:>12} {:>9} {:>9} {:>7} {:>15} {:>17} {:>5}\n", "configuration",
               "compute/step", "real step", "sim step", "error", "stall real/sim",
               "per transfer r/s", "data");
    auto per = [](const experiments::CheckSide& x) {
      return x.transfers ? 1e3 * x.transfer_s / double(x.transfers) : 0.0;
    };
    for (const auto& r : rows) {
      fmt::print(
          "  {:<53} {:>11.3f}s {:>8.3f}s {:>8.3f}s {:>+6.1f}% {:>7.3f}/{:.3f}s "
          "{:>7.3f}/{:.3f}ms {:>5}\n",
          r.config.label(), r.compute_step_s, r.real.step_s, r.sim.step_s, 100 * r.error,
          r.real.stall_s, r.sim.stall_s, per(r.real), per(r.sim), r.data_ok ? "ok" : "WRONG");
    }
    fmt::print(
        "  stall: whole run; per transfer: mean from start to completion, engine clock. Real "
        "run's own delays (whole run): checks past the op's compute (overrun), late wake-ups:\n");
    for (const auto& r : rows) {
      fmt::print("    {:<53} overrun {:.3f} s, late {:.3f} s; h2d {} / {}; links: {}\n",
                 r.config.label(), r.overrun_s, r.oversleep_s,
                 approx_bytes(double(r.real.h2d_bytes)), approx_bytes(double(r.sim.h2d_bytes)),
                 r.links_label);
    }
    fmt::print("  decisions (what each side asked of the engine, Note [Driver calls]):\n");
    for (const auto& r : rows) {
      fmt::print("    {:<53} {} ({} simulated, {} real calls){}\n", r.config.label(),
                 r.same_decisions ? "the same" : "DIFFERENT", r.sim_calls, r.real_calls,
                 r.first_difference.empty() ? "" : "; first: " + r.first_difference);
    }
    for (const auto& r : rows) {
      if (!r.first_error.empty()) fmt::print("  error ({}): {}\n", r.config.label(), r.first_error);
    }
  }
  if (!all_ok) throw CLI::RuntimeError(3);  // a wrong byte or a failed acquire, as run replay
}

void add_scenario_options(CLI::App* c, TrainArgs& a) {
  c->add_option("--config", a.config,
                "Run config, a TOML file (docs/config.md): profile.hw, policy.tiering, "
                "prefetch.mode. A flag given here wins over the file")
      ->check(CLI::ExistingFile);
  c->add_option("--hw", a.hw, "Hardware profile: a built-in name (u3m hw show) or a TOML file")
      ->capture_default_str();
  c->add_option("--cards", a.cards, "Cards; ZeRO-3 shards across them")->capture_default_str();
  c->add_option("--micro-batch", a.train.micro_batch_size, "Sequences per micro-batch")
      ->capture_default_str();
  c->add_option("--seq", a.train.seq_len, "Tokens per sequence")->capture_default_str();
  c->add_option("--grad-accum", a.train.micro_batches, "Micro-batches per optimizer step")
      ->capture_default_str();
  c->add_option("--lora-rank", a.train.lora_rank,
                "LoRA rank (0 = full fine-tuning); train capacity: 16 unless given")
      ->capture_default_str();
  c->add_flag("--recompute", a.train.recompute, "Recompute activations per layer in backward");
  c->add_option("--steps", a.steps, "Steps simulated; the last is reported")->capture_default_str();
  c->add_flag("--json", a.json, "One JSON object with the scenario, the profile and the version");
  c->add_option("--card-model", a.card_model,
                "separate: all N cards simulated together (collectives are barriers, the cards' "
                "SSD traffic shares one link; costs N simulations); symmetric: one card of N (its "
                "SSD a static 1/N share). Default: separate for train sim, symmetric for train "
                "capacity (hundreds of simulations)");
  c->add_option("--recalibrate", a.recalibrate,
                "u3m policy: recalibrate the heat thresholds during the run and demote cold "
                "copies (docs/policy.md)")
      ->capture_default_str();
  c->add_option("--demote-device", a.demote_device,
                "u3m policy: at each recalibration also demote device copies colder than the "
                "device threshold (off: they moved bytes that came back, docs/policy.md)")
      ->capture_default_str();
  c->add_option("--stream-ahead", a.stream_ahead,
                "u3m policy: at each ZeRO-3 gather, prefetch the next gather's weight shards "
                "(one layer ahead)")
      ->capture_default_str();
  c->add_option("--recalibrate-period", a.recalibrate_period_s,
                "u3m policy: virtual seconds between recalibrations (0 = a tenth of the first "
                "step)")
      ->capture_default_str();
  c->add_option("--prefetch", a.prefetch,
                "u3m policy: fixed (what enters a 16-op predicted window) or link (just in time "
                "for the link's transfer time; slower on the design scenario, docs/policy.md)")
      ->capture_default_str();
}

}  // namespace

void add_train_commands(CLI::App& app) {
  auto* train = app.add_subcommand("train", "Simulated training experiments (docs/training.md)");
  train->require_subcommand(1);
  auto a = std::make_shared<TrainArgs>();
  a->train.seq_len = 1024;  // the design's scenario: micro-batch 1, seq 1024

  auto* sim = train->add_subcommand(
      "sim",
      "Simulate training steps of a LLaMA-shaped model under a tiering policy: step time, "
      "throughput loss against infinite HBM, peaks per tier, bytes per link, stalls");
  sim->add_option(
         "--model", a->model,
         "llama2-13b, llama3-8b, tiny, tiny-mha, or a family shape (llama-1b .. llama-70b)")
      ->capture_default_str();
  sim->add_option("--policy", a->policy, policy::tiering_policy_choices())->capture_default_str();
  sim->add_option("--timeline", a->timeline,
                  "Write the reported run (the settings chosen) as Chrome trace / Perfetto JSON "
                  "on virtual time: ops, stalls, transfers per link, tier occupancy "
                  "(docs/operators.md)");
  sim->add_flag("--diagnose", a->diagnose,
                "Bandwidth diagnosis of the reported run, card 0: bytes per link against the "
                "profile's limit, top 10 ops by bytes moved and by stall, transfer time hidden "
                "and exposed per steady-state step (docs/operators.md)");
  sim->add_option("--fail-card", a->fail_card,
                  "K@STEP: card K fails before step STEP; its shards move to card K+1 over the "
                  "card-to-card link and training goes on (reports the slowdown)");
  add_scenario_options(sim, *a);
  sim->callback([a, sim] {
    apply_config(*a, sim);
    a->fail_card_given = sim->count("--fail-card") > 0;
    run_sim(*a);
  });

  auto* cap = train->add_subcommand(
      "capacity",
      "For each policy, the largest model of the llama family that trains within the "
      "throughput-loss bound (to --resolution), its gain against hbm-only and the physical "
      "bound; by default the design's LoRA r=16 scenario, then full fine-tuning at --full-ft");
  cap->add_option("--max-loss", a->max_loss, "Throughput-loss bound, e.g. 0.05")
      ->capture_default_str();
  cap->add_option("--policies", a->policies, "Comma-separated policies")->capture_default_str();
  cap->add_option("--resolution", a->resolution,
                  "Bisect each policy's capacity until the largest size within the bound and the "
                  "smallest beyond it are this close (0.02 = 2%)")
      ->capture_default_str();
  cap->add_option("--full-ft", a->full_ft,
                  "Also sweep full fine-tuning at these grad-accum depths (comma-separated), or "
                  "none")
      ->capture_default_str();
  add_scenario_options(cap, *a);
  cap->callback([a, cap] {
    apply_config(*a, cap);
    run_capacity(*a, cap->count("--lora-rank") > 0);
  });

  auto ca = std::make_shared<CheckArgs>();
  auto* chk = train->add_subcommand(
      "check",
      "Sim versus real: tiny training steps run for real (runtime, device-emu, a device budget "
      "below the footprint, each op sleeping for its modelled compute) and simulated with the "
      "local profile; step times and their error. Against real PyTorch training under "
      "u3m.torch.offload: python3 -m u3m_capture.simcheck (docs/pytorch.md)");
  chk->add_option("--hw", ca->hw,
                  "The local profile (a file from u3m hw calibrate); default: calibrate now")
      ->check(CLI::ExistingFile);
  chk->add_option("--calibrate-seconds", ca->calibrate_seconds,
                  "Calibration budget when --hw is not given")
      ->capture_default_str();
  chk->add_option("--dir", ca->dir, "Directory for calibration's SSD test file")
      ->capture_default_str();
  chk->add_option("--compute-scale", ca->compute_scale,
                  "Multiplies each op's roofline compute time (both sides)")
      ->capture_default_str();
  chk->add_option("--check-stride", ca->check_stride,
                  "The real run writes and checks one 8-byte word per this many bytes (8 = all)")
      ->capture_default_str();
  chk->add_option("--policy", ca->policy,
                  "Tiering policy both sides run: " + policy::tiering_policy_choices())
      ->capture_default_str();
  chk->add_flag("--json", ca->json, "One JSON object: both sides of every configuration");
  chk->callback([ca] { run_check(*ca); });
}

}  // namespace u3m::cli
