#include "u3m/experiments/serve_json.hpp"

#include <fmt/format.h>

#include "u3m/sim/profile_json.hpp"
#include "u3m/util/version.hpp"

namespace u3m::experiments {

namespace {

nlohmann::json pct(const Percentiles& p) {
  return {{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}};
}

// kv::Tier order: device, host, ssd.
constexpr const char* kTierNames[kv::kTiers] = {"device", "host", "ssd"};

}  // namespace

std::string serve_label(const ServeScenario& s) {
  if (s.instances == 1 && !s.shared_pool)
    return fmt::format("simulated (profile {}, model {}, cards {})", s.hw.name, s.shape.name,
                       s.cards);
  return fmt::format("simulated (profile {}, model {}, {} instances x {} cards, pool {})",
                     s.hw.name, s.shape.name, s.instances, s.cards,
                     s.shared_pool ? "shared" : "separate");
}

nlohmann::json serve_scenario_json(const ServeScenario& s) {
  const ServeSlo slo = s.effective_slo();
  const auto& front = s.requests.front();
  return {{"requests", s.requests_label},
          {"request_count", s.requests.size()},
          {"model", s.shape.name},
          {"hw", s.hw.name},
          {"cards", s.cards},
          {"tensor_parallel", s.cards},
          {"rate_scale", s.rate_scale},
          {"slo",
           {{"ttft_ms", slo.ttft_ms},
            {"ttft_prefill_factor", slo.ttft_prefill_factor},
            {"ttft_rule",
             "a request's TTFT SLO is max(ttft_ms, ttft_prefill_factor x its "
             "unloaded prefill)"},
            {"tpot_ms", slo.tpot_ms},
            {"meets", fmt::format(">= {:g}% of requests meet both", 100 * s.meet_fraction)}}},
          {"unloaded_prefill_ms_first_request", 1e3 * prefill_seconds(s, front.prompt_tokens())},
          {"unloaded_decode_step_ms_first_request",
           1e3 * decode_step_seconds(s, front.prompt_tokens())},
          {"block_tokens", s.block_tokens},
          {"layers_per_group", s.layers_per_group},
          {"max_batch_tokens", s.max_batch_tokens},
          {"max_running", s.max_running},
          {"hbm_utilization", s.hbm_utilization},
          {"dram_kv_fraction", s.dram_kv_fraction},
          {"ssd_bytes_per_card", s.ssd_bytes()},
          {"ssd_rated_dwpd", s.rated_dwpd()},
          {"spill_rate_bytes_per_s", s.spill_rate},
          {"spread_ties", s.spread_ties},
          {"instances", s.instances},
          {"pool", s.shared_pool ? "shared" : "separate"},
          {"routing", "by session (a session stays on its first instance), else round-robin"},
          {"figures", serve_label(s)},
          {"version", kVersion}};
}

nlohmann::json serve_result_json(const ServeScenario& s, const ServeResult& r) {
  static const char* links[] = {"d2h", "h2d", "h2s", "s2h"};
  nlohmann::json by_tier, by_link, hits;
  const kv::KvStats& k = r.kv;
  for (int t = 0; t < kv::kTiers; ++t) {
    by_tier[kTierNames[t]] = {{"capacity", r.capacity_bytes[t]}, {"peak", r.peak_bytes[t]}};
    hits[kTierNames[t]] = k.hit_blocks_by_tier[t];
  }
  hits["pool"] = r.pool_hit_blocks;
  by_tier["pool"] = {{"capacity", r.pool_capacity_bytes}, {"peak", r.pool_peak_bytes}};
  // The hit rate of each tier: tokens hit there / prompt tokens (own tiers by the lowest tier
  // a slot was in, Admission::hit_blocks_by_tier).
  nlohmann::json hit_rate;
  const double prompt = k.prompt_tokens ? double(k.prompt_tokens) : 1.0;
  // A policy's blocks may hold fewer tokens than the scenario's (lmcache's chunks, a blend
  // layout's partial blocks): the exact hit tokens are split by the tiers' share of hit blocks.
  const double per_block = k.hit_blocks ? double(k.hit_tokens) / double(k.hit_blocks) : 0;
  for (int t = 0; t < kv::kTiers; ++t)
    hit_rate[kTierNames[t]] = double(k.hit_blocks_by_tier[t]) * per_block / prompt;
  hit_rate["pool"] = double(r.pool_hit_tokens) / prompt;
  hit_rate["blend"] = double(r.blend_tokens) / prompt;
  for (int l = 0; l < 4; ++l)
    by_link[links[l]] = {{"bytes", r.links[l].bytes},
                         {"transfers", r.links[l].transfers},
                         {"busy_s", r.links[l].busy_s}};
  by_link["peer"] = {{"bytes_per_card", r.peer.bytes}, {"transfers", r.peer.transfers}};
  for (auto [name, l] : {std::pair{"net_rx", &r.net_rx}, {"net_tx", &r.net_tx}})
    by_link[name] = {{"bytes", l->bytes}, {"transfers", l->transfers}, {"busy_s", l->busy_s}};
  return {
      {"label", serve_label(s)},
      {"policy", r.policy},
      {"goodput_rps", r.goodput_rps},
      {"throughput_rps", r.throughput_rps},
      {"met_fraction", r.met_fraction},
      {"ttft_ms", pct(r.ttft_ms)},
      {"tpot_ms", pct(r.tpot_ms)},
      {"kv_hit_rate", r.kv_hit_rate},
      {"recomputed_share_of_reused", r.recomputed_share},
      {"blend_tokens", r.blend_tokens},
      {"prefill_tokens_saved", r.prefill_tokens_saved},
      {"reuse_rate", r.reuse_rate},
      {"max_concurrency", r.max_concurrency},
      {"bytes_by_tier", by_tier},
      {"bytes_by_link", by_link},
      {"requests", r.requests},
      {"finished", r.finished},
      {"too_large", r.too_large},
      {"met", r.met},
      {"stopped_early", r.stopped_early},
      {"span_s", r.span_s},
      {"makespan_s", r.makespan_s},
      {"iterations", r.iterations},
      {"busy_s", r.busy_s},
      {"kv_stream_wait_s", r.kv_wait_s},
      {"queue",
       {{"queued", k.queued},
        {"peak_queue", k.peak_queue},
        {"refused_queue_full_retried", r.retried_submits},
        {"admitted", k.admitted}}},
      {"ssd_wear",
       {{"bytes_written", r.ssd_wear.bytes_written},
        {"drive_writes_per_day", r.ssd_wear.drive_writes_per_day},
        {"rated_dwpd", r.ssd_wear.rated_dwpd}}},
      {"spilled_bytes", r.spilled_bytes},
      {"alerts", r.alerts},
      {"first_alert_s", r.first_alert_s},
      {"promoted_slots", {{"from_host", k.promoted_host_slots}, {"from_ssd", k.promoted_slots}}},
      {"hits_by_tier_blocks", hits},
      {"hit_rate_by_tier", hit_rate},
      {"pool",
       {{"shared", r.shared_pool},
        {"instances", r.instances},
        {"put_blocks", r.pool_put_blocks},
        {"evicted_blocks", r.pool_evicted_blocks},
        {"network_bytes", r.net_rx.bytes + r.net_tx.bytes}}},
      {"slo",
       {{"ttft_ms", r.slo.ttft_ms},
        {"ttft_prefill_factor", r.slo.ttft_prefill_factor},
        {"tpot_ms", r.slo.tpot_ms}}}};
}

nlohmann::json serve_sim_json(const ServeScenario& s, const ServeResult& r) {
  nlohmann::json j = {{"label", serve_label(s)},
                      {"scenario", serve_scenario_json(s)},
                      {"profile", sim::profile_json(s.hw)}};
  j["scenario"]["kv_policy"] = s.policy;
  j["policies"][r.policy] = serve_result_json(s, r);
  return j;
}

nlohmann::json serve_capacity_json(const ServeScenario& base,
                                   const std::vector<ServeCapacityRow>& rows) {
  double base_goodput = 0;
  for (const auto& r : rows)
    if (r.policy == "hbm-only") base_goodput = r.at.goodput_rps;
  nlohmann::json j = {{"label", serve_label(base)},
                      {"scenario", serve_scenario_json(base)},
                      {"profile", sim::profile_json(base.hw)}};
  j["scenario"].erase("rate_scale");
  j["scenario"]["search"] = "highest arrival-rate scale meeting the SLOs (docs/serving.md)";
  const ServeBound bound = serving_bound(base);
  j["bound"] = {{"what",
                 "goodput no KV policy can exceed: requests / least busy time of the work "
                 "no reuse removes (Note [Serving bound], derived, not simulated)"},
                {"goodput_rps", bound.goodput_rps},
                {"busy_s", bound.busy_s},
                {"memory_s", bound.memory_s},
                {"compute_s", bound.compute_s},
                {"fixed_s", bound.fixed_s},
                {"unique_tokens", bound.unique_tokens},
                {"kv_read_bytes", bound.kv_read_bytes},
                {"weight_read_bytes", bound.weight_read_bytes},
                {"vs_hbm_only", base_goodput > 0 ? nlohmann::json(bound.goodput_rps / base_goodput)
                                                 : nlohmann::json(nullptr)}};
  j["policies"] = nlohmann::json::object();
  for (const auto& r : rows) {
    nlohmann::json p = serve_result_json(base, r.at);
    p["policy"] = r.policy;  // also when no rate met the SLOs (an empty run)
    p["rate_scale"] = r.rate_scale;
    p["rate_rps"] = r.rate_rps;
    p["goodput_vs_hbm_only"] = base_goodput > 0 ? nlohmann::json(r.at.goodput_rps / base_goodput)
                                                : nlohmann::json(nullptr);  // no baseline run
    nlohmann::json tried = nlohmann::json::array();
    for (const auto& [scale, met] : r.tried)
      tried.push_back({{"rate_scale", scale}, {"met_fraction", met}});
    p["tried"] = tried;
    j["policies"][r.policy] = p;
  }
  return j;
}

}  // namespace u3m::experiments
