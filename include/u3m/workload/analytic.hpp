// Closed-form memory figures from the model shape: what the generated traces
// must contain (tests compare these with counts from generated traces).
// All byte figures are per rank (ZeRO-3 shards) and use 16-bit weights unless
// TrainConfig::mixed_precision is off (then fp32). docs/workloads.md derives
// every formula.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "u3m/workload/config.hpp"
#include "u3m/workload/shape.hpp"

namespace u3m::workload {

// One parameter tensor of the model (unsharded), in declaration order.
struct ParamSpec {
  std::string name;         // "layer_3.attn.q_proj.weight", "embed.weight", ...
  std::uint64_t numel = 0;  // full (unsharded) element count
  std::int32_t layer = trace::kNoLayer;
  bool trainable = true;
  std::int8_t proj = -1;  // Proj index for projection weights and adapters, else -1
  bool lora = false;      // a LoRA adapter (A or B)
};

// The parameter tensors the generators create: base weights (frozen when
// LoRA is on), then for LoRA the A [r x d_in] and B [d_out x r] adapters.
std::vector<ParamSpec> param_specs(const ModelShape& s, const TrainConfig& c);

namespace analytic {

// Base model parameter count: embed + layers * (q,k,v,o (GQA) + 3*d*ffn +
// 2*d norm weights) + final norm + lm_head (unless tied).
std::uint64_t param_count(const ModelShape& s);
std::uint64_t layer_param_count(const ModelShape& s);
// Sum over adapted projections and layers of r*(d_in + d_out).
std::uint64_t lora_param_count(const ModelShape& s, std::uint32_t rank,
                               const std::vector<Proj>& targets);
// ZeRO-3 shard: ceil(numel / ranks).
std::uint64_t shard_numel(std::uint64_t numel, std::uint32_t ranks);
// What this rank holds of a sharded tensor: shard_numel times c.zero3_shards.
std::uint64_t held_numel(std::uint64_t numel, const TrainConfig& c);
// 2 * layers * kv_heads * head_dim * bytes (K and V).
std::uint64_t kv_bytes_per_token(const ModelShape& s, std::uint32_t dtype_bytes = 2);
std::uint64_t kv_bytes(const ModelShape& s, std::uint64_t tokens, std::uint64_t batch,
                       std::uint32_t dtype_bytes = 2);

// Activation bytes live at the end of one micro-batch's forward pass (right
// before the final norm): what the backward pass will read. See
// docs/workloads.md "Activations" for the per-layer formula.
std::uint64_t saved_activation_bytes(const ModelShape& s, const TrainConfig& c);

struct TrainBytes {
  std::uint64_t params = 0;                  // all parameter tensors incl. adapters (elements)
  std::uint64_t trainable_params = 0;        // elements that get grads and optimizer state
  std::uint64_t param_bytes = 0;             // per rank (shards under ZeRO-3)
  std::uint64_t grad_bytes = 0;              // per rank
  std::uint64_t optimizer_bytes = 0;         // per rank: master + m + v (4+4+4 B) per trainable
  std::uint64_t activation_saved_bytes = 0;  // per micro-batch, see above
};
TrainBytes train_bytes(const ModelShape& s, const TrainConfig& c);

}  // namespace analytic
}  // namespace u3m::workload
