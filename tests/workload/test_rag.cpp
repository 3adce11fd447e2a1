// The RAG workload generator (src/workload/rag.cpp) and `u3m requests gen rag`.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_testing.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/rag.hpp"

namespace {

using namespace u3m::workload;

TEST(Zipf, ProbabilitiesFollowThePowerLaw) {
  const ZipfSampler z(100, 1.2);
  double sum = 0;
  for (std::uint32_t r = 0; r < 100; ++r) sum += z.probability(r);
  EXPECT_NEAR(sum, 1.0, 1e-12);
  EXPECT_NEAR(z.probability(0) / z.probability(1), std::pow(2.0, 1.2), 1e-9);
  EXPECT_NEAR(z.probability(9) / z.probability(99), std::pow(10.0, 1.2), 1e-9);
  const ZipfSampler flat(50, 0);
  EXPECT_NEAR(flat.probability(0), 1.0 / 50, 1e-12);
  EXPECT_NEAR(flat.probability(49), 1.0 / 50, 1e-12);
  EXPECT_THROW(ZipfSampler(0, 1), u3m::InputError);
  EXPECT_THROW(ZipfSampler(10, -1), u3m::InputError);
}

TEST(Zipf, SampleFrequenciesMatchTheProbabilities) {
  const ZipfSampler z(100, 1.0);
  Rng rng(42);
  const int n = 200000;
  std::vector<int> hits(100);
  for (int i = 0; i < n; ++i) ++hits.at(z.sample(rng));
  // Each of the first ranks within 5 standard deviations of its expectation.
  for (std::uint32_t r : {0u, 1u, 4u, 20u, 99u}) {
    const double p = z.probability(r);
    EXPECT_NEAR(hits[r], n * p, 5 * std::sqrt(n * p * (1 - p))) << "rank " << r;
  }
}

RagConfig small() {
  RagConfig c;
  c.requests = 400;
  c.corpus = 200;
  c.passages_per_request = 3;
  c.system_tokens = 64;
  c.passage = LengthDist::uniform(10, 20);
  c.question = LengthDist::uniform(3, 6);
  c.output = LengthDist::uniform(2, 9);
  c.seed = 7;
  return c;
}

TEST(RagGen, SameSeedSameRequestsOtherSeedOthers) {
  const RagConfig c = small();
  const auto a = generate_rag(c);
  EXPECT_EQ(a, generate_rag(c));
  RagConfig d = c;
  d.seed = 8;
  EXPECT_NE(a, generate_rag(d));
}

TEST(RagGen, PromptsAreSystemThenDistinctPassagesThenAUniqueQuestion) {
  const RagConfig c = small();
  const auto rs = generate_rag(c);
  ASSERT_EQ(rs.size(), c.requests);
  std::map<std::string, std::uint32_t> length;
  std::map<std::string, int> questions;
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const ServeRequest& r = rs[i];
    if (i) {
      EXPECT_GT(r.timestamp_ms, rs[i - 1].timestamp_ms);
    }
    ASSERT_EQ(r.prompt.size(), 1 + c.passages_per_request + 1);
    EXPECT_EQ(r.prompt.front(), (PromptSegment{"rag:sys", 64}));
    std::vector<std::string> ps;
    for (std::size_t k = 1; k <= c.passages_per_request; ++k) {
      const PromptSegment& s = r.prompt[k];
      ASSERT_EQ(s.id.rfind("rag:p:", 0), 0u) << s.id;
      EXPECT_GE(s.tokens, 10u);
      EXPECT_LE(s.tokens, 20u);
      auto [it, fresh] = length.emplace(s.id, s.tokens);
      EXPECT_EQ(it->second, s.tokens) << "passage " << s.id << " changed length";
      EXPECT_EQ(std::count(ps.begin(), ps.end(), s.id), 0) << "passage twice in request " << i;
      ps.push_back(s.id);
    }
    EXPECT_EQ(++questions[r.prompt.back().id], 1);
    EXPECT_GE(r.prompt.back().tokens, 3u);
    EXPECT_LE(r.output_tokens, 9u);
    EXPECT_TRUE(r.session.empty());
  }
}

TEST(RagGen, PopularPassagesFollowZipf) {
  // k = 1 makes each request one Zipf draw, so frequencies are the probabilities.
  RagConfig c = small();
  c.requests = 20000;
  c.passages_per_request = 1;
  c.corpus = 100;
  const ZipfSampler z(c.corpus, c.zipf_s);
  std::vector<int> hits(c.corpus);
  for (const auto& r : generate_rag(c)) ++hits.at(std::stoul(r.prompt[1].id.substr(6)));
  for (std::uint32_t rank : {0u, 1u, 9u}) {
    const double p = z.probability(rank), n = c.requests;
    EXPECT_NEAR(hits[rank], n * p, 5 * std::sqrt(n * p * (1 - p))) << "passage " << rank;
  }
  // Skew makes the prefix cache pay: more hits than with uniform popularity.
  auto hit_rate = [](const RagConfig& cfg) {
    RequestStats s;
    for (const auto& r : generate_rag(cfg)) s.add(r);
    return s.report().caches[0].hit_rate;
  };
  RagConfig uniform = c;
  uniform.zipf_s = 0;
  c.corpus = uniform.corpus = 5000;
  c.requests = uniform.requests = 2000;
  c.system_tokens = uniform.system_tokens = 0;  // only passages decide
  EXPECT_GT(hit_rate(c), hit_rate(uniform) + 0.05);
}

