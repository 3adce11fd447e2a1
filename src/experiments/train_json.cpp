#include "u3m/experiments/train_json.hpp"

#include <string>

#include <fmt/format.h>

#include "u3m/sim/profile_json.hpp"
#include "u3m/util/version.hpp"

namespace u3m::experiments {

nlohmann::json train_scenario_json(const TrainScenario& s) {
  const workload::TrainConfig& t = s.train;
  return {{"model",
           {{"name", s.shape.name},
            {"layers", s.shape.layers},
            {"d_model", s.shape.d_model},
            {"heads", s.shape.heads},
            {"kv_heads", s.shape.kv_heads},
            {"ffn", s.shape.ffn},
            {"vocab", s.shape.vocab}}},
          {"cards", s.cards},
          {"card_model", to_string(s.card_model)},
          {"u3m_policy",
           {{"recalibrate", s.u3m.recalibrate},
            {"recalibrate_period_s", s.u3m.recalibrate_period_s},
            {"demote_device", s.u3m.demote_device},
            {"prefetch", s.u3m.jit_prefetch ? "link" : "fixed"},
            {"stream_layer_ahead", s.u3m.stream_layer_ahead}}},
          {"zero3", s.cards > 1},
          {"steps_simulated", s.steps},
          {"micro_batch", t.micro_batch_size},
          {"seq_len", t.seq_len},
          {"grad_accum", t.micro_batches},
          {"mixed_precision", t.mixed_precision},
          {"recompute", t.recompute},
          {"lora_rank", t.lora_rank},
          {"lora_alpha", t.lora_alpha},
          {"settings_search", s.search},
          {"optimizer", "adam"},
          {"hw", s.hw.name},
          {"version", kVersion}};
}

nlohmann::json train_result_json(const TrainResult& r) {
  nlohmann::json links = nlohmann::json::object();
  for (int l = 0; l < engine::kNumLinks; ++l) {
    const auto& x = r.sim.links[l];
    links[std::string(engine::to_string(engine::Link(l)))] = {
        {"bytes", x.bytes}, {"transfers", x.transfers}, {"busy_s", double(x.busy_ns) * 1e-9}};
  }
  nlohmann::json cards = nlohmann::json::array();
  for (const auto& c : r.cards) {
    cards.push_back({{"card", c.card},
                     {"shards", c.shards},
                     {"step_s", c.step_s},
                     {"barrier_s", c.barrier_s},
                     {"stall_s", c.stall_s},
                     {"compute_s", c.compute_s}});
  }
  nlohmann::json u3m = nullptr;  // the u3m policy's own decisions (docs/policy.md)
  if (r.u3m_policy) {
    const policy::U3mPolicyStats& p = *r.u3m_policy;
    u3m = {{"recalibrations", p.recalibrations},
           {"demotions", p.demotions},
           {"jit_prefetches", p.jit_prefetches},
           {"hot", p.hot},
           {"warm", p.warm},
           {"horizon_ops", p.horizon_ops}};
  }
  nlohmann::json design = nullptr;  // the design-seed policy's (Note [Design seed])
  if (r.design_seed) {
    const policy::DesignSeedStats& p = *r.design_seed;
    design = {{"recalibrations", p.recalibrations},
              {"heat_demotions", p.heat_demotions},
              {"placement_demotions", p.placement_demotions},
              {"layer_prefetches", p.layer_prefetches},
              {"calibrated", p.calibrated},
              {"hot", p.hot},
              {"warm", p.warm}};
  }
  const observe::BandReport& b = r.hbm_band;
  nlohmann::json series = nlohmann::json::array();
  for (const observe::BandPoint& x : b.series)
    series.push_back({{"t_s", x.t_s}, {"mean", x.mean}, {"max", x.max}});
  const nlohmann::json band = {{"low", b.low},     {"high", b.high},       {"below_s", b.below_s},
                               {"in_s", b.in_s},   {"above_s", b.above_s}, {"mean", b.mean},
                               {"peak", b.peak},   {"series", series}};
  return {{"policy", r.policy},
          {"fits", r.fits},
          {"u3m_policy", u3m},
          {"design_seed_policy", design},
          {"hbm_band", band},
          {"card_model", to_string(r.card_model)},
          {"cards", cards},
          {"ssd_link", {{"bytes", r.ssd_link_bytes}, {"busy_s", r.ssd_link_busy_s}}},
          {"why", r.why},
          {"params", r.params},
          {"footprint_bytes", r.footprint},
          {"step_s", r.step_s},
          {"ideal_step_s", r.ideal_step_s},
          {"loss", r.loss},
          {"tokens_per_s", r.tokens_per_s},
          {"stall_s", r.stall_s},
          {"hidden_fraction", r.hidden_fraction},
          {"optimizer_on_host", r.optimizer_on_host},
          {"device_home", r.device_home},
          {"recompute_layers", r.recompute_layers},
          {"peak_bytes",
           {{"device", r.sim.peak_device}, {"host", r.sim.peak_host}, {"ssd", r.sim.peak_ssd}}},
          {"links", links},
          {"links_model", r.sim.links_label}};
}

nlohmann::json train_sim_json(const TrainScenario& s, const TrainResult& r) {
  nlohmann::json j = {{"label", fmt::format("simulated with profile {} ({}), model {}, not measured",
                                            s.hw.name, s.hw.origin, s.shape.name)},
                      {"scenario", train_scenario_json(s)},
                      {"profile", sim::profile_json(s.hw)},
                      {"result", train_result_json(r)}};
  j["scenario"]["policy"] = s.policy;
  return j;
}

}  // namespace u3m::experiments
