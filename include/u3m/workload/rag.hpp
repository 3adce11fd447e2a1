// A synthetic RAG serving workload in the u3m request format (docs/requests.md):
// one of a few application system prompts, k passages per request retrieved
// for a query topic (a Zipf-popular topic whose ranked passage list is
// perturbed by rank noise, so the same topic retrieves an overlapping but not
// identical top-k in varying order), and a unique question; optionally
// multi-turn sessions. Deterministic for a seed.
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

// The same law over ranks 0..n-1 without a table: rejection-inversion
// (Hormann & Derflinger 1996, as in Apache Commons RNG's
// RejectionInversionZipfSampler), O(1) memory, so a 21M-passage corpus costs
// nothing. Exact, not an approximation: sample frequencies follow
// ZipfSampler::probability.
class ZipfRejectionSampler {
 public:
  ZipfRejectionSampler(std::uint64_t n, double s);  // throws InputError like ZipfSampler
  std::uint64_t sample(Rng& rng) const;

 private:
  double h(double x) const;
  double h_integral(double x) const;
  double h_integral_inverse(double x) const;
  std::uint64_t n_;
  double s_, h_integral_x1_, h_integral_n_, threshold_;
};

// Note [RAG workload defaults]
// Sourced defaults (docs/requests.md, "The RAG generator", has the table):
//  * corpus = 21,015,324 passages: the DPR Wikipedia corpus (Karpukhin et al.,
//    EMNLP 2020, "Dense Passage Retrieval for Open-Domain Question Answering",
//    Sec. 4.1: the Dec. 2018 English Wikipedia split into 100-word passages).
//  * passage length: DPR's 100-word passages; 100 words is ~130 tokens at ~1.3
//    tokens per English word. The 1.3 factor and the +-20-token spread
//    (uniform 110..150) are ASSUMPTIONS.
//  * k = 4 passages: LangChain's VectorStore.similarity_search default k = 4
//    (LangChain API reference; a framework default, not a trace measurement).
//  * skewed passage popularity: RAGCache (Jin et al. 2024, arXiv 2404.12457)
//    characterises RAG retrieval as skewed towards a small share of documents;
//    that supports a Zipf law qualitatively, the exponent s = 1.0 is an
//    ASSUMPTION (not a fit).
//  * overlap and order variation: "adjacent queries may retrieve overlapping
//    evidence in different orders" (CacheWeaver, Tan et al., arXiv 2606.19667,
//    abstract); "43% of retrieved chunks are shared with prior requests, yet
//    only 11% are prefix-aligned" (Chunk-Level KV Cache Reuse for Efficient
//    RAG Serving, xzt102.github.io, 2026, Key Observations). Both only motivate
//    the model: the rank-noise law and its sigma = 1 rank are ASSUMPTIONS.
// ASSUMPTIONS without a published figure: 10,000 query topics with Zipf 1.0
// popularity, rank noise sigma = 1 rank over a 2k-long ranked list, 4 system
// prompts of 512 tokens with Zipf 1.0 popularity, 16-64-token questions,
// 64-256 output tokens, single-turn.
struct RagConfig {
  std::uint32_t requests = 1000;      // with trace arrivals: at most this many (0: all of them)
  double rate_per_s = 2.0;            // Poisson arrivals when no trace is given
  std::uint32_t system_tokens = 512;  // 0: no system prompt
  // Application templates: request draws template i with Zipf(system_zipf)
  // popularity; 1 keeps the single "rag:sys" segment of earlier versions.
  std::uint32_t system_prompts = 4;
  double system_zipf = 1.0;
  std::uint32_t corpus = 21'015'324;  // passages (DPR Wikipedia)
  std::uint32_t passages_per_request = 4;
  double zipf_s = 1.0;  // passage popularity: passage r has weight (r+1)^-s
  // Query topics: a request's topic is drawn with Zipf(topic_zipf) popularity
  // over `topics`; topic t has a fixed ranked list of 2k distinct passages
  // (drawn once, by passage popularity); each query perturbs the ranks with
  // N(0, rank_noise^2) noise and takes the k best, in that perturbed order.
  // topics = 0: no topics, each passage is an independent popularity draw
  // (the generator of earlier versions).
  std::uint32_t topics = 10'000;
  double topic_zipf = 1.0;
  double rank_noise = 1.0;  // in rank positions; 0: a topic always retrieves the same top-k
  // Each passage's length is drawn once, so a passage has one length everywhere.
  LengthDist passage = LengthDist::uniform(110, 150);
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
  // Passages and topics cost no memory each (lengths and ranked lists are
  // drawn from hashes on demand); every request is kept in memory.
  static constexpr std::uint32_t kMaxCorpus = 1'000'000'000, kMaxTopics = 1'000'000'000,
                                 kMaxSystemPrompts = 1'000'000, kMaxRequests = 10'000'000;
  void validate(std::string_view prefix = "--") const;
  std::string describe() const;  // one line, enough to recreate the workload
};

// Requests at the given arrival times (ms, non-decreasing), or, when
// arrival_ms is null, at Poisson(rate_per_s) times starting after one gap.
// Arrival times use their own random stream: the same seed gives the same
// prompts whichever arrival process is used.
std::vector<ServeRequest> generate_rag(const RagConfig& cfg,
                                       const std::vector<double>* arrival_ms = nullptr);

// Reuse on a trace in arrival order, unbounded cache: `prefix` is the ideal
// prefix-cache hit (Note [Ideal prefix cache], the same figure as `u3m requests
// stats`); `any_position` counts every segment whose id appeared in an earlier
// request, wherever it sits (what a position-independent KV cache such as
// CacheBlend's could reuse at best).
struct SegmentReuse {
  std::uint64_t prompt_tokens = 0, prefix_tokens = 0, any_position_tokens = 0;
  double prefix_share() const;
  double any_position_share() const;
};
SegmentReuse segment_reuse(const std::vector<ServeRequest>& requests);

}  // namespace u3m::workload
