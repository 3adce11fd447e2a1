#include "u3m/trace/model.hpp"

#include <array>
#include <cctype>

#include <xxhash.h>

namespace u3m::trace {

TensorId stable_id(std::string_view name) { return XXH64(name.data(), name.size(), 0); }

Tensor make_tensor(std::string name, std::uint64_t bytes, DType dtype, Role role,
                   std::int32_t layer, std::uint32_t job) {
  Tensor t;
  t.id = stable_id(name);
  t.name = std::move(name);
  t.bytes = bytes;
  t.dtype = dtype;
  t.role = role;
  t.layer = layer;
  t.job = job;
  return t;
}

void Trace::replay(TraceSink& out) const {
  // Interleave records so every reference is declared before use: walk the
  // events and declare jobs, tensors and ops lazily, in index order.
  for (auto& [k, v] : metadata) out.meta(k, v);
  for (auto& j : jobs) out.job(j);
  std::size_t next_tensor = 0, next_op = 0;
  for (const Event& e : events) {
    while (next_tensor <= e.tensor && next_tensor < tensors.size()) out.tensor(tensors[next_tensor++]);
    while (next_op <= e.op && next_op < ops.size()) out.op(ops[next_op++]);
    out.event(e);
  }
  while (next_tensor < tensors.size()) out.tensor(tensors[next_tensor++]);
  while (next_op < ops.size()) out.op(ops[next_op++]);
  out.finish();
}

std::optional<std::string> Trace::find_meta(std::string_view key) const {
  for (auto& [k, v] : metadata)
    if (k == key) return v;
  return std::nullopt;
}

namespace {

template <typename E, std::size_t N>
std::optional<E> parse_enum(const std::array<std::string_view, N>& names, std::string_view s) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  return std::nullopt;
}

constexpr std::array<std::string_view, 12> kDTypes = {"f32", "f16", "bf16", "f64", "f8",   "i64",
                                                      "i32", "i16", "i8",   "u8",  "bool", "other"};
constexpr std::array<std::string_view, 9> kRoles = {
    "param", "grad", "optim_master", "optim_m", "optim_v", "activation", "kv", "workspace", "other"};
constexpr std::array<std::string_view, kNumOpClasses> kOpClasses = {
    "matmul",    "attn_prefill", "attn_decode", "norm",       "softmax", "elementwise",
    "embedding", "optimizer",    "collective",  "copy",       "loss",    "other"};
constexpr std::array<std::string_view, kNumPhases> kPhases = {
    "forward", "backward", "optimizer", "prefill", "decode", "collective", "other"};
constexpr std::array<std::string_view, 4> kKinds = {"alloc", "read", "write", "free"};

}  // namespace

std::string_view to_string(DType v) { return kDTypes.at(static_cast<std::size_t>(v)); }
std::string_view to_string(Role v) { return kRoles.at(static_cast<std::size_t>(v)); }
std::string_view to_string(OpClass v) { return kOpClasses.at(static_cast<std::size_t>(v)); }
std::string_view to_string(Phase v) { return kPhases.at(static_cast<std::size_t>(v)); }
std::string_view to_string(EventKind v) { return kKinds.at(static_cast<std::size_t>(v)); }
std::optional<DType> parse_dtype(std::string_view s) { return parse_enum<DType>(kDTypes, s); }
std::optional<Role> parse_role(std::string_view s) { return parse_enum<Role>(kRoles, s); }
std::optional<OpClass> parse_op_class(std::string_view s) {
  return parse_enum<OpClass>(kOpClasses, s);
}
std::optional<Phase> parse_phase(std::string_view s) { return parse_enum<Phase>(kPhases, s); }
std::optional<EventKind> parse_event_kind(std::string_view s) {
  return parse_enum<EventKind>(kKinds, s);
}

std::uint32_t dtype_bytes(DType v) {
  switch (v) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: case DType::i16: return 2;
    case DType::f8: case DType::i8: case DType::u8: case DType::boolean: return 1;
    case DType::other: return 0;
  }
  return 0;
}

void op_family(std::string_view name, std::string& key) {
  auto digit = [&name](std::size_t i) {
    return std::isdigit(static_cast<unsigned char>(name[i])) != 0;
  };
  key.clear();
  std::size_t from = 0;  // start of the run not copied yet
  for (std::size_t i = 0; i + 1 < name.size(); ++i) {
    if (name[i] != '_' || !digit(i + 1)) continue;
    key.append(name, from, i + 1 - from);
    key += '*';
    std::size_t j = i + 1;
    while (j < name.size() && digit(j)) ++j;
    from = j;
    i = j - 1;
  }
  key.append(name, from);
}

}  // namespace u3m::trace
