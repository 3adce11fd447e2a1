// Factories for the baseline predictors (their classes live in their .cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "u3m/predict/predictor.hpp"
#include "u3m/predict/step_wheel.hpp"

namespace u3m::predict {

std::unique_ptr<Predictor> make_lru();
std::unique_ptr<Predictor> make_markov_reuse();
std::unique_ptr<Predictor> make_trace_replay();
std::unique_ptr<Predictor> make_oracle(const TraceFeed& feed);

// The distinct tensors each step reads or writes (CSR), for the oracle and
// the evaluator.
struct StepTensors {
  std::vector<std::size_t> begin;  // size steps + 1
  std::vector<std::uint32_t> tensors;
};
StepTensors build_step_tensors(const TraceFeed& feed);

}  // namespace u3m::predict
