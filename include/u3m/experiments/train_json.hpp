// The training experiments' results as JSON, built once (issue 15 item 7):
// `u3m train sim --json` prints it and Python's u3m.simulate_training
// converts it, so the two speak one schema (tiers named device, host, ssd
// as everywhere).
#pragma once

#include <nlohmann/json.hpp>

#include "u3m/experiments/train.hpp"

namespace u3m::experiments {

nlohmann::json train_scenario_json(const TrainScenario& s);
nlohmann::json train_result_json(const TrainResult& r);
// {"label": "simulated with ...", "scenario", "profile", "result"}.
nlohmann::json train_sim_json(const TrainScenario& s, const TrainResult& r);

}  // namespace u3m::experiments
