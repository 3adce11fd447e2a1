// Small hand-made mixed training+serving traces for the predictor tests and
// benchmark (the realistic generators live in workload/). Deterministic.
#pragma once

#include <cstdint>

#include "u3m/trace/model.hpp"

namespace u3m::predict {

struct SyntheticMixed {
  enum class Pattern { alternate, timeshare };
  Pattern pattern = Pattern::alternate;
  std::uint32_t layers = 4;
  std::uint32_t train_iterations = 6;
  std::uint32_t decode_steps = 48;     // serving iterations in total
  std::uint32_t decode_per_train = 8;  // alternate: decode steps after each training step
  std::uint32_t slice_ops = 7;         // timeshare: ops per slice of one job
  std::uint32_t max_requests = 4;      // concurrent requests
  std::uint32_t tokens_per_block = 4;  // KV block = this many tokens
  std::uint64_t op_ns = 1000;          // event time per op
};

// Job 0 "train-0": forward, backward, Adam per layer; activations allocated
// in forward and freed in backward. Job 1 "infer-0": decode steps over the
// live requests; each request's KV blocks (per layer) are new tensors,
// written at prefill and as tokens accrue, read by every decode step, freed
// when the request ends.
trace::Trace make_synthetic_mixed(const SyntheticMixed& p);

}  // namespace u3m::predict
