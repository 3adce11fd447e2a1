#include "u3m/policy/placement.hpp"

#include <cstdlib>

#include "u3m/util/error.hpp"

namespace u3m::policy {

PlacementRules PlacementRules::named(std::string_view name) {
  PlacementRules r;
  if (name == "design-seed") return r;
  if (name == "static-offload") {
    r.off_path_param = mem::Tier::device;
    r.adam_m = r.adam_v = r.master = mem::Tier::host;
    r.grad = mem::Tier::device;
    return r;
  }
  if (name == "hbm-only") {
    r.off_path_param = r.adam_m = r.adam_v = r.master = r.grad = mem::Tier::device;
    return r;
  }
  input_error("placement", "unknown rule set '{}' (expected design-seed, static-offload or hbm-only)",
              name);
}

mem::Tier PlacementRules::home(trace::Role role, std::int32_t tensor_layer,
                               std::int32_t current_layer) const {
  using trace::Role;
  const bool near = tensor_layer != trace::kNoLayer && current_layer != trace::kNoLayer &&
                    std::abs(tensor_layer - current_layer) < window_layers;
  switch (role) {
    case Role::param:
      return near ? mem::Tier::device : off_path_param;
    case Role::grad:
      return near ? mem::Tier::device : grad;
    case Role::optim_master:
      return master;
    case Role::optim_m:
      return adam_m;
    case Role::optim_v:
      return adam_v;
    case Role::activation:
      return activation;
    case Role::kv:
    case Role::workspace:
    case Role::other:
      return mem::Tier::device;
  }
  return mem::Tier::device;
}

}  // namespace u3m::policy
