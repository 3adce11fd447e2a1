// Training-step traces: byte totals against formulas computed here from the
// shape, event integrity, stable identities, and the structure of gradient
// accumulation, recomputation, LoRA and ZeRO-3.
#include <algorithm>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "u3m/util/error.hpp"
#include "u3m/workload/analytic.hpp"
#include "u3m/workload/generate.hpp"
#include "workload_testing.hpp"

namespace u3m::workload {
namespace {

using testing::CheckingSink;
using testing::Generated;
using trace::EventKind;
using trace::Role;

std::unique_ptr<Generated> gen(const ModelShape& s, const TrainConfig& c) {
  auto g = std::make_unique<Generated>();
  g->result = generate_train(s, c, g->count);
  EXPECT_TRUE(g->check.finished);
  EXPECT_TRUE(g->check.errors.empty()) << g->check.errors.front();
  return g;
}

TrainConfig small_config() {
  TrainConfig c;
  c.steps = 2;
  c.micro_batch_size = 2;
  c.seq_len = 16;
  return c;
}

// Sum of bytes of the declared tensors of one role.
std::uint64_t declared_bytes(const trace::Trace& t, Role r) {
  std::uint64_t sum = 0;
  for (const auto& x : t.tensors) sum += x.role == r ? x.bytes : 0;
  return sum;
}

// Live bytes of a role just before the first event of the first op named `op`.
std::uint64_t live_before(const trace::Trace& t, Role r, const std::string& op) {
  std::uint64_t live = 0;
  for (const auto& e : t.events) {
    if (t.ops[e.op].name == op) return live;
    const auto& x = t.tensors[e.tensor];
    if (x.role != r) continue;
    if (e.kind == EventKind::alloc) live += x.bytes;
    if (e.kind == EventKind::free) live -= x.bytes;
  }
  ADD_FAILURE() << "no op " << op;
  return 0;
}

// tiny: L=2, d=64, heads 4, kv heads 2 (kv dim 32), ffn 172, vocab 256.
constexpr std::uint64_t L = 2, d = 64, h = 4, kv = 32, f = 172, V = 256;
constexpr std::uint64_t kParams = V * d * 2 + L * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d) + d;

TEST(Train, ParamGradAndOptimizerBytesMatchTheFormulas) {
  auto g = gen(preset("tiny"), small_config());
  EXPECT_EQ(declared_bytes(g->t(), Role::param), 2 * kParams);
  EXPECT_EQ(declared_bytes(g->t(), Role::grad), 2 * kParams);
  EXPECT_EQ(declared_bytes(g->t(), Role::optim_master), 4 * kParams);
  EXPECT_EQ(declared_bytes(g->t(), Role::optim_m), 4 * kParams);
  EXPECT_EQ(declared_bytes(g->t(), Role::optim_v), 4 * kParams);
  // All gradients are live together when the optimizer starts.
  EXPECT_EQ(g->count.peak(0, Role::grad), 2 * kParams);
  EXPECT_EQ(g->count.peak(0, Role::param), 2 * kParams);
  const analytic::TrainBytes b = analytic::train_bytes(preset("tiny"), small_config());
  EXPECT_EQ(b.param_bytes, 2 * kParams);
  EXPECT_EQ(b.optimizer_bytes, 12 * kParams);
}

TEST(Train, SavedActivationsMatchThePerLayerFormula) {
  const std::uint64_t T = 32;
  TrainConfig c = small_config();
  auto g = gen(preset("tiny"), c);
  const std::uint64_t per_layer =
      2 * T *
          (d /*attn_norm*/ + d /*rope.q*/ + kv /*rope.k*/ + kv /*v*/ + d /*core*/ + d /*h*/ +
           d /*ffn_norm*/ + 3 * f /*gate,up,swiglu*/ + d /*layer out*/) +
      4 * T * h /*lse*/;
  const std::uint64_t expected = L * per_layer + 2 * T * d /*embed.out*/;
  EXPECT_EQ(live_before(g->t(), Role::activation, "train-0.final_norm"), expected);
  EXPECT_EQ(analytic::saved_activation_bytes(preset("tiny"), c), expected);

  c.recompute = true;
  auto r = gen(preset("tiny"), c);
  const std::uint64_t expected_rc = 2 * T * d * (L + 1);
  EXPECT_EQ(live_before(r->t(), Role::activation, "train-0.final_norm"), expected_rc);
  EXPECT_EQ(analytic::saved_activation_bytes(preset("tiny"), c), expected_rc);
  EXPECT_LT(r->count.peak(0, Role::activation), g->count.peak(0, Role::activation));
  EXPECT_GE(g->count.peak(0, Role::activation), expected);

  // Checkpointing the first layer only: it keeps its output, the others all.
  c.recompute = false;
  c.recompute_layers = 1;
  auto one = gen(preset("tiny"), c);
  const std::uint64_t expected_one = 2 * T * d + (L - 1) * per_layer + 2 * T * d;
  EXPECT_EQ(live_before(one->t(), Role::activation, "train-0.final_norm"), expected_one);
  EXPECT_EQ(analytic::saved_activation_bytes(preset("tiny"), c), expected_one);
  std::set<std::string> names;
  for (const auto& o : one->t().ops) names.insert(o.name);
  EXPECT_TRUE(names.count("train-0.layer_0.attn.core.recompute"));
  EXPECT_FALSE(names.count("train-0.layer_1.attn.core.recompute"));
}

TEST(Train, Llama3GqaActivationsAtFullSize) {
  // One llama3-8b micro-batch of 1 x 512 tokens; counted from the trace.
  TrainConfig c;
  c.steps = 1;
  c.seq_len = 512;
  auto g = gen(preset("llama3-8b"), c);
  const std::uint64_t T = 512, D = 4096, KV = 8 * 128, F = 14336, H = 32, NL = 32;
  const std::uint64_t per_layer = 2 * T * (6 * D + 2 * KV + 3 * F) + 4 * T * H;
  EXPECT_EQ(live_before(g->t(), Role::activation, "train-0.final_norm"),
            NL * per_layer + 2 * T * D);
  EXPECT_EQ(g->count.peak(0, Role::param), 2 * analytic::param_count(preset("llama3-8b")));
}

TEST(Train, LoraSavesOnlyWhatAdapterGradientsNeed) {
  const std::uint64_t T = 32, r = 4;
  TrainConfig c = small_config();
  c.lora_rank = r;
  c.lora_targets = {Proj::q, Proj::v};
  auto g = gen(preset("tiny"), c);
  // Frozen gate/up/down: ffn_norm.out and swiglu.out are not needed backward;
  // frozen embedding and norms: embed.out is not either. Adapters add T*r each.
  const std::uint64_t per_layer = 2 * T * (d + d + kv + kv + d + d + 2 * f + d + 2 * r) + 4 * T * h;
  EXPECT_EQ(live_before(g->t(), Role::activation, "train-0.final_norm"), L * per_layer);
  EXPECT_EQ(analytic::saved_activation_bytes(preset("tiny"), c), L * per_layer);

  const std::uint64_t adapters = L * (r * (d + d) + r * (d + kv));
  EXPECT_EQ(declared_bytes(g->t(), Role::param), 2 * (kParams + adapters));
  EXPECT_EQ(declared_bytes(g->t(), Role::grad), 2 * adapters);
  EXPECT_EQ(declared_bytes(g->t(), Role::optim_master) + declared_bytes(g->t(), Role::optim_m) +
                declared_bytes(g->t(), Role::optim_v),
            12 * adapters);
  for (const auto& x : g->t().tensors)
    if (x.role == Role::grad) {
      EXPECT_NE(x.name.find("lora_"), std::string::npos) << x.name;
    }
  for (const auto& o : g->t().ops) {
    EXPECT_FALSE(o.name.ends_with("q_proj.bwd_weight")) << "frozen base weight got a grad op";
    if (o.cls == trace::OpClass::optimizer) {
      EXPECT_NE(o.name.find("lora_"), std::string::npos);
    }
  }

  c.recompute = true;
  auto rc = gen(preset("tiny"), c);
  EXPECT_EQ(live_before(rc->t(), Role::activation, "train-0.final_norm"), 2 * T * d * (L + 1));
}

TEST(Train, GradientAccumulationProducesOnceAndOptimizesOncePerStep) {
  TrainConfig c = small_config();
  c.micro_batches = 3;
  auto g = gen(preset("tiny"), c);
  const auto& t = g->t();
  std::uint32_t grad = UINT32_MAX;
  for (std::uint32_t i = 0; i < t.tensors.size(); ++i)
    if (t.tensors[i].name == "train-0.layer_1.mlp.up_proj.weight.grad") grad = i;
  ASSERT_NE(grad, UINT32_MAX);
  std::map<std::uint32_t, std::map<EventKind, int>> per_step;
  for (const auto& e : t.events)
    if (e.tensor == grad) per_step[t.ops[e.op].iteration][e.kind]++;
  ASSERT_EQ(per_step.size(), 2u);
  for (auto& [step, kinds] : per_step) {
    EXPECT_EQ(kinds[EventKind::alloc], 1) << step;
    EXPECT_EQ(kinds[EventKind::write], 3) << step;  // one write per micro-batch
    EXPECT_EQ(kinds[EventKind::free], 1) << step;   // after the optimizer read it
  }
  // One optimizer op per trainable tensor per step, all after the last backward op.
  const std::size_t trainable = param_specs(preset("tiny"), c).size();
  std::map<std::uint32_t, std::size_t> adam, last_bwd, first_adam;
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    const auto& o = t.ops[i];
    if (o.phase == trace::Phase::optimizer) {
      adam[o.iteration]++;
      if (!first_adam.count(o.iteration)) first_adam[o.iteration] = i;
    }
    if (o.phase == trace::Phase::backward) last_bwd[o.iteration] = i;
  }
  for (std::uint32_t s = 0; s < 2; ++s) {
    EXPECT_EQ(adam[s], trainable);
    EXPECT_GT(first_adam[s], last_bwd[s]);
  }
}

