#include "u3m/workload/shape.hpp"

#include <array>
#include <string>

#include "u3m/util/error.hpp"

namespace u3m::workload {

void ModelShape::validate(std::string_view where) const {
  auto positive = [&](std::uint32_t v, std::string_view field) {
    if (v == 0) input_error(where, "{} must be a positive integer (model '{}')", field, name);
  };
  positive(layers, "layers");
  positive(d_model, "d_model");
  positive(heads, "heads");
  positive(kv_heads, "kv_heads");
  positive(ffn, "ffn");
  positive(vocab, "vocab");
  // Bounds keep every analytic product (d*d, vocab*d, d*ffn, ...) far from
  // 64-bit overflow; they are ~100x today's largest open models.
  auto at_most = [&](std::uint64_t v, std::uint64_t limit, std::string_view field) {
    if (v > limit) input_error(where, "{} = {} exceeds the supported maximum {}", field, v, limit);
  };
  at_most(layers, 4096, "layers");
  at_most(d_model, 1u << 20, "d_model");
  at_most(ffn, 1u << 22, "ffn");
  at_most(vocab, 1u << 24, "vocab");
  if (d_model % heads != 0)
    input_error(where, "heads ({}) must divide d_model ({})", heads, d_model);
  if (heads % kv_heads != 0)
    input_error(where, "kv_heads ({}) must divide heads ({})", kv_heads, heads);
}

const std::vector<ModelShape>& presets() {
  // Llama-2-13B and Llama-3-8B shapes as in their public config.json files.
  static const std::vector<ModelShape> kPresets = {
      {"llama2-13b", 40, 5120, 40, 40, 13824, 32000, false},
      {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, false},
      {"tiny", 2, 64, 4, 2, 172, 256, false},
      {"tiny-mha", 3, 96, 4, 4, 256, 320, false},
  };
  return kPresets;
}

const ModelShape& preset(std::string_view name) {
  std::string known;
  for (const ModelShape& s : presets()) {
    if (s.name == name) return s;
    known += known.empty() ? "" : ", ";
    known += s.name;
  }
  input_error("--model", "unknown model preset '{}' (known: {})", name, known);
}

namespace {
constexpr std::array<std::string_view, kNumProj> kProjNames = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
}

std::string_view to_string(Proj p) {
  return kProjNames.at(static_cast<std::size_t>(p));
}

std::vector<Proj> parse_proj_list(std::string_view text, std::string_view field) {
  std::vector<Proj> out;
  auto add = [&](Proj p) {
    for (Proj q : out)
      if (q == p) return;
    out.push_back(p);
  };
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    std::string_view item =
        text.substr(pos, comma == std::string_view::npos ? text.npos : comma - pos);
    if (item == "all") {
      for (int i = 0; i < kNumProj; ++i) add(static_cast<Proj>(i));
    } else {
      bool found = false;
      for (int i = 0; i < kNumProj; ++i) {
        std::string_view full = kProjNames[i];
        std::string_view shortname = full.substr(0, full.size() - 5);  // drop "_proj"
        if (item == full || item == shortname) {
          add(static_cast<Proj>(i));
          found = true;
        }
      }
      if (!found)
        input_error(field, "unknown projection '{}' (use q,k,v,o,gate,up,down or all)", item);
    }
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::uint32_t proj_in(const ModelShape& s, Proj p) {
  switch (p) {
    case Proj::o:
      return s.d_model;  // concatenated heads
    case Proj::down:
      return s.ffn;
    default:
      return s.d_model;
  }
}

std::uint32_t proj_out(const ModelShape& s, Proj p) {
  switch (p) {
    case Proj::q:
    case Proj::o:
    case Proj::down:
      return s.d_model;
    case Proj::k:
    case Proj::v:
      return s.kv_dim();
    case Proj::gate:
    case Proj::up:
      return s.ffn;
  }
  return 0;
}

}  // namespace u3m::workload
