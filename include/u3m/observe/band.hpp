// How a run's HBM use sat against the design's band (MISSION.md item 2: keep
// HBM use in [75%, 90%], 10% left for bursts): the time spent below, inside
// and above it, and a bounded series of the use over time, per card. A
// RunObserver: attach it to any run, simulated or real.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "u3m/engine/run_observer.hpp"

namespace u3m::observe {

struct BandPoint {
  double t_s = 0;            // the bucket's start, seconds after the card's first sample
  double mean = 0, max = 0;  // fraction of capacity, time-weighted over the bucket
};

struct BandReport {
  double low = 0.75, high = 0.90;
  double below_s = 0, in_s = 0, above_s = 0;  // seconds at each side of the band
  double mean = 0, peak = 0;                  // fractions of capacity
  std::vector<BandPoint> series;              // at most kMaxPoints, equal buckets
  double span_s() const { return below_s + in_s + above_s; }
  double in_fraction() const { return span_s() > 0 ? in_s / span_s() : 0.0; }
};

// Note [Band series]
// A run's tier use changes at every allocation, millions of times, and its
// length is not known in advance. The series keeps equal buckets of width w
// (first 1 us); when a sample falls beyond kMaxPoints buckets, w doubles and
// neighbours merge (means averaged, maxima kept), so memory stays bounded and
// the series always spans the whole run at the finest width that fits.
class TierBand final : public engine::RunObserver {
 public:
  static constexpr std::size_t kMaxPoints = 256;
  explicit TierBand(mem::Tier tier = mem::Tier::device, double low = 0.75, double high = 0.90)
      : tier_(tier), low_(low), high_(high) {}

  void occupancy(int card, mem::Tier tier, std::uint64_t used, double t_s) override;
  void attached(int card, const engine::Engine& e) override;
  // The card's capacity in bytes, for an engine that is not attached (tests).
  void set_capacity(int card, std::uint64_t bytes);

  // Up to now: the last level counts until the latest sample of that card.
  BandReport report(int card) const;

 private:
  struct Card {
    std::uint64_t capacity = 0;
    bool started = false;
    double origin = 0, last_t = 0, level = 0;  // level: fraction of capacity since last_t
    double below = 0, in = 0, above = 0, weighted = 0, peak = 0;
    double width = 1e-6;
    std::vector<double> sum;  // per bucket: integral of the level (fraction x s)
    std::vector<double> max;
  };
  void integrate(Card& c, double until);
  void add_to_buckets(Card& c, double t0, double t1, double level);
  void widen(Card& c);
  mem::Tier tier_;
  double low_, high_;
  mutable std::mutex mu_;
  std::map<int, Card> cards_;
};

}  // namespace u3m::observe