// The per-step sequence of (op name, tensor id, event kind).
std::vector<std::tuple<std::string, trace::TensorId, EventKind>> step_sequence(
    const trace::Trace& t, std::uint32_t step) {
  std::vector<std::tuple<std::string, trace::TensorId, EventKind>> seq;
  for (const auto& e : t.events) {
    const auto& o = t.ops[e.op];
    if (o.iteration == step && o.phase != trace::Phase::other)
      seq.emplace_back(o.name, t.tensors[e.tensor].id, e.kind);
  }
  return seq;
}

TEST(Train, IdentitiesAreStableAcrossSteps) {
  for (int variant = 0; variant < 4; ++variant) {
    TrainConfig c = small_config();
    c.steps = 3;
    c.micro_batches = 2;
    c.recompute = variant & 1;
    if (variant & 2) {
      c.zero3_ranks = 4;
      c.lora_rank = 2;
    }
    auto g = gen(preset("tiny"), c);
    const auto s0 = step_sequence(g->t(), 0), s1 = step_sequence(g->t(), 1),
               s2 = step_sequence(g->t(), 2);
    ASSERT_FALSE(s0.empty());
    EXPECT_EQ(s0, s1) << "variant " << variant;
    EXPECT_EQ(s1, s2) << "variant " << variant;
  }
}

