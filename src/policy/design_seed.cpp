// design-seed: the design's own training policy, as MISSION.md gives it
// (Note [Design seed]), beside u3m so the design's claims can be checked.
#include "u3m/policy/design_seed.hpp"

#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "policies.hpp"
#include "u3m/policy/heat.hpp"
#include "u3m/predict/window_log.hpp"

namespace u3m::policy {

std::vector<std::uint32_t> op_refcounts(const trace::Trace& t) {
  // Distinct op names per tensor: an op has the same name in every
  // iteration, so a weight read by the same three ops each step counts 3.
  std::unordered_map<std::string_view, std::uint32_t> name_id;
  std::vector<std::uint32_t> op_name(t.ops.size());
  for (std::size_t i = 0; i < t.ops.size(); ++i)
    op_name[i] = name_id.try_emplace(t.ops[i].name, name_id.size()).first->second;
  std::vector<std::uint32_t> count(t.tensors.size(), 0);
  std::vector<std::uint32_t> last(t.tensors.size(), UINT32_MAX);  // the last name counted
  std::vector<std::vector<std::uint32_t>> seen(t.tensors.size());
  for (const trace::Event& e : t.events) {
    if (e.op >= t.ops.size() || e.tensor >= t.tensors.size()) continue;
    const std::uint32_t n = op_name[e.op];
    if (last[e.tensor] == n) continue;  // the common case: events of one op in a row
    last[e.tensor] = n;
    auto& s = seen[e.tensor];
    bool known = false;
    for (std::uint32_t x : s) known = known || x == n;
    if (known) continue;
    s.push_back(n);
    ++count[e.tensor];
  }
  for (std::uint32_t& c : count) c = std::max<std::uint32_t>(c, 1);
  return count;
}

namespace {

// Note [Design seed]
// The design's policy, each part from MISSION.md and nothing of u3m's own:
//  * heat = (accesses / window) x log2(1 + refcount) / size_MB (item 2), in
//    HeatTracker's O(1) form, refcount the distinct ops that reference the
//    tensor (op_refcounts);
//  * thresholds start at the design's 0.8 and 0.3; at the end of the first
//    iteration, the profile, calibrate()'s binary search sets them so the
//    hotter-than sets fill 82.5% of HBM and of HBM + DRAM; every 30 s of the
//    driver's clock (virtual or real) the Recalibrator moves `hot` to keep
//    HBM use in [75%, 90%], and what is colder than its tier moves down:
//    device copies below `hot` to DRAM, DRAM copies below `warm` to the SSD;
//  * prefetch of what the design's predictor, the per-class EMA
//    ("design-ema", item 3, with its mode-switch detector and thrash guard),
//    expects within 16 ops;
//  * placement by the seed rules (item 4): the layer being computed holds
//    its parameters in HBM, so entering a layer asks for the next one's
//    (one layer ahead, in the walk's direction: forward up, backward down),
//    and the layer it left sends its parameters and gradients home to DRAM
//    (off-path); Adam m and the
//    master weights go back to DRAM and v to the SSD after each use; loaded
//    state is created where the rules put it (v in DRAM first: the engine
//    creates in memory, and v is sent on to the SSD at the first step);
//  * eviction in ascending heat above 90% of HBM: the engine's high
//    watermark, with heat as the published victim score.
// The design says nothing of where the Adam step runs; the settings search
// tries both, as for every policy. Moves are asked from the policy's own
// state (the engine leaves a copy in use, moving or absent as it is), never
// for a tensor the predictor expects within its window.
constexpr double kHorizonOps = 16;

class DesignSeed final : public TieringPolicy {
 public:
  explicit DesignSeed(const PolicyInputs& in);
  std::string_view name() const override { return "design-seed"; }
  engine::Engine::VictimOrder victim_order() const override {
    return engine::Engine::VictimOrder::scores;
  }
  engine::Engine::Scores initial_scores(std::uint32_t tensor, std::size_t) const override {
    const double k = heat_.order_key(tensor);
    return {k, k};
  }
  std::optional<Tier> home_tier(const trace::Tensor& x) const override { return seed_home(x); }
  bool optimizer_on_host() const override { return host_optimizer_; }
  void on_step(std::size_t j, StepContext& ctx) override;
  const DesignSeedStats& stats() const { return stats_; }

