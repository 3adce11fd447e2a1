// The serving simulator (issue 6): timing of continuous batching against the
// profile's costs, prefix caching in the baseline, admission control, the
// bounded queue, spill throttling and the DRAM alert, recompute-or-fetch, the
// capacity search, and the CLI end to end.
#include <gtest/gtest.h>
#include <cmath>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>

#include "cli_testing.hpp"
#include "u3m/engine/run_observer.hpp"
#include "u3m/experiments/serve.hpp"
#include "u3m/kv/recompute.hpp"
#include "u3m/mem/link.hpp"
#include "u3m/sim/cost.hpp"
#include "u3m/util/error.hpp"
#include "u3m/util/version.hpp"
#include "u3m/workload/analytic.hpp"
#include "u3m/workload/rag.hpp"

namespace u3m::experiments {
namespace {

using workload::PromptSegment;
using workload::ServeRequest;

ServeRequest req(double t_ms, std::vector<PromptSegment> prompt, std::uint32_t out) {
  ServeRequest r;
  r.timestamp_ms = t_ms;
  r.prompt = std::move(prompt);
  r.output_tokens = out;
  return r;
}

ServeScenario base(const std::string& model, const std::string& policy) {
  ServeScenario s;
  s.shape = workload::preset(model);
  s.hw = sim::load_profile("ascend-910b-32g");
  s.cards = 4;
  s.policy = policy;
  return s;
}

// Shrinks HBM so the KV budget is `slots` block-manager slots.
void kv_slots(ServeScenario& s, double slots) {
  const auto g = kv::KvGeometry::of(s.shape, s.block_tokens, s.layers_per_group);
  const double weights = 2.0 * double(workload::analytic::param_count(s.shape));
  s.hw.device.hbm_capacity.si =
      (weights + (slots + 0.5) * double(g.slot_bytes())) / (s.cards * s.hbm_utilization);
}

std::vector<ServeRequest> rag(std::uint32_t n, double rate, std::uint64_t seed = 1) {
  workload::RagConfig c;
  c.requests = n;
  c.rate_per_s = rate;
  c.corpus = 200;
  c.seed = seed;
  return workload::generate_rag(c);
}

TEST(ServeSim, LoneRequestTtftIsItsPrefillAndTpotItsDecodeSteps) {
  ServeScenario s = base("llama3-8b", "hbm-only");
  const std::uint32_t prompt = 5000, out = 9;  // 5000 > 2048: chunked prefill
  s.requests = {req(100, {{"p", prompt}}, out)};
  const ServeResult r = simulate_serving(s);
  ASSERT_EQ(r.finished, 1u);
  const ServeRequestResult& q = r.per_request[0];
  EXPECT_NEAR(q.first_token_s - q.arrival_s, prefill_seconds(s, prompt), 1e-12);
  double decode = 0;
  for (std::uint32_t i = 1; i < out; ++i) decode += decode_step_seconds(s, prompt + i - 1);
  EXPECT_NEAR(q.finish_s - q.first_token_s, decode, 1e-12);
  EXPECT_NEAR(r.tpot_ms.p50, 1e3 * decode / (out - 1), 1e-9);
  // Sanity of the roofline: prefill is compute bound (~2 * 8e9 FLOPs a token
  // on 4 x 354 TFLOP/s x 0.6), a decode step costs at least reading the weights.
  const double flops = 2.0 * double(workload::analytic::param_count(s.shape)) * prompt;
  EXPECT_GT(prefill_seconds(s, prompt), flops / (4 * 354e12 * 0.6) * 0.9);
  const double weights = 2.0 * double(workload::analytic::param_count(s.shape));
  EXPECT_GT(decode_step_seconds(s, prompt), weights / (4 * 1.6e12));
  EXPECT_TRUE(q.met);
}

TEST(ServeSim, HbmOnlyBaselineDoesPrefixCaching) {
  ServeScenario s = base("llama3-8b", "hbm-only");
  const std::vector<PromptSegment> p = {{"system", 1024}, {"doc", 2048}, {"q", 40}};
  s.requests = {req(0, p, 4), req(10'000, p, 4)};  // the second arrives after the first is done
  const ServeResult r = simulate_serving(s);
  ASSERT_EQ(r.finished, 2u);
  EXPECT_EQ(r.per_request[0].hit_tokens, 0u);
  EXPECT_EQ(r.per_request[1].hit_tokens, 3072u);  // every full 128-token block of 3112 tokens
  auto ttft = [&](int i) { return r.per_request[i].first_token_s - r.per_request[i].arrival_s; };
  EXPECT_LT(ttft(1), 0.2 * ttft(0));
  EXPECT_GT(r.kv_hit_rate, 0.45);
}

TEST(ServeSim, AdmissionControlQueuesAndEveryRequestFinishes) {
  ServeScenario s = base("tiny", "hbm-only");
  kv_slots(s, 40);  // room for ~4 of these requests (9 blocks each) at a time
  for (int i = 0; i < 30; ++i) s.requests.push_back(req(0, {{"r" + std::to_string(i), 1000}}, 100));
  const ServeResult r = simulate_serving(s);
  EXPECT_EQ(r.finished, 30u);
  EXPECT_EQ(r.too_large, 0u);
  EXPECT_LE(r.max_concurrency, 4u);
  EXPECT_GE(r.max_concurrency, 2u);
  EXPECT_GT(r.kv.queued + r.retried_submits, 0u);
  EXPECT_LE(r.peak_bytes[0], r.capacity_bytes[0]);
}

TEST(ServeSim, BoundedQueueNeverLosesARequest) {
  ServeScenario s = base("tiny", "hbm-only");
  kv_slots(s, 20);
  // A burst far past the queue's limit, and one request that can never fit.
  for (int i = 0; i < 60; ++i)
    s.requests.push_back(req(i * 0.01, {{"r" + std::to_string(i), 900}}, 50));
  s.requests.push_back(req(1, {{"huge", 100'000}}, 10));
  const ServeResult r = simulate_serving(s);
  EXPECT_GT(r.retried_submits, 0u);  // the queue refused some; they were submitted again
  EXPECT_EQ(r.too_large, 1u);
  EXPECT_TRUE(r.per_request.back().too_large);
  EXPECT_EQ(r.finished, 60u);
  for (std::size_t i = 0; i + 1 < r.per_request.size(); ++i)
    EXPECT_GE(r.per_request[i].finish_s, r.per_request[i].first_token_s) << i;
}

// Issue 18 item 7: goodput is requests that met both SLOs per second of makespan. Three
// requests arriving within 6 ms are not 500 requests a second.
// Note [Serving bound], by hand: two requests sharing a segment, 4 cards.
TEST(ServeSim, ServingBoundIsTheLeastBusyTimeNoReuseRemoves) {
  ServeScenario s = base("llama3-8b", "hbm-only");
  s.requests = {req(0, {{"a", 1000}}, 3), req(0, {{"a", 1000}, {"b", 200}}, 1)};
  const ServeBound b = serving_bound(s);
  const workload::ModelShape& m = s.shape;
  const double kv = double(workload::analytic::kv_bytes_per_token(m));
  EXPECT_DOUBLE_EQ(b.kv_read_bytes, (1001.0 + 1002.0) * kv);  // the first's two decode steps
  const double w = 2.0 * double(workload::analytic::param_count(m));
  EXPECT_DOUBLE_EQ(b.weight_read_bytes, w);  // both steps fit one iteration
  EXPECT_EQ(b.unique_tokens, 1200u);         // `a` once, `b` once
  const double n = 4;
  EXPECT_NEAR(b.memory_s, (b.kv_read_bytes + w) / (n * s.hw.device.hbm_bandwidth.si), 1e-15);
  const double lin = 2.0 * double(workload::analytic::layer_param_count(m)) * m.layers;
  const double rate = s.hw.device.peak_flops.si * s.hw.device.matmul_efficiency.si;
  EXPECT_NEAR(b.compute_s, (1200.0 + 2.0) * lin / (n * rate), 1e-15);
  const double fixed = (8.0 * m.layers - 1) * s.hw.device.launch_overhead.si +
                       2.0 * m.layers * sim::all_reduce_s(s.hw, 0, 4);
  EXPECT_NEAR(b.fixed_s, fixed, 1e-15);
  EXPECT_NEAR(b.busy_s, std::max(b.memory_s, b.compute_s) + fixed, 1e-15);
  EXPECT_DOUBLE_EQ(b.goodput_rps, 2 / b.busy_s);
  // No simulated policy beats it.
  for (const char* pol : {"hbm-only", "u3m", "u3m-blend"}) {
    s.policy = pol;
    EXPECT_LT(simulate_serving(s).goodput_rps, b.goodput_rps) << pol;
  }
}

TEST(ServeSim, GoodputIsMetRequestsPerSecondOfMakespan) {
  ServeScenario s = base("llama3-8b", "hbm-only");
  s.requests = {req(0, {{"a", 1024}}, 16), req(3, {{"b", 1024}}, 16), req(6, {{"c", 1024}}, 16)};
  const ServeResult r = simulate_serving(s);
  ASSERT_EQ(r.met, 3u);
  EXPECT_NEAR(r.span_s, 0.006, 1e-12);
  EXPECT_GT(r.makespan_s, 10 * r.span_s);
  EXPECT_DOUBLE_EQ(r.goodput_rps, 3.0 / r.makespan_s);
  EXPECT_LT(r.goodput_rps, 100.0);
}

// Note [Blend cost]: a passage cached after one context and reused after another costs its
// recomputed tokens' prefill (kv::blend_recompute_tokens), the copy of its KV and the
// re-rotation of its keys, and nothing else: the iteration's FLOPs and bytes, hand-computed.
TEST(ServeSim, BlendChargesRecomputedTokensCopiesAndReRotationExactly) {
  struct Ops : engine::RunObserver {
    std::vector<std::pair<std::string, engine::OpWork>> ops;
    void op(int, std::int64_t, std::size_t, std::string_view name, engine::OpWork w, double,
            double) override {
      ops.emplace_back(std::string(name), w);
    }
  } obs;
  ServeScenario s = base("llama3-8b", "u3m-blend");
  s.observer = &obs;
  s.requests = {req(0, {{"sys", 128}, {"p1", 256}, {"p2", 256}, {"q1", 64}}, 2),
                req(10'000, {{"sys", 128}, {"p2", 256}, {"p1", 256}, {"q2", 64}}, 2)};
  const ServeResult r = simulate_serving(s);
  ASSERT_EQ(r.finished, 2u);
  const ServeRequestResult& q = r.per_request[1];
  EXPECT_EQ(q.hit_tokens, 128u);    // sys, exactly
  EXPECT_EQ(q.blend_tokens, 512u);  // p2 and p1 at new positions: sixteen 32-token blocks
  const std::uint32_t per_block = kv::blend_recompute_tokens(32, 0.15, 32);
  EXPECT_EQ(per_block, 5u + 1u);  // ceil(0.15 x 32) recomputed + 32 / 32 for the selection
  EXPECT_EQ(q.recomputed_tokens, 16u * per_block);
  // Request 1's prefill is one iteration (ops: r0's prefill, r0's decode, r1's prefill, ...).
  ASSERT_GE(obs.ops.size(), 3u);
  EXPECT_EQ(obs.ops[2].first, "prefill");
  const workload::ModelShape& m = s.shape;
  const double lin = 2.0 * double(workload::analytic::layer_param_count(m)) * m.layers;
  const double attn = 4.0 * m.heads * m.head_dim() * m.layers;
  const double kv_tok = double(workload::analytic::kv_bytes_per_token(m));
  double flops = 2.0 * double(m.vocab) * m.d_model, bytes = 0;  // one lm_head: one sequence
  // u3m-blend's 32-token blocks: sys [0,128) hits; p2 [128,384) and p1 [384,640) are
  // blended block by block; q2 [640,704) is computed.
  for (double b = 128; b <= 640; b += 32) {
    const double t = b == 640 ? 64 : per_block;
    flops += t * lin + t * (2 * b + t - 1) / 2 * attn;
    bytes += kv_tok * (b + t);
  }
  bytes += 2 * 512 * kv_tok;  // the copies, HBM to HBM: read and write
  bytes += 512 * kv_tok;      // re-rotation: K read and written
  bytes += 2.0 * double(workload::analytic::param_count(m));  // the weights, once
  EXPECT_NEAR(obs.ops[2].second.flops, flops / 4, flops * 1e-12);
  EXPECT_NEAR(obs.ops[2].second.bytes, bytes / 4, bytes * 1e-12);
}

TEST(ServeSim, DramPressureAlertsAndSpillIsThrottled) {
  ServeScenario s = base("tiny", "u3m-dram");
  kv_slots(s, 30);
  s.ssd_admit_after = 0;   // every prompt here is seen once: the SSD filter would drop them all
  s.ssd_rated_dwpd = 1e6;  // and a budget at the drives' rating would drop most
  s.spill_rate = 2e6;  // 2 MB/s: 61 slots of 32 KiB a second at most
  const auto g = kv::KvGeometry::of(s.shape, s.block_tokens, s.layers_per_group);
  // DRAM for 60 slots: distinct prompts fill it with cached blocks.
  s.hw.host.dram_capacity.si = 60.5 * double(g.slot_bytes()) / (s.cards * s.dram_kv_fraction);
  for (int i = 0; i < 400; ++i)
    s.requests.push_back(req(i * 20.0, {{"d" + std::to_string(i), 512}}, 8));
  const ServeResult r = simulate_serving(s);
  EXPECT_EQ(r.finished, 400u);
  EXPECT_GE(r.alerts, 1u);
  EXPECT_GE(r.first_alert_s, 0.0);
  EXPECT_GT(r.spilled_bytes, 0u);
  EXPECT_LE(double(r.spilled_bytes), s.spill_rate * r.makespan_s + double(g.slot_bytes()));
  EXPECT_GE(r.links[2].bytes, r.spilled_bytes);  // spills cross the h2s link
}

// Note [SSD wear]: the h2s bytes are the drives' writes, spread over the
// group's drives and held at the run's pace for a day; the rating comes from
// the profile unless the scenario gives one.
TEST(ServeSim, SsdWearIsTheRunsWritesPerDriveDay) {
  ServeScenario s = base("tiny", "u3m-dram");
  kv_slots(s, 30);
  s.ssd_admit_after = 0;  // as above: write every victim
  s.ssd_rated_dwpd = 1e6;
  s.spill_rate = 2e6;
  const auto g = kv::KvGeometry::of(s.shape, s.block_tokens, s.layers_per_group);
  s.hw.host.dram_capacity.si = 60.5 * double(g.slot_bytes()) / (s.cards * s.dram_kv_fraction);
  for (int i = 0; i < 200; ++i)
    s.requests.push_back(req(i * 20.0, {{"d" + std::to_string(i), 512}}, 8));
  s.ssd_bytes_per_card = 1e9;
  ServeResult r = simulate_serving(s);
  ASSERT_GT(r.links[2].bytes, 0u);
  EXPECT_EQ(r.ssd_wear.bytes_written, r.links[2].bytes);
  EXPECT_DOUBLE_EQ(r.ssd_wear.drive_writes_per_day,
                   double(r.links[2].bytes) / (4 * 1e9) * 86400.0 / r.makespan_s);
  EXPECT_EQ(r.ssd_wear.rated_dwpd, 1e6);
  const double unbudgeted = r.ssd_wear.drive_writes_per_day;
  // Note [SSD admission]: at a rating below that pace, the write budget holds the run to it
  // (plus the 10 s of credit the budget may hold unspent).
  s.ssd_rated_dwpd = unbudgeted / 4;
  const ServeResult held = simulate_serving(s);
  ASSERT_GT(held.ssd_wear.bytes_written, 0u);
  const double cap_dwpd = 10 * (s.ssd_rated_dwpd * 4e9 / 86400) / (4e9) * 86400 / held.makespan_s;
  EXPECT_LE(held.ssd_wear.drive_writes_per_day, s.ssd_rated_dwpd + cap_dwpd);
  EXPECT_LT(held.ssd_wear.bytes_written, r.ssd_wear.bytes_written);
  EXPECT_GT(held.kv.ssd_declined_slots, 0u);
  EXPECT_EQ(held.finished, 200u);
  s.ssd_rated_dwpd = 0;
  EXPECT_NEAR(s.rated_dwpd(), s.hw.ssd.rated_dwpd(), 1e-12);  // the profile's, by default
  s.ssd_rated_dwpd = 3;
  account_ssd_wear(s, r);
  EXPECT_EQ(r.ssd_wear.rated_dwpd, 3.0);
  // Without its own size the scenario takes the profile's drives per card.
  s.ssd_bytes_per_card = 0;
  EXPECT_DOUBLE_EQ(s.ssd_bytes(), s.hw.ssd.capacity.si * s.hw.ssd.drives_per_node.si /
                                      s.hw.node.cards_per_node.si);
  s.ssd_rated_dwpd = -1;
  EXPECT_THROW(s.validate(), InputError);
}

TEST(ServeSim, SsdHitsAreFetchedOrRecomputedByCost) {
  // Hits on SSD: HBM holds one prompt, so the first prompt is demoted to SSD
  // by the second and found there by the third.
  auto run = [](double ssd_read_bw) {
    ServeScenario s = base("llama3-8b", "u3m");  // no DRAM tier: victims go to SSD
    kv_slots(s, 8 * 30);                         // 30 token blocks
    s.ssd_admit_after = 0;   // `a` is seen once before it leaves HBM: write it anyway
    s.ssd_rated_dwpd = 1e6;  // and give the write budget room for it
    s.hw.ssd.read_bandwidth.si = ssd_read_bw;
    const std::vector<PromptSegment> a = {{"a", 2048}, {"qa", 16}}, b = {{"b", 2048}, {"qb", 16}};
    s.requests = {req(0, a, 2), req(5'000, b, 2), req(10'000, a, 2)};
    return simulate_serving(s);
  };
  const ServeResult fast = run(50e9), slow = run(0.05e9);
  for (const ServeResult* r : {&fast, &slow}) {
    ASSERT_EQ(r->finished, 3u);
    EXPECT_GT(r->kv.hit_blocks_by_tier[2], 0u);  // the hit was on SSD
  }
  EXPECT_EQ(fast.per_request[2].recomputed_tokens, 0u);
  EXPECT_GT(fast.links[3].bytes, 0u);
  EXPECT_EQ(slow.per_request[2].recomputed_tokens, 3u * 128);  // cheaper than a 50 MB/s read
  EXPECT_EQ(slow.links[3].bytes, 0u);
  // Either way the third request beats a cold prefill of its prompt.
  const double cold = fast.per_request[0].first_token_s - fast.per_request[0].arrival_s;
  EXPECT_LT(fast.per_request[2].first_token_s - fast.per_request[2].arrival_s, cold);
}

// Note [Promoting DRAM hits]: under `u3m-tiered` the first prompt is demoted to DRAM
// by the second and promoted back into HBM by the third, which then decodes
// from HBM: the host link carries the promotion once, not a stream per step.
TEST(ServeSim, DramHitIsPromotedOnceInsteadOfStreamedEachStep) {
  ServeScenario s = base("llama3-8b", "u3m-tiered");
  kv_slots(s, 8 * 30);  // 30 token blocks
  const std::vector<PromptSegment> a = {{"a", 2048}, {"qa", 16}}, b = {{"b", 2048}, {"qb", 16}};
  s.requests = {req(0, a, 2), req(5'000, b, 2), req(10'000, a, 64)};
  const ServeResult r = simulate_serving(s);
  ASSERT_EQ(r.finished, 3u);
  // The second request pushed the first's last 3 cached blocks (deepest first) to DRAM.
  EXPECT_EQ(r.kv.hit_blocks, 16u);
  EXPECT_EQ(r.kv.hit_blocks_by_tier[1], 3u);
  EXPECT_EQ(r.kv.promoted_host_slots, 3u * 8);  // 8 layer groups each
  const auto g = kv::KvGeometry::of(s.shape, s.block_tokens, s.layers_per_group);
  EXPECT_EQ(r.links[1].bytes, 3u * 8 * g.slot_bytes());  // h2d: the promotion alone
  EXPECT_LT(r.kv_wait_s, 1e-9);                          // nothing streamed (0 up to rounding)
  EXPECT_EQ(r.per_request[2].recomputed_tokens, 0u);     // 100 GB/s beats recomputing
  const double cold = r.per_request[0].first_token_s - r.per_request[0].arrival_s;
  EXPECT_LT(r.per_request[2].first_token_s - r.per_request[2].arrival_s, cold);
}

TEST(ServeCapacity, HighestRateMeetingTheSlosIsBracketed) {
  ServeScenario s = base("tiny", "hbm-only");
  kv_slots(s, 200);
  s.requests = rag(150, 50.0);
  s.slo = {30, 5};
  const auto rows = serving_capacity(s, {"hbm-only"});
  ASSERT_EQ(rows.size(), 1u);
  const ServeCapacityRow& r = rows[0];
  ASSERT_GT(r.rate_scale, 0.0);
  EXPECT_GE(r.at.met_fraction, 0.9);
  EXPECT_FALSE(r.at.stopped_early);
  // Every probe at or below the answer met, and the bracket is tight: a probe
  // that failed lies within the bisection's last step (2^(1/32)) above it.
  double lowest_failed = 1e300;
  for (const auto& [scale, met] : r.tried) {
    if (scale <= r.rate_scale) {
      EXPECT_GE(met, 0.9) << scale;
    }
    if (met < 0.9) lowest_failed = std::min(lowest_failed, scale);
  }
  EXPECT_LE(lowest_failed, r.rate_scale * std::pow(2.0, 1.0 / 32) * 1.000001);
  // A tighter TTFT SLO cannot raise capacity.
  ServeScenario tight = s;
  tight.slo.ttft_ms = 10;
  EXPECT_LE(serving_capacity(tight, {"hbm-only"})[0].rate_scale, r.rate_scale);
}

// Two instances, round-robin: requests 0 and 2 go to instance 0, 1 and 3 to instance 1. All
// four share a 4096-token prefix (32 blocks); arrivals 5 s apart, so each runs alone.
ServeScenario two_instances(bool shared, bool same_prefix) {
  ServeScenario s = base("llama3-8b", "u3m");
  s.instances = 2;
  s.shared_pool = shared;
  for (int i = 0; i < 4; ++i)
    s.requests.push_back(req(5000.0 * i,
                             {{same_prefix ? "sys" : "sys" + std::to_string(i), 4096},
                              {"q" + std::to_string(i), 100}},
                             4));
  return s;
}

TEST(ServePool, PooledBeatsSeparateWhenAPrefixSpansInstances) {
  const ServeResult sep = simulate_serving(two_instances(false, true));
  const ServeResult pool = simulate_serving(two_instances(true, true));
  ASSERT_EQ(sep.finished, 4u);
  ASSERT_EQ(pool.finished, 4u);
  // Separate: request 1 is instance 1's first, a miss; 2 and 3 hit their own instance.
  EXPECT_EQ(sep.per_request[1].hit_tokens, 0u);
  EXPECT_EQ(sep.per_request[3].hit_tokens, 4096u);
  EXPECT_EQ(sep.pool_hit_tokens, 0u);
  EXPECT_EQ(sep.net_rx.bytes + sep.net_tx.bytes, 0u);
  // Pooled: request 1 reads instance 0's prefix from the pool; 2 and 3 still hit locally.
  EXPECT_EQ(pool.per_request[1].hit_tokens, 4096u);
  EXPECT_EQ(pool.pool_hit_tokens, 4096u);
  EXPECT_EQ(pool.pool_hit_blocks, 32u);
  EXPECT_GT(pool.kv_hit_rate, sep.kv_hit_rate);
  EXPECT_NEAR(pool.kv_hit_rate - sep.kv_hit_rate, 4096.0 / (4 * 4196), 1e-12);
  EXPECT_LT(pool.per_request[1].first_token_s, sep.per_request[1].first_token_s);

  // The fetch costs exactly the link model's bytes / bandwidth + latency on the instance's
  // NICs: request 1 computes the same 100 tokens as request 3 (a local HBM hit) and waits for
  // the fetch first.
  const ServeScenario s = two_instances(true, true);
  const double bw = s.hw.network.bandwidth_practical.si * s.hw.nics_per_node.si /
                    s.hw.node.cards_per_node.si * s.cards;
  const std::uint64_t bytes = 32ull * 128 * workload::analytic::kv_bytes_per_token(s.shape);
  EXPECT_EQ(pool.net_rx.bytes, bytes);
  EXPECT_EQ(pool.net_rx.transfers, 1u);
  const double fetch_s =
      double(mem::seconds_to_ns(double(bytes) / bw) + mem::seconds_to_ns(s.hw.network.latency.si)) /
      1e9;
  const auto ttft = [&](int i) {
    return pool.per_request[i].first_token_s - pool.per_request[i].arrival_s;
  };
  EXPECT_NEAR(ttft(1) - ttft(3), fetch_s, 1e-9);
  EXPECT_GT(fetch_s, s.hw.network.latency.si);  // the bytes count, not only the latency
  // Every prompt block went to the pool once (the shared prefix once, each question's
  // partial block never: only full blocks are shareable).
  EXPECT_EQ(pool.pool_put_blocks, 32u);
  EXPECT_EQ(pool.net_tx.bytes, bytes);
}

TEST(ServePool, PooledEqualsSeparateWithoutSharing) {
  const ServeResult sep = simulate_serving(two_instances(false, false));
  const ServeResult pool = simulate_serving(two_instances(true, false));
  EXPECT_EQ(pool.pool_hit_tokens, 0u);
  EXPECT_EQ(pool.kv_hit_rate, sep.kv_hit_rate);
  EXPECT_EQ(pool.goodput_rps, sep.goodput_rps);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(pool.per_request[i].first_token_s, sep.per_request[i].first_token_s) << i;
    EXPECT_EQ(pool.per_request[i].finish_s, sep.per_request[i].finish_s) << i;
  }
  EXPECT_EQ(pool.pool_put_blocks, 4u * 32);  // written, never read
  EXPECT_EQ(pool.net_rx.bytes, 0u);
}

TEST(ServePool, InstancesSplitTheLoadAndAreBounded) {
  // Three separate instances serve every request of the RAG trace (its sessions pinned to
  // one instance each) and none waits longer than on one instance; more than 8 is refused.
  ServeScenario s = base("llama3-8b", "u3m");
  s.requests = rag(30, 20);
  const ServeResult a = simulate_serving(s);
  s.instances = 3;
  const ServeResult b = simulate_serving(s);
  EXPECT_EQ(a.finished, 30u);
  EXPECT_EQ(b.finished, 30u);
  EXPECT_EQ(b.instances, 3u);
  // Three instances share the load: nothing waits longer than on one.
  EXPECT_LE(b.ttft_ms.p99, a.ttft_ms.p99 + 1e-9);
  s.instances = 9;
  EXPECT_THROW(simulate_serving(s), InputError);
}

TEST(ServeSim, BadScenarioNamesTheField) {
  ServeScenario s = base("tiny", "fifo");
  s.requests = rag(3, 1);
  try {
    simulate_serving(s);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-policy"), std::string::npos);
  }
  s.policy = "u3m";
  s.rate_scale = 0;
  EXPECT_THROW(simulate_serving(s), InputError);
}

TEST(ServeCli, SimAndCapacityJsonAndErrors) {
  auto r = u3m::testing::run_cli(
      "serve sim --requests rag:requests=40,rate=5,corpus=100 --model llama3-8b "
      "--kv-policy hbm-only --json",
      false);
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["scenario"]["hw"], "ascend-910b-32g");
  EXPECT_EQ(j["scenario"]["cards"], 4);
  EXPECT_TRUE(j["scenario"].contains("version"));
  EXPECT_TRUE(j["profile"]["device"]["hbm_capacity"].contains("source"));
  const auto& p = j["policies"]["hbm-only"];
  for (const char* k : {"goodput_rps", "kv_hit_rate", "max_concurrency", "bytes_by_tier"})
    EXPECT_TRUE(p.contains(k)) << k;
  for (const char* k : {"p50", "p90", "p99"}) {
    EXPECT_TRUE(p["ttft_ms"].contains(k));
    EXPECT_TRUE(p["tpot_ms"].contains(k));
  }
  EXPECT_EQ(p["finished"], 40);
  // One schema (issue 15 item 7): tiers are device, host, ssd, as in train sim's JSON.
  for (const char* t : {"device", "host", "ssd"}) {
    EXPECT_TRUE(p["bytes_by_tier"].contains(t)) << t;
    EXPECT_TRUE(p["hits_by_tier_blocks"].contains(t)) << t;
  }
  for (const char* old : {"hbm", "dram"}) {
    EXPECT_FALSE(p["bytes_by_tier"].contains(old)) << old;
    EXPECT_FALSE(p["hits_by_tier_blocks"].contains(old)) << old;
  }
  EXPECT_TRUE(p["promoted_slots"].contains("from_host"));
  EXPECT_EQ(p["label"], j["label"]);
  EXPECT_NE(j["label"].get<std::string>().find("simulated (profile ascend-910b-32g"),
            std::string::npos);
  EXPECT_EQ(j["scenario"]["version"], u3m::kVersion);

  const std::string sample =
      std::string(U3M_SOURCE_DIR) + "/data/requests/samples/mooncake_conversation_head20.jsonl";
  auto c = u3m::testing::run_cli(
      "serve capacity --requests " + sample + " --model llama3-8b --json", false);
  ASSERT_EQ(c.status, 0) << c.output;
  auto k = nlohmann::json::parse(c.output);
  for (const char* pol : {"hbm-only", "u3m"}) {
    ASSERT_TRUE(k["policies"].contains(pol)) << pol;
    EXPECT_TRUE(k["policies"][pol].contains("goodput_rps"));
    // Some rate meets the SLOs (the sample's last timestamp group used to be
    // a burst no rate scale removed, so every policy reported none).
    EXPECT_GT(k["policies"][pol]["rate_scale"].get<double>(), 0.0) << pol;
    EXPECT_GT(k["policies"][pol]["goodput_rps"].get<double>(), 0.0) << pol;
  }
  EXPECT_TRUE(k["scenario"]["slo"].contains("ttft_ms"));
  EXPECT_TRUE(k["scenario"]["slo"].contains("ttft_prefill_factor"));

  auto text = u3m::testing::run_cli("serve sim --requests rag:requests=10 --model llama3-8b");
  ASSERT_EQ(text.status, 0) << text.output;
  EXPECT_NE(text.output.find("simulated (profile ascend-910b-32g, model llama3-8b, cards 4)"),
            std::string::npos)
      << text.output;

  auto missing = u3m::testing::run_cli("serve sim --requests /nonexistent/x.jsonl");
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.output.find("/nonexistent/x.jsonl"), std::string::npos) << missing.output;
  auto pol = u3m::testing::run_cli("serve sim --requests rag:requests=5 --kv-policy fifo");
  EXPECT_EQ(pol.status, 2);
  EXPECT_NE(pol.output.find("fifo"), std::string::npos);
  auto key = u3m::testing::run_cli("serve sim --requests rag:colour=blue");
  EXPECT_EQ(key.status, 2);
  EXPECT_NE(key.output.find("colour"), std::string::npos);
  auto flag = u3m::testing::run_cli("serve sim --requests rag --no-such-flag");
  EXPECT_NE(flag.status, 0);
  EXPECT_NE(flag.output.find("no-such-flag"), std::string::npos);
}

}  // namespace
}  // namespace u3m::experiments
