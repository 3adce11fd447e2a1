#include "u3m/predict/synthetic.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

namespace u3m::predict {

using trace::EventKind;
using trace::OpClass;
using trace::Phase;
using trace::Role;

namespace {

struct ProtoOp {
  trace::Op op;
  std::vector<std::pair<std::uint32_t, EventKind>> touches;
};

class Builder {
 public:
  explicit Builder(trace::Trace& t) : t_(t) {}
  std::uint32_t tensor(std::string name, std::uint64_t bytes, Role role, std::int32_t layer,
                       std::uint32_t job) {
    t_.tensors.push_back(
        trace::make_tensor(std::move(name), bytes, trace::DType::f16, role, layer, job));
    return static_cast<std::uint32_t>(t_.tensors.size() - 1);
  }

 private:
  trace::Trace& t_;
};

ProtoOp make_op(std::string name, OpClass cls, Phase phase, std::uint32_t job, std::uint32_t iter,
                std::int32_t layer) {
  ProtoOp p;
  p.op.name = std::move(name);
  p.op.cls = cls;
  p.op.phase = phase;
  p.op.job = job;
  p.op.iteration = iter;
  p.op.layer = layer;
  return p;
}

std::vector<ProtoOp> training(const SyntheticMixed& p, Builder& b) {
  std::vector<std::uint32_t> w, g, m, v, act, att;
  for (std::uint32_t l = 0; l < p.layers; ++l) {
    auto L = static_cast<std::int32_t>(l);
    w.push_back(b.tensor(fmt::format("train-0.layer_{}.w", l), 1 << 20, Role::param, L, 0));
    g.push_back(b.tensor(fmt::format("train-0.layer_{}.w.grad", l), 1 << 20, Role::grad, L, 0));
    m.push_back(
        b.tensor(fmt::format("train-0.layer_{}.w.adam_m", l), 1 << 21, Role::optim_m, L, 0));
    v.push_back(
        b.tensor(fmt::format("train-0.layer_{}.w.adam_v", l), 1 << 21, Role::optim_v, L, 0));
    act.push_back(
        b.tensor(fmt::format("train-0.layer_{}.mm.out", l), 3 << 17, Role::activation, L, 0));
    att.push_back(
        b.tensor(fmt::format("train-0.layer_{}.attn.out", l), 1 << 17, Role::activation, L, 0));
  }
  std::vector<ProtoOp> ops;
  for (std::uint32_t it = 0; it < p.train_iterations; ++it) {
    for (std::uint32_t l = 0; l < p.layers; ++l) {
      auto L = static_cast<std::int32_t>(l);
      auto mm = make_op(fmt::format("layer_{}.mm", l), OpClass::matmul, Phase::forward, 0, it, L);
      mm.touches = {
          {w[l], EventKind::read}, {act[l], EventKind::alloc}, {act[l], EventKind::write}};
      ops.push_back(mm);
      auto at =
          make_op(fmt::format("layer_{}.attn", l), OpClass::attn_prefill, Phase::forward, 0, it, L);
      at.touches = {
          {act[l], EventKind::read}, {att[l], EventKind::alloc}, {att[l], EventKind::write}};
      ops.push_back(at);
    }
    for (std::uint32_t l = p.layers; l-- > 0;) {
      auto L = static_cast<std::int32_t>(l);
      auto at = make_op(fmt::format("layer_{}.attn.bwd", l), OpClass::attn_prefill, Phase::backward,
                        0, it, L);
      at.touches = {
          {att[l], EventKind::read}, {act[l], EventKind::read}, {att[l], EventKind::free}};
      ops.push_back(at);
      auto mm =
          make_op(fmt::format("layer_{}.mm.bwd", l), OpClass::matmul, Phase::backward, 0, it, L);
      mm.touches = {{w[l], EventKind::read},
                    {act[l], EventKind::read},
                    {g[l], EventKind::write},
                    {act[l], EventKind::free}};
      ops.push_back(mm);
    }
    for (std::uint32_t l = 0; l < p.layers; ++l) {
      auto L = static_cast<std::int32_t>(l);
      auto ad =
          make_op(fmt::format("layer_{}.adam", l), OpClass::optimizer, Phase::optimizer, 0, it, L);
      ad.touches = {{g[l], EventKind::read},  {m[l], EventKind::read},  {v[l], EventKind::read},
                    {w[l], EventKind::write}, {m[l], EventKind::write}, {v[l], EventKind::write}};
      ops.push_back(ad);
    }
  }
  return ops;
}

std::vector<ProtoOp> serving(const SyntheticMixed& p, Builder& b) {
  std::vector<std::uint32_t> w;
  for (std::uint32_t l = 0; l < p.layers; ++l)
    w.push_back(b.tensor(fmt::format("infer-0.layer_{}.w", l), 1 << 20, Role::param,
                         static_cast<std::int32_t>(l), 1));
  struct Request {
    std::uint32_t id, tokens, length;
    std::vector<std::vector<std::uint32_t>> blocks;  // per layer
  };
  std::vector<Request> live;
  std::uint32_t next_id = 0;
  std::vector<ProtoOp> ops;
  auto new_block = [&](Request& r, std::uint32_t l) {
    std::uint32_t t =
        b.tensor(fmt::format("infer-0.req_{}.layer_{}.kv_{}", r.id, l, r.blocks[l].size()), 1 << 16,
                 Role::kv, static_cast<std::int32_t>(l), 1);
    r.blocks[l].push_back(t);
    return t;
  };
  for (std::uint32_t step = 0; step < p.decode_steps; ++step) {
    // Admit requests; their prefill runs at the start of the step.
    while (live.size() < p.max_requests) {
      Request r{
          next_id, 2 * p.tokens_per_block, 2 * p.tokens_per_block + 6 + 5 * (next_id % 4), {}};
      ++next_id;
      r.blocks.resize(p.layers);
      for (std::uint32_t l = 0; l < p.layers; ++l) {
        auto op = make_op(fmt::format("prefill.layer_{}", l), OpClass::attn_prefill, Phase::prefill,
                          1, step, static_cast<std::int32_t>(l));
        op.touches.push_back({w[l], EventKind::read});
        for (int k = 0; k < 2; ++k) {
          std::uint32_t t = new_block(r, l);
          op.touches.push_back({t, EventKind::alloc});
          op.touches.push_back({t, EventKind::write});
        }
        ops.push_back(std::move(op));
      }
      live.push_back(std::move(r));
    }
    for (std::uint32_t l = 0; l < p.layers; ++l) {
      auto L = static_cast<std::int32_t>(l);
      auto mm =
          make_op(fmt::format("decode.layer_{}.mm", l), OpClass::matmul, Phase::decode, 1, step, L);
      mm.touches = {{w[l], EventKind::read}};
      ops.push_back(mm);
      auto at = make_op(fmt::format("decode.layer_{}.attn", l), OpClass::attn_decode, Phase::decode,
                        1, step, L);
      for (Request& r : live) {
        for (std::uint32_t t : r.blocks[l]) at.touches.push_back({t, EventKind::read});
        if (r.tokens % p.tokens_per_block == 0) {  // the new token opens a block
          std::uint32_t t = new_block(r, l);
          at.touches.push_back({t, EventKind::alloc});
        }
        at.touches.push_back({r.blocks[l].back(), EventKind::write});
      }
      ops.push_back(std::move(at));
    }
    auto last = make_op("decode.sample", OpClass::other, Phase::decode, 1, step, trace::kNoLayer);
    for (Request& r : live) ++r.tokens;
    for (auto it = live.begin(); it != live.end();) {
      if (it->tokens >= it->length) {
        for (auto& bl : it->blocks)
          for (std::uint32_t t : bl) last.touches.push_back({t, EventKind::free});
        it = live.erase(it);
      } else {
        ++it;
      }
    }
    if (!last.touches.empty()) ops.push_back(std::move(last));
  }
  return ops;
}

}  // namespace

trace::Trace make_synthetic_mixed(const SyntheticMixed& p) {
  trace::Trace t;
  t.meta("source", "u3m predict synthetic mixed trace (hand-made)");
  t.job("train-0");
  t.job("infer-0");
  Builder b(t);
  std::vector<ProtoOp> tr = training(p, b), sv = serving(p, b);
  // Interleave the two jobs' op streams.
  std::size_t i = 0, j = 0;
  std::uint32_t train_ops_per_iter = 5 * p.layers;
  auto emit = [&](ProtoOp& po) {
    auto op = static_cast<std::uint32_t>(t.ops.size());
    std::uint64_t time = op * p.op_ns;
    t.ops.push_back(po.op);
    for (auto [tensor, kind] : po.touches) t.events.push_back({time, op, tensor, kind});
  };
  while (i < tr.size() || j < sv.size()) {
    if (p.pattern == SyntheticMixed::Pattern::alternate) {
      for (std::uint32_t k = 0; k < train_ops_per_iter && i < tr.size(); ++k) emit(tr[i++]);
      std::uint32_t steps = 0;
      while (j < sv.size() && (i >= tr.size() || steps < p.decode_per_train)) {
        std::uint32_t it = sv[j].op.iteration;
        while (j < sv.size() && sv[j].op.iteration == it) emit(sv[j++]);
        ++steps;
      }
    } else {
      for (std::uint32_t k = 0; k < p.slice_ops && i < tr.size(); ++k) emit(tr[i++]);
      for (std::uint32_t k = 0; k < p.slice_ops && j < sv.size(); ++k) emit(sv[j++]);
    }
  }
  return t;
}

}  // namespace u3m::predict