 private:
  // Demotes `t` out of `from` unless it is in use, moving, expected soon or
  // not there; true if asked.
  bool send_down(std::uint32_t t, Tier from, StepContext& ctx);
  void enter_layer(std::int32_t layer, StepContext& ctx);
  void send_state_home(std::size_t j, StepContext& ctx);
  void recalibrate(StepContext& ctx);

  const trace::Trace& trace_;
  bool host_optimizer_;
  bool has_ssd_;
  std::optional<predict::WindowLog::Reader> window_;
  const predict::TraceFeed* feed_ = nullptr;
  HeatTracker heat_;
  std::vector<std::uint8_t> in_window_;
  std::vector<std::vector<std::uint32_t>> by_layer_;  // parameters and gradients of each layer
  std::int32_t layer_ = trace::kNoLayer;
  SsdHoming ssd_;  // what the rules home on the SSD (Adam v)
  bool started_ = false;
  std::uint32_t first_iteration_ = 0;
  Thresholds th_{};  // the design's 0.8 and 0.3 until calibrated
  Recalibrator rc_;
  DesignSeedStats stats_;
  ChangedScores changed_;
};

DesignSeed::DesignSeed(const PolicyInputs& in)
    : trace_(in.trace), host_optimizer_(in.host_optimizer), has_ssd_(in.has_ssd) {
  const trace::Trace& t = in.trace;
  // The shared log (PolicyInfo::predictor's), unless the options chose another predictor.
  auto log = in.window_log && in.window_log->predictor() == in.design.predictor
                 ? in.window_log
                 : make_window_log(t, in.design.predictor);
  if (&log->feed().trace() != &t)
    throw std::logic_error("design-seed policy: the window log is of another trace");
  feed_ = &log->feed();
  window_.emplace(std::move(log));
  const std::vector<std::uint32_t> refs = op_refcounts(t);
  in_window_.assign(t.tensors.size(), 0);
  for (std::uint32_t i = 0; i < t.tensors.size(); ++i) {
    const trace::Tensor& x = t.tensors[i];
    heat_.set_tensor(i, x.bytes, refs[i]);
    if ((x.role == trace::Role::param || x.role == trace::Role::grad) && x.layer >= 0) {
      if (by_layer_.size() <= static_cast<std::size_t>(x.layer)) by_layer_.resize(x.layer + 1);
      by_layer_[x.layer].push_back(i);
    }
  }
  rc_.period_ns = static_cast<std::uint64_t>(in.design.recalibrate_period_s * 1e9);
  stats_.hot = th_.hot;
  stats_.warm = th_.warm;
}

// Decided from the policy's own state only, never from residency (which
// follows the clock): the engine leaves a copy that is in use, moving or not
// there as it is.
bool DesignSeed::send_down(std::uint32_t t, Tier from, StepContext& ctx) {
  if (in_window_[t] || (from == Tier::host && !has_ssd_)) return false;
  ctx.demote(t, from);
  return true;
}

void DesignSeed::enter_layer(std::int32_t layer, StepContext& ctx) {
  const std::int32_t left = layer_;
  layer_ = layer;
  const PlacementRules& rules = seed_rules();
  if (left >= 0 && static_cast<std::size_t>(left) < by_layer_.size())
    for (std::uint32_t t : by_layer_[left])
      if (rules.home(trace_.tensors[t].role, left, layer) != Tier::device &&
          send_down(t, Tier::device, ctx))
        ++stats_.placement_demotions;
  // The layer being computed holds its parameters in HBM: fetched while the
  // one before it computes, so the next layer in the walk's direction is
  // asked for now (and this one, if the walk jumped).
  const std::int32_t ahead = left == trace::kNoLayer ? layer : layer + (layer > left ? 1 : -1);
  for (std::int32_t l : {layer, ahead}) {
    if (l < 0 || static_cast<std::size_t>(l) >= by_layer_.size()) continue;
    for (std::uint32_t t : by_layer_[l])
      if (trace_.tensors[t].role == trace::Role::param) {
        ctx.prefetch(t);
        ++stats_.layer_prefetches;
      }
    if (l == ahead) break;
  }
}

// The previous step's Adam state and master weights go back to their tiers.
void DesignSeed::send_state_home(std::size_t j, StepContext& ctx) {
  if (j == 0) return;
  for (const Touch& t : ctx.steps()[j - 1].touches) {
    const trace::Tensor& x = trace_.tensors[t.tensor];
    if (!optimizer_role(x.role)) continue;
    if (send_down(t.tensor, Tier::device, ctx)) ++stats_.placement_demotions;
    if (seed_rules().home(x.role, x.layer, layer_) == Tier::ssd && has_ssd_) ssd_.queue(t.tensor);
  }
}

void DesignSeed::on_step(std::size_t j, StepContext& ctx) {
  const std::uint64_t now = ctx.now_ns();
  const trace::Op& op = trace_.ops[ctx.steps()[j].op];
  if (!started_) {
    started_ = true;
    first_iteration_ = op.iteration;
    rc_.last_ns = now;
    if (has_ssd_)  // loaded state the rules home on the SSD was created in DRAM
      for (std::uint32_t i = 0; i < trace_.tensors.size(); ++i)
        if (seed_rules().home(trace_.tensors[i].role, trace_.tensors[i].layer, trace::kNoLayer) ==
            Tier::ssd)
          ssd_.queue(i);
  } else if (!stats_.calibrated && op.iteration != first_iteration_) {
    // The first iteration is the profile: every tensor used at its steady rate.
    stats_.calibrated = true;
    th_ = calibrate_on_held(ctx, [&](std::uint32_t t) { return heat_.heat(t, now); });
  }
  for (std::size_t e = feed_->step_begin(j); e < feed_->step_begin(j + 1); ++e) {
    const trace::Event& ev = trace_.events[e];
    if (predict::is_access(ev.kind)) {
      heat_.access(ev.tensor, now);
      changed_.mark(ev.tensor);
    }
  }
  const predict::WindowLog::Delta d = window_->step(j, kHorizonOps, now);
  for (std::uint32_t x : d.left) in_window_[x] = 0;
  for (const predict::Predicted& x : d.entered) in_window_[x.tensor] = 1;
  changed_.publish(ctx, [this](std::uint32_t t) { return heat_.order_key(t); });
  for (const predict::Predicted& x : d.entered) {
    // State a host optimizer works on stays in its tiers.
    if (host_optimizer_ && optimizer_role(trace_.tensors[x.tensor].role)) continue;
    ctx.prefetch(x.tensor);
  }
  if (op.layer != trace::kNoLayer && op.layer != layer_) enter_layer(op.layer, ctx);
  send_state_home(j, ctx);
  stats_.placement_demotions += ssd_.pass(ctx, &in_window_);
  if (now >= rc_.last_ns + rc_.period_ns) recalibrate(ctx);
  stats_.hot = th_.hot;
  stats_.warm = th_.warm;
}

void DesignSeed::recalibrate(StepContext& ctx) {
  const engine::Engine& eng = ctx.engine();
  const std::uint64_t now = ctx.now_ns();
  const double use = static_cast<double>(eng.stats().used[static_cast<int>(Tier::device)]) /
                     static_cast<double>(eng.config().device.capacity);
  rc_.maybe_adjust(th_, use, now);
  rc_.last_ns = now;
  ++stats_.recalibrations;
  for (std::uint32_t i = 0; i < trace_.tensors.size(); ++i) {
    const Tier want = th_.tier_for(heat_.heat(i, now));
    if (want == Tier::device) continue;
    bool asked = send_down(i, Tier::device, ctx);
    if (want == Tier::ssd) asked = send_down(i, Tier::host, ctx) || asked;
    if (asked) ++stats_.heat_demotions;
  }
}

}  // namespace

std::unique_ptr<TieringPolicy> make_design_seed(const PolicyInputs& in) {
  return std::make_unique<DesignSeed>(in);
}

const DesignSeedStats* design_seed_stats(const TieringPolicy& p) {
  const auto* d = dynamic_cast<const DesignSeed*>(&p);
  return d ? &d->stats() : nullptr;
}

}  // namespace u3m::policy
