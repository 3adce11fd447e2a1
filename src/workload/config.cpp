#include "u3m/workload/config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::workload {

std::uint64_t TimeModel::op_ns(double flops, std::uint64_t bytes, bool collective) const {
  double s = collective
                 ? static_cast<double>(bytes) / link_bytes_per_s
                 : std::max(flops / peak_flops, static_cast<double>(bytes) / hbm_bytes_per_s);
  return static_cast<std::uint64_t>(std::llround(s * 1e9 + op_overhead_ns));
}

std::string TimeModel::describe() const {
  return fmt::format(
      "nominal roofline: max(flops/{:g} TFLOPS, bytes/{:g} GB/s HBM) + {:g} us per op; "
      "collectives bytes/{:g} GB/s link (defaults: nominal Ascend 910B, see docs/workloads.md)",
      peak_flops / 1e12, hbm_bytes_per_s / 1e9, op_overhead_ns / 1e3, link_bytes_per_s / 1e9);
}

void TrainConfig::validate(const TrainFlags& flags) const {
  auto positive = [](std::uint64_t v, std::string_view field) {
    if (v == 0) input_error(field, "must be a positive integer");
  };
  positive(steps, flags.steps);
  positive(micro_batches, flags.micro_batches);
  positive(micro_batch_size, flags.micro_batch_size);
  positive(seq_len, flags.seq_len);
  positive(zero3_ranks, flags.zero3_ranks);
  positive(zero3_shards, "zero3_shards");
  if (zero3_shards > 1 && zero3_shards >= zero3_ranks)
    input_error("zero3_shards", "{} shards on one of {} ranks leaves no other rank", zero3_shards,
                zero3_ranks);
  if (lora_rank > 65536)
    input_error(flags.lora_rank, "{} is larger than any projection", lora_rank);
  if (lora_rank > 0 && lora_targets.empty())
    input_error("--lora-targets", "LoRA needs at least one target projection");
  if (tokens_per_micro_batch() > (1ull << 32))
    input_error(flags.micro_batch_size, "{} x {} = {} tokens per micro-batch is too large",
                flags.micro_batch_size, flags.seq_len, tokens_per_micro_batch());
}

LengthDist LengthDist::fixed_len(std::uint32_t n) {
  return {Kind::fixed, double(n), double(n), n};
}
LengthDist LengthDist::uniform(std::uint32_t lo, std::uint32_t hi) {
  return {Kind::uniform, double(lo), double(hi), hi};
}

namespace {

double parse_number(std::string_view s, std::string_view field, std::string_view spec) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v))
    input_error(field, "'{}' in '{}' is not a number", s, spec);
  return v;
}

std::uint32_t parse_count(std::string_view s, std::string_view field, std::string_view spec) {
  double v = parse_number(s, field, spec);
  if (v < 1 || v > 1e9 || v != std::floor(v))
    input_error(field, "'{}' in '{}' must be a positive integer", s, spec);
  return static_cast<std::uint32_t>(v);
}

}  // namespace

LengthDist LengthDist::parse(std::string_view spec, std::string_view field) {
  std::vector<std::string_view> parts;
  for (std::size_t pos = 0;;) {
    std::size_t c = spec.find(':', pos);
    parts.push_back(spec.substr(pos, c == spec.npos ? spec.npos : c - pos));
    if (c == spec.npos) break;
    pos = c + 1;
  }
  const std::string_view kind = parts[0];
  if (kind == "fixed" && parts.size() == 2) return fixed_len(parse_count(parts[1], field, spec));
  if (kind == "uniform" && parts.size() == 3) {
    std::uint32_t lo = parse_count(parts[1], field, spec), hi = parse_count(parts[2], field, spec);
    if (lo > hi) input_error(field, "uniform:LO:HI needs LO <= HI, got '{}'", spec);
    return uniform(lo, hi);
  }
  if (kind == "lognormal" && parts.size() == 4) {
    double median = parse_number(parts[1], field, spec);
    double sigma = parse_number(parts[2], field, spec);
    if (median < 1 || sigma < 0)
      input_error(field, "lognormal needs MEDIAN >= 1 and SIGMA >= 0, got '{}'", spec);
    return {Kind::lognormal, median, sigma, parse_count(parts[3], field, spec)};
  }
  input_error(field,
              "bad length distribution '{}' (use fixed:N, uniform:LO:HI or "
              "lognormal:MEDIAN:SIGMA:MAX)",
              spec);
}

std::string LengthDist::describe() const {
  switch (kind) {
    case Kind::fixed:
      return fmt::format("fixed:{}", max);
    case Kind::uniform:  // a is an integer; %g would round 1234567 to 1.23457e+06
      return fmt::format("uniform:{}:{}", static_cast<std::uint32_t>(a), max);
    case Kind::lognormal:  // {}: the shortest text that reads back as the same double
      return fmt::format("lognormal:{}:{}:{}", a, b, max);
  }
  return "?";
}

std::uint32_t LengthDist::upper_bound() const {
  return max;
}

void InferConfig::validate() const {
  if (block_tokens == 0) input_error("--block-tokens", "must be a positive integer");
  if (max_batch == 0) input_error("--max-batch", "must be a positive integer");
  if (max_prefill_tokens == 0) input_error("--max-prefill-tokens", "must be a positive integer");
  if (max_iterations == 0) input_error("--max-iterations", "must be a positive integer");
}

void MixedConfig::validate() const {
  train.validate();
  infer.validate();
  if (pattern == Pattern::alternate) {
    if (rounds == 0) input_error("--rounds", "must be a positive integer");
    if (rollout_batch == 0) input_error("--rollout-batch", "must be a positive integer");
    if (max_new_tokens == 0) input_error("--max-new-tokens", "must be a positive integer");
  }
}

std::string_view to_string(MixedConfig::Pattern p) {
  return p == MixedConfig::Pattern::alternate ? "alternate" : "timeshare";
}

}  // namespace u3m::workload
