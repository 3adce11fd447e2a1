// The design's mode-switch detector and thrash guard (MISSION.md section 3),
// one implementation shared by the predictors that use it: design-ema resets
// its EMA state on a switch; u3m can distrust its replay after one
// (SeqParams::mode_detector, docs/prediction.md "Mode switches").
#pragma once

#include <cstdint>
#include <deque>

#include "u3m/trace/model.hpp"

namespace u3m::predict {

struct ModeSwitchParams {
  // Detector (design: 10-op window, >30% change of the MatMul/attention ratio).
  std::uint32_t window_ops = 10;
  double change = 0.30;  // relative change of (matmul+1)/(attention+1)
  // Thrash guard (design: at most 2 switches per 60 s, then lock).
  std::uint32_t guard_max_switches = 2;
  std::uint64_t guard_period_ns = 60'000'000'000;
  std::uint64_t lock_ns = 60'000'000'000;  // how long the mode stays locked
};

class ModeSwitchDetector {
 public:
  explicit ModeSwitchDetector(ModeSwitchParams p = {}) : p_(p) {}
  // One op step of class `cls` starting at event time `now_ns`; true when a
  // switch is detected and applied (not suppressed by the guard).
  bool step(trace::OpClass cls, std::uint64_t now_ns);

  std::uint32_t switches() const { return switches_; }        // applied
  std::uint32_t guard_locks() const { return guard_locks_; }  // times the guard locked
  std::uint32_t suppressed() const { return suppressed_; }    // detections ignored while locked
  bool locked(std::uint64_t now_ns) const { return now_ns < locked_until_; }

 private:
  bool detect(std::uint64_t now);

  ModeSwitchParams p_;
  std::uint32_t win_ops_ = 0, win_mm_ = 0, win_attn_ = 0;
  double ref_ratio_ = -1;  // < 0: take the next window as the reference
  std::uint64_t locked_until_ = 0;
  std::deque<std::uint64_t> switch_times_;
  std::uint32_t switches_ = 0, guard_locks_ = 0, suppressed_ = 0;
};

}  // namespace u3m::predict
