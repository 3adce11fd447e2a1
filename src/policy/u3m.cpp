// u3m: the project's training policy (Note [Tiering policy] in tiering.hpp).
// The optimizer runs where the step is faster (the caller's choice, Note
// [Optimizer placement] in experiments/train.cpp); victims by ascending heat
// (MISSION.md item 2), except tensors the predictor expects within its
// window; prefetch what enters the predictor's window (u3m-seq, online), or,
// as an option, just in time for the link (Note [Just-in-time prefetch] in
// prefetch.hpp); heat thresholds recalibrated during the run demote what is
// colder than its tier (Note [Recalibration in runs]).
#include "u3m/policy/u3m.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

#include "policies.hpp"
#include "u3m/policy/heat.hpp"
#include "u3m/policy/placement.hpp"
#include "u3m/predict/predictor.hpp"
#include "u3m/predict/window_log.hpp"

namespace u3m::policy {

std::shared_ptr<predict::WindowLog> make_window_log(const trace::Trace& t,
                                                    std::string_view predictor) {
  return std::make_shared<predict::WindowLog>(t, std::string(predictor));
}

namespace {

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
// demoted. Device copies are demoted only with
// U3mPolicyOptions::demote_device: the engine already evicts by heat above
// its watermark, and the sweep's demotions only moved bytes that came back
// (a run started on the device lost 8.2% at llama-L43-d4480, grad-accum 8,
// with them, 3.7% without; demoting only above the engine's low watermark
// lost 8.2% too). The device threshold `hot` still moves with the band.
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
//
// Victim scores (Note [Published victim scores] in engine.hpp): the heat's
// order key (Note [Heat order key] in heat.hpp), plus kInWindow for a tensor
// the predictor expects within its window (kept unless nothing else can go:
// large, finite). Published after each step for the tensors it accessed and
// those that entered or left the window.
constexpr double kInWindow = 1e12;

// Note [Layer-ahead streaming]
// A ZeRO-3 gather reads the layer's weight shards; with the shards in DRAM
// (frozen LoRA weights, or a model whose shards do not fit) each must cross
// the host link before its gather. A 16-op window reaches the next gather
// only once the current layer's own gather is done, leaving the link the
// few compute ops of the layer; issued at the current gather instead, the
// next layer's shards have the whole layer (its gather on the card link,
// which the host link does not share). The trace gives the gathers' order,
// the same every iteration (what a framework's module order gives).

class U3mPolicy final : public TieringPolicy {
 public:
  explicit U3mPolicy(const PolicyInputs& in);
  std::string_view name() const override { return "u3m"; }
  engine::Engine::VictimOrder victim_order() const override {
    return engine::Engine::VictimOrder::scores;
  }
  engine::Engine::Scores initial_scores(std::uint32_t tensor, std::size_t) const override {
    const double s = score(tensor);
    return {s, s};
  }
  std::optional<Tier> home_tier(const trace::Tensor& x) const override {
    return tiered_home(x, device_home, host_optimizer);
  }
  bool optimizer_on_host() const override { return host_optimizer; }
  void on_step(std::size_t j, StepContext& ctx) override;
  const U3mPolicyStats& stats() const { return stats_; }

 private:
  double score(std::uint32_t t) const {
    const double k = heat.order_key(t);
    // Never accessed (key -inf): below every accessed tensor in the window
    // too (keys are within +-1e6: log of count x scale, plus seconds / window).
    return in_window[t] ? kInWindow + (std::isfinite(k) ? k : -1e9) : k;
  }
  void changed(std::uint32_t t) { changed_.mark(t); }
  void publish(StepContext& ctx);
  bool holds_host_state(const trace::Tensor& x) const {
    return host_optimizer && optimizer_role(x.role);
  }
  void end_of_first_iteration(StepContext& ctx);
  void recalibrate(StepContext& ctx);
  void issue_due(std::size_t j, StepContext& ctx);

  // The predictor's answers; its feed gives each step's events.
  std::optional<predict::WindowLog::Reader> window;
  const predict::TraceFeed* feed = nullptr;
  HeatTracker heat;
  std::vector<std::uint8_t> in_window;
  std::uint64_t now_ns = 0;
  std::uint32_t horizon = 16;
  bool host_optimizer = false;
  bool device_home = false;
  U3mPolicyOptions opt;
  bool has_ssd = false;

  // Just-in-time prefetch.
  struct Pending {
    std::uint32_t tensor;
    std::size_t step;  // predicted step of its next use
  };
  std::vector<Pending> pending, keep;
  OpClock clock;
  IterationProfile profile;
  LinkBacklog h2d, s2h;
  double max_fetch_s = 0;  // the slowest tensor's fetch from its home tier

  // Recalibration.
  bool calibrated = false;
  std::uint64_t start_ns = 0;
  bool started = false;
  std::uint32_t first_iteration = 0;
  Thresholds th{0, 0};  // calibrated at the end of the first iteration
  Recalibrator rc;
  U3mPolicyStats stats_;

