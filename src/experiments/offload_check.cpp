#include "u3m/experiments/offload_check.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <string_view>
#include <tuple>

#include "u3m/engine/steps.hpp"
#include "u3m/experiments/validate.hpp"
#include "u3m/policy/tiering.hpp"
#include "u3m/sim/cost.hpp"
#include "u3m/sim/sim_transport.hpp"
#include "u3m/util/error.hpp"

namespace u3m::experiments {

namespace {

using trace::EventKind;
using trace::Phase;
using trace::Role;

bool is_state(const trace::Tensor& t) {
  switch (t.role) {
    case Role::param:
    case Role::grad:
    case Role::optim_master:
    case Role::optim_m:
    case Role::optim_v:
      return true;
    default:
      break;
  }
  // u3m.torch.capture names optimizer state `<job>.optim.<param>.<key>`
  // (docs/capture.md); a key without a role of its own (step, momentum) too.
  const std::size_t dot = t.name.find('.');
  return dot != std::string::npos && t.name.compare(dot + 1, 6, "optim.") == 0;
}

constexpr std::uint32_t kDropped = std::numeric_limits<std::uint32_t>::max();

// The view's own copies, told apart from captured ops of class copy
// (aten::clone, aten::cat), which cost a torch op, not an offload access.
constexpr std::string_view kCopyPrefix = "u3m.offload.";
bool is_offload_copy(const trace::Op& op) {
  return op.cls == trace::OpClass::copy && op.name.starts_with(kCopyPrefix);
}

}  // namespace

trace::Trace offload_view(const trace::Trace& in) {
  // Which tensors the offload manages (Note [Offload view]).
  std::vector<std::uint8_t> fwd_write(in.tensors.size()), bwd_read(in.tensors.size());
  for (const trace::Event& e : in.events) {
    if (e.op >= in.ops.size() || e.tensor >= in.tensors.size())
      input_error("trace", "event names op {} or tensor {} outside the trace", e.op, e.tensor);
    const Phase ph = in.ops[e.op].phase;
    if (e.kind == EventKind::write && ph == Phase::forward) fwd_write[e.tensor] = 1;
    if (e.kind == EventKind::read && ph == Phase::backward) bwd_read[e.tensor] = 1;
  }
  trace::Trace out;
  for (const auto& [k, v] : in.metadata) out.meta(k, v);
  out.meta("view", "u3m.torch.offload (Note [Offload view])");
  for (const std::string& j : in.jobs) out.job(j);
  if (out.jobs.empty()) out.job("train-0");
  std::vector<std::uint32_t> index(in.tensors.size(), kDropped);
  for (std::size_t t = 0; t < in.tensors.size(); ++t) {
    if (!is_state(in.tensors[t]) && !(fwd_write[t] && bwd_read[t])) continue;
    index[t] = static_cast<std::uint32_t>(out.tensors.size());
    out.tensor(in.tensors[t]);
  }
  const std::uint32_t scratch = static_cast<std::uint32_t>(out.tensors.size());
  out.tensor(trace::make_tensor(out.jobs.front() + ".u3m.compute-scratch", 1, trace::DType::u8,
                                Role::workspace));

  // (tensor, phase, iteration) already gathered.
  std::set<std::tuple<std::uint32_t, Phase, std::uint32_t>> gathered;
  auto copy_op = [&](const trace::Op& of, const char* what, std::uint32_t t, std::uint64_t bytes) {
    trace::Op c;
    c.name = std::string(kCopyPrefix) + what + " " + out.tensors[t].name;
    c.cls = trace::OpClass::copy;
    c.phase = of.phase;
    c.job = of.job;
    c.iteration = of.iteration;
    c.layer = of.layer;
    c.bytes = bytes;
    out.op(c);
    return static_cast<std::uint32_t>(out.ops.size() - 1);
  };
  // An op with no events still computes: it runs where its index falls.
  std::vector<std::uint8_t> has_events(in.ops.size(), 0);
  for (const trace::Event& e : in.events) has_events[e.op] = 1;
  std::uint32_t next = 0;
  auto bare_ops_before = [&](std::uint32_t op) {
    for (; next < op; ++next) {
      if (has_events[next]) continue;
      out.op(in.ops[next]);
      out.event({0, static_cast<std::uint32_t>(out.ops.size() - 1), scratch, EventKind::read});
    }
    next = std::max(next, op + 1);
  };
  std::size_t i = 0;
  while (i < in.events.size()) {
    const std::uint32_t op = in.events[i].op;
    bare_ops_before(op);
    std::size_t end = i;
    while (end < in.events.size() && in.events[end].op == op) ++end;
    const trace::Op& o = in.ops[op];
    const std::uint64_t at = in.events[i].time_ns;
    const bool leased = o.phase == Phase::optimizer || o.phase == Phase::other;
    std::vector<trace::Event> mine, stores;
    for (std::size_t k = i; k < end; ++k) {
      const trace::Event& e = in.events[k];
      const std::uint32_t t = index[e.tensor];
      if (t == kDropped || e.kind == EventKind::alloc) continue;
      if (e.kind == EventKind::free) {
        mine.push_back({e.time_ns, 0, t, e.kind});
      } else if (leased) {
        // The step holds a lease, taken once per tensor: the op after it computes on it.
        if (gathered.emplace(t, o.phase, o.iteration).second) {
          const std::uint32_t l = copy_op(o, "lease", t, 0);
          out.event({at, l, t, e.kind});
        }
        mine.push_back({e.time_ns, 0, t, e.kind});
      } else if (e.kind == EventKind::read) {
        if (gathered.emplace(t, o.phase, o.iteration).second) {
          const std::uint32_t g = copy_op(o, "gather", t, 2 * out.tensors[t].bytes);
          out.event({at, g, t, EventKind::read});
        }
      } else {
        stores.push_back({e.time_ns, 0, t, EventKind::write});
      }
    }
    out.op(o);
    const std::uint32_t me = static_cast<std::uint32_t>(out.ops.size() - 1);
    const bool touches = std::any_of(mine.begin(), mine.end(),
                                     [](const trace::Event& e) { return e.kind != EventKind::free; });
    if (!touches) out.event({at, me, scratch, EventKind::read});
    for (trace::Event e : mine) {
      e.op = me;
      out.event(e);
    }
    for (const trace::Event& s : stores) {
      // Read from torch's memory, so the step is never a free creation
      // (engine::creates_only); what this pass wrote is there, not gathered.
      const std::uint32_t c = copy_op(o, "store", s.tensor, 2 * out.tensors[s.tensor].bytes);
      out.event({s.time_ns, c, scratch, EventKind::read});
      out.event({s.time_ns, c, s.tensor, EventKind::write});
      gathered.emplace(s.tensor, o.phase, o.iteration);
    }
    i = end;
  }
  bare_ops_before(static_cast<std::uint32_t>(in.ops.size()));
  return out;
}

OffloadSim simulate_offload(const trace::Trace& captured, const sim::HwProfile& hw,
                            const OffloadSimOptions& o) {
  if (o.budget_bytes == 0) input_error("budget_bytes", "must be > 0");
  std::uint32_t iterations = 0;
  for (const trace::Op& op : captured.ops) iterations = std::max(iterations, op.iteration + 1);
  if (iterations < 2)
    input_error("trace", "has {} iteration(s); the steady step needs at least 2", iterations);
  OffloadSim r;
  const trace::Trace view = offload_view(captured);
  const std::vector<engine::Step> steps = engine::build_steps(view);
  r.managed_bytes = engine::trace_footprint(view);
  r.ops = view.ops.size();
  if (!(o.access_overhead_s < 0 || std::isfinite(o.access_overhead_s)))
    input_error("access_overhead_s", "must be finite, got {}", o.access_overhead_s);
  const double access = o.access_overhead_s >= 0 ? o.access_overhead_s : hw.device.launch_overhead.si;
  const sim::OpTimeFn op_time = [hw, access](const trace::Op& op) {
    const sim::OpCost c = sim::op_cost(hw, op);
    return is_offload_copy(op) ? c.total_s - c.overhead_s + access : c.total_s;
  };
  const auto steady = [&](const trace::Trace& t) {
    double s = 0;
    for (const trace::Op& op : t.ops)
      if (op.job == 0 && op.iteration >= 1) s += op_time(op);
    return s / static_cast<double>(iterations - 1);
  };
  for (const trace::Op& op : view.ops) r.copy_ops += is_offload_copy(op);
  r.compute_step_s = steady(view);
  r.captured_compute_step_s = steady(captured);
  sim::SimOptions so;
  so.device_budget = o.budget_bytes;
  so.host_budget = o.host_bytes ? o.host_bytes : std::max<std::uint64_t>(8 * r.managed_bytes, 256u << 20);
  so.links = sim::links_from_profile(hw, 0);
  so.op_time = op_time;
  so.lookahead = o.lookahead;
  const std::unique_ptr<policy::TieringPolicy> pol = policy::make_tiering_policy(
      o.policy, {.trace = view,
                 .steps = steps,
                 .h2d = so.links.links[static_cast<int>(engine::Link::h2d)],
                 .s2h = {},
                 .has_ssd = false,
                 .lookahead = o.lookahead},
      "policy");
  so.policy = pol.get();
  r.report = sim::simulate_trace(view, steps, so);
  std::vector<double> ends;
  for (std::uint64_t ns : r.report.iteration_end_ns) ends.push_back(double(ns) * 1e-9);
  r.step_s = steady_step(ends);
  return r;
}

}  // namespace u3m::experiments
