// A hardware profile as JSON, every number with its unit, base-unit value and
// source; embedded in simulator results so any result can be rerun
// (MISSION.md, reproducibility). Header-only so u3m_sim need not link json.
#pragma once

#include <nlohmann/json.hpp>

#include "u3m/sim/profile.hpp"

namespace u3m::sim {

inline nlohmann::json profile_json(const HwProfile& p) {
  nlohmann::json j = nlohmann::json::object();
  j["origin"] = p.origin;
  for (const TextField& f : text_fields()) {
    if (f.section.empty())
      j[std::string(f.key)] = f.at(p);
    else
      j[std::string(f.section)][std::string(f.key)] = f.at(p);
  }
  for (const ParamField& f : param_fields()) {
    const Param& v = f.at(p);
    j[std::string(f.section)][std::string(f.key)] = {
        {"value", v.value}, {"unit", v.unit}, {"si", v.si}, {"source", v.source}};
  }
  return j;
}

}  // namespace u3m::sim
