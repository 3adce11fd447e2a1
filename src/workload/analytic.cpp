#include "u3m/workload/analytic.hpp"

#include <fmt/format.h>

namespace u3m::workload {

namespace {

bool adapted(const TrainConfig& c, Proj p) {
  if (!c.lora()) return false;
  for (Proj t : c.lora_targets)
    if (t == p) return true;
  return false;
}

std::string_view block_of(Proj p) {
  return (p == Proj::gate || p == Proj::up || p == Proj::down) ? "mlp" : "attn";
}

}  // namespace

std::vector<ParamSpec> param_specs(const ModelShape& s, const TrainConfig& c) {
  const bool base_trainable = !c.lora();
  const std::uint64_t d = s.d_model, v = s.vocab;
  std::vector<ParamSpec> out;
  out.push_back({"embed.weight", v * d, trace::kNoLayer, base_trainable});
  for (std::uint32_t l = 0; l < s.layers; ++l) {
    const auto layer = static_cast<std::int32_t>(l);
    auto proj = [&](Proj p) {
      std::string base = fmt::format("layer_{}.{}.{}", l, block_of(p), to_string(p));
      const std::uint64_t in = proj_in(s, p), o = proj_out(s, p);
      const auto pi = static_cast<std::int8_t>(p);
      out.push_back({base + ".weight", in * o, layer, base_trainable, pi, false});
      if (adapted(c, p)) {
        out.push_back({base + ".lora_a", std::uint64_t{c.lora_rank} * in, layer, true, pi, true});
        out.push_back({base + ".lora_b", o * c.lora_rank, layer, true, pi, true});
      }
    };
    out.push_back({fmt::format("layer_{}.attn_norm.weight", l), d, layer, base_trainable});
    for (Proj p : {Proj::q, Proj::k, Proj::v, Proj::o}) proj(p);
    out.push_back({fmt::format("layer_{}.ffn_norm.weight", l), d, layer, base_trainable});
    for (Proj p : {Proj::gate, Proj::up, Proj::down}) proj(p);
  }
  out.push_back({"final_norm.weight", d, trace::kNoLayer, base_trainable});
  if (!s.tied_embeddings) out.push_back({"lm_head.weight", v * d, trace::kNoLayer, base_trainable});
  return out;
}

namespace analytic {

std::uint64_t layer_param_count(const ModelShape& s) {
  const std::uint64_t d = s.d_model, kv = s.kv_dim(), f = s.ffn;
  return 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d;
}

std::uint64_t param_count(const ModelShape& s) {
  const std::uint64_t d = s.d_model, v = s.vocab;
  return v * d * (s.tied_embeddings ? 1 : 2) + s.layers * layer_param_count(s) + d;
}

std::uint64_t lora_param_count(const ModelShape& s, std::uint32_t rank,
                               const std::vector<Proj>& targets) {
  std::uint64_t per_layer = 0;
  for (Proj p : targets) per_layer += std::uint64_t{rank} * (proj_in(s, p) + proj_out(s, p));
  return per_layer * s.layers;
}

std::uint64_t shard_numel(std::uint64_t numel, std::uint32_t ranks) {
  return ranks <= 1 ? numel : (numel + ranks - 1) / ranks;
}

std::uint64_t held_numel(std::uint64_t numel, const TrainConfig& c) {
  return shard_numel(numel, c.zero3_ranks) * c.zero3_shards;
}

std::uint64_t kv_bytes_per_token(const ModelShape& s, std::uint32_t dtype_bytes) {
  return 2ull * s.layers * s.kv_heads * s.head_dim() * dtype_bytes;
}

std::uint64_t kv_bytes(const ModelShape& s, std::uint64_t tokens, std::uint64_t batch,
                       std::uint32_t dtype_bytes) {
  return kv_bytes_per_token(s, dtype_bytes) * tokens * batch;
}

std::uint64_t saved_activation_bytes(const ModelShape& s, const TrainConfig& c) {
  const std::uint64_t T = c.tokens_per_micro_batch(), d = s.d_model, kv = s.kv_dim(), f = s.ffn;
  const std::uint64_t b = c.mixed_precision ? 2 : 4;
  const bool full = !c.lora();
  auto needs = [&](Proj p) { return full || adapted(c, p); };
  // rope.q, rope.k, v, core.out, attn_residual.out, gate, up, layer out: always saved
  std::uint64_t elems = d + kv + kv + d + d + 2 * f + d;
  if (needs(Proj::q) || needs(Proj::k) || needs(Proj::v)) elems += d;  // attn_norm.out
  if (needs(Proj::gate) || needs(Proj::up)) elems += d;                // ffn_norm.out
  if (needs(Proj::down)) elems += f;                                   // swiglu.out
  for (int p = 0; p < kNumProj; ++p)
    if (adapted(c, static_cast<Proj>(p))) elems += c.lora_rank;     // lora_a.out
  const std::uint64_t per_layer = b * T * elems + 4 * T * s.heads;  // + fp32 softmax lse
  // A checkpointed layer keeps only its output (the next layer's input, or
  // the final norm's); the others keep everything above, output included.
  std::uint64_t total = 0;
  for (std::uint32_t l = 0; l < s.layers; ++l) total += c.recomputes(l) ? b * T * d : per_layer;
  // embed.out is read in backward by layer 0's recompute, or else only by its
  // attn_norm backward, which runs when the norm weight or the embedding is
  // trainable (full training).
  return total + (full || c.recomputes(0) ? b * T * d : 0);
}

TrainBytes train_bytes(const ModelShape& s, const TrainConfig& c) {
  TrainBytes r;
  const std::uint64_t wb = c.mixed_precision ? 2 : 4;
  for (const ParamSpec& p : param_specs(s, c)) {
    const std::uint64_t shard = held_numel(p.numel, c);
    r.params += p.numel;
    r.param_bytes += shard * wb;
    if (!p.trainable) continue;
    r.trainable_params += p.numel;
    r.grad_bytes += shard * wb;
    r.optimizer_bytes += shard * (c.mixed_precision ? 12 : 8);
  }
  r.activation_saved_bytes = saved_activation_bytes(s, c);
  return r;
}

}  // namespace analytic
}  // namespace u3m::workload
