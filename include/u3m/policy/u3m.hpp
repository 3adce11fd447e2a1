// The u3m tiering policy's report (the policy itself: src/policy/u3m.cpp;
// its knobs: U3mPolicyOptions in tiering.hpp).
#pragma once

#include <cstdint>

#include "u3m/policy/tiering.hpp"

namespace u3m::policy {

// What the u3m policy did in a run, for reports and tests.
struct U3mPolicyStats {
  std::uint64_t recalibrations = 0;  // threshold checks (each with a demotion pass)
  std::uint64_t demotions = 0;       // device -> DRAM and DRAM -> SSD moves asked for
  std::uint64_t jit_prefetches = 0;  // prefetches issued by the link-time rule
  double hot = 0, warm = 0;          // the thresholds at the end (0 before calibration)
  std::uint32_t horizon_ops = 0;     // the predictor's window at the end
  double max_fetch_s = 0;            // the slowest fetch (largest tensor from its home tier)
  double horizon_op_s = 0;           // the op time the window was derived from
  double mean_op_s = 0;              // the op clock at the end
};

// The stats of a policy made as "u3m"; null for any other policy.
const U3mPolicyStats* u3m_stats(const TieringPolicy& p);

}  // namespace u3m::policy
