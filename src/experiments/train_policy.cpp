// The training policies (Note [Training policies] in train_policy.hpp).
#include "u3m/experiments/train_policy.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>

#include "u3m/policy/heat.hpp"
#include "u3m/policy/placement.hpp"
#include "u3m/policy/prefetch.hpp"
#include "u3m/predict/predictor.hpp"
#include "u3m/util/error.hpp"

namespace u3m::experiments {

using engine::Tier;
using sim::PrefetchContext;
using trace::Role;

bool optimizer_role(Role r) {
  return r == Role::optim_master || r == Role::optim_m || r == Role::optim_v;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The trace index of an engine id (PrefetchContext::engine_id's inverse).
std::uint32_t tensor_of(engine::TensorId id) {
  return static_cast<std::uint32_t>(id - 1);
}

// Next use of each tensor after the current step, from the whole trace (the
// oracle's knowledge).
class NextUse {
 public:
  explicit NextUse(const std::vector<sim::Step>& steps, std::size_t tensors)
      : uses_(tensors), pos_(tensors, 0) {
    for (std::size_t j = 0; j < steps.size(); ++j) {
      for (const sim::Touch& t : steps[j].touches) uses_[t.tensor].push_back(j);
    }
  }
  void at(std::size_t step) { now_ = step; }
  // Steps until the next use after now; +inf if never.
  double distance(std::uint32_t t) {
    auto& u = uses_[t];
    std::size_t& p = pos_[t];
    while (p < u.size() && u[p] <= now_) ++p;
    return p < u.size() ? static_cast<double>(u[p] - now_) : kInf;
  }

 private:
  std::vector<std::vector<std::size_t>> uses_;
  std::vector<std::size_t> pos_;
  std::size_t now_ = 0;
};

// Note [Recalibration in runs]
// The heat thresholds decide where a tensor rests between uses
// (Thresholds::tier_for): at each recalibration, device copies colder than
// `hot` that the predictor does not expect within its window are demoted to
// DRAM, and DRAM-only data colder than `warm` to the SSD, at write-back
// priority, so room is made before a fetch needs it rather than by an
// eviction on the fetch's critical path. The first thresholds come from
// calibrate() over the heat of every tensor that holds data at the end of
// the first iteration (the first point where every tensor has been used at
// its steady rate); after that, every period, the Recalibrator moves `hot`
// to keep HBM use in [75%, 90%]. The period is virtual time, a tenth of the
// first iteration by default: the design's 30 s assumes hour-long jobs, and a
// simulated run is 3 steps of 0.2-80 s each, so a fixed 30 s would never
// fire in most runs. Tensors leased, moving or in the window are never
// demoted.
//
// Prefetch, with U3mPolicyOptions::jit_prefetch (Note [Just-in-time
// prefetch] in policy/prefetch.hpp): what enters the predictor's window
// waits in `pending` with its predicted step; at each op, a pending tensor
// off the device is fetched once its time to use (from the previous
// iteration's op times, Note [Iteration profile]) falls within its transfer
// time from the tier it is in plus what this policy already queued on that
// link, with the margin. The window is 16 ops during the first iteration,
// then IterationProfile::horizon_ops of the slowest fetch (largest tensor
// from its home tier). Only the policy's own prefetches count as queued:
// the engine's queues are private, so demand fetches and write-backs are
// left to the margin. Without the option, what enters a fixed 16-op window
// is prefetched at once (docs/policy.md compares the two).
struct U3mState {
  // The predictor's answers; its feed gives each step's events.
  std::optional<predict::WindowLog::Reader> window;
  const predict::TraceFeed* feed = nullptr;
  policy::HeatTracker heat;
  std::vector<std::uint8_t> in_window;
  std::uint64_t now_ns = 0;
  std::uint32_t horizon = 16;
  bool host_optimizer = false;
  U3mPolicyOptions opt;
  bool has_ssd = false;

  // Just-in-time prefetch.
  struct Pending {
    std::uint32_t tensor;
    std::size_t step;  // predicted step of its next use
  };
  std::vector<Pending> pending, keep;
  policy::OpClock clock;
  policy::IterationProfile profile;
  policy::LinkBacklog h2d, s2h;
  double max_fetch_s = 0;  // the slowest tensor's fetch from its home tier

  // Recalibration.
  bool calibrated = false;
  std::uint64_t start_ns = 0;
  bool started = false;
  std::uint32_t first_iteration = 0;
  policy::Thresholds th{0, 0};  // calibrated at the end of the first iteration
  policy::Recalibrator rc;
  U3mPolicyStats stats;

  bool holds_host_state(const trace::Tensor& x) const {
    return host_optimizer && optimizer_role(x.role);
  }
  void on_step(std::size_t j, PrefetchContext& ctx);
  void end_of_first_iteration(PrefetchContext& ctx);
  void recalibrate(PrefetchContext& ctx);
  void issue_due(std::size_t j, PrefetchContext& ctx);
};

void U3mState::on_step(std::size_t j, PrefetchContext& ctx) {
  now_ns = ctx.now_ns();
  clock.tick(now_ns);
  const trace::Trace& tr = ctx.trace();
  const std::uint32_t iteration = tr.ops[ctx.steps()[j].op].iteration;
  profile.tick(iteration, now_ns);
  if (!started) {
    started = true;
    start_ns = now_ns;
    first_iteration = iteration;
  } else if (!calibrated && iteration != first_iteration) {
    end_of_first_iteration(ctx);
  }
  for (std::size_t e = feed->step_begin(j); e < feed->step_begin(j + 1); ++e) {
    const trace::Event& ev = tr.events[e];
    if (predict::is_access(ev.kind)) heat.access(ev.tensor, now_ns);
  }
  // The predictor sees the step on virtual time, not the trace's nominal stamps.
  const predict::WindowLog::Delta d = window->step(j, horizon, now_ns);
  for (std::uint32_t x : d.left) in_window[x] = 0;
  for (const predict::Predicted& x : d.entered) {
    in_window[x.tensor] = 1;
    // State the host optimizer works on stays in DRAM.
    if (holds_host_state(tr.tensors[x.tensor])) continue;
    if (opt.jit_prefetch)
      pending.push_back({x.tensor, j + 1 + x.ops_ahead});
    else
      ctx.prefetch(x.tensor);
  }
  if (opt.jit_prefetch) issue_due(j, ctx);
  if (opt.recalibrate && calibrated && now_ns >= rc.last_ns + rc.period_ns) recalibrate(ctx);
  stats.hot = th.hot;
  stats.warm = th.warm;
  stats.horizon_ops = horizon;
  stats.mean_op_s = clock.mean_s();
}

void U3mState::issue_due(std::size_t j, PrefetchContext& ctx) {
  const trace::Trace& tr = ctx.trace();
  const double op_s = clock.mean_s();
  keep.clear();
  for (const Pending& p : pending) {
    if (!in_window[p.tensor]) continue;  // withdrawn
    const auto r = ctx.engine().residency(PrefetchContext::engine_id(p.tensor));
    if (!r) continue;
    if (r->valid[static_cast<int>(Tier::device)]) {
      // On the device now, but pressure may still push it out before its
      // use: watch it until then.
      if (p.step > j) keep.push_back(p);
      continue;
    }
    if (!r->valid[static_cast<int>(Tier::host)] && !r->valid[static_cast<int>(Tier::ssd)]) {
      if (p.step > j) keep.push_back(p);  // no data yet: written before its use, maybe
      continue;
    }
    const bool from_ssd = !r->valid[static_cast<int>(Tier::host)];
    const std::uint64_t bytes = tr.tensors[p.tensor].bytes;
    const double until_s = profile.until_s(p.step > j ? p.step - j : 0, op_s);
    const double transfer_s =
        policy::fetch_seconds(bytes, from_ssd ? Tier::ssd : Tier::host, h2d.link(), s2h.link());
    const double queued_s = h2d.ahead_s(now_ns) + (from_ssd ? s2h.ahead_s(now_ns) : 0.0);
    if (!policy::prefetch_due(until_s, transfer_s, queued_s, op_s, opt.jit)) {
      keep.push_back(p);
      continue;
    }
    ctx.prefetch(p.tensor);
    ++stats.jit_prefetches;
    if (from_ssd) s2h.book(bytes, now_ns);
    h2d.book(bytes, now_ns);
  }
  pending.swap(keep);
}

void U3mState::end_of_first_iteration(PrefetchContext& ctx) {
  calibrated = true;
  const engine::Engine& eng = ctx.engine();
  std::vector<policy::HeatSample> samples;
  for (std::uint32_t i = 0; i < in_window.size(); ++i) {
    const auto r = eng.residency(PrefetchContext::engine_id(i));
    if (!r || !(r->valid[0] || r->valid[1] || r->valid[2])) continue;  // holds no data
    samples.push_back({heat.heat(i, now_ns), ctx.trace().tensors[i].bytes});
  }
  th = policy::calibrate(std::move(samples), eng.config().device.capacity,
                         eng.config().host.capacity);
  const double first_s = static_cast<double>(now_ns - start_ns) * 1e-9;
  const double period_s = opt.recalibrate_period_s > 0 ? opt.recalibrate_period_s : first_s / 10;
  rc.period_ns = static_cast<std::uint64_t>(period_s * 1e9);
  rc.last_ns = now_ns;
  stats.max_fetch_s = max_fetch_s;
  stats.horizon_op_s = clock.mean_s();
  if (opt.jit_prefetch) horizon = profile.horizon_ops(max_fetch_s, clock.mean_s(), opt.jit);
}

void U3mState::recalibrate(PrefetchContext& ctx) {
  const engine::Engine& eng = ctx.engine();
  const engine::EngineStats es = eng.stats();
  const double use = static_cast<double>(es.used[static_cast<int>(Tier::device)]) /
                     static_cast<double>(eng.config().device.capacity);
  rc.maybe_adjust(th, use, now_ns);
  rc.last_ns = now_ns;  // also when it left the thresholds alone
  ++stats.recalibrations;
  for (std::uint32_t i = 0; i < in_window.size(); ++i) {
    if (in_window[i]) continue;
    // What its heat wants on the device stays wherever it is: heat first, so
    // the engine is asked only about the others. A tensor whose heat at its
    // last access was not above `hot` is not now (HeatTracker::peak): its
    // exact heat is needed only to tell DRAM from SSD.
    std::optional<Tier> want;
    if (heat.peak(i) > th.hot) {
      want = th.tier_for(heat.heat(i, now_ns));
      if (*want == Tier::device) continue;
    }
    const auto r = eng.residency(PrefetchContext::engine_id(i));
    if (!r || r->in_flight || r->readers > 0 || r->writer) continue;
    if (r->valid[static_cast<int>(Tier::device)]) {
      ctx.demote(i, Tier::device);
      ++stats.demotions;
    } else if (has_ssd && r->valid[static_cast<int>(Tier::host)] &&
               !r->valid[static_cast<int>(Tier::ssd)]) {
      if (!want) want = th.tier_for(heat.heat(i, now_ns));
      if (*want != Tier::ssd) continue;
      ctx.demote(i, Tier::host);
      ++stats.demotions;
    }
  }
}

}  // namespace

std::shared_ptr<predict::WindowLog> make_window_log(const trace::Trace& t) {
  return std::make_shared<predict::WindowLog>(t, "u3m-seq");
}

TrainPolicy make_train_policy(const std::string& name, const TrainPolicyInputs& in) {
  const trace::Trace& t = in.trace;
  const std::vector<sim::Step>& steps = in.steps;
  const bool host_optimizer = in.host_optimizer;
  TrainPolicy p;
  // Loaded weights and optimizer state rest on the device for the untiered
  // policies, in DRAM where the placement rules say for the tiered ones.
  p.home = [](const trace::Tensor&) { return Tier::device; };
  const policy::PlacementRules rules = policy::PlacementRules::named("u3m");
  auto placed = [rules](const trace::Tensor& x) {
    Tier h = rules.home(x.role, x.layer, trace::kNoLayer);
    return h == Tier::ssd ? Tier::host : h;  // created in DRAM; pressure spills it to SSD
  };
  if (name == "hbm-only") {
    p.victim = [](engine::TensorId, Tier) { return kInf; };
    p.prefetch = sim::no_prefetch();
  } else if (name == "static-offload") {
    p.optimizer_on_host = true;
    p.home = [](const trace::Tensor& x) {
      return optimizer_role(x.role) ? Tier::host : Tier::device;
    };
    p.victim = [&t](engine::TensorId id, Tier tier) {
      if (tier != Tier::device) return 0.0;
      return optimizer_role(t.tensors[tensor_of(id)].role) ? 0.0 : kInf;
    };
    p.prefetch = sim::lookahead_prefetch(2);
  } else if (name == "lru") {
    p.home = placed;
    p.prefetch = sim::no_prefetch();
  } else if (name == "u3m") {
    p.optimizer_on_host = host_optimizer;
    p.home = placed;
    auto st = std::make_shared<U3mState>();
    st->host_optimizer = host_optimizer;
    st->opt = in.u3m;
    st->has_ssd = in.links.ssd_capacity > 0;
    auto log = in.window_log ? in.window_log : make_window_log(t);
    if (&log->feed().trace() != &t)
      throw std::logic_error("make_train_policy: the window log is of another trace");
    st->feed = &log->feed();
    st->window.emplace(std::move(log));
    st->in_window.assign(t.tensors.size(), 0);
    const auto& h2d = in.links.links[static_cast<int>(engine::Link::h2d)];
    const auto& s2h = in.links.links[static_cast<int>(engine::Link::s2h)];
    st->h2d = policy::LinkBacklog({h2d.bandwidth, h2d.latency_s});
    st->s2h = policy::LinkBacklog({s2h.bandwidth, s2h.latency_s});
    for (std::uint32_t i = 0; i < t.tensors.size(); ++i) {
      const trace::Tensor& x = t.tensors[i];
      st->heat.set_tensor(i, x.bytes);
      if (st->holds_host_state(x) || !(h2d.bandwidth > 0)) continue;
      const Tier from = st->has_ssd && s2h.bandwidth > 0
                            ? rules.home(x.role, x.layer, trace::kNoLayer)
                            : Tier::host;
      st->max_fetch_s = std::max(
          st->max_fetch_s, policy::fetch_seconds(x.bytes, from == Tier::device ? Tier::host : from,
                                                 st->h2d.link(), st->s2h.link()));
    }
    p.victim = [st](engine::TensorId id, Tier) {
      const std::uint32_t i = tensor_of(id);
      // Expected soon: keep, unless nothing else can go (large, finite).
      return st->heat.heat(i, st->now_ns) + (st->in_window[i] ? 1e12 : 0.0);
    };
    p.prefetch = [st](std::size_t j, PrefetchContext& ctx) { st->on_step(j, ctx); };
    p.u3m_stats = std::shared_ptr<const U3mPolicyStats>(st, &st->stats);
  } else if (name == "oracle") {
    p.optimizer_on_host = host_optimizer;
    p.home = placed;
    auto next = std::make_shared<NextUse>(steps, t.tensors.size());
    p.victim = [next](engine::TensorId id, Tier) {
      return -next->distance(tensor_of(id));  // farthest first
    };
    auto ahead = sim::lookahead_prefetch(8);
    p.prefetch = [next, ahead](std::size_t j, PrefetchContext& ctx) {
      next->at(j);
      ahead(j, ctx);
    };
  } else {
    input_error("--policy",
                "unknown policy '{}' (expected hbm-only, static-offload, lru, u3m or oracle)",
                name);
  }
  return p;
}

}  // namespace u3m::experiments
