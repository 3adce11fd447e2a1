// The serving job: continuous batching over a paged KV cache. See
// docs/workloads.md "Inference".
#include <algorithm>

#include <fmt/format.h>

#include "jobs.hpp"
#include "u3m/util/error.hpp"

namespace u3m::workload::detail {

InferJob::InferJob(Emitter& e, const ModelShape& s, const InferConfig& c, std::string job_name,
                   RequestSource& src)
    : e_(e), s_(s), c_(c), name_(std::move(job_name)), src_(src) {
  job_ = e_.job(name_);
  block_bytes_ = 2ull * s.kv_dim() * c.block_tokens * 2;  // K and V, fp16
  lw_.resize(s.layers);
  for (const ParamSpec& spec : param_specs(s, TrainConfig{})) {  // base weights only
    const std::uint32_t t = e_.declare(name_ + "." + spec.name, spec.numel * 2, DType::f16,
                                       Role::param, spec.layer, job_, true);
    weights_.push_back(t);
    const std::string& n = spec.name;
    if (n == "embed.weight")
      embed_ = t;
    else if (n == "final_norm.weight")
      final_norm_ = t;
    else if (n == "lm_head.weight")
      lm_head_ = t;
    else if (n.find(".attn_norm.") != n.npos)
      lw_[spec.layer][0] = t;
    else if (n.find(".ffn_norm.") != n.npos)
      lw_[spec.layer][1] = t;
    else
      lw_[spec.layer][2 + spec.proj] = t;
  }
  if (s.tied_embeddings) lm_head_ = embed_;

  auto add_slot = [&](std::string name, DType dt, Role role, std::int32_t layer) {
    slots_.push_back(Slot{std::move(name), dt, role, layer, {}});
  };
  constexpr std::int32_t G = trace::kNoLayer;
  add_slot(name_ + ".input_ids", DType::i32, Role::other, G);
  add_slot(name_ + ".embed.out", DType::f16, Role::activation, G);
  add_slot(name_ + ".final_norm.out", DType::f16, Role::activation, G);
  add_slot(name_ + ".lm_head.out", DType::f16, Role::activation, G);
  add_slot(name_ + ".next_tokens", DType::i32, Role::other, G);
  static constexpr const char* kLayerSlotNames[kLayerSlots] = {
      "attn_norm.out",   "attn.q_proj.out",   "attn.k_proj.out",
      "attn.v_proj.out", "attn.rope.q",       "attn.rope.k",
      "attn.core.out",   "attn.o_proj.out",   "attn_residual.out",
      "ffn_norm.out",    "mlp.gate_proj.out", "mlp.up_proj.out",
      "mlp.swiglu.out",  "mlp.down_proj.out", "out"};
  for (std::uint32_t l = 0; l < s.layers; ++l) {
    op_names_.push_back(fmt::format("{}.layer_{}.", name_, l));
    for (const char* n : kLayerSlotNames)
      add_slot(op_names_.back() + n, DType::f16, Role::activation, static_cast<std::int32_t>(l));
  }
}

void InferJob::init() {
  Program p;
  p.begin(name_ + ".init", OpClass::copy, Phase::other, trace::kNoLayer, 0);
  for (std::uint32_t t : weights_) p.access(t, Acc::produce);
  e_.emit_all(p, job_, 0);
}

// Note [Activation sizes in serving]
// A serving iteration's activations scale with its token count, so the same
// logical tensor ("infer-0.layer_3.attn.q_proj.out") is declared once per
// distinct size: every declaration carries the same name and hence the same
// stable id, and each keeps its exact byte size.
std::uint32_t InferJob::slot(std::uint32_t index, std::uint64_t elems) {
  Slot& s = slots_[index];
  const std::uint64_t bytes = elems * trace::dtype_bytes(s.dtype);
  auto [it, fresh] = s.by_bytes.try_emplace(bytes, 0);
  if (fresh) it->second = e_.declare(s.name, bytes, s.dtype, s.role, s.layer, job_, false);
  return it->second;
}

bool InferJob::fetch() {
  if (lookahead_) return true;
  if (src_done_) return false;
  lookahead_ = src_.next();
  if (!lookahead_) {
    src_done_ = true;
    return false;
  }
  const Request& r = *lookahead_;
  if (r.prompt_tokens == 0 || r.output_tokens == 0)
    input_error(src_.describe(), "request {}: prompt and output lengths must be >= 1", r.id);
  if (r.arrival_ns < last_arrival_)
    input_error(src_.describe(), "request {}: arrival times must not decrease", r.id);
  if (!seen_ids_.insert(r.id).second)  // ids name KV blocks, so they must be unique
    input_error(src_.describe(), "request id {} appears twice", r.id);
  last_arrival_ = r.arrival_ns;
  return true;
}

void InferJob::pull_arrivals() {
  while (fetch() && lookahead_->arrival_ns <= e_.now()) {
    waiting_.push_back(*lookahead_);
    lookahead_.reset();
  }
}

bool InferJob::has_work() {
  pull_arrivals();
  return !running_.empty() || !waiting_.empty();
}

bool InferJob::done() {
  return !has_work() && !fetch();
}

std::optional<std::uint64_t> InferJob::next_arrival() {
  if (fetch()) return lookahead_->arrival_ns;
  return std::nullopt;
}

std::uint32_t InferJob::take_batch(std::uint32_t n, std::uint32_t output_cap) {
  std::uint32_t taken = 0;
  for (; taken < n && fetch(); ++taken) {
    Request r = *lookahead_;  // a rollout starts now, whatever its arrival time
    lookahead_.reset();
    r.arrival_ns = e_.now();
    r.output_tokens = std::min(r.output_tokens, output_cap);
    waiting_.push_back(r);
  }
  return taken;
}

std::uint32_t InferJob::new_block(Live& r, std::uint32_t l) {
  auto& blocks = r.blocks[l];
  const std::uint32_t t =
      e_.declare(fmt::format("{}.req_{}.layer_{}.kv_{}", name_, r.r.id, l, blocks.size()),
                 block_bytes_, DType::f16, Role::kv, static_cast<std::int32_t>(l), job_, true);
  blocks.push_back(t);
  return t;
}

void InferJob::iterate() {
  pull_arrivals();
  // Admission at the iteration boundary (vLLM-v0 style): newly admitted
  // requests get a prefill-only iteration; otherwise the running batch decodes.
  std::vector<Live> admitted;
  std::uint64_t budget = 0;
  while (!waiting_.empty() && running_.size() + admitted.size() < c_.max_batch) {
    const Request& r = waiting_.front();
    if (!admitted.empty() && budget + r.prompt_tokens > c_.max_prefill_tokens) break;
    budget += r.prompt_tokens;
    admitted.push_back(Live{r, 0, 0, std::vector<std::vector<std::uint32_t>>(s_.layers)});
    waiting_.pop_front();
  }
  const bool prefill = !admitted.empty();
  std::vector<Live>& batch = prefill ? admitted : running_;
  if (batch.empty()) return;
  const Phase ph = prefill ? Phase::prefill : Phase::decode;
  const std::uint64_t N = batch.size(), d = s_.d_model, kv = s_.kv_dim(), f = s_.ffn;
  const std::uint64_t T = prefill ? budget : N;
  const double Td = static_cast<double>(T), dd = static_cast<double>(d);
  constexpr std::int32_t G = trace::kNoLayer;

  prog_.clear();
  const std::uint32_t ids = slot(kIds, T);
  prog_.add(name_ + ".load_batch", OpClass::copy, ph, G, 0, {{ids, Acc::produce}});
  std::uint32_t x = slot(kEmbedOut, T * d);
  prog_.add(name_ + ".embed", OpClass::embedding, ph, G, 0,
            {{ids, Acc::read}, {embed_, Acc::read}, {x, Acc::produce}});
  for (std::uint32_t l = 0; l < s_.layers; ++l) {
    const std::string& L = op_names_[l];
    const auto layer = static_cast<std::int32_t>(l);
    const auto& W = lw_[l];
    auto mm = [&](const char* name, std::uint32_t in, Proj p, std::uint32_t out) {
      prog_.add(L + name, OpClass::matmul, ph, layer, 2.0 * Td * proj_in(s_, p) * proj_out(s_, p),
                {{in, Acc::read}, {W[2 + static_cast<int>(p)], Acc::read}, {out, Acc::produce}});
    };
    const std::uint32_t an = lslot(l, kAttnNorm, T * d), q = lslot(l, kQ, T * d),
                        k = lslot(l, kK, T * kv), v = lslot(l, kV, T * kv),
                        rq = lslot(l, kRopeQ, T * d), rk = lslot(l, kRopeK, T * kv),
                        core = lslot(l, kCore, T * d), o = lslot(l, kO, T * d),
                        h = lslot(l, kH, T * d), fn = lslot(l, kFfnNorm, T * d),
                        gate = lslot(l, kGate, T * f), up = lslot(l, kUp, T * f),
                        sw = lslot(l, kSwiglu, T * f), down = lslot(l, kDown, T * d),
                        out = lslot(l, kOut, T * d);
    prog_.add(L + "attn_norm", OpClass::norm, ph, layer, 4 * Td * dd,
              {{x, Acc::read}, {W[0], Acc::read}, {an, Acc::produce}});
    mm("attn.q_proj", an, Proj::q, q);
    mm("attn.k_proj", an, Proj::k, k);
    mm("attn.v_proj", an, Proj::v, v);
    prog_.add(L + "attn.rope", OpClass::elementwise, ph, layer, 3 * Td * double(d + kv),
              {{q, Acc::read}, {k, Acc::read}, {rq, Acc::produce}, {rk, Acc::produce}});
    // Append this iteration's K and V to each request's blocks.
    prog_.begin(L + "attn.kv_write", OpClass::copy, ph, layer, 0);
    prog_.access(rk, Acc::read);
    prog_.access(v, Acc::read);
    for (Live& r : batch) {
      if (prefill) {
        const std::uint32_t nb = (r.r.prompt_tokens + c_.block_tokens - 1) / c_.block_tokens;
        for (std::uint32_t b = 0; b < nb; ++b) prog_.access(new_block(r, l), Acc::produce);
      } else if (r.ctx % c_.block_tokens == 0) {
        prog_.access(new_block(r, l), Acc::produce);
      } else {
        prog_.access(r.blocks[l].back(), Acc::overwrite);
      }
    }
    if (prefill) {
      // Prefill attends over the fresh K/V (causal: half of 4*P*P*d).
      double flops = 0;
      for (const Live& r : batch) flops += 2.0 * r.r.prompt_tokens * r.r.prompt_tokens * dd;
      prog_.add(L + "attn.core", OpClass::attn_prefill, ph, layer, flops,
                {{rq, Acc::read}, {rk, Acc::read}, {v, Acc::read}, {core, Acc::produce}});
    } else {
      // Decode reads every KV block of every running request: 4*ctx*d FLOPs each.
      double flops = 0;
      for (const Live& r : batch) flops += 4.0 * (r.ctx + 1) * dd;
      prog_.begin(L + "attn.core", OpClass::attn_decode, ph, layer, flops);
      prog_.access(rq, Acc::read);
      for (const Live& r : batch)
        for (std::uint32_t b : r.blocks[l]) prog_.access(b, Acc::read);
      prog_.access(core, Acc::produce);
    }
    mm("attn.o_proj", core, Proj::o, o);
    prog_.add(L + "attn_residual", OpClass::elementwise, ph, layer, Td * dd,
              {{x, Acc::read}, {o, Acc::read}, {h, Acc::produce}});
    prog_.add(L + "ffn_norm", OpClass::norm, ph, layer, 4 * Td * dd,
              {{h, Acc::read}, {W[1], Acc::read}, {fn, Acc::produce}});
    mm("mlp.gate_proj", fn, Proj::gate, gate);
    mm("mlp.up_proj", fn, Proj::up, up);
    prog_.add(L + "mlp.swiglu", OpClass::elementwise, ph, layer, 5 * Td * double(f),
              {{gate, Acc::read}, {up, Acc::read}, {sw, Acc::produce}});
    mm("mlp.down_proj", sw, Proj::down, down);
    prog_.add(L + "ffn_residual", OpClass::elementwise, ph, layer, Td * dd,
              {{h, Acc::read}, {down, Acc::read}, {out, Acc::produce}});
    x = out;
  }
  const double V = s_.vocab, Nd = static_cast<double>(N);
  const std::uint32_t fno = slot(kFinalNorm, T * d), logits = slot(kLogits, N * s_.vocab),
                      next = slot(kNext, N);
  prog_.add(name_ + ".final_norm", OpClass::norm, ph, G, 4 * Td * dd,
            {{x, Acc::read}, {final_norm_, Acc::read}, {fno, Acc::produce}});
  // Only each sequence's last position needs logits.
  prog_.add(name_ + ".lm_head", OpClass::matmul, ph, G, 2 * Nd * dd * V,
            {{fno, Acc::read}, {lm_head_, Acc::read}, {logits, Acc::produce}});
  prog_.add(name_ + ".sample", OpClass::softmax, ph, G, 4 * Nd * V,
            {{logits, Acc::read}, {next, Acc::produce}});
  for (const Live& r : batch)
    if (r.generated + 1 >= r.r.output_tokens)  // finishes now: its blocks go
      for (const auto& layer_blocks : r.blocks)
        for (std::uint32_t b : layer_blocks) prog_.access(b, Acc::release);
  prog_.plan_frees(e_, scratch_);
  e_.emit_all(prog_, job_, iter_);
  ++iter_;

  for (Live& r : batch) {
    r.ctx = prefill ? r.r.prompt_tokens : r.ctx + 1;
    ++r.generated;
  }
  auto finished = [](const Live& r) { return r.generated >= r.r.output_tokens; };
  for (const Live& r : batch) completed_ += finished(r) ? 1 : 0;
  if (prefill) {
    for (Live& r : admitted)
      if (!finished(r)) running_.push_back(std::move(r));
  } else {
    running_.erase(std::remove_if(running_.begin(), running_.end(), finished), running_.end());
  }
  peak_running_ =
      std::max<std::uint32_t>(peak_running_, static_cast<std::uint32_t>(running_.size()));
}

}  // namespace u3m::workload::detail
