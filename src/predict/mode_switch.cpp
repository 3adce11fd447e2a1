// The design's mode-switch detector and thrash guard; see mode_switch.hpp and
// docs/prediction.md for how the design's text is read.
#include "u3m/predict/mode_switch.hpp"

#include <cmath>

namespace u3m::predict {

using trace::OpClass;

bool ModeSwitchDetector::step(OpClass cls, std::uint64_t now_ns) {
  // Tumbling windows of window_ops steps.
  ++win_ops_;
  if (cls == OpClass::matmul) ++win_mm_;
  if (cls == OpClass::attn_prefill || cls == OpClass::attn_decode) ++win_attn_;
  if (win_ops_ < p_.window_ops) return false;
  const bool applied = detect(now_ns);
  win_ops_ = win_mm_ = win_attn_ = 0;
  return applied;
}

bool ModeSwitchDetector::detect(std::uint64_t now) {
  double ratio = (win_mm_ + 1.0) / (win_attn_ + 1.0);
  if (ref_ratio_ < 0) {  // first window, or the first after a switch: the new reference
    ref_ratio_ = ratio;
    return false;
  }
  if (std::abs(ratio - ref_ratio_) <= p_.change * ref_ratio_) return false;
  if (locked(now)) {
    ++suppressed_;
    return false;
  }
  while (!switch_times_.empty() && switch_times_.front() + p_.guard_period_ns <= now)
    switch_times_.pop_front();
  if (switch_times_.size() >= p_.guard_max_switches) {
    // Thrash guard: a third switch within the period locks the mode.
    locked_until_ = now + p_.lock_ns;
    ++guard_locks_;
    ++suppressed_;
    return false;
  }
  switch_times_.push_back(now);
  ++switches_;
  ref_ratio_ = -1;
  return true;
}

}  // namespace u3m::predict
