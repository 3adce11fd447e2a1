#include "u3m/workload/generate.hpp"

#include "u3m/util/error.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "jobs.hpp"
#include "u3m/workload/analytic.hpp"

namespace u3m::workload {

namespace {

using detail::Emitter;
using detail::InferJob;
using detail::TrainJob;

std::string join_proj(const std::vector<Proj>& v) {
  std::string s;
  for (Proj p : v) s += (s.empty() ? "" : ",") + std::string(to_string(p));
  return s;
}

// Everything needed to regenerate the trace goes into its metadata.
void common_meta(Emitter& e, const ModelShape& s, std::string_view workload,
                 const GenOptions& opt) {
  e.meta("generator", "u3m workload generator v1 (src/workload, docs/workloads.md)");
  e.meta("workload", workload);
  e.meta("time_model", opt.time.describe());
  e.meta("model.preset", s.name);
  e.meta("model.layers", std::to_string(s.layers));
  e.meta("model.d_model", std::to_string(s.d_model));
  e.meta("model.heads", std::to_string(s.heads));
  e.meta("model.kv_heads", std::to_string(s.kv_heads));
  e.meta("model.ffn", std::to_string(s.ffn));
  e.meta("model.vocab", std::to_string(s.vocab));
  e.meta("model.tied_embeddings", s.tied_embeddings ? "true" : "false");
  e.meta("analytic.params", std::to_string(analytic::param_count(s)));
  e.meta("analytic.kv_bytes_per_token_fp16", std::to_string(analytic::kv_bytes_per_token(s)));
  for (const auto& [k, v] : opt.extra_meta) e.meta(k, v);
}

void train_meta(Emitter& e, const TrainConfig& c) {
  e.meta("train.steps", std::to_string(c.steps));
  e.meta("train.micro_batches", std::to_string(c.micro_batches));
  e.meta("train.micro_batch_size", std::to_string(c.micro_batch_size));
  e.meta("train.seq_len", std::to_string(c.seq_len));
  e.meta("train.recompute", c.recompute ? "true" : "false");
  if (c.recompute_layers > 0 && !c.recompute)
    e.meta("train.recompute_layers", std::to_string(c.recompute_layers));
  e.meta("train.mixed_precision", c.mixed_precision ? "true" : "false");
  e.meta("train.lora_rank", std::to_string(c.lora_rank));
  e.meta("train.lora_alpha", fmt::format("{:g}", c.lora_alpha));
  e.meta("train.lora_targets", c.lora() ? join_proj(c.lora_targets) : "");
  e.meta("train.zero3_ranks", std::to_string(c.zero3_ranks));
  if (c.zero3()) {
    e.meta("train.zero3_rank", "0");
    if (c.zero3_shards > 1) e.meta("train.zero3_shards", std::to_string(c.zero3_shards));
    e.meta("train.zero3_layout",
           "weights *.shard (param), gathered *.gathered and *.grad.unsharded (workspace); "
           "all-gather/reduce-scatter ops in phase collective");
  }
}

void infer_meta(Emitter& e, const InferConfig& c, const RequestSource& src) {
  e.meta("infer.block_tokens", std::to_string(c.block_tokens));
  e.meta("infer.max_batch", std::to_string(c.max_batch));
  e.meta("infer.max_prefill_tokens", std::to_string(c.max_prefill_tokens));
  e.meta("infer.requests", src.describe());
}

// Serves until every request has finished, idling to the next arrival.
void drain(Emitter& e, InferJob& job, std::uint32_t max_iterations) {
  while (!job.done() && job.iterations() < max_iterations) {
    if (!job.has_work()) {
      e.advance_to(*job.next_arrival());
      continue;
    }
    job.iterate();
  }
}

}  // namespace

// A LoRA rank above a projection's smaller side adds parameters, not a
// low-rank adapter: reject it against the shape (the config alone can't).
static void check_lora(const ModelShape& shape, const TrainConfig& cfg) {
  const std::uint32_t smallest = std::min(shape.kv_dim(), shape.d_model);
  if (cfg.lora_rank > smallest)
    input_error("--lora-rank", "{} exceeds the smallest adapted dimension ({}) of model '{}'",
                cfg.lora_rank, smallest, shape.name);
}

GenResult generate_train(const ModelShape& shape, const TrainConfig& cfg, trace::TraceSink& out,
                         const GenOptions& opt) {
  shape.validate();
  cfg.validate();
  check_lora(shape, cfg);
  Emitter e(out, opt.time);
  common_meta(e, shape, "train", opt);
  train_meta(e, cfg);
  TrainJob train(e, shape, cfg, "train-0");
  train.init();
  // Into memory: room for every step at once, not a regrowth per doubling
  // (a simulated scenario generates three traces of this size).
  if (auto* t = dynamic_cast<trace::Trace*>(&out)) {
    const auto [ops, events] = train.step_size();
    t->ops.reserve(t->ops.size() + ops * cfg.steps);
    t->events.reserve(t->events.size() + events * cfg.steps);
  }
  for (std::uint32_t s = 0; s < cfg.steps; ++s) train.run_step();
  GenResult r = e.finish();
  r.train_steps = train.steps_done();
  return r;
}

GenResult generate_infer(const ModelShape& shape, const InferConfig& cfg, RequestSource& requests,
                         trace::TraceSink& out, const GenOptions& opt) {
  shape.validate();
  cfg.validate();
  Emitter e(out, opt.time);
  common_meta(e, shape, "infer", opt);
  infer_meta(e, cfg, requests);
  InferJob infer(e, shape, cfg, "infer-0", requests);
  infer.init();
  drain(e, infer, cfg.max_iterations);
  GenResult r = e.finish();
  r.infer_iterations = infer.iterations();
  r.requests_completed = infer.completed();
  return r;
}

GenResult generate_mixed(const ModelShape& shape, const MixedConfig& cfg, RequestSource& requests,
                         trace::TraceSink& out, const GenOptions& opt) {
  shape.validate();
  cfg.validate();
  check_lora(shape, cfg.train);
  Emitter e(out, opt.time);
  common_meta(e, shape, "mixed", opt);
  e.meta("mixed.pattern", to_string(cfg.pattern));
  if (cfg.pattern == MixedConfig::Pattern::alternate) {
    e.meta("mixed.rounds", std::to_string(cfg.rounds));
    e.meta("mixed.rollout_batch", std::to_string(cfg.rollout_batch));
    e.meta("mixed.max_new_tokens", std::to_string(cfg.max_new_tokens));
  } else {
    e.meta("mixed.interleave",
           "one inference iteration at each training layer boundary "
           "while requests are waiting or running");
  }
  train_meta(e, cfg.train);
  infer_meta(e, cfg.infer, requests);
  TrainJob train(e, shape, cfg.train, "train-0");
  InferJob infer(e, shape, cfg.infer, "infer-0", requests);
  train.init();
  infer.init();
  const std::uint32_t max_it = cfg.infer.max_iterations;
  if (cfg.pattern == MixedConfig::Pattern::alternate) {
    // RLHF/GRPO-like: generate a batch of rollouts, then train on them.
    for (std::uint32_t round = 0; round < cfg.rounds; ++round) {
      infer.take_batch(cfg.rollout_batch, cfg.max_new_tokens);
      while (infer.has_work() && infer.iterations() < max_it) infer.iterate();
      for (std::uint32_t s = 0; s < cfg.train.steps; ++s) train.run_step();
    }
  } else {
    // Time-sharing: serving preempts training at layer boundaries.
    auto serve_one = [&] {
      if (infer.iterations() < max_it && infer.has_work()) infer.iterate();
    };
    for (std::uint32_t s = 0; s < cfg.train.steps; ++s) train.run_step(serve_one);
    drain(e, infer, max_it);
  }
  GenResult r = e.finish();
  r.train_steps = train.steps_done();
  r.infer_iterations = infer.iterations();
  r.requests_completed = infer.completed();
  return r;
}

// ---- CountingSink

void CountingSink::meta(std::string_view k, std::string_view v) {
  if (next_) next_->meta(k, v);
}
void CountingSink::job(std::string_view name) {
  if (next_) next_->job(name);
}
void CountingSink::tensor(const trace::Tensor& t) {
  tensor_bytes_.push_back(t.bytes);
  tensor_slot_.push_back(t.job < kMaxJobs
                             ? static_cast<std::uint8_t>(t.job * kRoles + static_cast<int>(t.role))
                             : 255);
  if (next_) next_->tensor(t);
}
void CountingSink::op(const trace::Op& o) {
  ++ops_;
  if (next_) next_->op(o);
}
void CountingSink::event(const trace::Event& e) {
  ++events_;
  last_ns_ = std::max(last_ns_, e.time_ns);
  if (e.kind == trace::EventKind::alloc || e.kind == trace::EventKind::free) {
    const std::uint64_t b = tensor_bytes_.at(e.tensor);
    const std::uint8_t slot = tensor_slot_[e.tensor];
    const bool alloc = e.kind == trace::EventKind::alloc;
    if (slot != 255) {
      std::uint64_t& live = live_[slot / kRoles][slot % kRoles];
      live = alloc ? live + b : live - b;
      peak_[slot / kRoles][slot % kRoles] = std::max(peak_[slot / kRoles][slot % kRoles], live);
    }
    live_total_ = alloc ? live_total_ + b : live_total_ - b;
    peak_total_ = std::max(peak_total_, live_total_);
  }
  if (next_) next_->event(e);
}
void CountingSink::finish() {
  if (next_) next_->finish();
}

}  // namespace u3m::workload
