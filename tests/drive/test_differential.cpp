// The differential test of issue 15: one trace and one tiering policy, run
// once by the simulator (sim::simulate_trace, virtual time) and once by real
// replay (drive::replay_trace, real bytes and threads), must ask the same of
// the engine, call for call (Note [Driver calls] in policy/tiering.hpp).
// Both run the one step driver (drive::StepDriver) with its two waiters: the
// ops both report to a RunObserver, which only the driver calls, are the
// same ops in the same order.
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli_testing.hpp"
#include "u3m/drive/replay.hpp"
#include "u3m/engine/steps.hpp"
#include "u3m/policy/tiering.hpp"
#include "u3m/sim/runner.hpp"
#include "u3m/trace/io.hpp"

namespace u3m::drive {
namespace {

using policy::DriverCall;
using policy::DriverLog;

std::string describe(const DriverCall& c) {
  return fmt::format("step {} {} tensor {} tier {}{} score {}", c.step, policy::to_string(c.kind),
                     c.tensor, mem::to_string(c.tier), c.write ? " write" : "", c.score);
}

// The u3m policy with only its clock-free decisions: recalibration (a period
// of the driver's clock) and just-in-time prefetch (link times against op
// times) read the clock, which the two drivers do not share.
// design-seed likewise: its prefetch window from the clock-free default
// predictor instead of the design's EMA, whose answers follow event times.
policy::DesignSeedOptions design_clock_free() {
  policy::DesignSeedOptions o;
  o.predictor = "u3m";
  return o;
}
policy::U3mPolicyOptions clock_free() {
  policy::U3mPolicyOptions o;
  o.recalibrate = false;
  o.jit_prefetch = false;
  return o;
}

// What the step driver reports of a run: each op as (index, name), each
// step end, and whether every stall ended no earlier than it began.
class OpRecorder final : public engine::RunObserver {
 public:
  void op(int card, std::int64_t, std::size_t index, std::string_view name, engine::OpWork,
          double t0, double t1) override {
    std::lock_guard g(mu_);
    ops.push_back(fmt::format("{} {} {}", card, index, name));
    ordered = ordered && t0 <= t1;
  }
  void stall(int, std::int64_t, std::size_t, double t0, double t1) override {
    std::lock_guard g(mu_);
    ordered = ordered && t0 <= t1;
  }
  void step_end(int card, std::int64_t step, double) override {
    std::lock_guard g(mu_);
    step_ends.push_back(fmt::format("{} {}", card, step));
  }
  std::vector<std::string> ops, step_ends;
  bool ordered = true;

 private:
  std::mutex mu_;
};

struct Runs {
  DriverLog sim, real;
  OpRecorder sim_ops, real_ops;
  bool sim_ok = false, real_ok = false;
  std::string sim_error, real_error;
};

// Held by pointer: the recorders hold a mutex.
std::unique_ptr<Runs> run_both(const trace::Trace& t, const std::string& name,
                               double device_fraction) {
  auto out = std::make_unique<Runs>();
  Runs& r = *out;
  const std::vector<engine::Step> steps = engine::build_steps(t);
  // Simulated: links of a PCIe 4 card, 10 us per op.
  sim::SimOptions so;
  so.device_fraction = device_fraction;
  const mem::LinkModel pcie{25e9, 2e-6};
  so.links.links = {pcie, pcie, mem::LinkModel{2e9, 20e-6}, mem::LinkModel{3e9, 20e-6}};
  so.op_time = [](const trace::Op&) { return 10e-6; };
  auto pol = policy::make_tiering_policy(name, {.trace = t,
                                                .steps = steps,
                                                .h2d = pcie,
                                                .s2h = {},
                                                .has_ssd = false,
                                                .u3m = clock_free(),
                                                .design = design_clock_free()});
  so.policy = pol.get();
  so.log = &r.sim;
  so.observer = &r.sim_ops;
  const sim::SimReport s = sim::simulate_trace(t, steps, so);
  r.sim_ok = s.ok();
  r.sim_error = s.first_error;
  // Real: the same budgets (both take them as the fraction of the same
  // footprint; host twice the footprint), real bytes, memcpy links.
  ReplayOptions ro;
  ro.device_fraction = device_fraction;
  ro.policy = name;
  ro.u3m = clock_free();
  ro.design = design_clock_free();
  ro.log = &r.real;
  ro.observer = &r.real_ops;
  const ReplayReport rr = replay_trace(t, ro);
  r.real_ok = rr.ok();
  r.real_error = rr.first_error;
  EXPECT_EQ(rr.mismatches, 0u);
  // u3m and design-seed publish heat keys of each driver's clock: their
  // calls are compared, not the values; every other policy's scores are
  // exact on both sides.
  if (name == "u3m" || name == "design-seed") {
    r.sim = policy::without_scores(std::move(r.sim));
    r.real = policy::without_scores(std::move(r.real));
  }
  return out;
}

void expect_same(const Runs& r) {
  EXPECT_EQ(r.sim_ok, r.real_ok) << "simulated: " << r.sim_error << "\nreal: " << r.real_error;
  // The same driver ran both: the same ops, reported by it on either clock.
  EXPECT_EQ(r.sim_ops.ops, r.real_ops.ops);
  EXPECT_EQ(r.sim_ops.step_ends, r.real_ops.step_ends);
  EXPECT_TRUE(r.sim_ops.ordered && r.real_ops.ordered);
  const std::size_t n = std::min(r.sim.size(), r.real.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (r.sim[i] == r.real[i]) continue;
    ADD_FAILURE() << "call " << i << " differs: simulated " << describe(r.sim[i]) << ", real "
                  << describe(r.real[i]);
    return;
  }
  EXPECT_EQ(r.sim.size(), r.real.size());
}

trace::Trace generated(const std::string& args) {
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("u3m-diff-{}.u3mt", ::getpid()))
          .string();
  const auto g = testing::run_cli("trace gen --model tiny " + args + " -o " + path);
  EXPECT_EQ(g.status, 0) << g.output;
  trace::Trace t = trace::load_trace(path);
  std::filesystem::remove(path);
  return t;
}

class Differential : public ::testing::TestWithParam<std::string> {};

TEST_P(Differential, SimulatorAndReplayAskTheSameOnATrainingTrace) {
  static const trace::Trace t = generated("--workload train --steps 3");
  // Everything fits: every policy runs to the end; then under pressure, for
  // the policies that can evict.
  const auto roomy = run_both(t, GetParam(), 1.0);
  EXPECT_TRUE(roomy->sim_ok) << roomy->sim_error;
  EXPECT_GT(roomy->sim.size(), t.events.size() / 4);        // the log holds the run
  EXPECT_GT(roomy->sim_ops.ops.size(), t.ops.size() / 2);   // every op that computes
  EXPECT_EQ(roomy->sim_ops.step_ends.size(), 3u);           // one per training step
  expect_same(*roomy);
  expect_same(*run_both(t, GetParam(), 0.6));
}

TEST_P(Differential, SimulatorAndReplayAskTheSameOnAMixedTrace) {
  static const trace::Trace t = generated("--workload mixed --steps 2 --requests 4");
  expect_same(*run_both(t, GetParam(), 1.0));
  expect_same(*run_both(t, GetParam(), 0.6));
}

std::vector<std::string> names() {
  std::vector<std::string> n;
  for (const policy::PolicyInfo& p : policy::tiering_policies()) n.emplace_back(p.name);
  return n;
}
INSTANTIATE_TEST_SUITE_P(EveryPolicy, Differential, ::testing::ValuesIn(names()),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
}  // namespace u3m::drive
