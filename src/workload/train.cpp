// The training job: one rank's view of a LLaMA-shape training step. See
// docs/workloads.md "Training step" for the operator sequence.
#include <fmt/format.h>

#include "jobs.hpp"

namespace u3m::workload::detail {

namespace {

std::string_view block_of(Proj p) {
  return (p == Proj::gate || p == Proj::up || p == Proj::down) ? "mlp" : "attn";
}

}  // namespace

TrainJob::TrainJob(Emitter& e, const ModelShape& s, const TrainConfig& c, std::string job_name)
    : e_(e), s_(s), c_(c), name_(std::move(job_name)) {
  job_ = e_.job(name_);
  wdt_ = adt_ = c.mixed_precision ? DType::f16 : DType::f32;
  T_ = c.tokens_per_micro_batch();
  const std::uint64_t wb = trace::dtype_bytes(wdt_);
  for (std::uint32_t l = 0; l < s.layers; ++l)
    lnames_.push_back(fmt::format("{}.layer_{}.", name_, l));

  // Parameters, their gradients and optimizer state.
  lp_.assign(s.layers, LayerParams{});
  for (auto& lp : lp_)
    for (int p = 0; p < kNumProj; ++p) lp.proj[p] = lp.lora_a[p] = lp.lora_b[p] = kNone;
  for (ParamSpec& spec : param_specs(s, c)) {
    const std::string base = name_ + "." + spec.name;
    const std::uint64_t shard = analytic::held_numel(spec.numel, c);
    Param p{spec, 0, 0};
    if (c.zero3()) {
      p.w = e_.declare(base + ".shard", shard * wb, wdt_, Role::param, spec.layer, job_, true);
      p.gathered = e_.declare(base + ".gathered", spec.numel * wb, wdt_, Role::workspace,
                              spec.layer, job_, false);
    } else {
      p.w = p.gathered =
          e_.declare(base, spec.numel * wb, wdt_, Role::param, spec.layer, job_, true);
    }
    if (spec.trainable) {
      p.grad = e_.declare(base + ".grad", shard * wb, wdt_, Role::grad, spec.layer, job_, false);
      p.grad_full = c.zero3() ? e_.declare(base + ".grad.unsharded", spec.numel * wb, wdt_,
                                           Role::workspace, spec.layer, job_, false)
                              : p.grad;
      if (c.mixed_precision)
        p.master = e_.declare(base + ".master", shard * 4, DType::f32, Role::optim_master,
                              spec.layer, job_, true);
      p.m = e_.declare(base + ".adam_m", shard * 4, DType::f32, Role::optim_m, spec.layer, job_,
                       true);
      p.v = e_.declare(base + ".adam_v", shard * 4, DType::f32, Role::optim_v, spec.layer, job_,
                       true);
    }
    const auto idx = static_cast<std::uint32_t>(params_.size());
    const std::string& n = spec.name;
    if (n == "embed.weight")
      embed_ = idx;
    else if (n == "final_norm.weight")
      final_norm_ = idx;
    else if (n == "lm_head.weight")
      lm_head_ = idx;
    else if (n.find(".attn_norm.") != n.npos)
      lp_[spec.layer].attn_norm = idx;
    else if (n.find(".ffn_norm.") != n.npos)
      lp_[spec.layer].ffn_norm = idx;
    else if (!spec.lora)
      lp_[spec.layer].proj[spec.proj] = idx;
    else if (n.ends_with("lora_a"))
      lp_[spec.layer].lora_a[spec.proj] = idx;
    else
      lp_[spec.layer].lora_b[spec.proj] = idx;
    params_.push_back(std::move(p));
  }
  if (s.tied_embeddings) lm_head_ = embed_;

  // Activations and their gradients (one micro-batch; reused by every micro-batch).
  const std::uint64_t T = T_, d = s.d_model, kv = s.kv_dim(), f = s.ffn;
  auto with_grad = [&](std::uint32_t l, const std::string& n, std::uint64_t elems, std::uint32_t& a,
                       std::uint32_t& g) {
    a = act(lnames_[l] + n, elems, adt_, l);
    g = act(lnames_[l] + n + ".grad", elems, adt_, l);
  };
  la_.resize(s.layers);
  for (std::uint32_t l = 0; l < s.layers; ++l) {
    LayerActs& A = la_[l];
    const std::string& L = lnames_[l];
    with_grad(l, "attn_norm.out", T * d, A.attn_norm, A.g_attn_norm);
    with_grad(l, "attn.q_proj.out", T * d, A.q, A.g_q);
    with_grad(l, "attn.k_proj.out", T * kv, A.k, A.g_k);
    with_grad(l, "attn.v_proj.out", T * kv, A.v, A.g_v);
    with_grad(l, "attn.rope.q", T * d, A.rope_q, A.g_rope_q);
    with_grad(l, "attn.rope.k", T * kv, A.rope_k, A.g_rope_k);
    with_grad(l, "attn.core.out", T * d, A.core, A.g_core);
    A.lse = act(L + "attn.core.lse", T * s.heads, DType::f32, l);  // softmax log-sum-exp, fp32
    A.o = act(L + "attn.o_proj.out", T * d, adt_, l);
    with_grad(l, "attn_residual.out", T * d, A.h, A.g_h);
    with_grad(l, "ffn_norm.out", T * d, A.ffn_norm, A.g_ffn_norm);
    with_grad(l, "mlp.gate_proj.out", T * f, A.gate, A.g_gate);
    with_grad(l, "mlp.up_proj.out", T * f, A.up, A.g_up);
    with_grad(l, "mlp.swiglu.out", T * f, A.swiglu, A.g_swiglu);
    A.down = act(L + "mlp.down_proj.out", T * d, adt_, l);
    with_grad(l, "out", T * d, A.out, A.g_out);
    for (int p = 0; p < kNumProj; ++p) {
      A.lora[p] = A.g_lora[p] = kNone;
      if (lp_[l].lora_a[p] == kNone) continue;
      const auto pr = static_cast<Proj>(p);
      with_grad(l, fmt::format("{}.{}.lora_a.out", block_of(pr), to_string(pr)), T * c.lora_rank,
                A.lora[p], A.g_lora[p]);
    }
  }
  constexpr std::int32_t G = trace::kNoLayer;
  ids_ = e_.declare(name_ + ".input_ids", T * 4, DType::i32, Role::other, G, job_, false);
  embed_out_ = act(name_ + ".embed.out", T * d, adt_, G);
  g_embed_out_ = act(name_ + ".embed.out.grad", T * d, adt_, G);
  fn_out_ = act(name_ + ".final_norm.out", T * d, adt_, G);
  g_fn_out_ = act(name_ + ".final_norm.out.grad", T * d, adt_, G);
  logits_ = act(name_ + ".lm_head.out", T * s.vocab, adt_, G);
  g_logits_ = act(name_ + ".lm_head.out.grad", T * s.vocab, adt_, G);
  loss_ = act(name_ + ".loss", 1, DType::f32, G);

  build_step();
}

std::uint32_t TrainJob::act(const std::string& name, std::uint64_t elems, DType dt,
                            std::int32_t layer) {
  return e_.declare(name, elems * trace::dtype_bytes(dt), dt, Role::activation, layer, job_, false);
}

std::uint32_t TrainJob::layer_input(std::uint32_t l) const {
  return l == 0 ? embed_out_ : la_[l - 1].out;
}
std::uint32_t TrainJob::layer_input_grad(std::uint32_t l) const {
  return l == 0 ? g_embed_out_ : la_[l - 1].g_out;
}

void TrainJob::init() {
  Program p;
  p.begin(name_ + ".init", OpClass::copy, Phase::other, trace::kNoLayer, 0);
  for (const Param& x : params_)
    for (std::uint32_t t : {x.w, x.master, x.m, x.v})
      if (t != kNone) p.access(t, Acc::produce);
  e_.emit_all(p, job_, 0);
}

// Weight gradients: the first micro-batch produces, later ones accumulate.
void TrainJob::grad_access(std::uint32_t p) {
  const std::uint32_t g = params_[p].grad_full;
  prog_.access(g, started_[g] ? Acc::update : Acc::produce);
  started_[g] = 1;
}

void TrainJob::accumulate(std::uint32_t dx, bool& started) {
  prog_.access(dx, started ? Acc::update : Acc::produce);
  started = true;
}

std::vector<std::uint32_t> TrainJob::layer_group(std::uint32_t l) const {
  std::vector<std::uint32_t> g;
  const LayerParams& P = lp_[l];
  g.push_back(P.attn_norm);
  g.push_back(P.ffn_norm);
  for (int p = 0; p < kNumProj; ++p)
    for (std::uint32_t i : {P.proj[p], P.lora_a[p], P.lora_b[p]})
      if (i != kNone) g.push_back(i);
  return g;
}

// ZeRO-3: all-gather the group's shards into full-size buffers before use.
// Each rank receives (N-1) shards per tensor over the link.
void TrainJob::gather(const std::vector<std::uint32_t>& group, std::int32_t layer,
                      const std::string& name) {
  const std::uint64_t wb = trace::dtype_bytes(wdt_);
  std::uint64_t link = 0;
  for (std::uint32_t p : group)
    link +=
        (c_.zero3_ranks - 1) * analytic::shard_numel(params_[p].spec.numel, c_.zero3_ranks) * wb;
  prog_.begin(name, OpClass::collective, Phase::collective, layer, 0, link);
  for (std::uint32_t p : group) {
    prog_.access(params_[p].w, Acc::read);
    prog_.access(params_[p].gathered, Acc::produce);
  }
}

// ZeRO-3: reduce-scatter full-size gradients into this rank's shard (every
// micro-batch, accumulating into the shard as DeepSpeed does).
void TrainJob::reduce_scatter(const std::vector<std::uint32_t>& group, std::int32_t layer,
                              const std::string& name) {
  const std::uint64_t wb = trace::dtype_bytes(wdt_);
  std::uint64_t link = 0;
  bool any = false;
  for (std::uint32_t p : group) {
    if (!params_[p].spec.trainable) continue;
    any = true;
    link +=
        (c_.zero3_ranks - 1) * analytic::shard_numel(params_[p].spec.numel, c_.zero3_ranks) * wb;
  }
  if (!any) return;
  prog_.begin(name, OpClass::collective, Phase::collective, layer, 0, link);
  for (std::uint32_t p : group) {
    const Param& x = params_[p];
    if (!x.spec.trainable) continue;
    prog_.access(x.grad_full, Acc::read);
    started_[x.grad_full] = 0;
    prog_.access(x.grad, started_[x.grad] ? Acc::update : Acc::produce);
    started_[x.grad] = 1;
  }
}

void TrainJob::norm_fwd(std::int32_t l, const std::string& name, std::uint32_t x, std::uint32_t w,
                        std::uint32_t y, Phase ph, const char* sfx) {
  prog_.add(name + sfx, OpClass::norm, ph, l, 4.0 * T_ * s_.d_model,
            {{x, Acc::read}, {use(w), Acc::read}, {y, Acc::produce}});
}

void TrainJob::norm_bwd(std::int32_t l, const std::string& name, std::uint32_t dy, std::uint32_t x,
                        std::uint32_t w, std::uint32_t dx) {
  prog_.add(name + ".bwd", OpClass::norm, Phase::backward, l, 8.0 * T_ * s_.d_model,
            {{dy, Acc::read}, {x, Acc::read}, {use(w), Acc::read}, {dx, Acc::produce}});
  if (params_[w].spec.trainable) grad_access(w);
}

void TrainJob::proj_fwd(std::uint32_t l, Proj p, std::uint32_t x, std::uint32_t y, Phase ph,
                        const char* sfx) {
  const LayerParams& P = lp_[l];
  const int pi = static_cast<int>(p);
  const std::string base = fmt::format("{}{}.{}", lnames_[l], block_of(p), to_string(p));
  const double in = proj_in(s_, p), out = proj_out(s_, p), T = static_cast<double>(T_);
  const auto layer = static_cast<std::int32_t>(l);
  prog_.add(base + sfx, OpClass::matmul, ph, layer, 2 * T * in * out,
            {{x, Acc::read}, {use(P.proj[pi]), Acc::read}, {y, Acc::produce}});
  if (P.lora_a[pi] == kNone) return;
  const double r = c_.lora_rank;
  const std::uint32_t a = la_[l].lora[pi];
  prog_.add(base + ".lora_a" + sfx, OpClass::matmul, ph, layer, 2 * T * in * r,
            {{x, Acc::read}, {use(P.lora_a[pi]), Acc::read}, {a, Acc::produce}});
  // B's product is scaled by alpha/r and added into the base output.
  prog_.add(base + ".lora_b" + sfx, OpClass::matmul, ph, layer, 2 * T * r * out + 2 * T * out,
            {{a, Acc::read}, {use(P.lora_b[pi]), Acc::read}, {y, Acc::update}});
}

void TrainJob::proj_bwd(std::uint32_t l, Proj p, std::uint32_t dy, std::uint32_t x,
                        std::uint32_t dx, bool& dx_started, bool need_dx) {
  const LayerParams& P = lp_[l];
  const int pi = static_cast<int>(p);
  const std::string base = fmt::format("{}{}.{}", lnames_[l], block_of(p), to_string(p));
  const double in = proj_in(s_, p), out = proj_out(s_, p), T = static_cast<double>(T_);
  const auto layer = static_cast<std::int32_t>(l);
  constexpr Phase B = Phase::backward;
  if (P.lora_a[pi] != kNone) {
    const double r = c_.lora_rank;
    const std::uint32_t a = la_[l].lora[pi], ga = la_[l].g_lora[pi];
    prog_.add(base + ".lora_b.bwd_weight", OpClass::matmul, B, layer, 2 * T * r * out,
              {{dy, Acc::read}, {a, Acc::read}});
    grad_access(P.lora_b[pi]);
    prog_.add(base + ".lora_b.bwd_data", OpClass::matmul, B, layer, 2 * T * r * out,
              {{dy, Acc::read}, {use(P.lora_b[pi]), Acc::read}, {ga, Acc::produce}});
    prog_.add(base + ".lora_a.bwd_weight", OpClass::matmul, B, layer, 2 * T * r * in,
              {{ga, Acc::read}, {x, Acc::read}});
    grad_access(P.lora_a[pi]);
    if (need_dx) {
      prog_.add(base + ".lora_a.bwd_data", OpClass::matmul, B, layer, 2 * T * r * in,
                {{ga, Acc::read}, {use(P.lora_a[pi]), Acc::read}});
      accumulate(dx, dx_started);
    }
  }
  if (need_dx) {
    prog_.add(base + ".bwd_data", OpClass::matmul, B, layer, 2 * T * in * out,
              {{dy, Acc::read}, {use(P.proj[pi]), Acc::read}});
    accumulate(dx, dx_started);
  }
  if (params_[P.proj[pi]].spec.trainable) {
    prog_.add(base + ".bwd_weight", OpClass::matmul, B, layer, 2 * T * in * out,
              {{dy, Acc::read}, {x, Acc::read}});
    grad_access(P.proj[pi]);
  }
}

void TrainJob::layer_fwd(std::uint32_t l, bool recompute) {
  const Phase ph = recompute ? Phase::backward : Phase::forward;
  const char* sfx = recompute ? ".recompute" : "";
  const LayerActs& A = la_[l];
  const LayerParams& P = lp_[l];
  const std::string& L = lnames_[l];
  const auto layer = static_cast<std::int32_t>(l);
  const double T = static_cast<double>(T_), d = s_.d_model, kv = s_.kv_dim(), f = s_.ffn;
  const double S = c_.seq_len;
  // Causal attention: QK^T and PV, 2*S*S*hd each per head, half of them masked.
  const double attn_flops = c_.micro_batch_size * 2.0 * S * S * d;
  const std::uint32_t x = layer_input(l);
  norm_fwd(layer, L + "attn_norm", x, P.attn_norm, A.attn_norm, ph, sfx);
  proj_fwd(l, Proj::q, A.attn_norm, A.q, ph, sfx);
  proj_fwd(l, Proj::k, A.attn_norm, A.k, ph, sfx);
  proj_fwd(l, Proj::v, A.attn_norm, A.v, ph, sfx);
  prog_.add(
      L + "attn.rope" + sfx, OpClass::elementwise, ph, layer, 3 * T * (d + kv),
      {{A.q, Acc::read}, {A.k, Acc::read}, {A.rope_q, Acc::produce}, {A.rope_k, Acc::produce}});
  prog_.add(L + "attn.core" + sfx, OpClass::attn_prefill, ph, layer, attn_flops,
            {{A.rope_q, Acc::read},
             {A.rope_k, Acc::read},
             {A.v, Acc::read},
             {A.core, Acc::produce},
             {A.lse, Acc::produce}});
  proj_fwd(l, Proj::o, A.core, A.o, ph, sfx);
  prog_.add(L + "attn_residual" + sfx, OpClass::elementwise, ph, layer, T * d,
            {{x, Acc::read}, {A.o, Acc::read}, {A.h, Acc::produce}});
  norm_fwd(layer, L + "ffn_norm", A.h, P.ffn_norm, A.ffn_norm, ph, sfx);
  proj_fwd(l, Proj::gate, A.ffn_norm, A.gate, ph, sfx);
  proj_fwd(l, Proj::up, A.ffn_norm, A.up, ph, sfx);
  prog_.add(L + "mlp.swiglu" + sfx, OpClass::elementwise, ph, layer, 5 * T * f,
            {{A.gate, Acc::read}, {A.up, Acc::read}, {A.swiglu, Acc::produce}});
  proj_fwd(l, Proj::down, A.swiglu, A.down, ph, sfx);
  prog_.add(L + "ffn_residual" + sfx, OpClass::elementwise, ph, layer, T * d,
            {{A.h, Acc::read}, {A.down, Acc::read}, {A.out, Acc::produce}});
  if (!recompute) prog_.mark_boundary();
}

void TrainJob::layer_bwd(std::uint32_t l) {
  const LayerActs& A = la_[l];
  const LayerParams& P = lp_[l];
  const std::string& L = lnames_[l];
  const auto layer = static_cast<std::int32_t>(l);
  const double T = static_cast<double>(T_), d = s_.d_model, kv = s_.kv_dim(), f = s_.ffn;
  const double S = c_.seq_len;
  // FlashAttention backward: 5 matmuls against the forward's 2, so 2.5x.
  const double attn_bwd_flops = 2.5 * c_.micro_batch_size * 2.0 * S * S * d;
  constexpr Phase B = Phase::backward;
  const std::uint32_t x = layer_input(l), dx = layer_input_grad(l), dy = A.g_out;
  // The gradient into layer 0's input is only needed for a trainable embedding.
  const bool need_dx = l > 0 || params_[embed_].spec.trainable;

  if (c_.zero3()) gather(layer_group(l), layer, L + "all_gather.bwd");
  if (c_.recomputes(l)) layer_fwd(l, true);
  bool started = false;
  proj_bwd(l, Proj::down, dy, A.swiglu, A.g_swiglu, started, true);
  prog_.add(L + "mlp.swiglu.bwd", OpClass::elementwise, B, layer, 10 * T * f,
            {{A.g_swiglu, Acc::read},
             {A.gate, Acc::read},
             {A.up, Acc::read},
             {A.g_gate, Acc::produce},
             {A.g_up, Acc::produce}});
  started = false;
  proj_bwd(l, Proj::up, A.g_up, A.ffn_norm, A.g_ffn_norm, started, true);
  proj_bwd(l, Proj::gate, A.g_gate, A.ffn_norm, A.g_ffn_norm, started, true);
  norm_bwd(layer, L + "ffn_norm", A.g_ffn_norm, A.h, P.ffn_norm, A.g_h);
  prog_.add(L + "ffn_residual.bwd", OpClass::elementwise, B, layer, T * d,
            {{dy, Acc::read}, {A.g_h, Acc::update}});
  started = false;
  proj_bwd(l, Proj::o, A.g_h, A.core, A.g_core, started, true);
  prog_.add(L + "attn.core.bwd", OpClass::attn_prefill, B, layer, attn_bwd_flops,
            {{A.g_core, Acc::read},
             {A.rope_q, Acc::read},
             {A.rope_k, Acc::read},
             {A.v, Acc::read},
             {A.core, Acc::read},
             {A.lse, Acc::read},
             {A.g_rope_q, Acc::produce},
             {A.g_rope_k, Acc::produce},
             {A.g_v, Acc::produce}});
  prog_.add(L + "attn.rope.bwd", OpClass::elementwise, B, layer, 3 * T * (d + kv),
            {{A.g_rope_q, Acc::read},
             {A.g_rope_k, Acc::read},
             {A.g_q, Acc::produce},
             {A.g_k, Acc::produce}});
  started = false;
  proj_bwd(l, Proj::v, A.g_v, A.attn_norm, A.g_attn_norm, started, need_dx);
  proj_bwd(l, Proj::k, A.g_k, A.attn_norm, A.g_attn_norm, started, need_dx);
  proj_bwd(l, Proj::q, A.g_q, A.attn_norm, A.g_attn_norm, started, need_dx);
  if (need_dx) {
    norm_bwd(layer, L + "attn_norm", A.g_attn_norm, x, P.attn_norm, dx);
    prog_.add(L + "attn_residual.bwd", OpClass::elementwise, B, layer, T * d,
              {{A.g_h, Acc::read}, {dx, Acc::update}});
  }
  if (c_.zero3()) reduce_scatter(layer_group(l), layer, L + "reduce_scatter");
  prog_.mark_boundary();
}

void TrainJob::build_step() {
  prog_.clear();
  started_.assign(e_.tensor_count(), 0);
  constexpr Phase F = Phase::forward, B = Phase::backward;
  constexpr std::int32_t G = trace::kNoLayer;
  const double T = static_cast<double>(T_), d = s_.d_model, V = s_.vocab;
  const std::vector<std::uint32_t> head_group = {final_norm_, lm_head_};
  const std::uint32_t x_last = la_.back().out;
  for (std::uint32_t mb = 0; mb < c_.micro_batches; ++mb) {
    prog_.add(name_ + ".load_batch", OpClass::copy, F, G, 0, {{ids_, Acc::produce}});
    if (c_.zero3()) gather({embed_}, G, name_ + ".embed.all_gather");
    prog_.add(name_ + ".embed", OpClass::embedding, F, G, 0,
              {{ids_, Acc::read}, {use(embed_), Acc::read}, {embed_out_, Acc::produce}});
    prog_.mark_boundary();
    for (std::uint32_t l = 0; l < s_.layers; ++l) {
      if (c_.zero3())
        gather(layer_group(l), static_cast<std::int32_t>(l), lnames_[l] + "all_gather.fwd");
      layer_fwd(l, false);
    }
    if (c_.zero3()) gather(head_group, G, name_ + ".head.all_gather");
    norm_fwd(G, name_ + ".final_norm", x_last, final_norm_, fn_out_, F, "");
    prog_.add(name_ + ".lm_head", OpClass::matmul, F, G, 2 * T * d * V,
              {{fn_out_, Acc::read}, {use(lm_head_), Acc::read}, {logits_, Acc::produce}});
    prog_.add(name_ + ".loss", OpClass::loss, F, G, 4 * T * V,
              {{logits_, Acc::read}, {ids_, Acc::read}, {loss_, Acc::produce}});
    prog_.mark_boundary();

    prog_.add(
        name_ + ".loss.bwd", OpClass::loss, B, G, 4 * T * V,
        {{loss_, Acc::read}, {logits_, Acc::read}, {ids_, Acc::read}, {g_logits_, Acc::produce}});
    prog_.add(name_ + ".lm_head.bwd_data", OpClass::matmul, B, G, 2 * T * d * V,
              {{g_logits_, Acc::read}, {use(lm_head_), Acc::read}, {g_fn_out_, Acc::produce}});
    if (params_[lm_head_].spec.trainable) {
      prog_.add(name_ + ".lm_head.bwd_weight", OpClass::matmul, B, G, 2 * T * d * V,
                {{g_logits_, Acc::read}, {fn_out_, Acc::read}});
      grad_access(lm_head_);
    }
    norm_bwd(G, name_ + ".final_norm", g_fn_out_, x_last, final_norm_, la_.back().g_out);
    if (c_.zero3()) reduce_scatter(head_group, G, name_ + ".head.reduce_scatter");
    prog_.mark_boundary();
    for (std::uint32_t l = s_.layers; l-- > 0;) layer_bwd(l);
    if (params_[embed_].spec.trainable) {
      prog_.add(name_ + ".embed.bwd", OpClass::embedding, B, G, T * d,
                {{g_embed_out_, Acc::read}, {ids_, Acc::read}});
      grad_access(embed_);
      if (c_.zero3()) reduce_scatter({embed_}, G, name_ + ".embed.reduce_scatter");
      prog_.mark_boundary();
    }
  }
  // Adam on this rank's (shard of each) trainable tensor: the fp32 master, m
  // and v are read and written, then the 16-bit weight is rewritten from it.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    if (!p.spec.trainable) continue;
    const double n = static_cast<double>(analytic::held_numel(p.spec.numel, c_));
    prog_.begin(name_ + "." + p.spec.name + ".adam", OpClass::optimizer, Phase::optimizer,
                p.spec.layer, 12 * n);
    prog_.access(p.grad, Acc::read);
    if (p.master != kNone) prog_.access(p.master, Acc::update);
    prog_.access(p.m, Acc::update);
    prog_.access(p.v, Acc::update);
    prog_.access(p.w, p.master != kNone ? Acc::overwrite : Acc::update);
    bool last_of_layer = true;
    for (std::size_t j = i + 1; j < params_.size(); ++j)
      if (params_[j].spec.trainable) {
        last_of_layer = params_[j].spec.layer != p.spec.layer;
        break;
      }
    if (last_of_layer) prog_.mark_boundary();
  }
  std::vector<std::uint8_t> scratch;
  prog_.plan_frees(e_, scratch);
}

}  // namespace u3m::workload::detail
