// Shapes, presets and the closed-form figures. Expected values are computed
// here from the shape, independently of src/workload/analytic.cpp.
#include <gtest/gtest.h>

#include "u3m/util/error.hpp"
#include "u3m/workload/analytic.hpp"
#include "u3m/workload/config.hpp"
#include "u3m/workload/requests.hpp"

namespace u3m::workload {
namespace {

// Independent reference: LLaMA parameters tensor by tensor.
std::uint64_t reference_params(std::uint64_t L, std::uint64_t d, std::uint64_t h, std::uint64_t kvh,
                               std::uint64_t f, std::uint64_t V) {
  const std::uint64_t hd = d / h;
  const std::uint64_t attn = d * d /*q*/ + d * kvh * hd /*k*/ + d * kvh * hd /*v*/ + d * d /*o*/;
  const std::uint64_t mlp = d * f * 3;
  const std::uint64_t norms = 2 * d;
  return V * d /*embed*/ + L * (attn + mlp + norms) + d /*final norm*/ + V * d /*lm_head*/;
}

TEST(Presets, Llama2_13bHas13BillionParametersAnd800KiBOfKvPerToken) {
  const ModelShape& s = preset("llama2-13b");
  const std::uint64_t expected = reference_params(40, 5120, 40, 40, 13824, 32000);
  EXPECT_EQ(analytic::param_count(s), expected);
  EXPECT_NEAR(static_cast<double>(analytic::param_count(s)), 13.0e9, 0.01 * 13.0e9);
  // 2 (K,V) * 40 layers * 40 kv heads * 128 head dim * 2 bytes
  EXPECT_EQ(analytic::kv_bytes_per_token(s), 819200u);
  EXPECT_EQ(s.head_dim(), 128u);
}

TEST(Presets, Llama3_8bIsGqaWithEightBillionParameters) {
  const ModelShape& s = preset("llama3-8b");
  EXPECT_EQ(analytic::param_count(s), reference_params(32, 4096, 32, 8, 14336, 128256));
  EXPECT_NEAR(static_cast<double>(analytic::param_count(s)), 8.03e9, 0.01e9);
  EXPECT_EQ(s.kv_dim(), 8u * 128u);
  EXPECT_EQ(analytic::kv_bytes_per_token(s), 2ull * 32 * 8 * 128 * 2);
}

TEST(Presets, ParamSpecsSumToTheParameterCount) {
  for (const ModelShape& s : presets()) {
    std::uint64_t sum = 0;
    for (const ParamSpec& p : param_specs(s, TrainConfig{})) sum += p.numel;
    EXPECT_EQ(sum, reference_params(s.layers, s.d_model, s.heads, s.kv_heads, s.ffn, s.vocab))
        << s.name;
  }
}

TEST(Presets, TiedEmbeddingsDropTheLmHead) {
  ModelShape s = preset("tiny");
  s.tied_embeddings = true;
  EXPECT_EQ(analytic::param_count(s), reference_params(2, 64, 4, 2, 172, 256) - 256 * 64);
}

TEST(Presets, UnknownNameListsTheKnownOnes) {
  try {
    preset("llama3-13b");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("llama2-13b"), std::string::npos) << e.what();
  }
}

TEST(ShapeValidation, NamesTheBrokenField) {
  auto expect_error = [](ModelShape s, const std::string& needle) {
    try {
      s.validate("--test");
      ADD_FAILURE() << "no error for " << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  ModelShape s = preset("tiny");
  EXPECT_NO_THROW(s.validate());
  ModelShape bad = s;
  bad.heads = 5;  // 64 % 5 != 0
  expect_error(bad, "heads (5) must divide d_model (64)");
  bad = s;
  bad.kv_heads = 3;  // 4 % 3 != 0
  expect_error(bad, "kv_heads (3) must divide heads (4)");
  bad = s;
  bad.layers = 0;
  expect_error(bad, "layers must be a positive");
  bad = s;
  bad.vocab = 0;
  expect_error(bad, "vocab");
}

TEST(Lora, TrainableParamsAreRankTimesInPlusOutOverAdaptedProjections) {
  const ModelShape& s = preset("llama3-8b");
  const std::uint64_t r = 16, d = 4096, kv = 1024, f = 14336, L = 32;
  EXPECT_EQ(analytic::lora_param_count(s, 16, {Proj::q, Proj::v}),
            L * (r * (d + d) + r * (d + kv)));
  EXPECT_EQ(analytic::lora_param_count(s, 16, {Proj::down}), L * r * (f + d));

  TrainConfig c;
  c.lora_rank = 16;
  c.lora_targets = {Proj::q, Proj::v};
  const analytic::TrainBytes b = analytic::train_bytes(s, c);
  const std::uint64_t lora = L * (r * 2 * d + r * (d + kv));
  EXPECT_EQ(b.trainable_params, lora);
  EXPECT_EQ(b.params, reference_params(32, 4096, 32, 8, 14336, 128256) + lora);
  EXPECT_EQ(b.grad_bytes, 2 * lora);
  EXPECT_EQ(b.optimizer_bytes, 12 * lora);
}

TEST(Zero3, ShardsAreCeilOfNumelOverRanks) {
  EXPECT_EQ(analytic::shard_numel(10, 3), 4u);
  EXPECT_EQ(analytic::shard_numel(9, 3), 3u);
  EXPECT_EQ(analytic::shard_numel(10, 1), 10u);
  const ModelShape& s = preset("tiny");
  TrainConfig c;
  c.zero3_ranks = 3;
  const analytic::TrainBytes b = analytic::train_bytes(s, c);
  // tiny: d=64, kv=32, f=172, V=256, L=2; every tensor sharded separately.
  auto sh = [](std::uint64_t n) { return (n + 2) / 3; };
  const std::uint64_t layer = 2 * sh(64) + 2 * sh(64 * 64) + 2 * sh(64 * 32) + 3 * sh(64 * 172);
  const std::uint64_t shards = 2 * sh(256 * 64) + 2 * layer + sh(64);
  EXPECT_EQ(b.param_bytes, 2 * shards);
  EXPECT_EQ(b.grad_bytes, 2 * shards);
  EXPECT_EQ(b.optimizer_bytes, 12 * shards);
}

TEST(Kv, BytesScaleWithTokensAndBatch) {
  const ModelShape& s = preset("llama2-13b");
  // The reference scenario: 120 requests x 2048 tokens.
  EXPECT_EQ(analytic::kv_bytes(s, 2048, 120), 2ull * 40 * 40 * 128 * 2 * 2048 * 120);
}

TEST(Activations, FullTrainingPerLayerFormula) {
  const ModelShape& s = preset("tiny");
  TrainConfig c;
  c.micro_batch_size = 2;
  c.seq_len = 16;
  const std::uint64_t T = 32, d = 64, kv = 32, f = 172, h = 4, L = 2;
  // saved per layer: attn_norm.out, rope.q, rope.k, v, core.out, attn_residual.out,
  // ffn_norm.out, gate, up, swiglu, layer out (2 B each) + fp32 lse; plus embed.out
  const std::uint64_t per_layer = 2 * T * (d + d + kv + kv + d + d + d + 3 * f + d) + 4 * T * h;
  EXPECT_EQ(analytic::saved_activation_bytes(s, c), L * per_layer + 2 * T * d);
  c.recompute = true;
  EXPECT_EQ(analytic::saved_activation_bytes(s, c), 2 * T * d * (L + 1));
}

TEST(LengthDist, ParsesAndRejects) {
  EXPECT_EQ(LengthDist::parse("fixed:7", "--x").describe(), "fixed:7");
  EXPECT_EQ(LengthDist::parse("uniform:3:9", "--x").describe(), "uniform:3:9");
  EXPECT_EQ(LengthDist::parse("lognormal:512:0.5:4096", "--x").upper_bound(), 4096u);
  for (const char* bad : {"", "fixed", "fixed:0", "uniform:9:3", "normal:1:2", "fixed:x",
                          "lognormal:0:1:5", "fixed:1.5"}) {
    EXPECT_THROW(LengthDist::parse(bad, "--prompt-len"), InputError) << bad;
  }
  Rng rng(3);
  const LengthDist u = LengthDist::uniform(3, 9);
  for (int i = 0; i < 1000; ++i) {
    const std::uint32_t v = rng.sample(u);
    ASSERT_GE(v, 3u);
    ASSERT_LE(v, 9u);
  }
}

TEST(Projections, ParseShortAndLongNames) {
  EXPECT_EQ(parse_proj_list("q,v", "--lora-targets"), (std::vector<Proj>{Proj::q, Proj::v}));
  EXPECT_EQ(parse_proj_list("gate_proj,down", "--lora-targets"),
            (std::vector<Proj>{Proj::gate, Proj::down}));
  EXPECT_EQ(parse_proj_list("all", "--lora-targets").size(), 7u);
  EXPECT_THROW(parse_proj_list("q,x", "--lora-targets"), InputError);
}

TEST(TimeModel, RooflinePlusOverhead) {
  TimeModel tm;
  tm.peak_flops = 100e12;
  tm.hbm_bytes_per_s = 1e12;
  tm.op_overhead_ns = 1000;
  EXPECT_EQ(tm.op_ns(1e12, 1000, false), 10'000'000u + 1000u);       // compute bound: 10 ms
  EXPECT_EQ(tm.op_ns(1, 1'000'000'000, false), 1'000'000u + 1000u);  // memory bound: 1 ms
  EXPECT_EQ(tm.op_ns(0, 56'000'000, true), 1'000'000u + 1000u);      // 56 MB over 56 GB/s
  EXPECT_EQ(tm.describe().rfind("nominal roofline", 0), 0u);
}

}  // namespace
}  // namespace u3m::workload
