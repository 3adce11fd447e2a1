// Where serving requests come from. The generators only see the
// RequestSource interface, so a reader of real request traces (Mooncake,
// Azure LLM inference traces) can replace the synthetic Poisson source.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "u3m/workload/config.hpp"

namespace u3m::workload {

struct Request {
  std::uint64_t id = 0;
  std::uint64_t arrival_ns = 0;
  std::uint32_t prompt_tokens = 1;
  std::uint32_t output_tokens = 1;  // tokens to generate, >= 1 (prefill yields the first)
};

class RequestSource {
 public:
  virtual ~RequestSource() = default;
  // The next request, in non-decreasing arrival order; nullopt when exhausted.
  virtual std::optional<Request> next() = 0;
  // One line for the trace metadata, enough to recreate the source.
  virtual std::string describe() const = 0;
};

// Deterministic, platform-independent random numbers (splitmix64): the same
// seed gives the same trace with any standard library.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next_u64();
  double uniform01();  // [0, 1)
  double normal();     // standard normal (Box-Muller)
  std::uint32_t sample(const LengthDist& d);

 private:
  std::uint64_t s_;
};

struct PoissonConfig {
  double rate_per_s = 2.0;  // mean arrivals per second of nominal time
  std::uint32_t count = 32;
  LengthDist prompt = LengthDist::uniform(256, 2048);
  LengthDist output = LengthDist::uniform(16, 256);
  std::uint64_t seed = 1;
  void validate() const;
};

// Poisson arrivals (exponential gaps) starting at time 0; lengths drawn from
// the configured distributions.
class PoissonSource final : public RequestSource {
 public:
  explicit PoissonSource(PoissonConfig cfg);
  std::optional<Request> next() override;
  std::string describe() const override;

 private:
  PoissonConfig cfg_;
  Rng rng_;
  std::uint64_t emitted_ = 0;
  double t_ns_ = 0;
};

// A fixed list, e.g. parsed from a real request trace or written by a test.
class ListSource final : public RequestSource {
 public:
  explicit ListSource(std::vector<Request> requests, std::string description = "list");
  std::optional<Request> next() override;
  std::string describe() const override { return description_; }

 private:
  std::vector<Request> requests_;
  std::size_t pos_ = 0;
  std::string description_;
};

}  // namespace u3m::workload
