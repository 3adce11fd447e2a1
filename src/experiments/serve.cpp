// The serving experiments' scenario (issue 6): the named policies, the SLOs, the
// scenario's checks and its arrival times. The simulator itself is serve::ServingSim
// (serving_sim.cpp). docs/serving.md.
#include "u3m/experiments/serve.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "u3m/util/error.hpp"
#include "u3m/workload/analytic.hpp"

namespace u3m::experiments {

// Note [Serving policies]
// All policies share the same HBM: cards * hbm_capacity * hbm_utilization
// minus the 16-bit weights is the KV budget, in block-manager slots.
//   hbm-only    vLLM's design: HBM-only paged KV with prefix caching, LRU,
//               no overcommit (a request runs only if all its KV fits HBM).
//   u3m         HBM + SSD, every layer group's home in HBM, LRU, cost-based
//               recompute-or-fetch for blocks found on SSD. Victims leave
//               HBM for SSD (through a DRAM bounce buffer) instead of being
//               dropped, and an SSD hit is promoted into HBM at admission.
//               DRAM serves as the SSD's write-back staging buffer (Note
//               [Write-behind]).
//   u3m-tiered  HBM + DRAM + SSD, homes in HBM, LRU, no overcommit,
//               recompute-or-fetch. Victims go HBM -> DRAM -> SSD; a hit in
//               DRAM or on SSD is promoted into HBM at admission (Note
//               [Promoting DRAM hits] in src/kv/block_manager.cpp), so DRAM
//               is a cache tier over the host link in front of the SSD and,
//               with overcommit 1, every running request's KV is in HBM: no
//               decode step streams KV. Simulated in docs/serving.md: it does
//               not beat `u3m` (the SSD write-back has one second of staging
//               instead of all of DRAM, and DRAM holds little of Mooncake's
//               reuse), so `u3m` stays the default.
//   u3m-dram    `u3m-tiered` with overcommit 1.5: referenced KV beyond HBM
//               is placed in DRAM and streamed over the host link by every
//               prefill chunk and decode step of its request (Note [KV
//               streaming]).
//   u3m-design  the design document's default: the first 4 layers' KV in
//               HBM, the rest in DRAM, overcommit 1.5: decode streams most of
//               every request's KV over the host link each step.
//   u3m-pgdsf   `u3m` with RAGCache's PGDSF eviction instead of LRU.
//   u3m-blend   `u3m-tiered` with segment reuse (Note [Segment reuse] in
//               src/kv/block_manager.cpp): a passage's KV cached after one
//               context is reused after another, copied, re-rotated and
//               partly recomputed (blend_fraction, Note [Blend cost]), in
//               32-token blocks (segments start on a block, so a small block
//               wastes less; the others take the scenario's --block-tokens).
// The baselines a user would run instead, at the same HBM, DRAM and SSD:
//   vllm-offload  vLLM's prefix caching with its native CPU offloading: HBM +
//               DRAM, LRU, a DRAM hit copied back into HBM, no SSD.
//   lmcache     an LMCache-like exact chunk cache: 256-token chunks (its
//               default chunk size) in HBM, DRAM and local disk, LRU, every
//               hit fetched.
// u3m, u3m-tiered, u3m-blend and u3m-pgdsf filter what they write to SSD (Note [SSD
// admission]; ServeScenario::ssd_admit_after) and reorder their admission queue by cached
// length (Note [Cache-aware admission]; ServeScenario::sched_bypass); u3m-dram and u3m-design
// filter their SSD writes too. The baselines do neither.
//
const std::vector<std::string>& serve_policy_names() {
  static const std::vector<std::string> n = {"hbm-only", "vllm-offload", "lmcache",
                                             "u3m",      "u3m-blend",    "u3m-tiered",
                                             "u3m-dram", "u3m-design",   "u3m-pgdsf"};
  return n;
}

const std::vector<std::string>& serve_default_policies() {
  static const std::vector<std::string> n = {"hbm-only", "vllm-offload", "lmcache", "u3m",
                                             "u3m-blend"};
  return n;
}

ServePolicy serve_policy(const std::string& name) {
  ServePolicy p;
  p.name = name;
  if (name == "hbm-only") return p;
  if (name == "vllm-offload") {
    p.dram = true;
    return p;
  }
  if (name == "lmcache") {
    p.dram = p.ssd = true;
    p.block_tokens = 256;
    return p;
  }
  if (name == "u3m" || name == "u3m-pgdsf" || name == "u3m-tiered" || name == "u3m-blend") {
    p.dram = name == "u3m-tiered" || name == "u3m-blend";
    p.ssd = true;
    p.recompute_choice = true;
    p.ssd_admission = p.cache_aware = true;
    if (name == "u3m-pgdsf") p.eviction = kv::EvictionPolicy::pgdsf;
    if (name == "u3m-blend") {
      p.reuse = kv::Reuse::blend;
      // Every segment starts a block (Note [Segment reuse]): at 128 tokens a 130-token passage
      // takes two blocks; at 32 it wastes 16 tokens on average. vLLM's own default is 16.
      p.block_tokens = 32;
    }
    return p;
  }
  if (name == "u3m-dram" || name == "u3m-design") {
    p.dram = p.ssd = true;
    p.overcommit = 1.5;
    p.recompute_choice = true;
    p.ssd_admission = true;
    p.design_homes = name == "u3m-design";
    return p;
  }
  input_error("--kv-policy", "unknown policy '{}' (choices: {})", name,
              fmt::join(serve_policy_names(), ", "));
}

// Note [Default SLOs]
// MLPerf Inference's server-scenario limits: TTFT 2 s for every LLM; TPOT
// 100 ms for Llama-3.1-8B (v5.0) and 200 ms for Llama-2-70B (v4.0). Models
// up to 20 B parameters get 100 ms, larger ones 200 ms. They are printed with
// every result, beside the unloaded prefill and decode times on the profile,
// so a reader sees how much queueing room they leave.
//
// Those limits come from prompts of a few thousand tokens. A long-context
// trace (Mooncake: p99 85k tokens, max 126k) holds prompts whose prefill
// alone, on an idle group, takes longer than 2 s (6.1% of Mooncake's
// requests for llama2-13b, 3.3% for llama3-8b, on ascend-910b-32g x 4), so a flat 2 s would let
// those unmeetable requests decide capacity. The TTFT SLO of a request is therefore max(2 s, 5 x
// its unloaded prefill time): the SLO-scale convention of DistServe (Zhong et al., OSDI 2024),
// where SLOs are multiples of the unloaded latency. For the RAG workload (~2k-token prompts, ~0.1 s
// prefill) it is the flat 2 s.
// --slo-ttft-factor 0 gives the flat SLO.
ServeSlo default_slo(const workload::ModelShape& m) {
  const double params = static_cast<double>(workload::analytic::param_count(m));
  return {2000.0, params <= 20e9 ? 100.0 : 200.0, 5.0};
}

ServeSlo ServeScenario::effective_slo() const {
  const ServeSlo d = default_slo(shape);
  return {slo.ttft_ms > 0 ? slo.ttft_ms : d.ttft_ms, slo.tpot_ms > 0 ? slo.tpot_ms : d.tpot_ms,
          slo.ttft_prefill_factor >= 0 ? slo.ttft_prefill_factor : d.ttft_prefill_factor};
}

double ServeScenario::ssd_bytes() const {
  if (ssd_bytes_per_card > 0) return ssd_bytes_per_card;
  const double cards_per_node = std::max(hw.node.cards_per_node.si, 1.0);
  return hw.ssd.capacity.si * hw.ssd.drives_per_node.si / cards_per_node;
}

double ServeScenario::rated_dwpd() const {
  return ssd_rated_dwpd > 0 ? ssd_rated_dwpd : hw.ssd.rated_dwpd();
}

// Note [SSD wear]
// Every byte the store moves onto the SSD crosses the h2s link (HBM blocks
// are staged through it too), so the link's bytes are the drives' writes.
// Drive writes per day = bytes written / (instances x cards x SSD bytes per card)
// x 86,400 / makespan: the run's write pace held for a day, spread evenly
// over the group's drives. It is compared with the drive's rating (its
// endurance / capacity / warranty days, from the profile, or
// [tiers.ssd] endurance_dwpd); above the rating the drives wear out before
// their warranty ends. Write amplification inside the drive is not counted.
void account_ssd_wear(const ServeScenario& s, ServeResult& r) {
  r.ssd_wear.bytes_written = r.links[2].bytes;  // engine::Link::h2s
  r.ssd_wear.rated_dwpd = s.rated_dwpd();
  const double drive_bytes = double(s.instances) * s.cards * s.ssd_bytes();
  r.ssd_wear.drive_writes_per_day =
      r.makespan_s > 0 && drive_bytes > 0
          ? double(r.ssd_wear.bytes_written) / drive_bytes * 86400.0 / r.makespan_s
          : 0;
}

void ServeScenario::validate() const {
  shape.validate("--model");
  serve_policy(policy);
  if (cards == 0) input_error("--cards", "must be >= 1");
  if (!(rate_scale > 0) || !std::isfinite(rate_scale))
    input_error("--rate-scale", "must be a finite number > 0, got {}", rate_scale);
  if (slo.ttft_ms < 0 || !std::isfinite(slo.ttft_ms))
    input_error("--slo-ttft-ms", "must be a finite number >= 0 (0: default), got {}", slo.ttft_ms);
  if (!std::isfinite(slo.ttft_prefill_factor) ||
      (slo.ttft_prefill_factor < 0 && slo.ttft_prefill_factor != -1))
    input_error("--slo-ttft-factor", "must be a finite number >= 0, got {}",
                slo.ttft_prefill_factor);
  if (slo.tpot_ms < 0 || !std::isfinite(slo.tpot_ms))
    input_error("--slo-tpot-ms", "must be a finite number >= 0 (0: default), got {}", slo.tpot_ms);
  if (block_tokens == 0) input_error("--block-tokens", "must be >= 1");
  if (!(blend_fraction >= 0 && blend_fraction <= 1))
    input_error("--blend-recompute", "must be in [0, 1], got {}", blend_fraction);
  if (max_batch_tokens == 0) input_error("--max-batch-tokens", "must be >= 1");
  if (max_running == 0) input_error("max_running", "must be >= 1");
  if (!(hbm_utilization > 0 && hbm_utilization <= 1))
    input_error("hbm_utilization", "must be in (0, 1], got {}", hbm_utilization);
  if (!(dram_kv_fraction > 0 && dram_kv_fraction <= 1))
    input_error("dram_kv_fraction", "must be in (0, 1], got {}", dram_kv_fraction);
  if (!(spill_rate > 0)) input_error("spill_rate", "must be > 0");
  if (ssd_bytes_per_card < 0 || !std::isfinite(ssd_bytes_per_card))
    input_error("ssd_bytes_per_card", "must be a finite number >= 0 (0: the profile's)");
  if (ssd_rated_dwpd < 0 || !std::isfinite(ssd_rated_dwpd))
    input_error("--ssd-dwpd", "must be a finite number >= 0 (0: the profile's rating), got {}",
                ssd_rated_dwpd);
  if (!(meet_fraction > 0 && meet_fraction <= 1))
    input_error("--meet-fraction", "must be in (0, 1], got {}", meet_fraction);
  if (requests.empty()) input_error("--requests", "no requests");
  if (instances < 1 || instances > kMaxInstances)
    input_error("--instances", "must be 1 to {}, got {}", kMaxInstances, instances);
}

// Note [Coarse timestamps]
// Mooncake's conversation trace stamps arrivals in steps of about 3 s, up to
// 19 requests with one timestamp. Replayed as written, each step is a burst
// that no arrival-rate scale removes: the last of 19 long prompts waits for
// the other 18 prefills, so no rate meets a 2 s TTFT. With spread_ties (the
// default), requests sharing a timestamp are spaced evenly over the gap to
// the next distinct timestamp, which keeps the trace's rate at every step
// and only undoes its rounding. The last group has no next timestamp, so it
// is spread over the trace's mean gap between distinct timestamps (else it
// would stay a burst that no rate scale removes).
std::vector<double> spread_arrivals(const std::vector<workload::ServeRequest>& reqs, bool spread) {
  std::vector<double> t(reqs.size());
  for (std::size_t i = 0; i < reqs.size(); ++i) t[i] = reqs[i].timestamp_ms;
  if (!spread || t.empty()) return t;
  std::size_t distinct = 1;
  for (std::size_t i = 1; i < t.size(); ++i)
    distinct += reqs[i].timestamp_ms != reqs[i - 1].timestamp_ms;
  const double mean_gap =
      distinct > 1 ? (reqs.back().timestamp_ms - reqs.front().timestamp_ms) / double(distinct - 1)
                   : 0.0;
  for (std::size_t i = 0; i < t.size();) {
    std::size_t j = i;
    while (j < t.size() && reqs[j].timestamp_ms == reqs[i].timestamp_ms) ++j;
    const double span = j < t.size() ? reqs[j].timestamp_ms - reqs[i].timestamp_ms : mean_gap;
    const double gap = span / double(j - i);
    for (std::size_t k = i; k < j; ++k) t[k] = reqs[i].timestamp_ms + gap * double(k - i);
    i = j;
  }
  return t;
}

Percentiles Percentiles::of(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto rank = [&](double q) {
    const auto i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::clamp<std::size_t>(i, 1, v.size()) - 1];
  };
  return {rank(0.5), rank(0.9), rank(0.99)};
}

}  // namespace u3m::experiments