TEST(RagGen, ArrivalsArePoissonOrTheTracesOwn) {
  RagConfig c = small();
  c.requests = 4000;
  c.rate_per_s = 5;
  const auto rs = generate_rag(c);
  const double mean_gap_ms = rs.back().timestamp_ms / rs.size();
  EXPECT_NEAR(mean_gap_ms, 200, 200 * 5 / std::sqrt(4000.0));  // 5 sigma of an exponential mean
  const std::vector<double> at = {0, 0, 10, 3000};
  c.requests = 0;  // all of them
  const auto traced = generate_rag(c, &at);
  ASSERT_EQ(traced.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(traced[i].timestamp_ms, at[i]);
    // Arrivals have their own random stream: the prompts do not change.
    EXPECT_EQ(traced[i].prompt, rs[i].prompt);
  }
  c.requests = 2;
  EXPECT_EQ(generate_rag(c, &at).size(), 2u);
  const std::vector<double> backwards = {5, 1};
  EXPECT_THROW(generate_rag(c, &backwards), u3m::InputError);
}

TEST(RagGen, FollowUpsRepeatThePreviousPromptAndAnswer) {
  RagConfig c = small();
  c.turns = 3;
  c.followup_prob = 0.6;
  const auto rs = generate_rag(c);
  std::map<std::string, std::vector<const ServeRequest*>> by_session;
  for (const auto& r : rs) {
    ASSERT_FALSE(r.session.empty());
    by_session[r.session].push_back(&r);
  }
  int followups = 0;
  for (const auto& [id, turns] : by_session) {
    EXPECT_LE(turns.size(), 3u) << id;
    for (std::size_t t = 1; t < turns.size(); ++t) {
      const ServeRequest& prev = *turns[t - 1];
      const ServeRequest& cur = *turns[t];
      ASSERT_EQ(cur.prompt.size(), prev.prompt.size() + 2);
      EXPECT_TRUE(std::equal(prev.prompt.begin(), prev.prompt.end(), cur.prompt.begin()));
      EXPECT_EQ(cur.prompt[prev.prompt.size()].tokens, prev.output_tokens);  // the answer
      ++followups;
    }
  }
  EXPECT_GT(followups, 50);
  // Each follow-up reuses its whole previous prompt, so it hits at least that much.
  RequestStats s;
  for (const auto& r : rs) s.add(r);
  std::uint64_t floor = 0;
  for (const auto& [id, turns] : by_session)
    for (std::size_t t = 1; t < turns.size(); ++t) floor += turns[t - 1]->prompt_tokens();
  EXPECT_GE(s.report().caches[0].hit_tokens, floor);
}

TEST(RagGen, SortedPassagesAndValidation) {
  RagConfig c = small();
  c.sort_passages = true;
  for (const auto& r : generate_rag(c))
    for (std::size_t k = 2; k <= c.passages_per_request; ++k)
      EXPECT_LT(std::stoul(r.prompt[k - 1].id.substr(6)), std::stoul(r.prompt[k].id.substr(6)));
  // Every passage of a tiny corpus still fits a request, even with strong skew.
  c.corpus = c.passages_per_request = 5;
  c.zipf_s = 4;
  for (const auto& r : generate_rag(c)) EXPECT_EQ(r.prompt.size(), 7u);
  auto error = [](RagConfig bad) {
    try {
      generate_rag(bad);
    } catch (const u3m::InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  RagConfig b = small();
  b.passages_per_request = 300;
  EXPECT_NE(error(b).find("--passages: 300 passages per request, but the corpus has only 200"),
            std::string::npos);
  b = small();
  b.followup_prob = 2;
  EXPECT_NE(error(b).find("--followup-prob"), std::string::npos);
  b = small();
  b.rate_per_s = 0;
  EXPECT_NE(error(b).find("--rate"), std::string::npos);
}

TEST(RagGenCli, WritesAFileTheStrictReaderLoads) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("u3m-rag-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto out = (dir / "rag.jsonl").string();
  auto r = u3m::testing::run_cli(
      "requests gen rag --requests 50 --corpus 100 --passages 2 --turns 2 --seed 3 -o " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("computed from the generated requests"), std::string::npos) << r.output;
  const auto rs = load_requests(out);
  ASSERT_EQ(rs.size(), 50u);
  RagConfig c;
  c.requests = 50;
  c.corpus = 100;
  c.passages_per_request = 2;
  c.turns = 2;
  c.seed = 3;
  EXPECT_EQ(rs, generate_rag(c));  // the CLI defaults are the library's
  // Arrival times from another trace.
  const auto out2 = (dir / "rag2.jsonl").string();
  r = u3m::testing::run_cli("requests gen rag --requests 0 --arrivals-from " +
                            std::string(U3M_SOURCE_DIR) +
                            "/data/requests/samples/azure_conv_head20.csv -o " + out2);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto azure =
      load_requests(std::string(U3M_SOURCE_DIR) + "/data/requests/samples/azure_conv_head20.csv");
  const auto rs2 = load_requests(out2);
  ASSERT_EQ(rs2.size(), azure.size());
  for (std::size_t i = 0; i < rs2.size(); ++i)
    EXPECT_EQ(rs2[i].timestamp_ms, azure[i].timestamp_ms);
  r = u3m::testing::run_cli("requests gen rag --passages 5 --corpus 2 -o " + out);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--passages"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
