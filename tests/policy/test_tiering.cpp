// The tiering policies (policy/tiering.hpp): the registry, the u3m policy's
// own decisions (periodic threshold recalibration, the link-time prefetch
// horizon), run in the simulator.
#include <stdexcept>

#include <gtest/gtest.h>

#include "u3m/policy/design_seed.hpp"
#include "u3m/policy/tiering.hpp"
#include "u3m/policy/u3m.hpp"
#include "u3m/predict/window_log.hpp"
#include "u3m/sim/runner.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/generate.hpp"
#include "u3m/workload/shape.hpp"

namespace u3m::policy {
namespace {

TEST(TieringPolicy, UnknownNameNamesTheFlagAndEveryChoice) {
  trace::Trace t;
  std::vector<Step> steps;
  try {
    make_tiering_policy("fifo", {.trace = t, .steps = steps}, "--policy");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--policy"), std::string::npos) << what;
    EXPECT_NE(what.find("fifo"), std::string::npos) << what;
    for (const PolicyInfo& p : tiering_policies())
      EXPECT_NE(what.find(p.name), std::string::npos) << what;
  }
}

TEST(TieringPolicy, EveryRegisteredPolicyIsMadeUnderItsName) {
  trace::Trace t;
  std::vector<Step> steps;
  for (const PolicyInfo& p : tiering_policies()) {
    EXPECT_FALSE(p.help.empty()) << p.name;
    EXPECT_EQ(make_tiering_policy(p.name, {.trace = t, .steps = steps})->name(), p.name);
  }
}

// A 3-step tiny-mha training trace with "HBM" a fraction of its footprint, 100 us
// per op, with the host link at `h2d_bw` bytes/s (simulated), under the
// policy `name`; with its u3m or design-seed stats.
struct PolicyRun {
  sim::SimReport rep;
  U3mPolicyStats stats;   // u3m
  DesignSeedStats design;  // design-seed
};
using U3mRun = PolicyRun;
trace::Trace tiny_trace() {
  workload::TrainConfig cfg;
  cfg.steps = 3;
  cfg.seq_len = 64;
  trace::Trace t;
  workload::generate_train(workload::preset("tiny-mha"), cfg, t);
  return t;
}
// `log`: the policy's shared window log (null: its own).
PolicyRun run_policy(const std::string& name, const trace::Trace& t, double device_fraction,
                     double h2d_bw = 5e9, const U3mPolicyOptions& opt = {},
                     DesignSeedOptions design = {},
                     std::shared_ptr<predict::WindowLog> log = nullptr) {
  const std::vector<Step> steps = sim::build_steps(t);
  sim::SimOptions o;
  o.device_fraction = device_fraction;
  o.links.links = {sim::LinkModel{h2d_bw, 1e-6}, sim::LinkModel{h2d_bw, 1e-6},
                   sim::LinkModel{1e9, 20e-6}, sim::LinkModel{2e9, 20e-6}};
  o.links.ssd_capacity = 1ull << 30;
  o.op_time = [](const trace::Op&) { return 100e-6; };
  PolicyInputs in{.trace = t,
                  .steps = steps,
                  .h2d = o.links.links[static_cast<int>(engine::Link::h2d)],
                  .s2h = o.links.links[static_cast<int>(engine::Link::s2h)],
                  .has_ssd = true,
                  .u3m = opt,
                  .design = design,
                  .window_log = std::move(log)};
  std::unique_ptr<TieringPolicy> pol = make_tiering_policy(name, in);
  o.policy = pol.get();
  PolicyRun r{sim::simulate_trace(t, steps, o), {}, {}};
  EXPECT_TRUE(r.rep.ok()) << name << ": " << r.rep.first_error;
  if (const U3mPolicyStats* u = u3m_stats(*pol)) r.stats = *u;
  if (const DesignSeedStats* d = design_seed_stats(*pol)) r.design = *d;
  EXPECT_EQ(u3m_stats(*pol) != nullptr, name == "u3m");
  EXPECT_EQ(design_seed_stats(*pol) != nullptr, name == "design-seed");
  return r;
}
U3mRun run_u3m_on(const trace::Trace& t, const U3mPolicyOptions& opt, double device_fraction,
                  double h2d_bw, std::shared_ptr<predict::WindowLog> log = nullptr) {
  return run_policy("u3m", t, device_fraction, h2d_bw, opt, {}, std::move(log));
}
U3mRun run_u3m(const U3mPolicyOptions& opt, double device_fraction, double h2d_bw) {
  return run_u3m_on(tiny_trace(), opt, device_fraction, h2d_bw);
}

// Note [Shared window log]: runs that read one log decide as runs with their
// own predictor, whether they replay it or (another horizon) fork.
TEST(U3mPolicy, RunsSharingAWindowLogDecideAsRunsWithTheirOwn) {
  const trace::Trace t = tiny_trace();
  for (bool jit : {false, true}) {
    SCOPED_TRACE(jit ? "jit prefetch" : "fixed window");
    U3mPolicyOptions opt;
    opt.jit_prefetch = jit;
    opt.demote_device = true;  // so the fixed window's policy acts
    auto same = [](const U3mRun& a, const U3mRun& b) {
      EXPECT_EQ(a.rep.total_ns, b.rep.total_ns);
      EXPECT_EQ(a.rep.stall_ns, b.rep.stall_ns);
      EXPECT_EQ(a.rep.steps, b.rep.steps);
      EXPECT_EQ(a.stats.demotions, b.stats.demotions);
      EXPECT_EQ(a.stats.recalibrations, b.stats.recalibrations);
      EXPECT_EQ(a.stats.jit_prefetches, b.stats.jit_prefetches);
      EXPECT_EQ(a.stats.horizon_ops, b.stats.horizon_ops);
    };
    const U3mRun own = run_u3m_on(t, opt, 0.9, 5e9);
    auto log = make_window_log(t);
    const U3mRun first = run_u3m_on(t, opt, 0.9, 5e9, log);
    const std::uint64_t computed = log->computed();
    EXPECT_GT(computed, 100u);
    const U3mRun second = run_u3m_on(t, opt, 0.9, 5e9, log);  // replays the first's calls
    EXPECT_EQ(log->computed(), computed);
    // Another link: other times, and with jit another window from the second iteration.
    const U3mRun slow_own = run_u3m_on(t, opt, 0.9, 1e9);
    const U3mRun slow = run_u3m_on(t, opt, 0.9, 1e9, log);
    same(own, first);
    same(own, second);
    same(slow_own, slow);
    EXPECT_GT(own.stats.demotions + own.stats.jit_prefetches, 0u);  // the policy acts
  }
  // A log of another trace is a caller's bug, not a silent misprediction.
  const trace::Trace other = tiny_trace();
  EXPECT_THROW(run_u3m_on(t, U3mPolicyOptions{}, 0.9, 5e9, make_window_log(other)),
               std::logic_error);
}

TEST(TieringPolicy, OnlyU3mReportsItsCounters) {
  trace::Trace t;
  std::vector<Step> steps;
  EXPECT_EQ(u3m_stats(*make_tiering_policy("lru", {.trace = t, .steps = steps})), nullptr);
}

// The design's refcount: distinct ops by name, the same op in every
// iteration counted once; a tensor no op names counts 1.
TEST(DesignSeed, RefcountIsTheDistinctOpsThatReferenceATensor) {
  trace::Trace t;
  for (const char* n : {"w", "x", "unused"}) t.tensors.push_back({.name = n, .bytes = 1000});
  auto op = [&t](const char* name, std::uint32_t it) {
    t.ops.push_back({.name = name, .iteration = it});
    return static_cast<std::uint32_t>(t.ops.size() - 1);
  };
  auto use = [&t](std::uint32_t o, std::uint32_t tensor) {
    t.events.push_back({.op = o, .tensor = tensor, .kind = trace::EventKind::read});
  };
  for (std::uint32_t it = 0; it < 3; ++it) {
    const std::uint32_t fwd = op("fwd", it), bwd = op("bwd", it), opt = op("step", it);
    use(fwd, 0);
    use(fwd, 0);  // two events of one op count once
    use(bwd, 0);
    use(opt, 0);
    use(fwd, 1);
  }
  const std::vector<std::uint32_t> rc = op_refcounts(t);
  ASSERT_EQ(rc.size(), 3u);
  EXPECT_EQ(rc[0], 3u);
  EXPECT_EQ(rc[1], 1u);
  EXPECT_EQ(rc[2], 1u);
}

// Note [Design seed]: the seed rules place state even where everything fits
// (Adam v on the SSD, off-path layers' parameters in DRAM), which a policy
// that only evicts under pressure never does.
TEST(DesignSeed, PlacesStateByTheSeedRulesEvenWhereItFits) {
  const trace::Trace t = tiny_trace();
  const PolicyRun d = run_policy("design-seed", t, 1.0);
  const PolicyRun lru = run_policy("lru", t, 1.0);
  EXPECT_GT(d.rep.peak_ssd, 0u);  // v sent to the SSD
  EXPECT_EQ(lru.rep.peak_ssd, 0u);
  EXPECT_GT(d.design.placement_demotions, 0u);
  EXPECT_GT(d.design.layer_prefetches, 0u);
  EXPECT_LT(d.rep.peak_device, lru.rep.peak_device);  // off-path layers left the device
  EXPECT_TRUE(d.design.calibrated);
  EXPECT_EQ(design_seed_stats(*make_tiering_policy(
                "u3m", {.trace = t, .steps = sim::build_steps(t)})),
            nullptr);
}

// The design's 30 s period on the driver's clock: a run shorter than it
// never recalibrates; with a period of 1 ms, about once per ms of the run.
TEST(DesignSeed, RecalibratesEveryPeriodOfTheDriversClock) {
  const trace::Trace t = tiny_trace();
  const PolicyRun slow = run_policy("design-seed", t, 0.6);
  EXPECT_LT(double(slow.rep.total_ns) * 1e-9, 30.0);
  EXPECT_EQ(slow.design.recalibrations, 0u);
  const PolicyRun fast = run_policy("design-seed", t, 0.6, 5e9, {}, {.recalibrate_period_s = 1e-3});
  const double periods = double(fast.rep.total_ns) * 1e-6;  // run length in ms
  ASSERT_GT(periods, 5.0);
  // Decisions come at op boundaries (100 us apart): one per period, give or take.
  EXPECT_GE(double(fast.design.recalibrations), periods * 0.8 - 1);
  EXPECT_LE(double(fast.design.recalibrations), periods + 1);
  EXPECT_GT(fast.design.heat_demotions, 0u);
}

// Note [ZeRO-Infinity]: the optimizer state rests on the SSD and each host
// Adam step finds it in DRAM, read ahead; zero-offload never touches the SSD.
TEST(ZeroInfinity, OptimizerStateRestsOnTheSsdAndIsReadAhead) {
  const trace::Trace t = tiny_trace();
  const PolicyRun inf = run_policy("zero-infinity", t, 1.0);
  const PolicyRun off = run_policy("zero-offload", t, 1.0);
  auto link = [](const PolicyRun& r, engine::Link l) {
    return r.rep.links[static_cast<int>(l)].bytes;
  };
  EXPECT_EQ(link(off, engine::Link::h2s) + link(off, engine::Link::s2h), 0u);
  EXPECT_GT(inf.rep.peak_ssd, 0u);
  // Every step after the first reads the state back and writes it again.
  std::uint64_t state = 0;
  for (const trace::Tensor& x : t.tensors)
    if (optimizer_role(x.role)) state += x.bytes;
  EXPECT_GE(link(inf, engine::Link::s2h), state);
  EXPECT_GE(link(inf, engine::Link::h2s), 2 * state);
  // The reads were prefetches that the Adam steps then hit.
  EXPECT_GT(inf.rep.engine.prefetch_hits, 0u);
  EXPECT_GT(inf.rep.engine.prefetch_hits, off.rep.engine.prefetch_hits);
}

TEST(U3mPolicy, RecalibrationCalibratesAfterTheFirstIterationAndDemotes) {
  U3mPolicyOptions on;
  on.jit_prefetch = false;  // the recalibration alone
  on.demote_device = true;  // and the design's device demotions
  const U3mRun a = run_u3m(on, 0.9, 5e9);
  // A tenth of an iteration per period over the last two iterations: ~20.
  EXPECT_GE(a.stats.recalibrations, 10u);
  EXPECT_GT(a.stats.demotions, 0u);
  EXPECT_GT(a.stats.hot, 0.0);
  EXPECT_GE(a.stats.hot, a.stats.warm);

  U3mPolicyOptions off = on;
  off.recalibrate = false;
  const U3mRun b = run_u3m(off, 0.9, 5e9);
  EXPECT_EQ(b.stats.recalibrations, 0u);
  EXPECT_EQ(b.stats.demotions, 0u);
  EXPECT_EQ(b.rep.steps, a.rep.steps);
  // Demotions are real moves: the demoting run writes back more or drops
  // more clean copies.
  EXPECT_GT(a.rep.engine.evictions, b.rep.engine.evictions);
}

TEST(U3mPolicy, AFixedPeriodSetsHowOftenItRecalibrates) {
  U3mPolicyOptions slow;
  slow.jit_prefetch = false;
  slow.recalibrate_period_s = 1000;  // longer than the run: never after calibration
  EXPECT_EQ(run_u3m(slow, 0.5, 5e9).stats.recalibrations, 0u);
}

TEST(U3mPolicy, PrefetchHorizonFollowsTheLinkTransferTime) {
  U3mPolicyOptions jit;
  jit.recalibrate = false;
  jit.jit_prefetch = true;
  jit.jit.min_ops = 1;  // tiny tensors: let the window go below the usual floor
  const U3mRun fast = run_u3m(jit, 0.9, 25e9);
  const U3mRun slow = run_u3m(jit, 0.9, 200e6);
  // The slowest fetch is the SSD's bytes plus the host link's: 125x slower
  // host link, same SSD.
  EXPECT_GT(slow.stats.max_fetch_s, 5 * fast.stats.max_fetch_s);
  auto window_s = [](const U3mRun& r) { return r.stats.horizon_ops * r.stats.horizon_op_s; };
  for (const U3mRun* r : {&fast, &slow}) {
    EXPECT_GE(r->stats.horizon_ops, jit.jit.min_ops);
    EXPECT_LE(r->stats.horizon_ops, jit.jit.max_ops);
    // The window, in time, covers the slowest fetch with its margin.
    EXPECT_GE(window_s(*r), r->stats.max_fetch_s * jit.jit.factor);
    EXPECT_GT(r->stats.jit_prefetches, 0u);
  }
  EXPECT_GT(window_s(slow), window_s(fast));
  EXPECT_GT(slow.stats.horizon_ops, fast.stats.horizon_ops);

  U3mPolicyOptions fixed = jit;
  fixed.jit_prefetch = false;
  const U3mRun f = run_u3m(fixed, 0.5, 25e9);
  EXPECT_EQ(f.stats.horizon_ops, 16u);
  EXPECT_EQ(f.stats.jit_prefetches, 0u);
}

}  // namespace
}  // namespace u3m::policy
