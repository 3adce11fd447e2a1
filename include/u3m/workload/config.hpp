// Configuration of the workload generators, and the nominal time model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "u3m/workload/shape.hpp"

namespace u3m::workload {

// Note [Nominal time model]
// Timestamps are nominal, never measured: each op takes
//   max(flops / peak_flops, bytes / hbm_bandwidth) + op_overhead
// (collectives: link_bytes / link_bandwidth + op_overhead), ops run one after
// another on one device. Defaults are nominal Ascend 910B figures:
//  * 376 TFLOPS FP16 dense: the figure public reports give for the 910B (the
//    910B2 SKU). Not checked against a Huawei datasheet; other reports give
//    256-320 (e.g. https://boardor.com/blog/huawei-ascend-910b-outperforms-h20-910c-approaches-h100
//    says ~320) and some quote 354; set --peak-tflops to taste.
//  * 1.6 TB/s HBM bandwidth (MISSION.md: 910B cards, about 1.6 TB/s).
//  * 56 GB/s card-to-card: one HCCS link, as public Atlas 800T A2 material
//    describes (7 links, 392 GB/s per card in an 8-card mesh); unverified.
//  * 5 us per-op launch overhead: an assumption, not a measurement.
struct TimeModel {
  double peak_flops = 376e12;
  double hbm_bytes_per_s = 1.6e12;
  double link_bytes_per_s = 56e9;
  double op_overhead_ns = 5000;

  std::uint64_t op_ns(double flops, std::uint64_t bytes, bool collective) const;
  // "nominal roofline, peak 376 TFLOPS fp16, HBM 1600 GB/s, link 56 GB/s, 5 us/op"
  std::string describe() const;
};

// The names TrainConfig::validate() gives the fields: `u3m trace gen`'s flags
// by default; `u3m train sim` spells some differently (kTrainSimFlags).
struct TrainFlags {
  std::string_view steps = "--steps", micro_batches = "--micro-batches",
                   micro_batch_size = "--batch", seq_len = "--seq-len", lora_rank = "--lora-rank",
                   zero3_ranks = "--zero3-ranks";
};
inline constexpr TrainFlags kTrainSimFlags{"--steps", "--grad-accum", "--micro-batch",
                                           "--seq",   "--lora-rank",  "--cards"};

struct TrainConfig {
  std::uint32_t steps = 2;
  std::uint32_t micro_batches = 1;     // gradient accumulation: optimizer once per step
  std::uint32_t micro_batch_size = 1;  // sequences per micro-batch
  std::uint32_t seq_len = 2048;
  bool recompute = false;  // checkpoint per layer: keep layer inputs only
  // Checkpoint only the first N layers (their activations wait longest for
  // backward); the rest keep theirs. `recompute` means every layer.
  std::uint32_t recompute_layers = 0;
  bool mixed_precision = true;  // 16-bit weights/grads + fp32 master, m, v
  std::uint32_t lora_rank = 0;  // 0: full fine-tuning
  double lora_alpha = 32;       // recorded only; scaling costs no memory
  std::vector<Proj> lora_targets = {Proj::q, Proj::v};
  std::uint32_t zero3_ranks = 1;  // 1: unsharded; N >= 2: this trace is rank 0 of N
  // Shards of the sharded state (weights, gradients, optimizer) this rank
  // holds: 1, or 2 once it has taken over a failed neighbour's (`u3m train
  // sim --fail-card`). Collective traffic is unchanged: a ring still moves
  // N-1 shards through every rank's link.
  std::uint32_t zero3_shards = 1;

  std::uint64_t tokens_per_micro_batch() const { return std::uint64_t{micro_batch_size} * seq_len; }
  bool lora() const { return lora_rank > 0; }
  bool recomputes(std::uint32_t layer) const { return recompute || layer < recompute_layers; }
  bool zero3() const { return zero3_ranks > 1; }
  // Throws InputError naming the field by its flag in `flags`.
  void validate(const TrainFlags& flags = {}) const;
};

// A request length distribution: "fixed:N", "uniform:LO:HI" or
// "lognormal:MEDIAN:SIGMA:MAX" (clipped to [1, MAX]).
struct LengthDist {
  enum class Kind : std::uint8_t { fixed, uniform, lognormal };
  Kind kind = Kind::fixed;
  double a = 1, b = 1;
  std::uint32_t max = 1;

  static LengthDist fixed_len(std::uint32_t n);
  static LengthDist uniform(std::uint32_t lo, std::uint32_t hi);
  // Throws InputError naming `field` on a malformed spec.
  static LengthDist parse(std::string_view spec, std::string_view field);
  std::string describe() const;  // the spec string parse() accepts
  std::uint32_t upper_bound() const;
};

struct InferConfig {
  std::uint32_t block_tokens = 128;          // KV block size; vllm-ascend's default is 128
  std::uint32_t max_batch = 120;             // running requests (the reference scenario: 120)
  std::uint32_t max_prefill_tokens = 16384;  // per prefill iteration (one prompt always fits)
  std::uint32_t max_iterations = 1u << 30;   // safety stop
  void validate() const;
};

struct MixedConfig {
  enum class Pattern : std::uint8_t { alternate, timeshare };
  Pattern pattern = Pattern::alternate;
  TrainConfig train;
  InferConfig infer;
  // alternate (RLHF/GRPO-like): `rounds` x (rollout of `rollout_batch`
  // requests, each at most `max_new_tokens` new tokens; then train.steps steps).
  std::uint32_t rounds = 2;
  std::uint32_t rollout_batch = 8;
  std::uint32_t max_new_tokens = 64;
  void validate() const;
};
std::string_view to_string(MixedConfig::Pattern p);

// Extra metadata a caller wants in the trace (e.g. the command line).
using MetaList = std::vector<std::pair<std::string, std::string>>;

struct GenOptions {
  TimeModel time;
  MetaList extra_meta;
};

}  // namespace u3m::workload
