// The one list of tiering policies (Note [Tiering policy] in tiering.hpp).
#include <fmt/format.h>

#include "policies.hpp"
#include "u3m/policy/placement.hpp"
#include "u3m/util/error.hpp"

namespace u3m::policy {

bool optimizer_role(trace::Role r) {
  return r == trace::Role::optim_master || r == trace::Role::optim_m ||
         r == trace::Role::optim_v;
}

const PlacementRules& seed_rules() {
  static const PlacementRules rules = PlacementRules::named("design-seed");
  return rules;
}

Tier seed_home(const trace::Tensor& x) {
  const Tier h = seed_rules().home(x.role, x.layer, trace::kNoLayer);
  return h == Tier::ssd ? Tier::host : h;  // created in DRAM; pressure spills it to SSD
}

Tier tiered_home(const trace::Tensor& x, bool device_home, bool host_optimizer) {
  if (!device_home) return seed_home(x);
  return host_optimizer && optimizer_role(x.role) ? Tier::host : Tier::device;
}

std::string_view to_string(DriverCall::Kind k) {
  switch (k) {
    case DriverCall::Kind::acquire: return "acquire";
    case DriverCall::Kind::prefetch: return "prefetch";
    case DriverCall::Kind::demote: return "demote";
    case DriverCall::Kind::publish: return "publish";
    case DriverCall::Kind::free: return "free";
  }
  return "?";
}

DriverLog without_scores(DriverLog log) {
  for (DriverCall& c : log) c.score = 0;
  return log;
}

const std::vector<PolicyInfo>& tiering_policies() {
  static const std::vector<PolicyInfo> all = {
      {"hbm-only", "everything on the device, nothing evicted, no prefetch: fits or not",
       make_hbm_only, true, false},
      {"static-offload",
       "ZeRO-Offload: optimizer step and state on the host, the rest pinned on the device, "
       "2 ops of lookahead",
       make_static_offload, false, true},
      {"zero-offload",
       "ZeRO-Offload: as static-offload, and gradients leave the device for the host as "
       "backward produces them (DeepSpeed's offload_optimizer)",
       make_zero_offload, false, true},
      {"zero-infinity",
       "ZeRO-Infinity: as zero-offload, with the optimizer state (master, m, v) resting on the "
       "NVMe SSD, read into DRAM 4 ops ahead of each host Adam step and written back after it",
       make_zero_infinity, false, true},
      {"lru",
       "seed placement, least recently used evicted first, demand fetches only; the optimizer "
       "on the device or the host",
       make_lru, true, true, true},
      {"lookahead",
       "the trace-replay baseline: LRU, the tensors of the op --lookahead ahead prefetched",
       make_lookahead},
      {"u3m",
       "seed placement, victims by heat, prefetch of the predictor's window, recalibrated "
       "thresholds, optimizer where it is faster",
       make_u3m, true, true, true, "u3m-seq"},
      {"design-seed",
       "the design's policy as MISSION.md gives it: heat with refcount, thresholds 0.8/0.3 then "
       "calibrated and recalibrated every 30 s, seed placement, design-ema prefetch",
       make_design_seed, true, true, false, "design-ema"},
      {"belady",
       "Belady victims, a perfect 8-op lookahead and layer-ahead weight streaming from the whole "
       "trace (not a proven bound: the physical bound of train capacity is)",
       make_belady, true, true, true},
  };
  return all;
}

std::string tiering_policy_choices() {
  std::string out;
  for (const PolicyInfo& p : tiering_policies()) out += fmt::format("{}{}", out.empty() ? "" : " | ", p.name);
  return out;
}

const PolicyInfo& find_tiering_policy(std::string_view name, std::string_view flag) {
  for (const PolicyInfo& p : tiering_policies())
    if (p.name == name) return p;
  input_error(flag, "unknown policy '{}' (expected {})", name, tiering_policy_choices());
}

std::unique_ptr<TieringPolicy> make_tiering_policy(std::string_view name, const PolicyInputs& in,
                                                   std::string_view flag) {
  return find_tiering_policy(name, flag).make(in);
}

}  // namespace u3m::policy
