#include "u3m/policy/prefetch.hpp"

#include <algorithm>
#include <cmath>

namespace u3m::policy {


double fetch_seconds(std::uint64_t bytes, mem::Tier from, const LinkCost& h2d,
                     const LinkCost& s2h) {
  switch (from) {
    case mem::Tier::device:
      return 0;
    case mem::Tier::host:
      return h2d.seconds(bytes);
    case mem::Tier::ssd:
      return s2h.seconds(bytes) + h2d.seconds(bytes);
  }
  return 0;
}

bool prefetch_due(double until_use_s, double transfer_s, double queued_s, double op_s,
                  const JitConfig& c) {
  return until_use_s <= (transfer_s + queued_s) * c.factor + c.slack_ops * op_s;
}

std::uint32_t horizon_ops(double max_transfer_s, double op_s, const JitConfig& c) {
  if (!(op_s > 0)) return c.max_ops;
  const double ops = std::ceil(max_transfer_s * c.factor / op_s) + c.slack_ops + 1;
  return static_cast<std::uint32_t>(
      std::clamp(ops, static_cast<double>(c.min_ops), static_cast<double>(c.max_ops)));
}

void OpClock::tick(std::uint64_t now_ns) {
  if (started_ && now_ns >= last_ns_) {
    const double dt = static_cast<double>(now_ns - last_ns_) * 1e-9;
    mean_s_ = measured_ ? mean_s_ + weight_ * (dt - mean_s_) : dt;
    measured_ = true;
  }
  started_ = true;
  last_ns_ = std::max(last_ns_, now_ns);
}

void IterationProfile::tick(std::uint32_t iteration, std::uint64_t now_ns) {
  if (started_ && iteration != iteration_) {
    prev_.swap(cur_);
    cur_.clear();
  }
  started_ = true;
  iteration_ = iteration;
  cur_.push_back(now_ns);
}

double IterationProfile::until_s(std::uint64_t k, double mean_op_s) const {
  const std::size_t n = prev_.size();
  if (cur_.empty() || n < 2) return static_cast<double>(k) * mean_op_s;
  const std::size_t o = cur_.size() - 1;           // the current op's offset in its iteration
  auto span = [&](std::size_t a, std::size_t b) {  // prev_[b] - prev_[a], a <= b < n
    return static_cast<double>(prev_[b] - prev_[a]) * 1e-9;
  };
  if (o >= n) return static_cast<double>(k) * mean_op_s;
  if (o + k < n) return span(o, o + k);
  // Into the next iteration: to the end, one op across the boundary, then
  // from the start; past a whole iteration, mean ops.
  const std::uint64_t rest = o + k - (n - 1) - 1;  // ops into the next iteration
  const double to_end = span(o, n - 1) + mean_op_s;
  if (rest < n) return to_end + span(0, rest);
  return to_end + span(0, n - 1) + static_cast<double>(rest - (n - 1)) * mean_op_s;
}

std::uint32_t IterationProfile::horizon_ops(double fetch_s, double mean_op_s,
                                            const JitConfig& c) const {
  const std::size_t n = prev_.size();
  if (n < 2) return policy::horizon_ops(fetch_s, mean_op_s, c);
  const auto need = static_cast<std::uint64_t>(std::llround(fetch_s * c.factor * 1e9));
  // Two pointers: for each start a, the first b with prev_[b] - prev_[a] >= need.
  std::size_t most = 0, b = 0;
  for (std::size_t a = 0; a < n; ++a) {
    b = std::max(b, a);
    while (b < n && prev_[b] - prev_[a] < need) ++b;
    if (b == n) {  // the rest of the iteration is shorter than the fetch
      most = std::max(most, n - a);
      break;
    }
    most = std::max(most, b - a);
  }
  const double ops = static_cast<double>(most) + c.slack_ops + 1;
  return static_cast<std::uint32_t>(
      std::clamp(ops, static_cast<double>(c.min_ops), static_cast<double>(c.max_ops)));
}

}  // namespace u3m::policy
