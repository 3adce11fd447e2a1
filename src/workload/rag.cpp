// The RAG workload generator (include/u3m/workload/rag.hpp, docs/requests.md).
#include "u3m/workload/rag.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::workload {

ZipfSampler::ZipfSampler(std::uint32_t n, double s) {
  if (n == 0) input_error("--corpus", "must be at least 1 passage");
  if (!std::isfinite(s) || s < 0) input_error("--zipf", "must be a finite number >= 0, got {}", s);
  cdf_.resize(n);
  double sum = 0;
  for (std::uint32_t r = 0; r < n; ++r) {
    sum += std::pow(static_cast<double>(r) + 1, -s);
    cdf_[r] = sum;
  }
  for (double& c : cdf_) c /= sum;
  cdf_.back() = 1.0;  // no rounding gap above the last rank
}

std::uint32_t ZipfSampler::sample(Rng& rng) const {
  const double u = rng.uniform01();
  return static_cast<std::uint32_t>(std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
}

double ZipfSampler::probability(std::uint32_t rank) const {
  return rank == 0 ? cdf_[0] : cdf_[rank] - cdf_[rank - 1];
}

void RagConfig::validate(std::string_view prefix) const {
  auto field = [&](std::string_view key) { return fmt::format("{}{}", prefix, key); };
  if (corpus == 0) input_error(field("corpus"), "must be at least 1 passage");
  // Bounds on what one run can hold: the sampler keeps a double per passage
  // and every request is kept in memory.
  if (corpus > kMaxCorpus) input_error(field("corpus"), "{} passages: at most {}", corpus, kMaxCorpus);
  if (requests > kMaxRequests)
    input_error(field("requests"), "{} requests: at most {}", requests, kMaxRequests);
  if (passages_per_request > corpus)
    input_error(field("passages"), "{} passages per request, but the corpus has only {}",
                passages_per_request, corpus);
  if (!std::isfinite(zipf_s) || zipf_s < 0)
    input_error(field("zipf"), "must be a finite number >= 0, got {}", zipf_s);
  if (!(rate_per_s > 0) || !std::isfinite(rate_per_s))
    input_error(field("rate"), "must be a positive number of requests per second");
  if (turns == 0) input_error(field("turns"), "must be at least 1");
  if (!(followup_prob >= 0 && followup_prob <= 1))
    input_error(field("followup-prob"), "must be between 0 and 1, got {}", followup_prob);
  // The longest possible prompt: the last turn carries every earlier question and answer.
  const std::uint64_t longest = std::uint64_t{system_tokens} +
                                std::uint64_t{passages_per_request} * passage.upper_bound() +
                                std::uint64_t{turns} * question.upper_bound() +
                                std::uint64_t{turns - 1} * output.upper_bound();
  if (longest > UINT32_MAX)
    input_error(field("turns"), "prompts could reach {} tokens, more than 2^32 - 1", longest);
}

std::string RagConfig::describe() const {
  return fmt::format(
      "rag requests={} rate={:g}/s system={} corpus={} passages={} zipf={:g} passage-len={} "
      "question-len={} output-len={} passage-order={} turns={} followup-prob={:g} seed={}",
      requests, rate_per_s, system_tokens, corpus, passages_per_request, zipf_s, passage.describe(),
      question.describe(), output.describe(), sort_passages ? "sorted" : "rank", turns,
      followup_prob, seed);
}

namespace {

// Independent streams from one seed: content, corpus lengths and arrivals
// each get their own, so changing one never shifts another.
std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t stream) {
  Rng r(seed ^ (0x5851f42d4c957f2dull * (stream + 1)));
  return r.next_u64();
}

struct Session {
  std::string id;
  std::uint32_t turns_done = 0;
  ServeRequest last;  // the previous turn
};

}  // namespace

std::vector<ServeRequest> generate_rag(const RagConfig& cfg,
                                       const std::vector<double>* arrival_ms) {
  cfg.validate();
  Rng content(stream_seed(cfg.seed, 0)), lengths(stream_seed(cfg.seed, 1)),
      arrivals(stream_seed(cfg.seed, 2));
  const ZipfSampler zipf(cfg.corpus, cfg.zipf_s);
  std::vector<std::uint32_t> passage_tokens(cfg.corpus);
  for (std::uint32_t& t : passage_tokens) t = lengths.sample(cfg.passage);

  std::size_t count = cfg.requests;
  if (arrival_ms) {
    if (cfg.requests == 0 || cfg.requests > arrival_ms->size()) count = arrival_ms->size();
    for (std::size_t i = 1; i < count; ++i)
      if ((*arrival_ms)[i] < (*arrival_ms)[i - 1])
        input_error("arrival times", "request {} arrives before request {}", i, i - 1);
  } else if (count == 0) {
    input_error("--requests", "must be a positive integer without --arrivals-from");
  }

  std::vector<ServeRequest> out;
  out.reserve(count);
  std::vector<Session> open;
  std::uint64_t sessions = 0;
  std::vector<std::uint32_t> picked;
  double t_ms = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (arrival_ms) {
      t_ms = (*arrival_ms)[i];
    } else {
      t_ms += -std::log(1.0 - arrivals.uniform01()) / cfg.rate_per_s * 1e3;
    }
    ServeRequest r;
    // Microsecond resolution keeps the files short; the process itself is unrounded.
    r.timestamp_ms = arrival_ms ? t_ms : std::round(t_ms * 1e3) / 1e3;
    r.output_tokens = content.sample(cfg.output);
    const std::string question = fmt::format("rag:q:{}", i);

    if (cfg.turns > 1 && !open.empty() && content.uniform01() < cfg.followup_prob) {
      // A follow-up: the previous prompt and its answer become the prefix.
      const std::size_t k = content.next_u64() % open.size();
      Session& s = open[k];
      r.session = s.id;
      r.prompt = s.last.prompt;
      r.prompt.push_back({fmt::format("rag:a:{}:{}", s.id, s.turns_done), s.last.output_tokens});
      r.prompt.push_back({question, content.sample(cfg.question)});
      s.last = r;
      if (++s.turns_done == cfg.turns) {
        open[k] = std::move(open.back());
        open.pop_back();
      }
      out.push_back(std::move(r));
      continue;
    }

    if (cfg.system_tokens) r.prompt.push_back({"rag:sys", cfg.system_tokens});
    // k distinct passages. Rejection is fast unless k is close to the corpus
    // size under strong skew; after 64 misses a slot takes the most popular
    // passage not yet chosen, so the loop always ends.
    picked.clear();
    auto taken = [&](std::uint32_t p) {
      return std::find(picked.begin(), picked.end(), p) != picked.end();
    };
    for (std::uint32_t j = 0; j < cfg.passages_per_request; ++j) {
      std::uint32_t p = zipf.sample(content);
      for (int miss = 0; taken(p) && miss < 64; ++miss) p = zipf.sample(content);
      for (p = taken(p) ? 0 : p; taken(p);) ++p;  // validate() ensured k <= corpus
      picked.push_back(p);
    }
    if (cfg.sort_passages) std::sort(picked.begin(), picked.end());
    for (std::uint32_t p : picked)
      r.prompt.push_back({fmt::format("rag:p:{}", p), passage_tokens[p]});
    r.prompt.push_back({question, content.sample(cfg.question)});
    if (cfg.turns > 1) {
      r.session = fmt::format("s{}", sessions++);
      open.push_back({r.session, 1, r});
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace u3m::workload
