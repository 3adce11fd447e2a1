#include "u3m/engine/steps.hpp"

#include <algorithm>
#include <limits>

#include "u3m/util/error.hpp"

namespace u3m::engine {

std::vector<Step> build_steps(const trace::Trace& trace, std::uint64_t max_events) {
  for (const trace::Tensor& t : trace.tensors) {
    if (t.bytes == 0) input_error("trace", "tensor '{}' has 0 bytes; cannot run it", t.name);
  }
  const std::size_t n =
      max_events ? std::min<std::size_t>(max_events, trace.events.size()) : trace.events.size();
  // A first pass sizes each step's lists (an upper bound: every access or
  // free event), so building them below allocates once per list.
  struct Size {
    std::uint32_t touches = 0, frees = 0;
  };
  std::vector<Size> sizes;
  for (std::size_t i = 0; i < n; ++i) {
    const trace::Event& e = trace.events[i];
    if (e.op >= trace.ops.size())
      input_error("trace", "event {} names op {}, but the trace has {} ops", i, e.op,
                  trace.ops.size());
    if (e.tensor >= trace.tensors.size())
      input_error("trace", "event {} names tensor {}, but the trace has {} tensors", i, e.tensor,
                  trace.tensors.size());
    if (i == 0 || trace.events[i - 1].op != e.op) sizes.emplace_back();
    if (e.kind == trace::EventKind::free)
      ++sizes.back().frees;
    else if (e.kind != trace::EventKind::alloc)
      ++sizes.back().touches;
  }
  std::vector<Step> steps;
  steps.reserve(sizes.size());
  // slot[t]: index of tensor t in the current step's touches, valid while stamp[t] == step.
  constexpr std::uint64_t kNone = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::uint64_t> stamp(trace.tensors.size(), kNone);
  std::vector<std::uint32_t> slot(trace.tensors.size(), 0);
  for (std::size_t i = 0; i < n; ++i) {
    const trace::Event& e = trace.events[i];
    if (i == 0 || trace.events[i - 1].op != e.op) {
      steps.push_back(Step{e.op, {}, {}, i + 1});
      const Size& z = sizes[steps.size() - 1];
      steps.back().touches.reserve(z.touches);
      steps.back().frees.reserve(z.frees);
    }
    Step& s = steps.back();
    s.end_event = i + 1;
    const std::uint64_t here = steps.size() - 1;
    switch (e.kind) {
      case trace::EventKind::alloc:
        break;  // a tensor holds memory from its first touch
      case trace::EventKind::free:
        s.frees.push_back(e.tensor);
        break;
      case trace::EventKind::read:
      case trace::EventKind::write: {
        const bool w = e.kind == trace::EventKind::write;
        if (stamp[e.tensor] != here) {
          stamp[e.tensor] = here;
          slot[e.tensor] = static_cast<std::uint32_t>(s.touches.size());
          s.touches.push_back(Touch{e.tensor, w});
        } else if (w) {
          s.touches[slot[e.tensor]].writes = true;
        }
        break;
      }
    }
  }
  return steps;
}

std::uint64_t trace_footprint(const trace::Trace& trace) {
  std::vector<std::uint8_t> live(trace.tensors.size(), 0);
  std::uint64_t now = 0, peak = 0;
  // Most events touch a live tensor and change nothing: the tensor's size
  // (a cache line of its own) is read only when it comes or goes.
  for (const trace::Event& ev : trace.events) {
    std::uint8_t& l = live[ev.tensor];
    if (ev.kind == trace::EventKind::free) {
      if (l) now -= trace.tensors[ev.tensor].bytes;
      l = 0;
    } else if (!l) {
      l = 1;
      now += trace.tensors[ev.tensor].bytes;
      peak = std::max(peak, now);
    }
  }
  return peak;
}

}  // namespace u3m::engine
