// The design's predictor; see include/u3m/predict/u3m_ema.hpp and
// docs/prediction.md for how each part of the design's text is read.
#include "u3m/predict/u3m_ema.hpp"

#include <cmath>

namespace u3m::predict {

using trace::OpClass;

U3mEmaPredictor::U3mEmaPredictor(U3mEmaParams p) : p_(p), mode_(p.mode) {}

void U3mEmaPredictor::observe(const Access& a) {
  track_time(a);
  now_ns_ = a.time_ns;
  if (!any_ || a.step != cur_step_) {
    any_ = true;
    cur_step_ = a.step;
    // Mode detector: one op per step; a switch resets all EMA state.
    if (mode_.step(a.cls, a.time_ns)) reset_state(a.time_ns);
  }
  if (a.tensor >= ts_.size()) ts_.resize(a.tensor + 1);
  TensorState& s = ts_[a.tensor];
  if (a.kind == trace::EventKind::free) {
    s.live = false;
    wheel_.cancel(a.tensor);
    recent_.remove(a.tensor);
    return;
  }
  s.live = true;
  if (!is_access(a.kind)) return;

  ClassState& cs = classes_[static_cast<int>(a.cls)];
  if (s.epoch == epoch_ && s.n >= 1) {
    if (a.time_ns == s.last_ns) return;  // same instant: no new interval
    double d = double(a.time_ns - s.last_ns);
    if (s.n >= 2 && a.time_ns >= rewarm_until_) {
      // Calibration: did the access land where this class's EMA said?
      double pred = double(s.last_ns) + s.mean + s.slope;
      bool hit = std::abs(double(a.time_ns) - pred) <= p_.hit_tolerance * std::max(s.mean, 1.0);
      ++cs.n;
      cs.hits += hit;
      if (cs.n >= p_.calib_window) {
        // Below target: 0.9 -> 0.7 -> LRU. At or above: step back (our
        // addition, so one bad phase does not condemn a class for good).
        if (double(cs.hits) < p_.hit_target * cs.n)
          cs.stage = std::min(cs.stage + 1, 2);
        else if (cs.stage > 0)
          --cs.stage;
        cs.n = cs.hits = 0;
      }
    }
    double alpha = cs.stage >= 1 ? p_.alpha_degraded : p_.alpha;
    if (s.n == 1) {
      s.mean = d;
      s.slope = 0;
    } else {
      double m = alpha * s.mean + (1 - alpha) * d;
      s.slope = p_.slope_beta * s.slope + (1 - p_.slope_beta) * (m - s.mean);
      s.mean = m;
    }
    ++s.n;
  } else {
    s.epoch = epoch_;
    s.n = 1;
    s.mean = s.slope = 0;
  }
  s.last_ns = a.time_ns;
  s.last_step = a.step;
  s.cls = static_cast<std::uint8_t>(a.cls);
  recent_.touch(a.tensor, a.step);
  if (s.n < 2 || cs.stage >= 2) {
    wheel_.cancel(a.tensor);  // no estimate yet, or the class predicts by recency
    return;
  }
  // Event time -> op steps with our own online ns-per-op (no look-ahead).
  double nspo = std::max(ns_per_op(), 1.0);
  double ahead = std::max(s.mean + s.slope, 0.0) / nspo;
  std::uint64_t at = a.step + std::max<std::uint64_t>(1, std::llround(ahead));
  auto slack = static_cast<std::uint64_t>(p_.hit_tolerance * s.mean / nspo);
  wheel_.schedule(a.tensor, at, at + slack);
}

void U3mEmaPredictor::step_done() {
  wheel_.advance(cur_step_ + 1);
}

void U3mEmaPredictor::predict(std::uint32_t horizon, std::vector<Predicted>& out) {
  out.clear();
  if (stamp_.size() < ts_.size()) stamp_.resize(ts_.size(), 0);
  ++stamp_now_;
  std::uint64_t now = wheel_.now();
  wheel_.for_each(horizon, [&](std::uint32_t t, std::uint64_t at) {
    stamp_[t] = stamp_now_;
    out.push_back({t, static_cast<std::uint32_t>(at > now ? at - now : 0)});
  });
  // Classes in LRU fallback: touched in the last H steps -> within the next H.
  recent_.walk([&](std::uint32_t t, std::uint64_t step) {
    std::uint64_t behind = now - 1 - step;
    if (behind >= horizon) return false;
    const TensorState& s = ts_[t];
    if (classes_[s.cls].stage >= 2 && stamp_[t] != stamp_now_) {
      stamp_[t] = stamp_now_;
      out.push_back({t, static_cast<std::uint32_t>(behind)});
    }
    return true;
  });
}

void U3mEmaPredictor::reset_state(std::uint64_t now) {
  ++epoch_;  // every tensor's EMA triple is stale from here on
  for (ClassState& c : classes_) c = ClassState{};
  rewarm_until_ = now + p_.rewarm_ns;
  wheel_ = StepWheel{};
  wheel_.advance(cur_step_ + 1);
}

}  // namespace u3m::predict