TEST(Train, NamesFollowTheStableScheme) {
  auto g = gen(preset("tiny"), small_config());
  std::set<std::string> names;
  for (const auto& x : g->t().tensors) names.insert(x.name);
  for (const char* n :
       {"train-0.layer_1.attn.q_proj.out", "train-0.layer_1.attn.q_proj.weight",
        "train-0.layer_0.attn.k_proj.weight.grad", "train-0.layer_0.mlp.gate_proj.weight.adam_m",
        "train-0.embed.weight.master", "train-0.lm_head.out.grad", "train-0.layer_1.out"})
    EXPECT_TRUE(names.count(n)) << n;
  // Weights are allocated once (the init op) and never freed.
  const auto& t = g->t();
  for (const auto& e : t.events)
    if (t.tensors[e.tensor].role == Role::param && e.kind == EventKind::alloc) {
      EXPECT_EQ(t.ops[e.op].name, "train-0.init");
    }
}

TEST(Train, OpsCarryFlopsClassPhaseAndNominalTime) {
  const std::uint64_t T = 32;
  TrainConfig c = small_config();
  c.recompute = true;
  auto g = gen(preset("tiny"), c);
  const auto& t = g->t();
  std::map<std::string, const trace::Op*> first;
  for (const auto& o : t.ops) first.try_emplace(o.name, &o);
  auto op = [&](const std::string& n) -> const trace::Op& {
    EXPECT_TRUE(first.count(n)) << n;
    return *first.at(n);
  };
  EXPECT_DOUBLE_EQ(op("train-0.layer_0.attn.q_proj").flops, 2.0 * T * d * d);
  EXPECT_DOUBLE_EQ(op("train-0.layer_0.attn.k_proj").flops, 2.0 * T * d * kv);  // GQA
  EXPECT_DOUBLE_EQ(op("train-0.layer_0.mlp.down_proj.bwd_data").flops, 2.0 * T * f * d);
  EXPECT_DOUBLE_EQ(op("train-0.lm_head").flops, 2.0 * T * d * V);
  // Causal attention over 2 sequences of 16: 2 * (2 * S^2 * d).
  EXPECT_DOUBLE_EQ(op("train-0.layer_1.attn.core").flops, 2 * 2.0 * 16 * 16 * d);
  EXPECT_EQ(op("train-0.layer_1.attn.core").cls, trace::OpClass::attn_prefill);
  EXPECT_EQ(op("train-0.layer_1.attn.core.recompute").phase, trace::Phase::backward);
  EXPECT_EQ(op("train-0.layer_1.attn.core.bwd").phase, trace::Phase::backward);
  EXPECT_EQ(op("train-0.layer_1.attn_norm").cls, trace::OpClass::norm);
  EXPECT_EQ(op("train-0.layer_1.attn_norm").layer, 1);
  EXPECT_EQ(op("train-0.loss").cls, trace::OpClass::loss);
  EXPECT_EQ(op("train-0.embed").cls, trace::OpClass::embedding);
  EXPECT_EQ(op("train-0.layer_0.mlp.swiglu").cls, trace::OpClass::elementwise);
  EXPECT_EQ(op("train-0.layer_0.attn.q_proj.weight.adam").cls, trace::OpClass::optimizer);
  // bytes = inputs + weight + output; time = roofline of the defaults + 5 us.
  const trace::Op& q = op("train-0.layer_0.attn.q_proj");
  EXPECT_EQ(q.bytes, 2 * (T * d + d * d + T * d));
  std::uint64_t t0 = UINT64_MAX, t1 = 0;
  const auto qi = static_cast<std::uint32_t>(&q - t.ops.data());
  for (const auto& e : t.events)
    if (e.op == qi) t0 = std::min(t0, e.time_ns), t1 = std::max(t1, e.time_ns);
  const double expect_ns =
      std::max(2.0 * T * d * d / 376e12, 2.0 * (T * d + d * d + T * d) / 1.6e12) * 1e9 + 5000;
  EXPECT_NEAR(static_cast<double>(t1 - t0), expect_ns, 1.0);
  EXPECT_EQ(t.find_meta("time_model").value_or("").rfind("nominal roofline", 0), 0u);
  EXPECT_TRUE(t.find_meta("generator").has_value());
  EXPECT_EQ(t.find_meta("train.recompute"), "true");
}

