// The RAG workload generator (include/u3m/workload/rag.hpp, docs/requests.md).
#include "u3m/workload/rag.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

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

ZipfRejectionSampler::ZipfRejectionSampler(std::uint64_t n, double s) : n_(n), s_(s) {
  if (n == 0) input_error("--corpus", "must be at least 1 passage");
  if (!std::isfinite(s) || s < 0) input_error("--zipf", "must be a finite number >= 0, got {}", s);
  h_integral_x1_ = h_integral(1.5) - 1;
  h_integral_n_ = h_integral(static_cast<double>(n) + 0.5);
  threshold_ = 2 - h_integral_inverse(h_integral(2.5) - h(2));
}

namespace {
// log1p(x)/x and expm1(x)/x, with their series near 0.
double helper1(double x) {
  return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x));
}
double helper2(double x) {
  return std::abs(x) > 1e-8 ? std::expm1(x) / x
                            : 1 + x * 0.5 * (1 + x * (1.0 / 3) * (1 + 0.25 * x));
}
}  // namespace

// Ranks here are 1-based as in the paper; sample() returns rank - 1.
double ZipfRejectionSampler::h(double x) const {
  return std::exp(-s_ * std::log(x));
}

double ZipfRejectionSampler::h_integral(double x) const {
  const double log_x = std::log(x);
  return helper2((1 - s_) * log_x) * log_x;
}

double ZipfRejectionSampler::h_integral_inverse(double x) const {
  double t = x * (1 - s_);
  if (t < -1) t = -1;  // rounding guard
  return std::exp(helper1(t) * x);
}

