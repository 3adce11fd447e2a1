// Internal machinery shared by the generators: a Program (a list of ops and
// the tensors each touches), a lifetime pass that decides where tensors die,
// and an Emitter that turns programs into trace records with nominal times.
//
// Note [Programs and lifetimes]
// A generator describes work as ops with accesses (read, produce = alloc +
// write, update = read + write, overwrite = write, release = free only). It
// never writes free events by hand for transient tensors: plan_frees() scans
// the program backwards and frees each transient tensor right after its last
// access before it is produced again. So activations die at their last use,
// gradients die after the optimizer reads them, ZeRO-3 gathered weights die
// after the layer, and "what is saved for backward" follows from which
// backward ops read what, not from a hand-kept list. Persistent tensors
// (weights, optimizer state, KV blocks) are never freed by the pass; KV
// blocks are released explicitly when their request finishes.
// A training step is the same program every step, so it is built and planned
// once and emitted once per step, which keeps generation allocation-light.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "u3m/trace/model.hpp"
#include "u3m/workload/config.hpp"
#include "u3m/workload/generate.hpp"

namespace u3m::workload::detail {

using trace::DType;
using trace::OpClass;
using trace::Phase;
using trace::Role;

enum class Acc : std::uint8_t { read, produce, update, overwrite, release };

struct PAccess {
  std::uint32_t tensor;
  Acc kind;
  bool free_after = false;  // set by plan_frees
};

struct POp {
  std::uint32_t name;  // index into Program::names
  OpClass cls;
  Phase phase;
  std::int32_t layer;
  double flops;
  std::uint64_t link_bytes;  // collectives: bytes over the card-to-card link
  bool boundary;             // ends a layer unit (where co-located work may interleave)
  std::uint32_t first, count;
};

struct Program;

struct TensorInfo {
  std::uint64_t bytes;
  bool persistent;
};

class Emitter {
 public:
  Emitter(trace::TraceSink& out, const TimeModel& tm) : out_(out), tm_(tm) {}

  std::uint32_t job(std::string_view name);
  std::uint32_t declare(std::string name, std::uint64_t bytes, DType dtype, Role role,
                        std::int32_t layer, std::uint32_t job, bool persistent);
  const TensorInfo& info(std::uint32_t t) const { return tensors_[t]; }
  std::size_t tensor_count() const { return tensors_.size(); }
  void meta(std::string_view k, std::string_view v) { out_.meta(k, v); }

  std::uint64_t now() const { return now_; }
  void advance_to(std::uint64_t t) { now_ = std::max(now_, t); }

  // Emits one op of a planned program and its events; advances the clock.
  void emit(const Program& p, const POp& op, std::uint32_t job, std::uint32_t iteration);
  void emit_all(const Program& p, std::uint32_t job, std::uint32_t iteration);
  GenResult finish();

 private:
  trace::TraceSink& out_;
  TimeModel tm_;
  std::vector<TensorInfo> tensors_;
  std::uint32_t jobs_ = 0;
  std::uint64_t now_ = 0, ops_ = 0, events_ = 0, last_event_ns_ = 0;
  trace::Op op_;  // reused so op names keep their capacity
};

struct Program {
  std::vector<std::string> names;
  std::vector<POp> ops;
  std::vector<PAccess> acc;

  void clear() {
    names.clear();
    ops.clear();
    acc.clear();
  }
  // Starts an op; add its accesses with access() until the next begin().
  void begin(std::string name, OpClass cls, Phase phase, std::int32_t layer, double flops,
             std::uint64_t link_bytes = 0);
  void access(std::uint32_t tensor, Acc kind);
  void add(std::string name, OpClass cls, Phase phase, std::int32_t layer, double flops,
           std::initializer_list<std::pair<std::uint32_t, Acc>> accesses);
  void mark_boundary() { ops.back().boundary = true; }
  // {ops, events} that emitting the whole program writes (after plan_frees).
  std::pair<std::size_t, std::size_t> emitted_size() const;
  // Note [Programs and lifetimes]. `scratch` is reused between calls.
  void plan_frees(const Emitter& e, std::vector<std::uint8_t>& scratch);
};

}  // namespace u3m::workload::detail
