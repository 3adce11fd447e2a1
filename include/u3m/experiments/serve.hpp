// The serving experiments of issue 6: a request trace served by a
// tensor-parallel group of cards with continuous batching, its KV cache held
// by the tiered block manager (src/kv) under a policy (`u3m serve sim`), and
// the capacity search that finds, per policy, the highest request rate that
// meets the latency SLOs (`u3m serve capacity`). Every figure is simulated
// with a hardware profile, never measured. docs/serving.md explains the model.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "u3m/kv/block_manager.hpp"
#include "u3m/kv/recompute.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/workload/request_trace.hpp"
#include "u3m/workload/shape.hpp"

namespace u3m::engine {
class RunObserver;
}

namespace u3m::experiments {

// Every serving policy (docs/serving.md "Policies"), baselines first.
const std::vector<std::string>& serve_policy_names();
// What `serve capacity` compares by default: hbm-only, each baseline and each u3m mode.
const std::vector<std::string>& serve_default_policies();

// How a named policy configures the block manager (Note [Serving policies]).
struct ServePolicy {
  std::string name;
  bool dram = false, ssd = false;  // tiers besides HBM
  bool design_homes = false;       // true: first 4 layers' KV in HBM, the rest in DRAM
  double overcommit = 1.0;
  kv::EvictionPolicy eviction = kv::EvictionPolicy::lru;
  bool recompute_choice = false;  // Note [Recompute or fetch]
  kv::Reuse reuse = kv::Reuse::exact;  // Note [Segment reuse]
  std::uint32_t block_tokens = 0;      // 0: the scenario's; else the policy's own chunk size
  bool ssd_admission = false;          // Note [SSD admission]: the scenario's threshold applies
  bool cache_aware = false;            // Note [Cache-aware admission]: the scenario's bound
};
ServePolicy serve_policy(const std::string& name);  // InputError listing the names

struct ServeSlo {
  double ttft_ms = 0, tpot_ms = 0;
  // A request's TTFT SLO is max(ttft_ms, this x its unloaded prefill time);
  // < 0 in a scenario: the default (Note [Default SLOs]); 0: ttft_ms for all.
  double ttft_prefill_factor = -1;
};

inline constexpr std::uint32_t kMaxInstances = 8;  // serving instances one simulation takes

struct ServeScenario {
  workload::ModelShape shape;
  sim::HwProfile hw;
  std::uint32_t cards = 4;  // one tensor-parallel group
  std::string policy = "u3m";
  std::vector<workload::ServeRequest> requests;  // arrival order
  std::string requests_label;                    // where they came from, for reports
  double rate_scale = 1;                         // arrival times are divided by it
  ServeSlo slo;                                  // 0: default_slo()
  std::uint32_t block_tokens = 128;
  // Note [Blend cost]: the share of a blended block's tokens recomputed (u3m-blend).
  double blend_fraction = kv::kDefaultBlendFraction;
  // Note [SSD admission]: lookups a block's content needs before it may be written to SSD,
  // for the policies that filter (u3m's); 0 or 1: every victim is written.
  std::uint32_t ssd_admit_after = 2;
  // Note [Cache-aware admission]: how often a queued request may be passed over by one with
  // more of its prompt cached, for the policies that reorder (u3m's); 0: FIFO.
  std::uint32_t sched_bypass = 8;
  std::uint32_t layers_per_group = 4;
  std::uint32_t max_batch_tokens = 2048;  // tokens per iteration (decodes + prefill chunks)
  std::uint32_t max_running = 256;        // sequences in one batch at most
  double hbm_utilization = 0.9;           // share of HBM for weights + KV (vLLM's default)
  double dram_kv_fraction = 0.75;         // share of host DRAM given to KV
  double ssd_bytes_per_card = 0;          // 0: the profile's drives (ssd_bytes())
  double ssd_rated_dwpd = 0;              // 0: the profile's rating (rated_dwpd())
  double spill_rate = 1e9;                // bytes/s of the emergency spill to SSD
  double meet_fraction = 0.9;             // "meets the SLOs": this share of requests meets both
  bool spread_ties = true;                // Note [Coarse timestamps]
  // Watches the run (serve sim --timeline), on virtual time: each iteration
  // as an op of the group (card 0), waits for KV as stalls, and the store's
  // transfers and tier use through its engine. Must outlive the run.
  engine::RunObserver* observer = nullptr;
  // Serving instances of `cards` cards each, placed on nodes of the profile's cards_per_node,
  // the trace split between them (Note [Instances and the pool] in serving_sim.cpp).
  std::uint32_t instances = 1;
  // true: a KV pool below every instance's own tiers that all of them read and write, over
  // the profile's network; false: each instance keeps only its own tiers.
  bool shared_pool = false;
  void validate() const;                  // throws InputError naming the flag
  ServeSlo effective_slo() const;         // slo, with 0 fields from default_slo()
  // SSD bytes per card: ssd_bytes_per_card, or the profile's drive capacity x
  // drives per node / cards per node.
  double ssd_bytes() const;
  double rated_dwpd() const;  // ssd_rated_dwpd, or the profile's ssd.rated_dwpd()
};

// Note [Default SLOs] in serve.cpp.
ServeSlo default_slo(const workload::ModelShape& m);

// Arrival times in ms: the timestamps, with equal ones spread over the gap
// to the next distinct timestamp when `spread` (Note [Coarse timestamps]).
std::vector<double> spread_arrivals(const std::vector<workload::ServeRequest>& requests,
                                    bool spread);

// Note [Serving bound] in serving_sim.cpp: the most goodput any KV policy can reach on this
// trace and hardware, whatever it reuses: requests / the least busy time of the work that no
// reuse removes (decode's reads, the first occurrence of every segment, fixed iteration costs).
struct ServeBound {
  double busy_s = 0;                                // the least busy time (instances in parallel)
  double goodput_rps = 0;                           // requests / busy_s
  double memory_s = 0, compute_s = 0, fixed_s = 0;  // its parts, on one group
  double kv_read_bytes = 0, weight_read_bytes = 0;
  std::uint64_t unique_tokens = 0;  // prompt tokens no cache can hold before they are computed
};
ServeBound serving_bound(const ServeScenario& s);

// Unloaded costs on the profile (one request alone, no cache hit).
double prefill_seconds(const ServeScenario& s, std::uint64_t prompt_tokens);
double decode_step_seconds(const ServeScenario& s, std::uint64_t context_tokens);

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0;
  static Percentiles of(std::vector<double> v);  // nearest rank; zeros when empty
};