std::uint64_t ZipfRejectionSampler::sample(Rng& rng) const {
  for (;;) {
    const double u = h_integral_n_ + rng.uniform01() * (h_integral_x1_ - h_integral_n_);
    const double x = h_integral_inverse(u);
    double kd = std::floor(x + 0.5);
    kd = std::clamp(kd, 1.0, static_cast<double>(n_));
    const auto k = static_cast<std::uint64_t>(kd);
    if (kd - x <= threshold_ || u >= h_integral(kd + 0.5) - h(kd)) return k - 1;
  }
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
  if (topics > kMaxTopics)
    input_error(field("topics"), "{} topics: at most {}", topics, kMaxTopics);
  if (!std::isfinite(topic_zipf) || topic_zipf < 0)
    input_error(field("topic-zipf"), "must be a finite number >= 0, got {}", topic_zipf);
  if (!std::isfinite(rank_noise) || rank_noise < 0)
    input_error(field("rank-noise"), "must be a finite number of ranks >= 0, got {}", rank_noise);
  if (system_prompts == 0) input_error(field("system-prompts"), "must be at least 1");
  if (system_prompts > kMaxSystemPrompts)
    input_error(field("system-prompts"), "{} system prompts: at most {}", system_prompts,
                kMaxSystemPrompts);
  if (!std::isfinite(system_zipf) || system_zipf < 0)
    input_error(field("system-zipf"), "must be a finite number >= 0, got {}", system_zipf);
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
      "rag requests={} rate={:g}/s system={} system-prompts={} system-zipf={:g} corpus={} "
      "passages={} zipf={:g} topics={} topic-zipf={:g} rank-noise={:g} passage-len={} "
      "question-len={} output-len={} passage-order={} turns={} followup-prob={:g} seed={}",
      requests, rate_per_s, system_tokens, system_prompts, system_zipf, corpus,
      passages_per_request, zipf_s, topics, topic_zipf, rank_noise, passage.describe(),
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
  Rng content(stream_seed(cfg.seed, 0)), arrivals(stream_seed(cfg.seed, 2));
  const std::uint64_t length_seed = stream_seed(cfg.seed, 1), topic_seed = stream_seed(cfg.seed, 3);
  const ZipfRejectionSampler passage_zipf(cfg.corpus, cfg.zipf_s);
  const ZipfRejectionSampler topic_zipf(std::max<std::uint32_t>(cfg.topics, 1), cfg.topic_zipf);
  const ZipfRejectionSampler system_zipf(cfg.system_prompts, cfg.system_zipf);
  const std::uint32_t k = cfg.passages_per_request;
  // A passage's length is a function of its id: no table, however large the corpus.
  auto passage_tokens = [&](std::uint64_t p) {
    Rng r(stream_seed(length_seed, p));
    return r.sample(cfg.passage);
  };
  // Up to `n` distinct passages by popularity. Rejection is fast unless n is
  // close to the corpus size under strong skew; after 64 misses a slot takes
  // the most popular passage not yet chosen, so the loop always ends.
  auto draw_distinct = [&](Rng& rng, std::uint32_t n, std::vector<std::uint32_t>& out) {
    out.clear();
    auto taken = [&](std::uint32_t p) { return std::find(out.begin(), out.end(), p) != out.end(); };
    for (std::uint32_t j = 0; j < n; ++j) {
      auto p = static_cast<std::uint32_t>(passage_zipf.sample(rng));
      for (int miss = 0; taken(p) && miss < 64; ++miss)
        p = static_cast<std::uint32_t>(passage_zipf.sample(rng));
      for (p = taken(p) ? 0 : p; taken(p);) ++p;  // n <= corpus: a free id exists
      out.push_back(p);
    }
  };
  // Topic t's ranked list: 2k passages (at most the corpus), drawn once from
  // the topic's own stream, so it is the same whenever the topic recurs.
  const std::uint32_t list_len =
      static_cast<std::uint32_t>(std::min<std::uint64_t>(std::uint64_t{2} * k, cfg.corpus));
  std::unordered_map<std::uint64_t, std::vector<std::uint32_t>> topic_lists;
  auto ranked_list = [&](std::uint64_t t) -> const std::vector<std::uint32_t>& {
    auto [it, fresh] = topic_lists.try_emplace(t);
    if (fresh) {
      Rng r(stream_seed(topic_seed, t));
      draw_distinct(r, list_len, it->second);
    }
    return it->second;
  };

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
  std::vector<std::pair<double, std::uint32_t>> scored;
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
      const std::size_t s_idx = content.next_u64() % open.size();
      Session& s = open[s_idx];
      r.session = s.id;
      r.prompt = s.last.prompt;
      r.prompt.push_back({fmt::format("rag:a:{}:{}", s.id, s.turns_done), s.last.output_tokens});
      r.prompt.push_back({question, content.sample(cfg.question)});
      s.last = r;
      if (++s.turns_done == cfg.turns) {
        open[s_idx] = std::move(open.back());
        open.pop_back();
      }
      out.push_back(std::move(r));
      continue;
    }

    if (cfg.system_tokens) {
      if (cfg.system_prompts == 1) {
        r.prompt.push_back({"rag:sys", cfg.system_tokens});
      } else {
        r.prompt.push_back(
            {fmt::format("rag:sys:{}", system_zipf.sample(content)), cfg.system_tokens});
      }
    }
    if (cfg.topics == 0) {
      draw_distinct(content, k, picked);  // independent draws (no topics)
    } else {
      // Perturbed ranks: list position j scores j + N(0, sigma^2); the k best
      // scores are retrieved, best first.
      const std::vector<std::uint32_t>& list = ranked_list(topic_zipf.sample(content));
      scored.clear();
      for (std::uint32_t j = 0; j < list.size(); ++j)
        scored.emplace_back(j + (cfg.rank_noise > 0 ? cfg.rank_noise * content.normal() : 0.0),
                            list[j]);
      std::partial_sort(scored.begin(), scored.begin() + k, scored.end());
      picked.clear();
      for (std::uint32_t j = 0; j < k; ++j) picked.push_back(scored[j].second);
    }
    if (cfg.sort_passages) std::sort(picked.begin(), picked.end());
    for (std::uint32_t p : picked)
      r.prompt.push_back({fmt::format("rag:p:{}", p), passage_tokens(p)});
    r.prompt.push_back({question, content.sample(cfg.question)});
    if (cfg.turns > 1) {
      r.session = fmt::format("s{}", sessions++);
      open.push_back({r.session, 1, r});
    }
    out.push_back(std::move(r));
  }
  return out;
}

double SegmentReuse::prefix_share() const {
  return prompt_tokens ? double(prefix_tokens) / double(prompt_tokens) : 0.0;
}

double SegmentReuse::any_position_share() const {
  return prompt_tokens ? double(any_position_tokens) / double(prompt_tokens) : 0.0;
}

SegmentReuse segment_reuse(const std::vector<ServeRequest>& requests) {
  SegmentReuse u;
  RequestStats stats;
  std::unordered_set<std::string> seen;
  for (const ServeRequest& r : requests) {
    stats.add(r);
    for (const PromptSegment& s : r.prompt) {
      u.prompt_tokens += s.tokens;
      if (seen.contains(s.id)) u.any_position_tokens += s.tokens;
    }
    for (const PromptSegment& s : r.prompt) seen.insert(s.id);
  }
  u.prefix_tokens = stats.report().caches.at(0).hit_tokens;
  return u;
}

}  // namespace u3m::workload
