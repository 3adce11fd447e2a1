#include "emitter.hpp"

#include "u3m/util/error.hpp"

#include <algorithm>
#include <cassert>

namespace u3m::workload::detail {

std::uint32_t Emitter::job(std::string_view name) {
  out_.job(name);
  return jobs_++;
}

std::uint32_t Emitter::declare(std::string name, std::uint64_t bytes, DType dtype, Role role,
                               std::int32_t layer, std::uint32_t job, bool persistent) {
  trace::Tensor t = trace::make_tensor(std::move(name), bytes, dtype, role, layer, job);
  out_.tensor(t);
  if (tensors_.size() >= UINT32_MAX)
    input_error("trace gen", "more than 2^32 - 1 tensors; generate fewer requests");
  tensors_.push_back({bytes, persistent});
  return static_cast<std::uint32_t>(tensors_.size() - 1);
}

void Emitter::emit(const Program& p, const POp& o, std::uint32_t job, std::uint32_t iteration) {
  const PAccess* a = p.acc.data() + o.first;
  const PAccess* end = a + o.count;
  std::uint64_t bytes = 0;
  for (const PAccess* x = a; x != end; ++x) {
    const std::uint64_t b = tensors_[x->tensor].bytes;
    switch (x->kind) {
      case Acc::read:
      case Acc::produce:
      case Acc::overwrite:
        bytes += b;
        break;
      case Acc::update:
        bytes += 2 * b;
        break;
      case Acc::release:
        break;
    }
  }
  const bool collective = o.cls == OpClass::collective;
  if (collective) bytes = o.link_bytes;
  const std::uint64_t t0 = now_, t1 = now_ + tm_.op_ns(o.flops, bytes, collective);

  op_.name.assign(p.names[o.name]);
  op_.cls = o.cls;
  op_.phase = o.phase;
  op_.job = job;
  op_.iteration = iteration;
  op_.layer = o.layer;
  op_.flops = o.flops;
  op_.bytes = bytes;
  out_.op(op_);
  // Events index ops and tensors with 32 bits (model.hpp): refuse to wrap.
  if (ops_ >= UINT32_MAX) input_error("trace gen", "more than 2^32 - 1 ops; generate fewer steps");
  const auto op_index = static_cast<std::uint32_t>(ops_++);

  // Memory exists and inputs are read when the op starts; outputs are written
  // and dead tensors freed when it ends.
  trace::Event e;
  e.op = op_index;
  auto put = [&](std::uint32_t tensor, trace::EventKind k, std::uint64_t t) {
    e.tensor = tensor;
    e.kind = k;
    e.time_ns = t;
    out_.event(e);
    ++events_;
  };
  for (const PAccess* x = a; x != end; ++x) {
    if (x->kind == Acc::produce) put(x->tensor, trace::EventKind::alloc, t0);
    if (x->kind == Acc::read || x->kind == Acc::update) put(x->tensor, trace::EventKind::read, t0);
  }
  for (const PAccess* x = a; x != end; ++x)
    if (x->kind == Acc::produce || x->kind == Acc::update || x->kind == Acc::overwrite)
      put(x->tensor, trace::EventKind::write, t1);
  for (const PAccess* x = a; x != end; ++x)
    if (x->free_after || x->kind == Acc::release) put(x->tensor, trace::EventKind::free, t1);
  now_ = t1;
  last_event_ns_ = t1;
}

void Emitter::emit_all(const Program& p, std::uint32_t job, std::uint32_t iteration) {
  for (const POp& o : p.ops) emit(p, o, job, iteration);
}

GenResult Emitter::finish() {
  out_.finish();
  GenResult r;
  r.ops = ops_;
  r.events = events_;
  r.tensors = tensors_.size();
  r.end_ns = last_event_ns_;
  return r;
}

void Program::begin(std::string name, OpClass cls, Phase phase, std::int32_t layer, double flops,
                    std::uint64_t link_bytes) {
  names.push_back(std::move(name));
  ops.push_back(POp{static_cast<std::uint32_t>(names.size() - 1), cls, phase, layer, flops,
                    link_bytes, false, static_cast<std::uint32_t>(acc.size()), 0});
}

void Program::access(std::uint32_t tensor, Acc kind) {
  acc.push_back(PAccess{tensor, kind, false});
  ops.back().count++;
}

void Program::add(std::string name, OpClass cls, Phase phase, std::int32_t layer, double flops,
                  std::initializer_list<std::pair<std::uint32_t, Acc>> accesses) {
  begin(std::move(name), cls, phase, layer, flops);
  for (auto [t, k] : accesses) access(t, k);
}

std::pair<std::size_t, std::size_t> Program::emitted_size() const {
  std::size_t events = 0;  // as Emitter::emit writes them
  for (const PAccess& a : acc) {
    events += a.kind == Acc::produce || a.kind == Acc::update ? 2 : a.kind == Acc::release ? 0 : 1;
    events += a.free_after || a.kind == Acc::release;
  }
  return {ops.size(), events};
}

void Program::plan_frees(const Emitter& e, std::vector<std::uint8_t>& used_later) {
  // used_later[t]: t is accessed again after the current point, before being
  // produced anew. Every transient tensor is dead at the end of a program.
  if (used_later.size() < e.tensor_count()) used_later.resize(e.tensor_count(), 0);
  for (std::size_t i = acc.size(); i-- > 0;) {
    PAccess& a = acc[i];
    a.free_after = false;
    if (a.kind == Acc::release || e.info(a.tensor).persistent) continue;
    if (!used_later[a.tensor]) {
      a.free_after = true;
      used_later[a.tensor] = 1;
    }
    if (a.kind == Acc::produce) used_later[a.tensor] = 0;
  }
  for (const PAccess& a : acc) used_later[a.tensor] = 0;  // leave scratch clean for reuse
}

}  // namespace u3m::workload::detail
