#include "u3m/workload/requests.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::workload {

std::uint64_t Rng::next_u64() {
  // splitmix64 (Steele, Lea, Flood 2014): fully specified, so traces are
  // reproducible across standard libraries (std:: distributions are not).
  std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform01() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

double Rng::normal() {
  double u1 = 1.0 - uniform01();  // (0, 1]
  double u2 = uniform01();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
}

std::uint32_t Rng::sample(const LengthDist& d) {
  switch (d.kind) {
    case LengthDist::Kind::fixed:
      return d.max;
    case LengthDist::Kind::uniform: {
      auto lo = static_cast<std::uint64_t>(d.a);
      std::uint64_t span = d.max - lo + 1;
      return static_cast<std::uint32_t>(lo + next_u64() % span);
    }
    case LengthDist::Kind::lognormal: {
      double v = std::round(d.a * std::exp(d.b * normal()));
      return static_cast<std::uint32_t>(std::clamp(v, 1.0, static_cast<double>(d.max)));
    }
  }
  return 1;
}

void PoissonConfig::validate() const {
  if (!(rate_per_s > 0) || !std::isfinite(rate_per_s))
    input_error("--arrival-rate", "must be a positive number of requests per second");
  if (count == 0) input_error("--requests", "must be a positive integer");
}

PoissonSource::PoissonSource(PoissonConfig cfg) : cfg_(cfg), rng_(cfg.seed) {
  cfg_.validate();
}

std::optional<Request> PoissonSource::next() {
  if (emitted_ >= cfg_.count) return std::nullopt;
  // Exponential inter-arrival gaps; the first request arrives after one gap.
  t_ns_ += -std::log(1.0 - rng_.uniform01()) / cfg_.rate_per_s * 1e9;
  Request r;
  r.id = emitted_++;
  // A tiny rate can push arrivals past what 64-bit nanoseconds hold.
  if (!(t_ns_ < 9.2e18))
    input_error("--arrival-rate", "{} requests/s puts request {} beyond 2^63 ns", cfg_.rate_per_s,
                r.id);
  r.arrival_ns = static_cast<std::uint64_t>(t_ns_);
  r.prompt_tokens = rng_.sample(cfg_.prompt);
  r.output_tokens = rng_.sample(cfg_.output);
  return r;
}

std::string PoissonSource::describe() const {
  return fmt::format("poisson rate={:g}/s count={} prompt={} output={} seed={}", cfg_.rate_per_s,
                     cfg_.count, cfg_.prompt.describe(), cfg_.output.describe(), cfg_.seed);
}

ListSource::ListSource(std::vector<Request> requests, std::string description)
    : requests_(std::move(requests)), description_(std::move(description)) {
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    const Request& r = requests_[i];
    if (r.prompt_tokens == 0 || r.output_tokens == 0)
      input_error(description_, "request {} (id {}): prompt and output lengths must be >= 1", i,
                  r.id);
    if (i > 0 && r.arrival_ns < requests_[i - 1].arrival_ns)
      input_error(description_, "request {} (id {}): arrival times must not decrease", i, r.id);
  }
}

std::optional<Request> ListSource::next() {
  if (pos_ >= requests_.size()) return std::nullopt;
  return requests_[pos_++];
}

}  // namespace u3m::workload
