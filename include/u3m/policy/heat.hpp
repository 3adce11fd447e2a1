// Heat and tier thresholds (MISSION.md item 2): how hot each tensor is, which
// tier its heat asks for, and the calibration that keeps HBM use in a band.
// Decision code: time comes in as arguments, never from a clock of its own.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "u3m/mem/status.hpp"

namespace u3m::policy {

// Note [Heat in O(1)]
// The design's heat is (accesses / window) * log2(1 + refcount) / size_MB.
// An exact sliding-window count needs every access time; instead each tensor
// keeps an exponentially decayed count with time constant `window`:
// c <- c * exp(-dt / window) + 1 on each access. For a steady rate r this
// settles at about r * window (exactly r*window / (1 - exp(-1/(r*window)))),
// so c / window is the access rate the formula wants, in O(1) time and two
// numbers per tensor. Refcount is how many distinct ops read the tensor (its
// fan-out), set by whoever knows the graph; size_MB uses 10^6 bytes and is
// floored at 1 KB so tiny tensors do not get infinite heat.
//
// Note [Heat memo]
// A policy asks the heat of every eviction candidate at every pressure scan,
// and all its scans within one op see the same `now`: the same tensor's heat
// is asked many times per op, each an exp(). So heat() keeps its last answer
// per tensor with the instant it was for, and access() drops it; an access
// at the instant of the tensor's last one (several events of one op) decays
// by exp(-0) = 1 and skips the call. Both return the very bits the full
// formula would (the memo is the same computation's result, and x * 1.0 ==
// x), so no decision can change. The decay factor exp(-dt / window) itself
// is kept in a small table keyed by dt in ns: the tensors of one op are
// accessed at the same instants, so they share their dt at every later
// query, and the table answers those with the very bits exp() gave.
// The memo and the table make heat() a writer: one tracker must not be read
// from two threads at once.
struct HeatConfig {
  double window_s = 5.0;
};

class HeatTracker {
 public:
  explicit HeatTracker(HeatConfig config = {}) : config_(config) {}
  // Tensors are dense indices; the tracker grows on demand.
  void set_tensor(std::uint32_t t, std::uint64_t bytes, std::uint32_t refcount = 1);
  void access(std::uint32_t t, std::uint64_t now_ns);
  // Not safe to call concurrently on one tracker (Note [Heat memo]).
  double heat(std::uint32_t t, std::uint64_t now_ns) const;
  // Its heat at its last access: heat(t, now) <= peak(t) for any later now,
  // exactly as computed (the decay is <= 1 and rounding is monotone), so
  // peak(t) <= x proves heat(t, now) <= x without an exp().
  double peak(std::uint32_t t) const {
    return t < state_.size() ? state_[t].count / config_.window_s * state_[t].scale : 0.0;
  }
  // Note [Heat order key]
  // heat(t, now) = count * exp(-(now - last) / window) * scale / window, so
  // log heat = log(count * scale) + last / window - (now / window + log
  // window): the part in parentheses is the same for every tensor. The key
  // log(count * scale) + last / window orders tensors as their heat does at
  // every instant, and changes only when the tensor is accessed: a policy
  // can publish it to the engine once per access (Note [Published victim
  // scores] in engine.hpp). -inf for a tensor never accessed (heat 0).
  double order_key(std::uint32_t t) const;
  std::size_t size() const { return state_.size(); }
  const HeatConfig& config() const { return config_; }

 private:
  struct State {
    double count = 0;
    std::uint64_t last_ns = 0;
    double scale = 0;  // log2(1 + refcount) / size_MB
    // heat() at memo_ns (Note [Heat memo]); memo_ns = kNoMemo: none.
    mutable std::uint64_t memo_ns = kNoMemo;
    mutable double memo = 0;
  };
  static constexpr std::uint64_t kNoMemo = UINT64_MAX;
  State& at(std::uint32_t t);
  // exp(-dt / window) for dt = dt_ns > 0 (Note [Heat memo]).
  double decay(std::uint64_t dt_ns) const;
  HeatConfig config_;
  std::vector<State> state_;
  struct Decay {
    std::uint64_t dt_ns = 0;  // 0: empty (dt = 0 never needs exp)
    double factor = 1;
  };
  static constexpr int kDecayBits = 8;
  mutable std::array<Decay, 1u << kDecayBits> decay_{};
};

// The design's default thresholds: HBM above 0.8, DRAM 0.3-0.8, SSD below.
struct Thresholds {
  double hot = 0.8, warm = 0.3;
  mem::Tier tier_for(double heat) const {
    return heat > hot ? mem::Tier::device : heat >= warm ? mem::Tier::host : mem::Tier::ssd;
  }
};

struct HeatSample {
  double heat = 0;
  std::uint64_t bytes = 0;
};

// Note [Threshold calibration]
// The initial thresholds come from a binary search over a profile (a set of
// tensors with their heat): `hot` is the lowest threshold whose hotter-than
// set fits in target * HBM bytes, `warm` likewise for HBM + DRAM. Binary
// search over the heat values themselves (sorted once), so the answer is
// exact for the profile and costs O(n log n).
Thresholds calibrate(std::vector<HeatSample> profile, std::uint64_t hbm_bytes,
                     std::uint64_t dram_bytes, double target = 0.825);

// Periodic recalibration (default every 30 s of the caller's clock): keeps
// HBM use inside [low, high] = [75%, 90%] by moving `hot`. Above the band the
// threshold rises by `step` (fewer tensors qualify); below it falls.
struct Recalibrator {
  double low = 0.75, high = 0.90;
  double step = 1.25;  // multiplicative
  std::uint64_t period_ns = 30'000'000'000;
  std::uint64_t last_ns = 0;
  // Returns true if it changed `th`. hbm_use is the fraction of HBM in use.
  bool maybe_adjust(Thresholds& th, double hbm_use, std::uint64_t now_ns);
};

}  // namespace u3m::policy