TEST(Train, Zero3GathersShardsAndReduceScattersGrads) {
  const std::uint64_t N = 3;
  TrainConfig c = small_config();
  c.zero3_ranks = N;
  c.micro_batches = 2;
  auto g = gen(preset("tiny"), c);
  const auto& t = g->t();
  auto sh = [&](std::uint64_t n) { return (n + N - 1) / N; };
  const std::uint64_t layer = 2 * sh(d) + 2 * sh(d * d) + 2 * sh(d * kv) + 3 * sh(d * f);
  const std::uint64_t shards = 2 * sh(V * d) + L * layer + sh(d);
  EXPECT_EQ(declared_bytes(t, Role::param), 2 * shards);
  EXPECT_EQ(declared_bytes(t, Role::grad), 2 * shards);
  EXPECT_EQ(declared_bytes(t, Role::optim_m), 4 * shards);
  // Gathered weights and unsharded grads are full-size workspace buffers.
  EXPECT_EQ(declared_bytes(t, Role::workspace), 2 * 2 * kParams);
  // Per micro-batch: embed, L fwd, head, L bwd gathers; head, L, embed reduce-scatters.
  std::map<std::uint32_t, int> collectives;
  for (const auto& o : t.ops)
    if (o.cls == trace::OpClass::collective) {
      EXPECT_EQ(o.phase, trace::Phase::collective);
      EXPECT_GT(o.bytes, 0u);
      collectives[o.iteration]++;
    }
  EXPECT_EQ(collectives[0], static_cast<int>(2 * (4 + 3 * L)));
  // Compute reads the gathered buffer, never the shard.
  for (const auto& e : t.events) {
    const auto& x = t.tensors[e.tensor];
    const auto& o = t.ops[e.op];
    if (x.name.ends_with(".shard") && e.kind == EventKind::read) {
      EXPECT_TRUE(o.cls == trace::OpClass::collective) << o.name;
    }
  }
}

