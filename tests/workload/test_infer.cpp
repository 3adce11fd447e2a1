// Serving traces: KV bytes against the formula, continuous batching, block
// lifetimes, phases, determinism.
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

std::unique_ptr<Generated> serve(const ModelShape& s, const InferConfig& c, RequestSource& src) {
  auto g = std::make_unique<Generated>();
  g->result = generate_infer(s, c, src, g->count);
  EXPECT_TRUE(g->check.finished);
  EXPECT_TRUE(g->check.errors.empty()) << g->check.errors.front();
  return g;
}

Request req(std::uint64_t id, std::uint64_t at_ns, std::uint32_t prompt, std::uint32_t out) {
  return Request{id, at_ns, prompt, out};
}

// tiny: L=2, kv_heads=2, head_dim=16.
constexpr std::uint64_t L = 2, kvh = 2, hd = 16;

TEST(Infer, KvOfOneRequestMatchesTheFormula) {
  const std::uint32_t P = 10, O = 5;
  for (std::uint32_t bt : {1u, 4u}) {
    ListSource src({req(0, 0, P, O)});
    InferConfig c;
    c.block_tokens = bt;
    auto g = serve(preset("tiny"), c, src);
    // The last generated token's K/V is never written: P + O - 1 tokens cached.
    const std::uint64_t tokens = P + O - 1;
    const std::uint64_t blocks = (tokens + bt - 1) / bt;
    EXPECT_EQ(g->count.peak(0, Role::kv), L * blocks * 2 * kvh * hd * bt * 2) << bt;
    if (bt == 1) {
      EXPECT_EQ(g->count.peak(0, Role::kv), 2 * L * kvh * hd * tokens * 2);
    }
    EXPECT_EQ(g->result.infer_iterations, O);  // one prefill + O-1 decodes
    EXPECT_EQ(g->result.requests_completed, 1u);
    // Every block is freed by the end.
    for (std::uint32_t i = 0; i < g->t().tensors.size(); ++i)
      if (g->t().tensors[i].role == Role::kv) {
        EXPECT_FALSE(g->check.alive(i));
      }
  }
}

TEST(Infer, KvOfABatchIsBatchTimesPerRequest) {
  const std::uint32_t B = 5, P = 7, O = 3;
  std::vector<Request> rs;
  for (std::uint32_t i = 0; i < B; ++i) rs.push_back(req(i, 0, P, O));
  ListSource src(rs);
  InferConfig c;
  c.block_tokens = 1;
  auto g = serve(preset("tiny"), c, src);
  EXPECT_EQ(g->count.peak(0, Role::kv), 2 * L * kvh * hd * (P + O - 1) * 2 * B);
  EXPECT_EQ(analytic::kv_bytes(preset("tiny"), P + O - 1, B),
            2 * L * kvh * hd * (P + O - 1) * 2 * B);
}

// Per decode attention op: the set of requests whose KV blocks it reads.
std::vector<std::set<std::string>> decode_batches(const trace::Trace& t) {
  std::map<std::uint32_t, std::set<std::string>> by_op;
  for (const auto& e : t.events) {
    const auto& o = t.ops[e.op];
    const auto& x = t.tensors[e.tensor];
    if (o.cls == trace::OpClass::attn_decode && x.role == Role::kv && o.layer == 0)
      by_op[e.op].insert(x.name.substr(0, x.name.find(".layer_")));
  }
  std::vector<std::set<std::string>> out;
  for (auto& [op, s] : by_op) out.push_back(s);
  return out;
}

TEST(Infer, ContinuousBatchingJoinsAndLeavesAtIterationBoundaries) {
  // Request 1 arrives while request 0 decodes; request 0 finishes first.
  ListSource src({req(0, 0, 8, 30), req(1, 2'000'000, 8, 60)});
  InferConfig c;
  c.block_tokens = 4;
  auto g = serve(preset("tiny"), c, src);
  const auto batches = decode_batches(g->t());
  bool alone_then_joined = false, left = false;
  for (std::size_t i = 1; i < batches.size(); ++i) {
    if (batches[i - 1] == std::set<std::string>{"infer-0.req_0"} && batches[i].size() == 2)
      alone_then_joined = true;
    if (batches[i - 1].size() == 2 && batches[i] == std::set<std::string>{"infer-0.req_1"})
      left = true;
  }
  EXPECT_TRUE(alone_then_joined);
  EXPECT_TRUE(left);
  // Request 0's blocks are freed by the op of the iteration it finishes in,
  // well before the trace ends.
  std::uint32_t last_iter = 0, req0_free_iter = 0;
  for (const auto& e : g->t().events) {
    const auto& o = g->t().ops[e.op];
    last_iter = std::max(last_iter, o.iteration);
    if (e.kind == EventKind::free && g->t().tensors[e.tensor].name.starts_with("infer-0.req_0."))
      req0_free_iter = o.iteration;
  }
  EXPECT_GT(req0_free_iter, 0u);
  EXPECT_LT(req0_free_iter + 20, last_iter);
  EXPECT_EQ(g->result.requests_completed, 2u);
}

