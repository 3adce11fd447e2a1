// The design's predictor ("design-ema"; "u3m" before issue 17): one EMA predictor per operator class, with
// online calibration, a global mode-switch detector and a thrash guard
// (MISSION.md section 3). Kept as specified, as the floor the default
// predictor ("u3m", seq.hpp) must beat. See docs/prediction.md.
//
// Note [Reading of the design's EMA predictor]
// The design gives each operator class "last access time, mean interval,
// trend slope". A per-class triple alone predicts when the next op of a class
// runs, not which tensors it touches, so we keep that triple per tensor and
// let the class of the accessing op own the smoothing factor, the hit-rate
// calibration and the LRU fallback. A tensor's next access is predicted at
// last + mean + slope (event time) and converted to op steps with the
// predictor's own online ns-per-op estimate: it never looks ahead.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <vector>

#include "u3m/predict/predictor.hpp"
#include "u3m/predict/step_wheel.hpp"

namespace u3m::predict {

struct U3mEmaParams {
  double alpha = 0.9;                // EMA weight on history (design: 0.9)
  double alpha_degraded = 0.7;       // after one calibration window below target (design: 0.7)
  double slope_beta = 0.9;           // EMA weight on history for the trend slope
  double hit_target = 0.85;          // design: recalibrate below 85% hit rate
  std::uint32_t calib_window = 256;  // accesses per class per calibration decision
  // A prediction "hits" when the access lands within hit_tolerance * interval
  // of the predicted time.
  double hit_tolerance = 0.5;
  // Mode-switch detector (design: 10-op window, >30% change of MatMul/attention).
  std::uint32_t mode_window_ops = 10;
  double mode_change = 0.30;                 // relative change of (matmul+1)/(attention+1)
  std::uint64_t rewarm_ns = 30'000'000'000;  // design: re-warm over ~30 s
  // Thrash guard (design: at most 2 switches per 60 s, then lock).
  std::uint32_t guard_max_switches = 2;
  std::uint64_t guard_period_ns = 60'000'000'000;
  std::uint64_t lock_ns = 60'000'000'000;  // how long the mode stays locked
};

class U3mEmaPredictor final : public Predictor {
 public:
  explicit U3mEmaPredictor(U3mEmaParams p = {});
  std::string_view name() const override { return "design-ema"; }
  void observe(const Access& a) override;
  void step_done() override;
  void predict(std::uint32_t horizon_ops, std::vector<Predicted>& out) override;

  // Detector and guard state, for tests and reports.
  std::uint32_t switches() const { return switches_; }        // applied (state reset)
  std::int64_t mode_switches() const override { return switches_; }
  std::uint32_t guard_locks() const { return guard_locks_; }  // times the guard locked
  std::uint32_t suppressed() const { return suppressed_; }    // detections ignored while locked
  bool locked(std::uint64_t now_ns) const { return now_ns < locked_until_; }
  // 0: alpha, 1: alpha_degraded, 2: LRU fallback.
  int class_stage(trace::OpClass c) const { return classes_[static_cast<int>(c)].stage; }

 private:
  struct TensorState {
    std::uint64_t epoch = 0;  // EMA state valid only if epoch == epoch_
    std::uint64_t last_ns = 0, last_step = 0;
    double mean = 0, slope = 0;
    std::uint32_t n = 0;  // accesses seen in this epoch
    std::uint8_t cls = 0;
    bool live = false;
  };
  struct ClassState {
    int stage = 0;
    std::uint32_t n = 0, hits = 0;
  };

  void reset_state(std::uint64_t now);
  void detect_mode(std::uint64_t now);

  U3mEmaParams p_;
  std::vector<TensorState> ts_;
  std::array<ClassState, trace::kNumOpClasses> classes_{};
  StepWheel wheel_;
  RecencyList recent_;  // for classes in LRU fallback
  std::uint64_t epoch_ = 1;
  std::uint64_t cur_step_ = 0, now_ns_ = 0;
  bool any_ = false;
  // Mode detector: counts over the current tumbling window of steps.
  trace::OpClass step_cls_ = trace::OpClass::other;
  std::uint32_t win_ops_ = 0, win_mm_ = 0, win_attn_ = 0;
  double ref_ratio_ = -1;  // < 0: take the next window as the reference
  std::uint64_t rewarm_until_ = 0, locked_until_ = 0;
  std::deque<std::uint64_t> switch_times_;
  std::uint32_t switches_ = 0, guard_locks_ = 0, suppressed_ = 0;
  std::vector<std::uint32_t> stamp_;
  std::uint32_t stamp_now_ = 0;
};

}  // namespace u3m::predict
