// A synthetic RAG serving workload in the u3m request format (docs/requests.md):
// a shared system prompt, k retrieved passages per request drawn from a
// corpus with Zipf popularity, and a unique question; optionally multi-turn
// sessions. Deterministic for a seed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "u3m/workload/config.hpp"
#include "u3m/workload/request_trace.hpp"
#include "u3m/workload/requests.hpp"

namespace u3m::workload {

// Zipf(s) over ranks 0..n-1: P(rank r) is proportional to (r + 1)^-s.
// s = 0 is uniform. Sampling inverts a precomputed CDF (O(log n)).
class ZipfSampler {
 public:
  ZipfSampler(std::uint32_t n, double s);  // throws InputError: n >= 1, s finite and >= 0
  std::uint32_t sample(Rng& rng) const;
  double probability(std::uint32_t rank) const;
  std::uint32_t size() const { return static_cast<std::uint32_t>(cdf_.size()); }

 private:
  std::vector<double> cdf_;
};

// Note [RAG workload defaults]
// The defaults are assumptions, not measurements: a 512-token system prompt,
// k = 4 passages of 256-512 tokens from a 10,000-passage corpus with Zipf
// s = 1.0 popularity (RAGCache, Jin et al. 2024, reports skewed retrieval on
// its traces; the exponent here is a knob, not a fit), a 16-64-token question
// and 64-256 output tokens.
struct RagConfig {
  std::uint32_t requests = 1000;      // with trace arrivals: at most this many (0: all of them)
  double rate_per_s = 2.0;            // Poisson arrivals when no trace is given
  std::uint32_t system_tokens = 512;  // 0: no system prompt
  std::uint32_t corpus = 10000;       // passages
  std::uint32_t passages_per_request = 4;
  double zipf_s = 1.0;
  // Each passage's length is drawn once, so a passage has one length everywhere.
  LengthDist passage = LengthDist::uniform(256, 512);
  LengthDist question = LengthDist::uniform(16, 64);
  LengthDist output = LengthDist::uniform(64, 256);
  // false: passages in retrieval order (rank of relevance); true: sorted by
  // passage id, so requests that retrieve the same set share the whole prefix.
  bool sort_passages = false;
  // Multi-turn sessions: a follow-up's prompt is the previous turn's prompt,
  // its answer and a new question (no new retrieval). 1: single-turn.
  std::uint32_t turns = 1;
  double followup_prob = 0.5;  // an arrival continues an open session with this probability
  std::uint64_t seed = 1;

  // Throws InputError naming the field as `prefix` + its key: the CLI flag
  // ("--zipf") by default; serve's "rag:KEY=V" spec passes kSpecPrefix.
  static constexpr std::string_view kSpecPrefix = "--requests rag:";
  static constexpr std::uint32_t kMaxCorpus = 10'000'000, kMaxRequests = 10'000'000;
  void validate(std::string_view prefix = "--") const;
  std::string describe() const;  // one line, enough to recreate the workload
};

// Requests at the given arrival times (ms, non-decreasing), or, when
// arrival_ms is null, at Poisson(rate_per_s) times starting after one gap.
// Arrival times use their own random stream: the same seed gives the same
// prompts whichever arrival process is used.
std::vector<ServeRequest> generate_rag(const RagConfig& cfg,
                                       const std::vector<double>* arrival_ms = nullptr);

}  // namespace u3m::workload
