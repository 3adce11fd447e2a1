// Model shapes for the workload generators: a LLaMA-family decoder described
// by a handful of integers, plus named presets.
//
// Note [LLaMA3-13B]
// The design document's reference model, "LLaMA3-13B", does not exist. The
// shape it describes (40 layers, hidden 5120, 40 KV heads, i.e. full
// multi-head KV) is Llama-2-13B's, so the preset is called `llama2-13b`.
// `llama3-8b` is the modern grouped-query case (8 KV heads).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "u3m/trace/model.hpp"

namespace u3m::workload {

struct ModelShape {
  std::string name = "custom";
  std::uint32_t layers = 0;
  std::uint32_t d_model = 0;
  std::uint32_t heads = 0;
  std::uint32_t kv_heads = 0;  // == heads for multi-head attention, fewer for GQA
  std::uint32_t ffn = 0;       // SwiGLU hidden size (gate/up output width)
  std::uint32_t vocab = 0;
  bool tied_embeddings = false;  // lm_head reuses the embedding matrix

  std::uint32_t head_dim() const { return heads ? d_model / heads : 0; }
  std::uint32_t kv_dim() const { return kv_heads * head_dim(); }

  // Throws u3m::InputError naming the offending field (`where` prefixes the
  // message, e.g. "--model llama2-13b" or "--heads").
  void validate(std::string_view where = "model shape") const;
};

// llama2-13b, llama3-8b, tiny (2 layers, GQA, for tests), tiny-mha (3 layers, full MHA).
const std::vector<ModelShape>& presets();
// Throws InputError listing the known names when `name` is not a preset.
const ModelShape& preset(std::string_view name);

// The seven linear projections of a layer (LoRA targets).
enum class Proj : std::uint8_t { q, k, v, o, gate, up, down };
inline constexpr int kNumProj = 7;
std::string_view to_string(Proj p);  // "q_proj", ...
// Parses "q,v" or "q_proj,v_proj" (also "all"); throws InputError naming `field`.
std::vector<Proj> parse_proj_list(std::string_view text, std::string_view field);

// Input and output width of a projection for this shape (GQA-aware).
std::uint32_t proj_in(const ModelShape& s, Proj p);
std::uint32_t proj_out(const ModelShape& s, Proj p);

}  // namespace u3m::workload
