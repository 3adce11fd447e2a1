// u3m trace gen: synthetic LLaMA-shape traces (training, serving, co-location).
// The generators live in src/workload; docs/workloads.md explains the model.
#include <chrono>
#include <fstream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "u3m/trace/io.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/analytic.hpp"
#include "u3m/workload/generate.hpp"

namespace u3m::cli {
namespace {

using namespace u3m::workload;

struct GenArgs {
  std::string model = "llama2-13b", workload = "mixed", pattern = "alternate";
  std::uint32_t layers = 0, d_model = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0;
  bool tied = false;
  TrainConfig train;
  std::string lora_targets = "q,v";
  bool fp32 = false;
  InferConfig infer;
  PoissonConfig requests;
  std::string prompt_len = "uniform:256:2048", output_len = "uniform:16:256";
  std::uint32_t rounds = 2, rollout_batch = 8, max_new_tokens = 64;
  double peak_tflops = 376, hbm_gbps = 1600, link_gbps = 56, overhead_us = 5;
  std::string out, summary_json;
  std::string options_dump;  // every option's value, for the trace metadata
};

ModelShape resolve_shape(const GenArgs& a, const CLI::App& cmd) {
  ModelShape s = preset(a.model);
  bool custom = false;
  auto apply = [&](const char* flag, std::uint32_t v, std::uint32_t& field) {
    if (cmd.count(flag) == 0) return;
    field = v;
    custom = true;
  };
  apply("--layers", a.layers, s.layers);
  apply("--d-model", a.d_model, s.d_model);
  apply("--heads", a.heads, s.heads);
  apply("--kv-heads", a.kv_heads, s.kv_heads);
  apply("--ffn", a.ffn, s.ffn);
  apply("--vocab", a.vocab, s.vocab);
  if (a.tied) {
    s.tied_embeddings = true;
    custom = true;
  }
  if (custom) s.name += "+custom";
  s.validate(custom ? "custom shape (--layers/--d-model/--heads/--kv-heads/--ffn/--vocab)"
                    : "--model");
  return s;
}

// Decimal units, scaled so tiny models don't print "0.00 GB".
std::string gb(std::uint64_t bytes) {
  if (bytes >= 1'000'000'000) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1'000'000) return fmt::format("{:.2f} MB", bytes / 1e6);
  if (bytes >= 1'000) return fmt::format("{:.2f} kB", bytes / 1e3);
  return fmt::format("{} B", bytes);
}

void run_gen(GenArgs a, const CLI::App& cmd) {
  const ModelShape shape = resolve_shape(a, cmd);
  a.train.mixed_precision = !a.fp32;
  if (a.train.lora()) a.train.lora_targets = parse_proj_list(a.lora_targets, "--lora-targets");
  a.requests.prompt = LengthDist::parse(a.prompt_len, "--prompt-len");
  a.requests.output = LengthDist::parse(a.output_len, "--output-len");
  // Alternate rollouts draw rounds x rollout-batch requests unless told otherwise.
  // (A zero product keeps the default: MixedConfig::validate() names the zero flag.)
  const std::uint64_t rollouts = std::uint64_t{a.rounds} * a.rollout_batch;
  if (a.workload == "mixed" && a.pattern == "alternate" && cmd.count("--requests") == 0 &&
      rollouts > 0) {
    if (rollouts > UINT32_MAX)
      input_error("--rollout-batch", "--rounds x --rollout-batch = {} requests is too many",
                  rollouts);
    a.requests.count = static_cast<std::uint32_t>(rollouts);
  }
  for (auto [v, flag] : {std::pair{a.peak_tflops, "--peak-tflops"},
                         {a.hbm_gbps, "--hbm-gbps"},
                         {a.link_gbps, "--link-gbps"}})
    if (!(v > 0)) input_error(flag, "must be a positive number, got {}", v);
  if (a.overhead_us < 0) input_error("--op-overhead-us", "must not be negative");

  GenOptions opt;
  opt.time.peak_flops = a.peak_tflops * 1e12;
  opt.time.hbm_bytes_per_s = a.hbm_gbps * 1e9;
  opt.time.link_bytes_per_s = a.link_gbps * 1e9;
  opt.time.op_overhead_ns = a.overhead_us * 1e3;
  opt.extra_meta = {{"seed", std::to_string(a.requests.seed)},
                    {"gen.command", "u3m trace gen"},
                    {"gen.options", a.options_dump}};

  std::unique_ptr<trace::TraceSink> writer;
  if (!a.out.empty()) writer = trace::open_writer(a.out);
  CountingSink count(writer.get());

  const auto t0 = std::chrono::steady_clock::now();
  GenResult r;
  const bool train = a.workload != "infer", infer = a.workload != "train";
  if (a.workload == "train") {
    r = generate_train(shape, a.train, count, opt);
  } else if (a.workload == "infer") {
    PoissonSource src(a.requests);
    r = generate_infer(shape, a.infer, src, count, opt);
  } else {
    MixedConfig m;
    m.pattern = a.pattern == "alternate" ? MixedConfig::Pattern::alternate
                                         : MixedConfig::Pattern::timeshare;
    m.train = a.train;
    m.infer = a.infer;
    m.rounds = a.rounds;
    m.rollout_batch = a.rollout_batch;
    m.max_new_tokens = a.max_new_tokens;
    PoissonSource src(a.requests);
    r = generate_mixed(shape, m, src, count, opt);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // ---- summary
  nlohmann::json j;
  j["model"] = {{"preset", shape.name},       {"layers", shape.layers},
                {"d_model", shape.d_model},   {"heads", shape.heads},
                {"kv_heads", shape.kv_heads}, {"ffn", shape.ffn},
                {"vocab", shape.vocab},       {"tied_embeddings", shape.tied_embeddings}};
  j["workload"] = a.workload;
  if (a.workload == "mixed") j["pattern"] = a.pattern;
  auto& an = j["analytic"];
  an["label"] = "analytic (from the model shape)";
  an["params"] = analytic::param_count(shape);
  an["kv_bytes_per_token"] = analytic::kv_bytes_per_token(shape);
  fmt::print(
      "u3m trace gen: {} ({} layers, d {}, {} heads, {} KV heads, ffn {}, vocab {}), "
      "workload {}{}{}\n",
      shape.name, shape.layers, shape.d_model, shape.heads, shape.kv_heads, shape.ffn, shape.vocab,
      a.workload, a.workload == "mixed" ? " / " : "", a.workload == "mixed" ? a.pattern : "");
  fmt::print("analytic (from the model shape):\n");
  fmt::print("  parameters               {:.2f} B ({} fp16)\n", analytic::param_count(shape) / 1e9,
             gb(2 * analytic::param_count(shape)));
  if (train) {
    const analytic::TrainBytes b = analytic::train_bytes(shape, a.train);
    const char* per = a.train.zero3() ? " per rank" : "";
    fmt::print("  trainable parameters     {:.4f} B{}\n", b.trainable_params / 1e9,
               a.train.lora() ? " (LoRA adapters)" : "");
    fmt::print("  params{:<18} {}\n", per, gb(b.param_bytes));
    fmt::print("  grads{:<19} {}\n", per, gb(b.grad_bytes));
    fmt::print("  optimizer{:<15} {} ({})\n", per, gb(b.optimizer_bytes),
               a.train.mixed_precision ? "fp32 master + Adam m + v" : "Adam m + v, fp32");
    fmt::print("  activations saved        {} per micro-batch ({} tokens{})\n",
               gb(b.activation_saved_bytes), a.train.tokens_per_micro_batch(),
               a.train.recompute ? ", recompute" : "");
    an["trainable_params"] = b.trainable_params;
    an["param_bytes"] = b.param_bytes;
    an["grad_bytes"] = b.grad_bytes;
    an["optimizer_bytes"] = b.optimizer_bytes;
    an["activation_saved_bytes"] = b.activation_saved_bytes;
  }
  fmt::print("  KV per token             {} B (fp16)\n", analytic::kv_bytes_per_token(shape));
  if (infer) {
    const std::uint64_t kv = analytic::kv_bytes(shape, a.train.seq_len, a.infer.max_batch);
    fmt::print("  KV total                 {} for --max-batch {} x --seq-len {} tokens\n", gb(kv),
               a.infer.max_batch, a.train.seq_len);
    an["kv_bytes_max_batch_x_seq_len"] = kv;
  }

  auto& c = j["counted"];
  c["label"] = "counted from the generated trace";
  c["ops"] = count.ops();
  c["events"] = count.events();
  c["tensors"] = count.tensors();
  c["train_steps"] = r.train_steps;
  c["infer_iterations"] = r.infer_iterations;
  c["requests_completed"] = r.requests_completed;
  c["nominal_duration_ns"] = r.end_ns;
  fmt::print("counted from the generated trace:\n");
  fmt::print("  ops {}, events {}, tensors {}\n", count.ops(), count.events(), count.tensors());
  if (train) fmt::print("  training steps {}\n", r.train_steps);
  if (infer)
    fmt::print("  serving iterations {}, requests completed {}\n", r.infer_iterations,
               r.requests_completed);
  fmt::print("  nominal duration {:.3f} s (time model: {})\n", r.end_ns / 1e9, opt.time.describe());
  const std::vector<std::pair<std::uint32_t, std::string>> jobs =
      a.workload == "train" ? std::vector<std::pair<std::uint32_t, std::string>>{{0, "train-0"}}
      : a.workload == "infer"
          ? std::vector<std::pair<std::uint32_t, std::string>>{{0, "infer-0"}}
          : std::vector<std::pair<std::uint32_t, std::string>>{{0, "train-0"}, {1, "infer-0"}};
  using trace::Role;
  for (const auto& [job, name] : jobs) {
    fmt::print("  peak live bytes, {}:", name);
    auto& jj = c["peak_bytes"][name];
    for (Role role : {Role::param, Role::grad, Role::optim_master, Role::optim_m, Role::optim_v,
                      Role::activation, Role::kv, Role::workspace, Role::other}) {
      const std::uint64_t p = count.peak(job, role);
      jj[std::string(trace::to_string(role))] = p;
      if (p) fmt::print(" {} {}", trace::to_string(role), gb(p));
    }
    fmt::print("\n");
  }
  c["peak_bytes_all"] = count.peak_total();
  fmt::print("  peak live bytes, all jobs: {}\n", gb(count.peak_total()));
  j["generation_seconds_measured"] = secs;
  fmt::print("generated in {:.2f} s ({:.1f} M events/s, measured wall clock on this machine){}\n",
             secs, count.events() / secs / 1e6, a.out.empty() ? "" : " -> " + a.out);
  j["output"] = a.out;
  j["options"] = a.options_dump;
  if (!a.summary_json.empty()) {
    std::ofstream f(a.summary_json);
    f << j.dump(2) << "\n";
    if (!f) input_error(a.summary_json, "cannot write the summary");
  }
}

}  // namespace

void add_trace_gen_command(CLI::App& trace) {
  auto args = std::make_shared<GenArgs>();
  GenArgs& a = *args;
  CLI::App* g = trace.add_subcommand(
      "gen",
      "Generate a synthetic LLaMA-shape trace: a training step (forward, backward, optimizer; "
      "gradient accumulation, recompute, LoRA, ZeRO-3), continuous-batching serving with a paged "
      "KV cache, or both co-located on one device. Always prints a summary; times are nominal "
      "(roofline), see docs/workloads.md.");
  g->add_option("--model", a.model, "Model preset: llama2-13b, llama3-8b, tiny, tiny-mha")
      ->capture_default_str();
  g->add_option("--workload", a.workload, "train | infer | mixed")
      ->check(CLI::IsMember({"train", "infer", "mixed"}))
      ->capture_default_str();
  g->add_option("--pattern", a.pattern,
                "Co-location pattern for mixed: alternate (rollouts then training steps, "
                "RLHF-like) | timeshare (serving iterations interleave at training layer "
                "boundaries as requests arrive)")
      ->check(CLI::IsMember({"alternate", "timeshare"}))
      ->capture_default_str();
  const char* kShape = "Custom shape (overrides the preset)";
  g->add_option("--layers", a.layers, "Decoder layers")->group(kShape);
  g->add_option("--d-model", a.d_model, "Hidden size")->group(kShape);
  g->add_option("--heads", a.heads, "Attention heads (must divide d-model)")->group(kShape);
  g->add_option("--kv-heads", a.kv_heads, "KV heads (must divide heads)")->group(kShape);
  g->add_option("--ffn", a.ffn, "SwiGLU hidden size")->group(kShape);
  g->add_option("--vocab", a.vocab, "Vocabulary size")->group(kShape);
  g->add_flag("--tied-embeddings", a.tied, "lm_head shares the embedding matrix")->group(kShape);

  const char* kTrain = "Training (train, mixed)";
  g->add_option("--steps", a.train.steps, "Training steps (mixed alternate: per round)")
      ->capture_default_str()
      ->group(kTrain);
  g->add_option("--micro-batches", a.train.micro_batches,
                "Gradient accumulation micro-batches per step")
      ->capture_default_str()
      ->group(kTrain);
  g->add_option("--batch", a.train.micro_batch_size, "Sequences per micro-batch")
      ->capture_default_str()
      ->group(kTrain);
  g->add_option("--seq-len", a.train.seq_len,
                "Training sequence length (also the context of the analytic KV total)")
      ->capture_default_str()
      ->group(kTrain);
  g->add_flag("--recompute", a.train.recompute,
              "Activation checkpointing per layer (keep layer inputs, re-run forward in backward)")
      ->group(kTrain);
  g->add_flag("--fp32", a.fp32, "fp32 weights and grads, no master copy (default: mixed fp16)")
      ->group(kTrain);
  g->add_option("--lora-rank", a.train.lora_rank, "LoRA rank; 0 = full fine-tuning")
      ->capture_default_str()
      ->group(kTrain);
  g->add_option("--lora-alpha", a.train.lora_alpha, "LoRA alpha (recorded)")
      ->capture_default_str()
      ->group(kTrain);
  g->add_option("--lora-targets", a.lora_targets,
                "Adapted projections: q,k,v,o,gate,up,down or all")
      ->capture_default_str()
      ->group(kTrain);
  g->add_option("--zero3-ranks", a.train.zero3_ranks,
                "ZeRO-3 data-parallel ranks; the trace is rank 0 (1 = unsharded)")
      ->capture_default_str()
      ->group(kTrain);

  const char* kServe = "Serving (infer, mixed)";
  g->add_option("--requests", a.requests.count,
                "Number of requests (mixed alternate: default rounds x rollout-batch)")
      ->capture_default_str()
      ->group(kServe);
  g->add_option("--arrival-rate", a.requests.rate_per_s,
                "Poisson arrival rate, requests per nominal second")
      ->capture_default_str()
      ->group(kServe);
  g->add_option("--prompt-len", a.prompt_len,
                "Prompt length: fixed:N | uniform:LO:HI | lognormal:MEDIAN:SIGMA:MAX")
      ->capture_default_str()
      ->group(kServe);
  g->add_option("--output-len", a.output_len, "Output length, same syntax")
      ->capture_default_str()
      ->group(kServe);
  g->add_option("--block-tokens", a.infer.block_tokens, "Tokens per KV block")
      ->capture_default_str()
      ->group(kServe);
  g->add_option("--max-batch", a.infer.max_batch, "Most requests in the running batch")
      ->capture_default_str()
      ->group(kServe);
  g->add_option("--max-prefill-tokens", a.infer.max_prefill_tokens,
                "Prompt tokens per prefill iteration")
      ->capture_default_str()
      ->group(kServe);
  g->add_option("--seed", a.requests.seed, "Seed of the request generator")
      ->capture_default_str()
      ->group(kServe);
  g->add_option("--rounds", a.rounds, "mixed alternate: rollout/train rounds")
      ->capture_default_str()
      ->group(kServe);
  g->add_option("--rollout-batch", a.rollout_batch, "mixed alternate: requests per rollout")
      ->capture_default_str()
      ->group(kServe);
  g->add_option("--max-new-tokens", a.max_new_tokens,
                "mixed alternate: cap on tokens generated per rollout")
      ->capture_default_str()
      ->group(kServe);

  const char* kTime = "Nominal time model (defaults: Ascend 910B, see docs/workloads.md)";
  g->add_option("--peak-tflops", a.peak_tflops, "Dense fp16 peak")
      ->capture_default_str()
      ->group(kTime);
  g->add_option("--hbm-gbps", a.hbm_gbps, "HBM bandwidth, GB/s")
      ->capture_default_str()
      ->group(kTime);
  g->add_option("--link-gbps", a.link_gbps, "Card-to-card bandwidth for collectives, GB/s")
      ->capture_default_str()
      ->group(kTime);
  g->add_option("--op-overhead-us", a.overhead_us, "Fixed cost per op, microseconds")
      ->capture_default_str()
      ->group(kTime);

  g->add_option("-o,--output", a.out, "Write the trace here: .jsonl or .u3mt (binary)");
  g->add_option("--summary-json", a.summary_json, "Also write the summary as JSON here");
  g->callback([args, g] {
    GenArgs copy = *args;
    copy.options_dump = g->config_to_str(true, false);
    run_gen(std::move(copy), *g);
  });
}

}  // namespace u3m::cli