struct ServeLinkStats {
  std::uint64_t bytes = 0, transfers = 0;
  double busy_s = 0;
};

// Per-request outcome, in trace order.
struct ServeRequestResult {
  double arrival_s = 0;
  double first_token_s = -1, finish_s = -1;  // -1: never (too large, or the run stopped)
  double ttft_slo_s = 0;                     // this request's TTFT SLO
  std::uint64_t hit_tokens = 0, recomputed_tokens = 0;
  std::uint64_t blend_tokens = 0;  // Note [Segment reuse]: reused at a new position
  bool too_large = false;
  bool met = false;  // both SLOs
};

struct ServeResult {
  std::string policy;
  ServeSlo slo;
  std::uint64_t requests = 0, finished = 0, too_large = 0, met = 0;
  bool stopped_early = false;  // the capacity search gave up on this rate: too many misses
  double span_s = 0;           // first to last arrival
  double makespan_s = 0;       // first arrival to last finish
  double met_fraction = 0;     // met / requests
  double goodput_rps = 0;      // met / makespan
  double throughput_rps = 0;   // finished / makespan
  Percentiles ttft_ms, tpot_ms;
  double kv_hit_rate = 0;  // exact-prefix cached prompt tokens (own tiers + pool) / prompt tokens
  // Reused tokens: exact hits plus blended ones (Note [Segment reuse]); of those, the share
  // recomputed (recompute-or-fetch, blend's recomputed tokens); prompt tokens the prefill did
  // not compute, and their share of all prompt tokens.
  std::uint64_t blend_tokens = 0, prefill_tokens_saved = 0;
  double recomputed_share = 0, reuse_rate = 0;
  std::uint64_t max_concurrency = 0;
  std::uint64_t iterations = 0;
  double busy_s = 0;     // iterations' time
  double kv_wait_s = 0;  // iterations' time beyond compute, waiting for DRAM KV
  std::array<std::uint64_t, kv::kTiers> capacity_bytes{}, peak_bytes{};  // per tier
  std::array<ServeLinkStats, 4> links{};  // engine::Link order: d2h, h2d, h2s, s2h
  ServeLinkStats peer;                    // tensor-parallel all-reduces
  // Note [Pooled KV]: the shared pool and the network to it, summed over the instances.
  std::uint32_t instances = 1;
  bool shared_pool = false;
  std::uint64_t pool_capacity_bytes = 0, pool_peak_bytes = 0;
  std::uint64_t pool_hit_blocks = 0, pool_hit_tokens = 0;  // fetched from the pool
  std::uint64_t pool_put_blocks = 0, pool_evicted_blocks = 0;
  ServeLinkStats net_rx, net_tx;  // the instances' NICs: pool reads, pool writes
  std::uint64_t retried_submits = 0;      // refused_queue_full, submitted again later
  std::uint64_t spilled_bytes = 0, alerts = 0;
  double first_alert_s = -1;
  kv::KvStats kv;
  // SSD wear (Note [SSD wear] in serve.cpp): the bytes the run wrote to the
  // group's drives, as drive writes per day at the run's pace, against the rating.
  struct SsdWear {
    std::uint64_t bytes_written = 0;
    double drive_writes_per_day = 0, rated_dwpd = 0;
  } ssd_wear;
  std::vector<ServeRequestResult> per_request;
};

// Fills r.ssd_wear from r's SSD writes and makespan (Note [SSD wear]).
void account_ssd_wear(const ServeScenario& s, ServeResult& r);

// The trace served by s.instances serve::ServingSims (experiments/serving_sim.hpp), with a
// shared KV pool when s.shared_pool (Note [Instances and the pool] in serving_sim.cpp).
// `stop_after_misses`: stop once more requests than this missed an SLO (the
// capacity search's early exit); 0 = run to the end.
ServeResult simulate_serving(const ServeScenario& s, std::uint64_t stop_after_misses = 0);

struct ServeCapacityRow {
  std::string policy;
  double rate_scale = 0;                         // the highest that met the SLOs; 0: none tried did
  double rate_rps = 0;                           // the trace's mean arrival rate at that scale
  ServeResult at;                                // the run at that scale
  std::vector<std::pair<double, double>> tried;  // (rate scale, met fraction)
};

// For each policy, the highest rate scale meeting the SLOs (Note [Capacity
// search]). `progress` is called before each simulation.
std::vector<ServeCapacityRow> serving_capacity(
    const ServeScenario& base, const std::vector<std::string>& policies,
    const std::function<void(const std::string&)>& progress = {});

}  // namespace u3m::experiments
