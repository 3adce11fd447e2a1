// The serving experiments' results as JSON, built once (issue 15 item 7): `u3m serve sim
// --json` and `u3m serve capacity --json` print it, and Python's u3m.simulate_serving
// converts it, so the two speak one schema. Tiers are named device, host and ssd, as in
// train_json and everywhere else.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "u3m/experiments/serve.hpp"

namespace u3m::experiments {

// "simulated (profile P, model M, cards N)": every serving figure carries it.
std::string serve_label(const ServeScenario& s);
nlohmann::json serve_scenario_json(const ServeScenario& s);
// One policy's run: the label, the policy, goodput, latencies, KV and link figures.
nlohmann::json serve_result_json(const ServeScenario& s, const ServeResult& r);
// {"label", "scenario", "profile", "policies": {policy: serve_result_json}}.
nlohmann::json serve_sim_json(const ServeScenario& s, const ServeResult& r);
// The same shape for a capacity search over `base`: per policy the run at its capacity, plus
// rate_scale, rate_rps, goodput_vs_hbm_only and every probe in `tried`.
nlohmann::json serve_capacity_json(const ServeScenario& base,
                                   const std::vector<ServeCapacityRow>& rows);

}  // namespace u3m::experiments
