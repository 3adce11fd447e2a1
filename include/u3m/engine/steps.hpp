// A trace as the runtime runs it: steps, each a run of consecutive events of
// one op, with the tensors the op touches (first-touch order, and whether it
// writes each) and those it frees. Real replay (replay.hpp) and the simulator
// (sim/runner.hpp) both run these units, so they treat a trace alike.
#pragma once

#include <cstdint>
#include <vector>

#include "u3m/trace/model.hpp"

namespace u3m::engine {

struct Touch {
  std::uint32_t tensor = 0;  // index into Trace::tensors
  bool writes = false;
};

struct Step {
  std::uint32_t op = 0;              // index into Trace::ops
  std::vector<Touch> touches;        // first-touch order, one entry per tensor
  std::vector<std::uint32_t> frees;  // tensors freed at the end of the step
  std::uint64_t end_event = 0;       // one past the step's last event
};

// The steps of the first `max_events` events (0 = all). A tensor holds
// memory from its first touch, so alloc events add nothing. Throws
// InputError for a tensor of 0 bytes or an event naming an op or tensor that
// does not exist.
std::vector<Step> build_steps(const trace::Trace& trace, std::uint64_t max_events = 0);

// Whether a step only creates: it touches something, and every touch writes a
// tensor that holds no data yet (`holds_data(tensor)`), so it is run without
// compute. The one rule: the step driver asks it with its live state, the
// traffic bound with the state it simulates.
template <typename HoldsData>
bool creates_only(const Step& s, HoldsData&& holds_data) {
  if (s.touches.empty()) return false;
  for (const Touch& t : s.touches)
    if (!t.writes || holds_data(t.tensor)) return false;
  return true;
}

// The most bytes live at once over the trace (alloc/free events; tensors
// never allocated count from their first use to the end).
std::uint64_t trace_footprint(const trace::Trace& trace);

}  // namespace u3m::engine
