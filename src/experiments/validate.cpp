#include "u3m/experiments/validate.hpp"

#include <memory>

#include "u3m/engine/steps.hpp"
#include "u3m/policy/tiering.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "u3m/sim/cost.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/generate.hpp"
#include "u3m/workload/shape.hpp"

namespace u3m::experiments {

std::string CheckConfig::label() const {
  // The lookahead is the lookahead policy's knob; other policies ignore it.
  return fmt::format("{} seq {}, device {:.0f}%, {:g} GB/s, {}", model, seq_len,
                     100 * device_fraction, link_gbps,
                     policy == "lookahead" ? fmt::format("lookahead {}", lookahead) : policy);
}

void CheckConfig::validate() const {
  workload::preset(model);  // throws, listing the presets
  if (seq_len == 0) input_error("seq_len", "must be >= 1");
  if (micro_batch == 0) input_error("micro_batch", "must be >= 1");
  if (steps < 2) input_error("steps", "must be >= 2 (the first step warms up), got {}", steps);
  if (!(device_fraction > 0 && device_fraction <= 1))
    input_error("device_fraction", "must be in (0, 1], got {}", device_fraction);
  if (!(link_gbps > 0 && std::isfinite(link_gbps)))
    input_error("link_gbps", "must be a finite rate > 0, got {}", link_gbps);
  policy::find_tiering_policy(policy, "--policy");
}

// Note [Check configurations]
// tiny-mha at seq 2048 keeps about 15 MB live at once and moves 30-40 MB each
// way per training step under these budgets, in transfers of about 110 KB.
// Compute is the local profile's roofline x 0.2 (CheckSetup), about 0.43 s
// per step: a device five times faster than one core of this machine. The
// links run at 0.25-0.5 GB/s so that a transfer (220-450 us) is long against
// the real stack's fixed cost per transfer (about 30 us, measured by
// drive::transfer_overhead_s), as a 1 MB transfer over PCIe (40 us at 25
// GB/s) is against a device's few microseconds; and so that moving data is a
// visible share of the step (stalls of 5-30%), which makes the simulator's
// link and overlap model, not the compute times both sides share, decide the
// figure. The four differ in budget (how much must move), link rate (how long
// it takes) and lookahead (how much can hide behind compute). Faster links at
// shorter compute shrink every transfer towards the fixed costs, where this
// loaded 2-core machine's thread wake-ups dominate (docs/training.md).
std::vector<CheckConfig> default_check_configs() {
  struct Row {
    double fraction, gbps;
    unsigned lookahead;
  };
  const Row rows[] = {{0.6, 0.5, 4}, {0.4, 0.25, 4}, {0.4, 0.5, 0}, {0.6, 0.25, 0}};
  std::vector<CheckConfig> v;
  for (const Row& r : rows) {
    CheckConfig c;
    c.device_fraction = r.fraction;
    c.link_gbps = r.gbps;
    c.lookahead = r.lookahead;
    v.push_back(c);
  }
  return v;
}

sim::OpTimeFn check_op_time(const sim::HwProfile& local, double scale) {
  if (!(scale >= 0 && std::isfinite(scale)))
    input_error("--compute-scale", "must be a finite number >= 0, got {}", scale);
  return [local, scale](const trace::Op& op) { return scale * sim::op_cost(local, op).total_s; };
}

sim::SimTransportConfig check_links(const CheckConfig& c, const sim::HwProfile& local,
                                    double latency_s) {
  sim::SimTransportConfig links;
  const sim::LinkModel m{std::min(c.link_gbps * 1e9, local.host_link.bandwidth_practical.si),
                         latency_s};
  links.links[static_cast<int>(engine::Link::d2h)] = m;
  links.links[static_cast<int>(engine::Link::h2d)] = m;
  links.ssd_capacity = 0;
  links.validate();
  return links;
}

double steady_step(const std::vector<double>& ends) {
  if (ends.size() < 2) return 0;
  return (ends.back() - ends.front()) / static_cast<double>(ends.size() - 1);
}

CheckResult run_check(const CheckConfig& c, const CheckSetup& setup) {
  c.validate();
  CheckResult r;
  r.config = c;
  workload::TrainConfig tc;
  tc.steps = c.steps;
  tc.seq_len = c.seq_len;
  tc.micro_batch_size = c.micro_batch;
  tc.validate();
  trace::Trace t;
  workload::generate_train(workload::preset(c.model), tc, t);
  const sim::OpTimeFn op_time = check_op_time(setup.local, setup.compute_scale);
  double compute = 0;
  for (const trace::Op& op : t.ops) {
    if (op.job == 0 && op.iteration >= 1) compute += op_time(op);
  }
  r.compute_step_s = compute / static_cast<double>(c.steps - 1);

  // Real: the runtime over device-emu, real bytes, every read checked.
  drive::ReplayOptions ro;
  ro.device_fraction = c.device_fraction;
  ro.lookahead = c.lookahead;
  ro.policy = c.policy;
  policy::DriverLog real_log, sim_log;
  ro.log = &real_log;
  ro.h2d_gbps = ro.d2h_gbps = c.link_gbps;
  ro.op_time = op_time;
  ro.check_stride = setup.check_stride;
  r.link_latency_s =
      setup.link_latency_s >= 0 ? setup.link_latency_s : drive::transfer_overhead_s(ro);
  const drive::ReplayReport real = drive::replay_trace(t, ro);
  r.footprint = real.footprint;
  r.device_budget = real.device_budget;
  r.data_ok = real.ok();
  r.bytes_verified = real.bytes_verified;
  r.first_error = real.first_error;
  r.overrun_s = real.overrun_s;
  r.oversleep_s = real.oversleep_s;
  auto link_bytes = [](const engine::EngineStats& s, engine::Link l) {
    return s.links[static_cast<int>(l)].bytes;
  };
  auto transfers = [](const engine::EngineStats& s, CheckSide& side) {
    for (engine::Link l : {engine::Link::d2h, engine::Link::h2d}) {
      side.transfers += s.links[static_cast<int>(l)].transfers;
      side.transfer_s += double(s.links[static_cast<int>(l)].busy_ns) * 1e-9;
    }
  };
  r.real.iteration_end_s = real.iteration_end_s;
  r.real.step_s = steady_step(real.iteration_end_s);
  r.real.total_s = real.iteration_end_s.empty() ? real.wall_s : real.iteration_end_s.back();
  r.real.stall_s = real.stall_s;
  r.real.h2d_bytes = link_bytes(real.engine, engine::Link::h2d);
  r.real.d2h_bytes = link_bytes(real.engine, engine::Link::d2h);
  r.real.evictions = real.engine.evictions;
  transfers(real.engine, r.real);

  // Simulated: the same engine on virtual time, same trace and budgets.
  sim::SimOptions so;
  so.device_budget = real.device_budget;
  so.host_budget = real.host_budget;
  so.links = check_links(c, setup.local, r.link_latency_s);
  so.op_time = op_time;
  so.lookahead = c.lookahead;
  so.log = &sim_log;
  const std::vector<engine::Step> steps = engine::build_steps(t);
  const std::unique_ptr<policy::TieringPolicy> pol = policy::make_tiering_policy(
      c.policy, {.trace = t,
                 .steps = steps,
                 .h2d = so.links.links[static_cast<int>(engine::Link::h2d)],
                 .s2h = {},
                 .has_ssd = false,
                 .lookahead = c.lookahead});
  so.policy = pol.get();
  const sim::SimReport sim = sim::simulate_trace(t, steps, so);
  r.sim_calls = sim_log.size();
  r.real_calls = real_log.size();
  // The calls, not the score values: u3m's heat keys are on each side's clock.
  sim_log = policy::without_scores(std::move(sim_log));
  real_log = policy::without_scores(std::move(real_log));
  r.same_decisions = sim_log == real_log;
  for (std::size_t i = 0; i < std::min(sim_log.size(), real_log.size()) && !r.same_decisions;
       ++i) {
    if (sim_log[i] == real_log[i]) continue;
    auto say = [](const policy::DriverCall& x) {
      return fmt::format("step {} {} tensor {}", x.step, policy::to_string(x.kind), x.tensor);
    };
    r.first_difference = fmt::format("call {}: simulated {}, real {}", i, say(sim_log[i]),
                                     say(real_log[i]));
    break;
  }
  if (!r.same_decisions && r.first_difference.empty())
    r.first_difference = fmt::format("{} calls simulated, {} real", r.sim_calls, r.real_calls);
  r.links_label = sim.links_label;
  if (r.first_error.empty()) r.first_error = sim.first_error;
  for (std::uint64_t ns : sim.iteration_end_ns) r.sim.iteration_end_s.push_back(double(ns) * 1e-9);
  r.sim.step_s = steady_step(r.sim.iteration_end_s);
  r.sim.total_s = double(sim.total_ns) * 1e-9;
  r.sim.stall_s = double(sim.stall_ns) * 1e-9;
  r.sim.h2d_bytes = sim.links[static_cast<int>(engine::Link::h2d)].bytes;
  r.sim.d2h_bytes = sim.links[static_cast<int>(engine::Link::d2h)].bytes;
  r.sim.evictions = sim.engine.evictions;
  transfers(sim.engine, r.sim);
  r.error = r.real.step_s > 0 ? r.sim.step_s / r.real.step_s - 1 : 0;
  return r;
}

}  // namespace u3m::experiments
