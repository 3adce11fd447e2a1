// TierBand: Note [Band series] in band.hpp.
#include "u3m/observe/band.hpp"

#include <algorithm>
#include <cmath>

#include "u3m/engine/engine.hpp"

namespace u3m::observe {

void TierBand::attached(int card, const engine::Engine& e) {
  const engine::EngineConfig& cfg = e.config();
  set_capacity(card, tier_ == mem::Tier::device ? cfg.device.capacity : cfg.host.capacity);
}

void TierBand::set_capacity(int card, std::uint64_t bytes) {
  std::lock_guard g(mu_);
  cards_[card].capacity = bytes;
}

void TierBand::widen(Card& c) {
  const std::size_t n = (c.sum.size() + 1) / 2;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t a = 2 * i, b = std::min(2 * i + 1, c.sum.size() - 1);
    c.sum[i] = c.sum[a] + (b != a ? c.sum[b] : 0.0);
    c.max[i] = std::max(c.max[a], c.max[b]);
  }
  c.sum.resize(n);
  c.max.resize(n);
  c.width *= 2;
}

void TierBand::add_to_buckets(Card& c, double t0, double t1, double level) {
  while ((t1 - c.origin) / c.width > static_cast<double>(kMaxPoints)) widen(c);
  // Walk the buckets by index: times at their edges round either way.
  auto k =
      std::min(static_cast<std::size_t>(std::max(0.0, (t0 - c.origin) / c.width)), kMaxPoints - 1);
  for (double t = t0; t < t1 && k < kMaxPoints; ++k) {
    if (c.sum.size() <= k) {
      c.sum.resize(k + 1, 0.0);
      c.max.resize(k + 1, 0.0);
    }
    const double edge = c.origin + static_cast<double>(k + 1) * c.width;
    const double end = k + 1 == kMaxPoints ? t1 : std::min(t1, edge);
    c.sum[k] += level * std::max(0.0, end - t);
    c.max[k] = std::max(c.max[k], level);
    t = end;
  }
}

void TierBand::integrate(Card& c, double until) {
  if (until <= c.last_t) return;
  const double dt = until - c.last_t;
  (c.level < low_ ? c.below : c.level > high_ ? c.above : c.in) += dt;
  c.weighted += c.level * dt;
  add_to_buckets(c, c.last_t, until, c.level);
  c.last_t = until;
}

void TierBand::occupancy(int card, mem::Tier tier, std::uint64_t used, double t_s) {
  if (tier != tier_) return;
  std::lock_guard g(mu_);
  Card& c = cards_[card];
  if (c.capacity == 0) return;  // not attached: no scale
  if (!c.started) {
    c.started = true;
    c.origin = c.last_t = t_s;
  }
  integrate(c, t_s);
  c.level = static_cast<double>(used) / static_cast<double>(c.capacity);
  c.peak = std::max(c.peak, c.level);
  if (c.sum.empty()) {  // the first sample: its level opens bucket 0
    c.sum.push_back(0.0);
    c.max.push_back(c.level);
  } else {
    const auto k = std::min(static_cast<std::size_t>((t_s - c.origin) / c.width), kMaxPoints - 1);
    if (k < c.max.size()) c.max[k] = std::max(c.max[k], c.level);
  }
}

BandReport TierBand::report(int card) const {
  std::lock_guard g(mu_);
  BandReport r;
  r.low = low_;
  r.high = high_;
  auto it = cards_.find(card);
  if (it == cards_.end()) return r;
  const Card& c = it->second;
  r.below_s = c.below;
  r.in_s = c.in;
  r.above_s = c.above;
  r.peak = c.peak;
  const double span = r.span_s();
  r.mean = span > 0 ? c.weighted / span : c.level;
  for (std::size_t i = 0; i < c.sum.size(); ++i) {
    const double t0 = static_cast<double>(i) * c.width;
    const double covered = std::min(c.width, (c.last_t - c.origin) - t0);
    r.series.push_back({t0, covered > 0 ? c.sum[i] / covered : c.max[i], c.max[i]});
  }
  return r;
}

}  // namespace u3m::observe
