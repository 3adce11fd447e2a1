#include "u3m/policy/heat.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace u3m::policy {

HeatTracker::State& HeatTracker::at(std::uint32_t t) {
  if (t >= state_.size()) state_.resize(static_cast<std::size_t>(t) + 1);
  return state_[t];
}

void HeatTracker::set_tensor(std::uint32_t t, std::uint64_t bytes, std::uint32_t refcount) {
  const double mb = std::max(static_cast<double>(bytes), 1e3) / 1e6;
  State& s = at(t);
  s.scale = std::log2(1.0 + static_cast<double>(std::max<std::uint32_t>(refcount, 1))) / mb;
  s.memo_ns = kNoMemo;
}

double HeatTracker::decay(std::uint64_t dt_ns) const {
  // Fibonacci hashing: nearby dts (ops a few ns apart) spread over the table.
  Decay& d = decay_[(dt_ns * 0x9E3779B97F4A7C15ull) >> (64 - kDecayBits)];
  if (d.dt_ns != dt_ns) {
    const double dt = static_cast<double>(dt_ns) * 1e-9;
    d.dt_ns = dt_ns;
    d.factor = std::exp(-dt / config_.window_s);
  }
  return d.factor;
}

void HeatTracker::access(std::uint32_t t, std::uint64_t now_ns) {
  State& s = at(t);
  if (s.scale == 0) s.scale = std::log2(2.0) / 1e-3;  // unknown size: like 1 KB, refcount 1
  // dt = 0 (not later than the last access): exp(-0) = 1 (Note [Heat memo]).
  if (now_ns > s.last_ns) {
    s.count *= decay(now_ns - s.last_ns);
    s.last_ns = now_ns;
  }
  s.count += 1.0;
  s.memo_ns = kNoMemo;
}

double HeatTracker::heat(std::uint32_t t, std::uint64_t now_ns) const {
  if (t >= state_.size()) return 0;
  const State& s = state_[t];
  if (s.memo_ns == now_ns && now_ns != kNoMemo) return s.memo;
  double count = s.count;
  if (now_ns > s.last_ns) count *= decay(now_ns - s.last_ns);  // else exp(-0) = 1
  s.memo_ns = now_ns;
  s.memo = count / config_.window_s * s.scale;
  return s.memo;
}

double HeatTracker::order_key(std::uint32_t t) const {
  if (t >= state_.size() || !(state_[t].count > 0)) return -std::numeric_limits<double>::infinity();
  const State& s = state_[t];
  return std::log(s.count * s.scale) + static_cast<double>(s.last_ns) * 1e-9 / config_.window_s;
}

namespace {
// The lowest threshold h among the heats such that the bytes of samples with
// heat > h fit in `budget`; +inf if even the hottest alone does not fit.
double fit_threshold(const std::vector<HeatSample>& by_heat_desc,
                     const std::vector<std::uint64_t>& prefix, double budget) {
  // prefix[k] = bytes of the k hottest. Find the largest k with prefix[k] <= budget.
  std::size_t lo = 0, hi = by_heat_desc.size();
  while (lo < hi) {
    std::size_t mid = (lo + hi + 1) / 2;
    if (static_cast<double>(prefix[mid]) <= budget)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (lo == by_heat_desc.size()) return 0;  // everything fits
  // Threshold: the heat of the first sample that does not fit (strictly
  // hotter ones qualify).
  return by_heat_desc[lo].heat;
}
}  // namespace

Thresholds calibrate(std::vector<HeatSample> profile, std::uint64_t hbm_bytes,
                     std::uint64_t dram_bytes, double target) {
  std::sort(profile.begin(), profile.end(),
            [](const HeatSample& a, const HeatSample& b) { return a.heat > b.heat; });
  std::vector<std::uint64_t> prefix(profile.size() + 1, 0);
  for (std::size_t i = 0; i < profile.size(); ++i) prefix[i + 1] = prefix[i] + profile[i].bytes;
  Thresholds th;
  th.hot = fit_threshold(profile, prefix, target * static_cast<double>(hbm_bytes));
  th.warm = std::min(
      th.hot, fit_threshold(profile, prefix, target * static_cast<double>(hbm_bytes + dram_bytes)));
  return th;
}

bool Recalibrator::maybe_adjust(Thresholds& th, double hbm_use, std::uint64_t now_ns) {
  if (now_ns < last_ns + period_ns) return false;
  last_ns = now_ns;
  if (hbm_use > high) {
    th.hot = th.hot > 0 ? th.hot * step : 1e-9;
    return true;
  }
  if (hbm_use < low && th.hot > th.warm) {
    th.hot = std::max(th.warm, th.hot / step);
    return true;
  }
  return false;
}

}  // namespace u3m::policy
