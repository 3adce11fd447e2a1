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
  auto x_of = [&s](const Sample& smp) {
    return static_cast<double>(smp.t_ns - s.origin_ns) * 1e-9;
  };
  if (s.window.empty() || now_ns >= s.last_sample_ns + config_.sample_interval_ns) {
    if (s.window.empty()) s.origin_ns = now_ns;
    s.window.push_back(Sample{now_ns, used});
    s.sums.add(x_of(s.window.back()), static_cast<double>(used), 1);
    s.last_sample_ns = now_ns;
    slide(s, now_ns);
  } else {
    // The newest sample's use changes, its time does not: only the sums
    // over y move (the difference of two uses below 2^53 bytes is exact).
    Sample& newest = s.window.back();
    const double dy = static_cast<double>(used) - static_cast<double>(newest.used);
    newest.used = used;
    s.sums.sy += dy;
    s.sums.sxy += x_of(newest) * dy;
    // No sample was added, so only age can drop one: the oldest's.
    if (s.window.front().t_ns + config_.window_ns < now_ns) slide(s, now_ns);
  }
  update_growth(s);

  Level before = r.level;
  r.level = level_of(r.fraction);
  if (r.level != before) {
    if (r.level > before) {
      if (r.level >= Level::warning && before < Level::warning) ++r.warnings;
      if (r.level == Level::critical) ++r.criticals;
    }
    if (alert_) {
      fill_estimates(s, r);
      alert_(r, before);
    }
  }
}

// Note [Time to OOM]
// Growth is the least-squares slope of (time, use) over the samples of the
// last window, not the difference of two samples: one allocation burst or one
// free must not swing the estimate from minutes to never. Time to OOM is the
// headroom divided by that slope, and infinite when use is flat or falling
// or the tier is unbounded.
void Monitor::slide(State& s, std::uint64_t now_ns) const {
  while (!s.window.empty() && (s.window.size() > config_.max_samples ||
                               s.window.front().t_ns + config_.window_ns < now_ns)) {
    const Sample old = s.window.front();
    s.window.pop_front();
    s.sums.add(static_cast<double>(old.t_ns - s.origin_ns) * 1e-9, static_cast<double>(old.used),
               -1);
    if (s.window.empty()) {
      s.sums = {};  // exact zero, no drift
      break;
    }
    // Move the origin to the new oldest sample: x' = x - c.
    const double c = static_cast<double>(s.window.front().t_ns - s.origin_ns) * 1e-9;
    Sums& m = s.sums;
    m.sxx += -2 * c * m.sx + m.n * c * c;
    m.sxy -= c * m.sy;
    m.sx -= m.n * c;
    s.origin_ns = s.window.front().t_ns;
  }
}

// Per record, only the shortest time to OOM is kept up to date; the growth
// and the current time to OOM follow from the sums and the report's fields,
// so they are computed when read (report(), an alert), the same way. The
// quotients are taken only when they can matter: growth only when the
// slope's numerator is positive (its denominator is), and time to OOM only
// when it can be a new minimum: headroom / growth < min implies headroom <=
// min * growth even after rounding (rounding is monotone), so the minimum is
// the same as dividing at every record.
double Monitor::growth_of(const Sums& m) {
  const double denom = m.n * m.sxx - m.sx * m.sx;
  return (m.n >= 2 && denom > 0) ? (m.n * m.sxy - m.sx * m.sy) / denom : 0.0;
}

void Monitor::update_growth(State& s) const {
  TierReport& r = s.r;
  const Sums& m = s.sums;
  if (r.capacity == 0 || !(m.n * m.sxy - m.sx * m.sy > 0)) return;  // not growing: no OOM
  const double growth = growth_of(m);
  if (!(growth > 0)) return;
  const double headroom = headroom_of(r);
  if (headroom <= r.min_time_to_oom_s * growth)
    r.min_time_to_oom_s = std::min(r.min_time_to_oom_s, headroom / growth);
}

double Monitor::headroom_of(const TierReport& r) {
  return r.used >= r.capacity ? 0.0 : static_cast<double>(r.capacity - r.used);
}

void Monitor::fill_estimates(const State& s, TierReport& r) {
  r.growth_bytes_per_s = growth_of(s.sums);
  r.time_to_oom_s = r.capacity > 0 && r.growth_bytes_per_s > 0
                        ? headroom_of(r) / r.growth_bytes_per_s
                        : std::numeric_limits<double>::infinity();
}

TierReport Monitor::report(Tier t) const {
  const State& s = tiers_[static_cast<int>(t)];
  TierReport r = s.r;
  fill_estimates(s, r);
  return r;
}

}  // namespace u3m::mem