TEST(Infer, MaxBatchBoundsTheRunningSetAndPeakBlocks) {
  std::vector<Request> rs;
  for (std::uint32_t i = 0; i < 6; ++i) rs.push_back(req(i, 0, 5, 4 + i));
  ListSource src(rs);
  InferConfig c;
  c.block_tokens = 2;
  c.max_batch = 2;
  auto g = serve(preset("tiny"), c, src);
  for (const auto& b : decode_batches(g->t())) EXPECT_LE(b.size(), 2u);
  EXPECT_EQ(g->result.requests_completed, 6u);
  // Peak KV: at most two requests' worth of the longest (5 + 9 - 1 tokens).
  const std::uint64_t block = 2 * kvh * hd * 2 * 2;
  EXPECT_LE(g->count.peak(0, Role::kv), 2 * L * ((5 + 9 - 1 + 1) / 2) * block);
  EXPECT_GT(g->count.peak(0, Role::kv), 0u);
}

TEST(Infer, PhasesAndAttentionClassesFollowPrefillAndDecode) {
  ListSource src({req(0, 0, 6, 4)});
  auto g = serve(preset("tiny"), InferConfig{}, src);
  std::map<std::uint32_t, std::set<trace::Phase>> phases;
  int prefill_attn = 0, decode_attn = 0;
  for (const auto& o : g->t().ops) {
    if (o.phase == trace::Phase::other) continue;  // init
    phases[o.iteration].insert(o.phase);
    if (o.name.ends_with("attn.core")) {
      if (o.phase == trace::Phase::prefill) {
        EXPECT_EQ(o.cls, trace::OpClass::attn_prefill);
        EXPECT_DOUBLE_EQ(o.flops, 2.0 * 6 * 6 * 64);
        ++prefill_attn;
      } else {
        EXPECT_EQ(o.cls, trace::OpClass::attn_decode);
        ++decode_attn;
      }
    }
  }
  ASSERT_EQ(phases.size(), 4u);
  EXPECT_EQ(phases[0], std::set<trace::Phase>{trace::Phase::prefill});
  for (std::uint32_t i = 1; i < 4; ++i)
    EXPECT_EQ(phases[i], std::set<trace::Phase>{trace::Phase::decode});
  EXPECT_EQ(prefill_attn, 2);  // one per layer
  EXPECT_EQ(decode_attn, 6);
}

TEST(Infer, SameSeedSameTraceOtherSeedOtherTrace) {
  auto run = [](std::uint64_t seed) {
    PoissonConfig p;
    p.seed = seed;
    p.count = 6;
    p.rate_per_s = 500;
    p.prompt = LengthDist::uniform(4, 40);
    p.output = LengthDist::uniform(2, 12);
    PoissonSource src(p);
    InferConfig c;
    c.block_tokens = 8;
    return serve(preset("tiny"), c, src);
  };
  auto a = run(7), b = run(7), c = run(8);
  auto same = [](const trace::Trace& x, const trace::Trace& y) {
    if (x.metadata != y.metadata || x.events.size() != y.events.size() ||
        x.tensors.size() != y.tensors.size() || x.ops.size() != y.ops.size())
      return false;
    for (std::size_t i = 0; i < x.events.size(); ++i) {
      const auto &e = x.events[i], &f = y.events[i];
      if (e.time_ns != f.time_ns || e.op != f.op || e.tensor != f.tensor || e.kind != f.kind)
        return false;
    }
    for (std::size_t i = 0; i < x.tensors.size(); ++i)
      if (x.tensors[i].name != y.tensors[i].name || x.tensors[i].bytes != y.tensors[i].bytes)
        return false;
    return true;
  };
  EXPECT_TRUE(same(a->t(), b->t()));
  EXPECT_FALSE(same(a->t(), c->t()));
  EXPECT_NE(a->t().find_meta("infer.requests").value_or("").find("seed=7"), std::string::npos);
}

TEST(Requests, PoissonGapsAverageOneOverRate) {
  PoissonConfig p;
  p.rate_per_s = 10;
  p.count = 4000;
  p.seed = 11;
  PoissonSource src(p);
  std::uint64_t last = 0;
  int n = 0;
  while (auto r = src.next()) {
    ASSERT_GE(r->arrival_ns, last);
    last = r->arrival_ns;
    ++n;
  }
  ASSERT_EQ(n, 4000);
  // Mean gap 100 ms; the standard error over 4000 gaps is about 1.6%.
  EXPECT_NEAR(static_cast<double>(last) / n, 1e8, 0.06e8);
}

TEST(Requests, BadListsAreInputErrors) {
  EXPECT_THROW(ListSource({req(0, 10, 5, 5), req(1, 5, 5, 5)}), InputError);
  EXPECT_THROW(ListSource({req(0, 0, 0, 5)}), InputError);
  // A custom source that repeats an id is caught by the generator.
  struct Repeat final : RequestSource {
    int n = 0;
    std::optional<Request> next() override {
      if (n++ >= 2) return std::nullopt;
      return Request{1, 0, 4, 2};
    }
    std::string describe() const override { return "repeat"; }
  } repeat;
  CheckingSink sink;
  EXPECT_THROW(generate_infer(preset("tiny"), InferConfig{}, repeat, sink), InputError);
}

}  // namespace
}  // namespace u3m::workload