  // Scores to publish after this step.
  ChangedScores changed_;
  // Layer-ahead streaming: by step, the next gather step (SIZE_MAX: none).
  std::vector<std::size_t> next_gather_;
};

U3mPolicy::U3mPolicy(const PolicyInputs& in)
    : host_optimizer(in.host_optimizer),
      device_home(in.device_home),
      opt(in.u3m),
      has_ssd(in.has_ssd),
      h2d(in.h2d),
      s2h(in.s2h) {
  const trace::Trace& t = in.trace;
  auto log = in.window_log ? in.window_log : make_window_log(t);
  if (&log->feed().trace() != &t)
    throw std::logic_error("u3m policy: the window log is of another trace");
  feed = &log->feed();
  window.emplace(std::move(log));
  in_window.assign(t.tensors.size(), 0);
  if (opt.stream_layer_ahead) next_gather_ = next_gathers(t, in.steps);
  for (std::uint32_t i = 0; i < t.tensors.size(); ++i) {
    const trace::Tensor& x = t.tensors[i];
    heat.set_tensor(i, x.bytes);
    if (holds_host_state(x) || !(in.h2d.bandwidth > 0)) continue;
    const Tier from = has_ssd && in.s2h.bandwidth > 0
                          ? seed_rules().home(x.role, x.layer, trace::kNoLayer)
                          : Tier::host;
    max_fetch_s = std::max(
        max_fetch_s,
        fetch_seconds(x.bytes, from == Tier::device ? Tier::host : from, h2d.link(), s2h.link()));
  }
}

void U3mPolicy::publish(StepContext& ctx) {
  changed_.publish(ctx, [this](std::uint32_t t) { return score(t); });
}

void U3mPolicy::on_step(std::size_t j, StepContext& ctx) {
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
    if (predict::is_access(ev.kind)) {
      heat.access(ev.tensor, now_ns);
      changed(ev.tensor);
    }
  }
  // The predictor sees the step on virtual time, not the trace's nominal stamps.
  const predict::WindowLog::Delta d = window->step(j, horizon, now_ns);
  for (std::uint32_t x : d.left) {
    in_window[x] = 0;
    changed(x);
  }
  for (const predict::Predicted& x : d.entered) {
    in_window[x.tensor] = 1;
    changed(x.tensor);
  }
  // Before any prefetch: the room a prefetch makes must spare what just
  // entered the window.
  publish(ctx);
  for (const predict::Predicted& x : d.entered) {
    // State the host optimizer works on stays in DRAM.
    if (holds_host_state(tr.tensors[x.tensor])) continue;
    if (opt.jit_prefetch)
      pending.push_back({x.tensor, j + 1 + x.ops_ahead});
    else
      ctx.prefetch(x.tensor);
  }
  if (opt.jit_prefetch) issue_due(j, ctx);
  stream_layer_ahead(j, next_gather_, ctx);
  if (opt.recalibrate && calibrated && now_ns >= rc.last_ns + rc.period_ns) recalibrate(ctx);
  stats_.hot = th.hot;
  stats_.warm = th.warm;
  stats_.horizon_ops = horizon;
  stats_.mean_op_s = clock.mean_s();
}

void U3mPolicy::issue_due(std::size_t j, StepContext& ctx) {
  const trace::Trace& tr = ctx.trace();
  const double op_s = clock.mean_s();
  keep.clear();
  for (const Pending& p : pending) {
    if (!in_window[p.tensor]) continue;  // withdrawn
    const auto r = ctx.engine().residency(StepContext::engine_id(p.tensor));
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
        fetch_seconds(bytes, from_ssd ? Tier::ssd : Tier::host, h2d.link(), s2h.link());
    const double queued_s = h2d.ahead_s(now_ns) + (from_ssd ? s2h.ahead_s(now_ns) : 0.0);
    if (!prefetch_due(until_s, transfer_s, queued_s, op_s, opt.jit)) {
      keep.push_back(p);
      continue;
    }
    ctx.prefetch(p.tensor);
    ++stats_.jit_prefetches;
    if (from_ssd) s2h.book(bytes, now_ns);
    h2d.book(bytes, now_ns);
  }
  pending.swap(keep);
}

void U3mPolicy::end_of_first_iteration(StepContext& ctx) {
  calibrated = true;
  th = calibrate_on_held(ctx, [&](std::uint32_t t) { return heat.heat(t, now_ns); });
  const double first_s = static_cast<double>(now_ns - start_ns) * 1e-9;
  const double period_s = opt.recalibrate_period_s > 0 ? opt.recalibrate_period_s : first_s / 10;
  rc.period_ns = static_cast<std::uint64_t>(period_s * 1e9);
  rc.last_ns = now_ns;
  stats_.max_fetch_s = max_fetch_s;
  stats_.horizon_op_s = clock.mean_s();
  if (opt.jit_prefetch) horizon = profile.horizon_ops(max_fetch_s, clock.mean_s(), opt.jit);
}

void U3mPolicy::recalibrate(StepContext& ctx) {
  const engine::Engine& eng = ctx.engine();
  const engine::EngineStats es = eng.stats();
  const double use = static_cast<double>(es.used[static_cast<int>(Tier::device)]) /
                     static_cast<double>(eng.config().device.capacity);
  rc.maybe_adjust(th, use, now_ns);
  rc.last_ns = now_ns;  // also when it left the thresholds alone
  ++stats_.recalibrations;
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
    const auto r = eng.residency(StepContext::engine_id(i));
    if (!r || r->in_flight || r->readers > 0 || r->writer) continue;
    if (r->valid[static_cast<int>(Tier::device)]) {
      if (!opt.demote_device) continue;
      ctx.demote(i, Tier::device);
      ++stats_.demotions;
    } else if (has_ssd && r->valid[static_cast<int>(Tier::host)] &&
               !r->valid[static_cast<int>(Tier::ssd)]) {
      if (!want) want = th.tier_for(heat.heat(i, now_ns));
      if (*want != Tier::ssd) continue;
      ctx.demote(i, Tier::host);
      ++stats_.demotions;
    }
  }
}

}  // namespace

std::unique_ptr<TieringPolicy> make_u3m(const PolicyInputs& in) {
  return std::make_unique<U3mPolicy>(in);
}

const U3mPolicyStats* u3m_stats(const TieringPolicy& p) {
  const auto* u = dynamic_cast<const U3mPolicy*>(&p);
  return u ? &u->stats() : nullptr;
}

}  // namespace u3m::policy
