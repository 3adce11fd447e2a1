// u3m train sim | capacity: the training experiments of issue 5, simulated
// (docs/training.md). Every figure printed here is simulated with a named
// hardware profile, never measured.
#include <memory>
#include <string>

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "u3m/experiments/train.hpp"
#include "u3m/sim/profile_json.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/shape.hpp"

namespace u3m::cli {
namespace {

constexpr const char* kVersion = "u3m 0.1.0";

struct TrainArgs {
  std::string model = "llama2-13b", hw = "ascend-910b-32g", policy = "u3m";
  std::string policies = "hbm-only,static-offload,lru,u3m,oracle";
  std::uint32_t cards = 4, steps = 3;
  workload::TrainConfig train;
  double max_loss = 0.05;
  bool json = false;
};

workload::ModelShape find_model(const std::string& name) {
  for (const workload::ModelShape& m : experiments::llama_family()) {
    if (m.name == name) return m;
  }
  return workload::preset(name);  // throws InputError listing the presets
}

experiments::TrainScenario scenario(const TrainArgs& a) {
  experiments::TrainScenario s;
  s.shape = find_model(a.model);
  s.hw = sim::load_profile(a.hw);
  s.cards = a.cards;
  s.steps = a.steps;
  s.train = a.train;
  s.policy = a.policy;
  s.validate();
  return s;
}

nlohmann::json scenario_json(const experiments::TrainScenario& s) {
  const workload::TrainConfig& t = s.train;
  return {{"model",
           {{"name", s.shape.name},
            {"layers", s.shape.layers},
            {"d_model", s.shape.d_model},
            {"heads", s.shape.heads},
            {"kv_heads", s.shape.kv_heads},
            {"ffn", s.shape.ffn},
            {"vocab", s.shape.vocab}}},
          {"cards", s.cards},
          {"zero3", s.cards > 1},
          {"steps_simulated", s.steps},
          {"micro_batch", t.micro_batch_size},
          {"seq_len", t.seq_len},
          {"grad_accum", t.micro_batches},
          {"mixed_precision", t.mixed_precision},
          {"recompute", t.recompute},
          {"lora_rank", t.lora_rank},
          {"optimizer", "adam"},
          {"hw", s.hw.name},
          {"version", kVersion}};
}

nlohmann::json result_json(const experiments::TrainResult& r) {
  nlohmann::json links = nlohmann::json::object();
  for (int l = 0; l < engine::kNumLinks; ++l) {
    const auto& x = r.sim.links[l];
    links[std::string(engine::to_string(engine::Link(l)))] = {
        {"bytes", x.bytes}, {"transfers", x.transfers}, {"busy_s", double(x.busy_ns) * 1e-9}};
  }
  nlohmann::json fam = nlohmann::json::array();
  for (std::size_t i = 0; i < r.sim.op_families.size() && i < 10; ++i) {
    const auto& f = r.sim.op_families[i];
    fam.push_back({{"op", f.name},
                   {"steps", f.steps},
                   {"compute_s", double(f.compute_ns) * 1e-9},
                   {"stall_s", double(f.stall_ns) * 1e-9},
                   {"missed_bytes", f.missed_bytes}});
  }
  return {{"policy", r.policy},
          {"fits", r.fits},
          {"why", r.why},
          {"params", r.params},
          {"footprint_bytes", r.footprint},
          {"step_s", r.step_s},
          {"ideal_step_s", r.ideal_step_s},
          {"loss", r.loss},
          {"tokens_per_s", r.tokens_per_s},
          {"stall_s", r.stall_s},
          {"hidden_fraction", r.hidden_fraction},
          {"optimizer_on_host", r.optimizer_on_host},
          {"peak_bytes",
           {{"device", r.sim.peak_device}, {"host", r.sim.peak_host}, {"ssd", r.sim.peak_ssd}}},
          {"links", links},
          {"top_ops_by_missed_bytes", fam},
          {"links_model", r.sim.links_label}};
}

std::string gb(double b) {
  return fmt::format("{:.1f} GB", b / 1e9);
}

void run_sim(const TrainArgs& a) {
  experiments::TrainScenario s = scenario(a);
  experiments::TrainResult r = experiments::simulate_training(s);
  if (a.json) {
    nlohmann::json j = {{"scenario", scenario_json(s)},
                        {"profile", sim::profile_json(s.hw)},
                        {"result", result_json(r)}};
    j["scenario"]["policy"] = s.policy;
    fmt::print("{}\n", j.dump(2));
    return;
  }
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
      "  per card: step needs {} at once; peak device {}, host {}, SSD {}; optimizer on the {}\n",
      gb(double(r.footprint)), gb(double(r.sim.peak_device)), gb(double(r.sim.peak_host)),
      gb(double(r.sim.peak_ssd)), r.optimizer_on_host ? "host CPU" : "device");
  fmt::print("  stall {:.3f} s over {} steps; transfer time hidden behind compute {:.0f}%\n",
             r.stall_s, s.steps, 100 * r.hidden_fraction);
  fmt::print("  {:<5} {:>10} {:>10} {:>8}\n", "link", "bytes", "transfers", "busy s");
  for (int l = 0; l < engine::kNumLinks; ++l) {
    const auto& x = r.sim.links[l];
    fmt::print("  {:<5} {:>10} {:>10} {:>8.3f}\n", engine::to_string(engine::Link(l)),
               gb(double(x.bytes)), x.transfers, double(x.busy_ns) * 1e-9);
  }
  fmt::print("  top ops by bytes they waited for:\n");
  for (std::size_t i = 0; i < r.sim.op_families.size() && i < 5; ++i) {
    const auto& f = r.sim.op_families[i];
    if (f.missed_bytes == 0) break;
    fmt::print("    {:<40} {:>10} waited {:.3f} s over {} runs\n", f.name,
               gb(double(f.missed_bytes)), double(f.stall_ns) * 1e-9, f.steps);
  }
  fmt::print("  links modelled: {}\n", r.sim.links_label);
}

void run_capacity(const TrainArgs& a) {
  TrainArgs base = a;
  base.policy = "u3m";
  experiments::TrainScenario s = scenario(base);
  std::vector<std::string> pols;
  for (std::size_t b = 0; b <= a.policies.size();) {
    std::size_t e = a.policies.find(',', b);
    if (e == std::string::npos) e = a.policies.size();
    pols.push_back(a.policies.substr(b, e - b));
    b = e + 1;
  }
  for (const std::string& p : pols) {
    experiments::TrainScenario check = s;
    check.policy = p;
    check.validate();  // names the bad policy
  }
  const bool tty = isatty(STDERR_FILENO) && !a.json;
  auto progress = [&](const std::string& what) {
    if (tty) fmt::print(stderr, "\r\033[K  simulating {}", what);
  };
  auto rows = experiments::training_capacity(s, pols, a.max_loss, progress);
  if (tty) fmt::print(stderr, "\r\033[K");
  std::uint64_t base_params = 0;
  for (const auto& r : rows) {
    if (r.policy == "hbm-only") base_params = r.max_params;
  }
  if (a.json) {
    nlohmann::json j = {{"scenario", scenario_json(s)}, {"profile", sim::profile_json(s.hw)}};
    j["scenario"]["max_loss"] = a.max_loss;
    j["scenario"]["family"] = "llama family (docs/training.md)";
    for (const auto& r : rows) {
      nlohmann::json tried = nlohmann::json::array();
      for (const auto& t : r.tried) {
        tried.push_back(
            {{"params", t.params}, {"fits", t.fits}, {"loss", t.loss}, {"step_s", t.step_s}});
      }
      j["policies"][r.policy] = {
          {"max_params", r.max_params},
          {"model", r.model},
          {"loss", r.loss},
          {"step_s", r.step_s},
          {"gain_vs_hbm_only", base_params ? double(r.max_params) / double(base_params) : 0.0},
          {"tried", tried}};
    }
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print(
      "training capacity, simulated with profile {} x {} cards (ZeRO-3), micro-batch {} x {} "
      "tokens, grad-accum {}, Adam, 16-bit weights; bound: loss <= {:.0f}%\n",
      s.hw.name, s.cards, s.train.micro_batch_size, s.train.seq_len, s.train.micro_batches,
      100 * a.max_loss);
  fmt::print("  {:<15} {:>12} {:>11} {:>8} {:>8} {:>10}\n", "policy", "max params", "model", "loss",
             "step s", "vs hbm-only");
  for (const auto& r : rows) {
    if (r.max_params == 0) {  // not even the smallest shape met the bound
      fmt::print("  {:<15} {:>12} {:>11} {:>8} {:>8} {:>10}\n", r.policy, "none", "-", "-", "-",
                 "-");
      continue;
    }
    fmt::print("  {:<15} {:>11.2f}B {:>11} {:>7.1f}% {:>8.3f} {:>9.2f}x\n", r.policy,
               double(r.max_params) / 1e9, r.model, 100 * r.loss, r.step_s,
               base_params ? double(r.max_params) / double(base_params) : 0.0);
  }
  // What limits the larger shapes: the first one each policy could not take.
  fmt::print("  first shape over the bound, per policy:\n");
  for (const auto& r : rows) {
    for (const auto& t : r.tried) {
      if (t.fits && t.loss <= a.max_loss) continue;
      fmt::print("    {:<15} {:.2f}B params: {}\n", r.policy, double(t.params) / 1e9,
                 t.fits
                     ? fmt::format("loss {:.1f}% (step {:.3f} s vs {:.3f} s ideal, stall {:.3f} s)",
                                   100 * t.loss, t.step_s, t.ideal_step_s, t.stall_s)
                     : t.why.substr(0, 110));
      break;
    }
  }
}

void add_scenario_options(CLI::App* c, TrainArgs& a) {
  c->add_option("--hw", a.hw, "Hardware profile: a built-in name (u3m hw show) or a TOML file")
      ->capture_default_str();
  c->add_option("--cards", a.cards, "Cards; ZeRO-3 shards across them")->capture_default_str();
  c->add_option("--micro-batch", a.train.micro_batch_size, "Sequences per micro-batch")
      ->capture_default_str();
  c->add_option("--seq", a.train.seq_len, "Tokens per sequence")->capture_default_str();
  c->add_option("--grad-accum", a.train.micro_batches, "Micro-batches per optimizer step")
      ->capture_default_str();
  c->add_option("--lora-rank", a.train.lora_rank, "LoRA rank (0 = full fine-tuning)")
      ->capture_default_str();
  c->add_flag("--recompute", a.train.recompute, "Recompute activations per layer in backward");
  c->add_option("--steps", a.steps, "Steps simulated; the last is reported")->capture_default_str();
  c->add_flag("--json", a.json, "One JSON object with the scenario, the profile and the version");
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
  sim->add_option("--policy", a->policy, "hbm-only | static-offload | lru | u3m | oracle")
      ->capture_default_str();
  add_scenario_options(sim, *a);
  sim->callback([a] { run_sim(*a); });

  auto* cap = train->add_subcommand(
      "capacity",
      "For each policy, the largest model of the llama family that trains within the "
      "throughput-loss bound, and its gain against hbm-only");
  cap->add_option("--max-loss", a->max_loss, "Throughput-loss bound, e.g. 0.05")
      ->capture_default_str();
  cap->add_option("--policies", a->policies, "Comma-separated policies")->capture_default_str();
  add_scenario_options(cap, *a);
  cap->callback([a] { run_capacity(*a); });
}

}  // namespace u3m::cli
