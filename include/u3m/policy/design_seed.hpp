// The design's own training policy, faithfully (issue 22 item 4, MISSION.md
// items 2-4), so its claims can be checked beside u3m's: the policy itself is
// src/policy/design_seed.cpp, its knobs DesignSeedOptions in tiering.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "u3m/policy/tiering.hpp"

namespace u3m::policy {

// What the design-seed policy did in a run, for reports and tests.
struct DesignSeedStats {
  std::uint64_t recalibrations = 0;       // threshold checks, every period of the driver's clock
  std::uint64_t heat_demotions = 0;       // colder than its tier at a recalibration
  std::uint64_t placement_demotions = 0;  // off-path parameters, gradients and Adam state sent home (asked)
  std::uint64_t layer_prefetches = 0;     // the current layer's parameters brought in
  double hot = 0.8, warm = 0.3;           // the thresholds at the end
  bool calibrated = false;                // the profile's binary search ran
};

// The stats of a policy made as "design-seed"; null for any other policy.
const DesignSeedStats* design_seed_stats(const TieringPolicy& p);

// The design's refcount of each tensor (index into Trace::tensors): how many
// distinct ops (by name: the same op in every iteration) reference it. At
// least 1.
std::vector<std::uint32_t> op_refcounts(const trace::Trace& t);

}  // namespace u3m::policy
