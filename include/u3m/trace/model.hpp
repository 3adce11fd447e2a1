// The trace model: tensors with stable identities, the operators that touch
// them, and timestamped access events. Every layer of u3m consumes this.
//
// Note [Stable identity]
// A tensor's identity is the 64-bit xxh64 hash of a stable name such as
// "train-0.layer_12.attn.q_proj.out". The name is built from model structure,
// operator and argument slot, never from a runtime address, so the same
// logical tensor gets the same id in step k and step k+1. Activations are
// freed and re-allocated every step but keep their id; a KV block is named by
// request, layer and block index. In memory, events refer to tensors and ops
// by dense index (cheap array lookups on hot paths); the id travels with the
// Tensor record and is what crosses files and processes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace u3m::trace {

using TensorId = std::uint64_t;

// xxh64(name, seed 0): the stable id of a tensor name.
TensorId stable_id(std::string_view name);

enum class DType : std::uint8_t { f32, f16, bf16, f64, f8, i64, i32, i16, i8, u8, boolean, other };
enum class Role : std::uint8_t {
  param,
  grad,
  optim_master,  // fp32 master copy of 16-bit weights
  optim_m,       // Adam first moment
  optim_v,       // Adam second moment
  activation,
  kv,
  workspace,
  other,
};
// The ~12 operator classes of MISSION.md; one EMA predictor each.
enum class OpClass : std::uint8_t {
  matmul,
  attn_prefill,  // full-sequence attention (training forward/backward, prefill)
  attn_decode,   // one-token attention over a KV cache
  norm,
  softmax,
  elementwise,
  embedding,
  optimizer,
  collective,
  copy,
  loss,
  other,
};
enum class Phase : std::uint8_t { forward, backward, optimizer, prefill, decode, collective, other };
enum class EventKind : std::uint8_t { alloc, read, write, free };

inline constexpr int kNumOpClasses = 12;
inline constexpr int kNumPhases = 7;
inline constexpr std::int32_t kNoLayer = -1;

struct Tensor {
  TensorId id = 0;  // stable_id(name)
  std::string name;
  std::uint64_t bytes = 0;
  DType dtype = DType::other;
  Role role = Role::other;
  std::int32_t layer = kNoLayer;
  std::uint32_t job = 0;  // index into Trace::jobs
};

// A tensor record whose id is xxh64 of its name (Note [Stable identity]).
Tensor make_tensor(std::string name, std::uint64_t bytes, DType dtype, Role role,
                   std::int32_t layer = kNoLayer, std::uint32_t job = 0);

struct Op {
  std::string name;  // e.g. "aten::mm" or "layer_3.attn.q_proj"
  OpClass cls = OpClass::other;
  Phase phase = Phase::other;
  std::uint32_t job = 0;        // index into Trace::jobs
  std::uint32_t iteration = 0;  // training step or serving iteration of its job
  std::int32_t layer = kNoLayer;
  double flops = 0;             // 0 when unknown
  std::uint64_t bytes = 0;      // bytes the op moves, 0 when unknown
};

struct Event {
  std::uint64_t time_ns = 0;
  std::uint32_t op = 0;      // index into Trace::ops
  std::uint32_t tensor = 0;  // index into Trace::tensors
  EventKind kind = EventKind::read;
};

// Streaming consumer. Producers (generators, importers, readers) call it in an
// order that keeps references valid: a job before anything that names it, a
// tensor or op before any event that refers to it. Tensors and ops are
// numbered 0,1,2,... in the order they are declared; jobs likewise.
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void meta(std::string_view key, std::string_view value) = 0;
  virtual void job(std::string_view name) = 0;
  virtual void tensor(const Tensor& t) = 0;
  virtual void op(const Op& o) = 0;
  virtual void event(const Event& e) = 0;
  virtual void finish() {}
};

// A whole trace in memory; also a sink that collects what it is fed.
struct Trace : TraceSink {
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<std::string> jobs;
  std::vector<Tensor> tensors;
  std::vector<Op> ops;
  std::vector<Event> events;

  void meta(std::string_view k, std::string_view v) override { metadata.emplace_back(k, v); }
  void job(std::string_view name) override { jobs.emplace_back(name); }
  void tensor(const Tensor& t) override { tensors.push_back(t); }
  void op(const Op& o) override { ops.push_back(o); }
  void event(const Event& e) override { events.push_back(e); }

  // Feeds this trace, in order, to another sink.
  void replay(TraceSink& out) const;
  std::optional<std::string> find_meta(std::string_view key) const;
};

// Names of enum values as they appear in files, docs and the CLI.
std::string_view to_string(DType v);
std::string_view to_string(Role v);
std::string_view to_string(OpClass v);
std::string_view to_string(Phase v);
std::string_view to_string(EventKind v);
std::optional<DType> parse_dtype(std::string_view s);
std::optional<Role> parse_role(std::string_view s);
std::optional<OpClass> parse_op_class(std::string_view s);
std::optional<Phase> parse_phase(std::string_view s);
std::optional<EventKind> parse_event_kind(std::string_view s);

std::uint32_t dtype_bytes(DType v);  // 0 for DType::other

// An op's family: its name with layer numbers folded ("layer_12.attn.q_proj"
// -> "layer_*.attn.q_proj"), so reports group one op kind over the layers.
// Built in `key` (reused: op names outgrow the small-string buffer).
void op_family(std::string_view name, std::string& key);
inline std::string op_family(std::string_view name) {
  std::string key;
  op_family(name, key);
  return key;
}

}  // namespace u3m::trace
