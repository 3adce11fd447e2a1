// Where a tensor should rest between uses (MISSION.md item 4, training): the
// design's seed rules, ZeRO-3 aware. With ZeRO-3 the framework shards
// parameters, gradients and optimizer state across cards; these rules tier
// each card's own shard.
#pragma once

#include <cstdint>
#include <string_view>

#include "u3m/mem/status.hpp"
#include "u3m/trace/model.hpp"

namespace u3m::policy {

struct PlacementRules {
  // The design's seed default: current layer's parameters and activations in
  // HBM, off-path parameters in DRAM, Adam m in DRAM, Adam v on SSD.
  mem::Tier off_path_param = mem::Tier::host;
  mem::Tier adam_m = mem::Tier::host;
  mem::Tier adam_v = mem::Tier::ssd;
  mem::Tier master = mem::Tier::host;        // fp32 master weights, updated with m and v
  mem::Tier grad = mem::Tier::host;          // reduced gradient shards wait for the optimizer step
  mem::Tier activation = mem::Tier::device;  // saved for backward; swap/recompute decides
  // Layers around the current one kept on the device (1 = the current layer only).
  std::int32_t window_layers = 1;

  // The named rule sets: "design-seed" (the design's seed default above), "static-offload"
  // (ZeRO-Offload: optimizer state and master weights in DRAM, all
  // parameters and activations on the device), "hbm-only" (everything on
  // the device). Throws InputError for another name.
  static PlacementRules named(std::string_view name);

  // The resting tier of a tensor of `role` on `tensor_layer` while the
  // computation is at `current_layer` (kNoLayer: not inside a layer).
  mem::Tier home(trace::Role role, std::int32_t tensor_layer, std::int32_t current_layer) const;
};

}  // namespace u3m::policy
