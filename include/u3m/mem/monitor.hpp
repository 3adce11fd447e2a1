// The memory monitor (MISSION.md item 7): per-tier use, warning and critical
// levels, and a time-to-OOM estimate from the recent growth rate. It is pure
// bookkeeping: the owner (the runtime) reports each tier's use with a
// timestamp from its Clock, so the same monitor runs under wall time and under
// the simulator's virtual clock. Not thread-safe; the owner serializes calls.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <string_view>
#include <vector>

#include "u3m/mem/status.hpp"

namespace u3m::mem {

inline constexpr int kNumTiers = 3;

enum class Level : std::uint8_t { ok, warning, critical };
std::string_view to_string(Level l);

struct MonitorConfig {
  double warning = 0.85;  // fraction of capacity
  double critical = 0.95;
  // Growth is the least-squares slope of use over the samples of the last
  // `window_ns`; samples are kept at most every `sample_interval_ns`.
  std::uint64_t window_ns = 10'000'000'000;
  std::uint64_t sample_interval_ns = 1'000'000;
  std::size_t max_samples = 512;
};

struct TierReport {
  Tier tier = Tier::device;
  std::uint64_t used = 0, capacity = 0, peak = 0;
  double fraction = 0;  // used / capacity; 0 when capacity is 0 (unbounded)
  Level level = Level::ok;
  double growth_bytes_per_s = 0;  // over the window; negative when shrinking
  // Seconds until use reaches capacity at the current growth; +inf when not
  // growing or unbounded.
  double time_to_oom_s = std::numeric_limits<double>::infinity();
  double min_time_to_oom_s = std::numeric_limits<double>::infinity();  // the shortest seen
  std::uint64_t warnings = 0, criticals = 0;  // times the level rose to each
};

// Called when a tier's level changes (up or down).
using AlertFn = std::function<void(const TierReport&, Level from)>;

class Monitor {
 public:
  explicit Monitor(MonitorConfig config = {});
  void on_alert(AlertFn fn) { alert_ = std::move(fn); }
  // Records a tier's use at time now_ns (non-decreasing per tier).
  void record(Tier t, std::uint64_t used, std::uint64_t capacity, std::uint64_t now_ns);
  TierReport report(Tier t) const;
  const MonitorConfig& config() const { return config_; }

 private:
  struct Sample {
    std::uint64_t t_ns, used;
  };
  // Running least-squares sums over the window, x in seconds from origin_ns
  // (the oldest sample's time), so each update is O(1).
  struct Sums {
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    void add(double x, double y, double sign) {
      n += sign, sx += sign * x, sy += sign * y, sxx += sign * x * x, sxy += sign * x * y;
    }
  };
  struct State {
    // growth_bytes_per_s and time_to_oom_s are computed when read
    // (fill_estimates), so they are stale here: read the report instead.
    TierReport r;
    std::deque<Sample> window;  // oldest first
    std::uint64_t origin_ns = 0;
    Sums sums;
    std::uint64_t last_sample_ns = 0;
  };
  Level level_of(double fraction) const;
  void slide(State& s, std::uint64_t now_ns) const;  // drops samples that left the window
  void update_growth(State& s) const;
  static double growth_of(const Sums& m);
  static double headroom_of(const TierReport& r);
  // growth_bytes_per_s and time_to_oom_s, from the sums and r's use.
  static void fill_estimates(const State& s, TierReport& r);

  MonitorConfig config_;
  std::array<State, kNumTiers> tiers_;
  AlertFn alert_;
};

}  // namespace u3m::mem
