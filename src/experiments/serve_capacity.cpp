// The serving capacity search (issue 6 item 4): per policy, the highest
// arrival-rate scale that meets the SLOs. docs/serving.md.
#include <cmath>

#include <fmt/format.h>

#include "u3m/experiments/serve.hpp"

namespace u3m::experiments {

// Note [Capacity search]
// "Meets the SLOs" at a rate scale: at least meet_fraction (default 90%) of
// the trace's requests meet both the TTFT and the TPOT SLO; a request too
// large to ever run counts as a miss. The search starts at scale 1 and
// doubles (or halves) until it brackets the boundary, within 2^-10..2^10,
// then bisects the bracket in log space five times (to within ~2%). It
// assumes that meeting the SLOs is monotone in the rate, which holds for
// queueing but not strictly for a finite trace (a higher rate can shift
// which requests share a batch); `tried` lists every probe so a reader can
// check. A probe stops early once more requests missed than the fraction
// allows, since it can no longer meet the SLOs.
std::vector<ServeCapacityRow> serving_capacity(
    const ServeScenario& base, const std::vector<std::string>& policies,
    const std::function<void(const std::string&)>& progress) {
  base.validate();
  const auto n = static_cast<double>(base.requests.size());
  const auto allowed = static_cast<std::uint64_t>(std::floor((1 - base.meet_fraction) * n));
  double trace_rate = 0;  // mean arrival rate of the trace at scale 1
  if (base.requests.size() > 1) {
    const double span =
        (base.requests.back().timestamp_ms - base.requests.front().timestamp_ms) / 1e3;
    if (span > 0) trace_rate = (n - 1) / span;
  }
  std::vector<ServeCapacityRow> rows;
  for (const std::string& policy : policies) {
    ServeCapacityRow row;
    row.policy = policy;
    ServeScenario s = base;
    s.policy = policy;
    auto probe = [&](double scale) {
      s.rate_scale = scale;
      if (progress) progress(fmt::format("{} at rate scale {:.3g}", policy, scale));
      // stop_after_misses 0 means "never stop", so allow one more when none is allowed.
      ServeResult r = simulate_serving(s, allowed + 1);
      const bool ok = !r.stopped_early && r.met_fraction >= base.meet_fraction;
      row.tried.push_back({scale, r.met_fraction});
      if (ok && scale > row.rate_scale) {
        row.rate_scale = scale;
        row.at = std::move(r);
      }
      return ok;
    };
    double lo = 0, hi = 0;  // lo meets, hi does not
    constexpr double kMin = 1.0 / 1024, kMax = 1024;
    if (probe(1)) {
      lo = 1;
      for (double x = 2; x <= kMax; x *= 2) {
        if (!probe(x)) {
          hi = x;
          break;
        }
        lo = x;
      }
    } else {
      hi = 1;
      for (double x = 0.5; x >= kMin; x /= 2) {
        if (probe(x)) {
          lo = x;
          break;
        }
        hi = x;
      }
    }
    if (lo > 0 && hi > 0) {
      for (int i = 0; i < 5; ++i) {
        const double mid = std::sqrt(lo * hi);
        (probe(mid) ? lo : hi) = mid;
      }
    }
    row.rate_rps = row.rate_scale * trace_rate;
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace u3m::experiments
