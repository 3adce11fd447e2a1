#include "u3m/mem/link.hpp"

#include <algorithm>
#include <cmath>

#include "u3m/util/error.hpp"

namespace u3m::mem {

std::uint64_t seconds_to_ns(double s) {
  return static_cast<std::uint64_t>(std::llround(s * 1e9));
}

double LinkModel::hold_s(std::uint64_t bytes) const {
  return bandwidth > 0 ? static_cast<double>(bytes) / bandwidth : 0.0;
}

void LinkModel::validate(std::string_view where, std::string_view name,
                         bool unbounded_ok) const {
  if (!(std::isfinite(bandwidth) && (bandwidth > 0 || (unbounded_ok && bandwidth == 0))))
    input_error(where, "{}.bandwidth must be a positive number of bytes/s{}, got {}", name,
                unbounded_ok ? " (or 0: unbounded)" : "", bandwidth);
  if (!(std::isfinite(latency_s) && latency_s >= 0))
    input_error(where, "{}.latency must be >= 0 s, got {}", name, latency_s);
}

LinkSchedule::Slot LinkSchedule::book(std::uint64_t now_ns, std::uint64_t bytes, double rate) {
  Slot s;
  s.start_ns = std::max(now_ns, free_ns_);
  s.free_ns = s.start_ns + (rate > 0 ? seconds_to_ns(static_cast<double>(bytes) / rate) : 0);
  free_ns_ = s.free_ns;
  return s;
}

double LinkSchedule::ahead_s(std::uint64_t now_ns) const {
  return free_ns_ > now_ns ? static_cast<double>(free_ns_ - now_ns) * 1e-9 : 0.0;
}

}  // namespace u3m::mem
