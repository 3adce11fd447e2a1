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
#include <vector>

#include "u3m/predict/mode_switch.hpp"
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
  // Mode-switch detector and thrash guard (mode_switch.hpp).
  ModeSwitchParams mode;
  std::uint64_t rewarm_ns = 30'000'000'000;  // design: re-warm over ~30 s
};

class U3mEmaPredictor final : public Predictor {
 public:
  explicit U3mEmaPredictor(U3mEmaParams p = {});
  std::string_view name() const override { return "design-ema"; }
  void observe(const Access& a) override;
  void step_done() override;
  void predict(std::uint32_t horizon_ops, std::vector<Predicted>& out) override;

  // Detector and guard state, for tests and reports.
  std::uint32_t switches() const { return mode_.switches(); }  // applied (state reset)
  std::int64_t mode_switches() const override { return mode_.switches(); }
  std::uint32_t guard_locks() const { return mode_.guard_locks(); }
  std::uint32_t suppressed() const { return mode_.suppressed(); }
  bool locked(std::uint64_t now_ns) const { return mode_.locked(now_ns); }
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

  U3mEmaParams p_;
  std::vector<TensorState> ts_;
  std::array<ClassState, trace::kNumOpClasses> classes_{};
  StepWheel wheel_;
  RecencyList recent_;  // for classes in LRU fallback
  std::uint64_t epoch_ = 1;
  std::uint64_t cur_step_ = 0, now_ns_ = 0;
  bool any_ = false;
  ModeSwitchDetector mode_;
  std::uint64_t rewarm_until_ = 0;
  std::vector<std::uint32_t> stamp_;
  std::uint32_t stamp_now_ = 0;
};

}  // namespace u3m::predict