TEST(Train, EveryOptionCombinationGivesAConsistentTrace) {
  // gen() fails on any integrity error the CheckingSink finds; bytes of the
  // resident weights must match the analytic per-rank figure in every case.
  for (int v = 0; v < 64; ++v) {
    ModelShape s = preset(v & 32 ? "tiny-mha" : "tiny");
    s.tied_embeddings = v & 1;
    TrainConfig c = small_config();
    c.steps = 1;
    c.micro_batches = v & 2 ? 2 : 1;
    c.recompute = v & 4;
    c.zero3_ranks = v & 8 ? 3 : 1;
    if (v & 16) {
      c.lora_rank = 3;
      c.lora_targets = {Proj::k, Proj::o, Proj::down};
    }
    c.mixed_precision = !(v & 2);
    SCOPED_TRACE(v);
    auto g = gen(s, c);
    const analytic::TrainBytes b = analytic::train_bytes(s, c);
    EXPECT_EQ(g->count.peak(0, Role::param), b.param_bytes);
    EXPECT_EQ(g->count.peak(0, Role::grad), b.grad_bytes);
    EXPECT_EQ(live_before(g->t(), Role::activation, "train-0.final_norm"),
              analytic::saved_activation_bytes(s, c));
  }
}

TEST(Train, AnInMemoryTraceIsReservedExactlyOnce) {
  // generate_train reserves a trace::Trace's ops and events from the step
  // program's size: the reservation must be what the steps then emit, no
  // more and no less (less would regrow, more would waste), in every case.
  for (int v = 0; v < 16; ++v) {
    ModelShape s = preset(v & 8 ? "tiny-mha" : "tiny");
    TrainConfig c = small_config();
    c.steps = 3;
    c.micro_batches = v & 1 ? 2 : 1;
    c.recompute = v & 2;
    c.zero3_ranks = v & 4 ? 3 : 1;
    SCOPED_TRACE(v);
    trace::Trace t;
    const GenResult r = generate_train(s, c, t);
    EXPECT_EQ(t.events.size(), r.events);
    EXPECT_EQ(t.events.capacity(), t.events.size());
    EXPECT_EQ(t.ops.capacity(), t.ops.size());
  }
}

TEST(Train, FullPrecisionHasNoMasterCopy) {
  TrainConfig c = small_config();
  c.mixed_precision = false;
  auto g = gen(preset("tiny"), c);
  EXPECT_EQ(declared_bytes(g->t(), Role::param), 4 * kParams);
  EXPECT_EQ(declared_bytes(g->t(), Role::optim_master), 0u);
  EXPECT_EQ(analytic::train_bytes(preset("tiny"), c).optimizer_bytes, 8 * kParams);
}

TEST(Train, TwoHeldShardsDoubleTheShardedStateNotTheTraffic) {
  TrainConfig c = small_config();
  c.zero3_ranks = 4;
  auto one = gen(preset("tiny"), c);
  c.zero3_shards = 2;
  auto two = gen(preset("tiny"), c);
  for (Role r : {Role::param, Role::grad, Role::optim_m, Role::optim_v})
    EXPECT_EQ(declared_bytes(two->t(), r), 2 * declared_bytes(one->t(), r));
  EXPECT_EQ(declared_bytes(two->t(), Role::workspace), declared_bytes(one->t(), Role::workspace));
  std::uint64_t link1 = 0, link2 = 0;
  for (const auto& o : one->t().ops)
    if (o.cls == trace::OpClass::collective) link1 += o.bytes;
  for (const auto& o : two->t().ops)
    if (o.cls == trace::OpClass::collective) link2 += o.bytes;
  EXPECT_EQ(link1, link2);
  c.zero3_shards = 4;  // all four on one rank: no other rank is left
  CheckingSink sink;
  EXPECT_THROW(generate_train(preset("tiny"), c, sink), InputError);
}

TEST(Train, BadConfigIsAnInputError) {
  TrainConfig c = small_config();
  c.seq_len = 0;
  CheckingSink sink;
  EXPECT_THROW(generate_train(preset("tiny"), c, sink), InputError);
  c = small_config();
  c.lora_rank = 4;
  c.lora_targets.clear();
  EXPECT_THROW(generate_train(preset("tiny"), c, sink), InputError);
}

}  // namespace
}  // namespace u3m::workload
