#include "u3m/mem/monitor.hpp"

#include <algorithm>
#include <cmath>

namespace u3m::mem {

std::string_view to_string(Level l) {
  switch (l) {
    case Level::ok:
      return "ok";
    case Level::warning:
      return "warning";
    case Level::critical:
      return "critical";
  }
  return "?";
}

Monitor::Monitor(MonitorConfig config) : config_(config) {
  for (int i = 0; i < kNumTiers; ++i) tiers_[i].r.tier = static_cast<Tier>(i);
}

Level Monitor::level_of(double fraction) const {
  if (fraction >= config_.critical) return Level::critical;
  if (fraction >= config_.warning) return Level::warning;
  return Level::ok;
}

void Monitor::record(Tier t, std::uint64_t used, std::uint64_t capacity, std::uint64_t now_ns) {
  State& s = tiers_[static_cast<int>(t)];
  TierReport& r = s.r;
  r.used = used;
  r.capacity = capacity;
  if (used > r.peak) r.peak = used;
  r.fraction = capacity ? static_cast<double>(used) / static_cast<double>(capacity) : 0.0;

  // Keep one sample per interval (the latest value wins inside an interval),
  // so a burst of small changes does not flood the window.
  if (!s.any || now_ns >= s.last_sample_ns + config_.sample_interval_ns || s.ring.empty()) {
    Sample smp{now_ns, used};
    if (s.ring.size() < config_.max_samples) {
      s.ring.push_back(smp);
    } else {
      s.ring[s.head] = smp;
      s.head = (s.head + 1) % s.ring.size();
    }
    s.last_sample_ns = now_ns;
    s.any = true;
  } else {
    std::size_t newest = s.ring.size() < config_.max_samples
                             ? s.ring.size() - 1
                             : (s.head + s.ring.size() - 1) % s.ring.size();
    s.ring[newest].used = used;
  }
  update_growth(s, now_ns);

  Level before = r.level;
  r.level = level_of(r.fraction);
  if (r.level != before) {
    if (r.level > before) {
      if (r.level >= Level::warning && before < Level::warning) ++r.warnings;
      if (r.level == Level::critical) ++r.criticals;
    }
    if (alert_) alert_(r, before);
  }
}

// Note [Time to OOM]
// Growth is the least-squares slope of (time, use) over the samples of the
// last window, not the difference of two samples: one allocation burst or one
// free must not swing the estimate from minutes to never. Time to OOM is the
// headroom divided by that slope, and infinite when use is flat or falling
// or the tier is unbounded.
void Monitor::update_growth(State& s, std::uint64_t now_ns) const {
  TierReport& r = s.r;
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double t0 = static_cast<double>(now_ns);
  for (const Sample& smp : s.ring) {
    if (smp.t_ns + config_.window_ns < now_ns) continue;
    double x = (static_cast<double>(smp.t_ns) - t0) * 1e-9;
    double y = static_cast<double>(smp.used);
    n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  double denom = n * sxx - sx * sx;
  r.growth_bytes_per_s = (n >= 2 && denom > 0) ? (n * sxy - sx * sy) / denom : 0.0;
  r.time_to_oom_s = std::numeric_limits<double>::infinity();
  if (r.capacity > 0 && r.growth_bytes_per_s > 0) {
    double headroom = r.used >= r.capacity ? 0.0 : static_cast<double>(r.capacity - r.used);
    r.time_to_oom_s = headroom / r.growth_bytes_per_s;
    r.min_time_to_oom_s = std::min(r.min_time_to_oom_s, r.time_to_oom_s);
  }
}

TierReport Monitor::report(Tier t) const {
  return tiers_[static_cast<int>(t)].r;
}

}  // namespace u3m::mem
