// The RAG workload generator (src/workload/rag.cpp) and `u3m requests gen rag`.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
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
  c.system_prompts = 1;  // the one "rag:sys" segment these tests check
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
  c.topics = 0;  // independent popularity draws
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

TEST(Zipf, RejectionSamplerMatchesTheTableSampler) {
  // The table-free sampler draws the same law: each rank within 5 sigma.
  for (double s : {0.0, 0.7, 1.0, 1.2, 3.0}) {
    const std::uint32_t n = 50;
    const ZipfSampler table(n, s);
    const ZipfRejectionSampler z(n, s);
    Rng rng(11);
    const int draws = 100000;
    std::vector<int> hits(n);
    for (int i = 0; i < draws; ++i) ++hits.at(z.sample(rng));
    for (std::uint32_t r : {0u, 1u, 7u, 49u}) {
      const double p = table.probability(r);
      EXPECT_NEAR(hits[r], draws * p, 5 * std::sqrt(draws * p * (1 - p)) + 1)
          << "s " << s << " rank " << r;
    }
  }
  Rng rng(3);
  const ZipfRejectionSampler one(1, 1.0);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(one.sample(rng), 0u);
  // A 21M-rank law costs no table and stays in range.
  const ZipfRejectionSampler big(21'015'324, 1.0);
  for (int i = 0; i < 1000; ++i) EXPECT_LT(big.sample(rng), 21'015'324u);
  EXPECT_THROW(ZipfRejectionSampler(0, 1), u3m::InputError);
  EXPECT_THROW(ZipfRejectionSampler(10, -0.5), u3m::InputError);
}

// The passage ids of a request, in prompt order.
std::vector<std::uint32_t> passages_of(const ServeRequest& r) {
  std::vector<std::uint32_t> ps;
  for (const auto& s : r.prompt)
    if (s.id.rfind("rag:p:", 0) == 0) ps.push_back(std::stoul(s.id.substr(6)));
  return ps;
}

RagConfig topical() {
  RagConfig c;  // library defaults except the size of the run
  c.requests = 2000;
  c.seed = 5;
  return c;
}

TEST(RagGen, TopicsRetrieveAnOverlappingTopKInVaryingOrder) {
  const auto rs = generate_rag(topical());
  ASSERT_EQ(rs.size(), 2000u);
  std::set<std::uint32_t> seen;
  std::set<std::vector<std::uint32_t>> sets_seen;
  std::map<std::vector<std::uint32_t>, std::set<std::vector<std::uint32_t>>> orders;
  int overlapping = 0, identical_set = 0;
  for (const auto& r : rs) {
    const auto ps = passages_of(r);
    ASSERT_EQ(ps.size(), 4u);
    auto set = ps;
    std::sort(set.begin(), set.end());
    EXPECT_EQ(std::adjacent_find(set.begin(), set.end()), set.end()) << "a passage twice";
    if (std::any_of(ps.begin(), ps.end(), [&](std::uint32_t p) { return seen.contains(p); }))
      ++overlapping;
    if (sets_seen.contains(set)) ++identical_set;
    seen.insert(ps.begin(), ps.end());
    sets_seen.insert(set);
    orders[set].insert(ps);
  }
  // Topics recur, so many requests share passages with an earlier one; rank
  // noise makes many of those a top-k set no earlier request retrieved.
  EXPECT_GT(overlapping, 0.3 * rs.size());
  EXPECT_GT(overlapping - identical_set, 0.2 * rs.size());
  EXPECT_GT(identical_set, 0);
  // Order variation: some passage set is retrieved in more than one order.
  int reordered = 0;
  for (const auto& [set, os] : orders) reordered += os.size() > 1;
  EXPECT_GT(reordered, 10);

  // Without rank noise a topic always retrieves the same top-k in the same
  // order: a set never appears in two orders, and fewer distinct sets.
  RagConfig quiet = topical();
  quiet.rank_noise = 0;
  std::map<std::vector<std::uint32_t>, std::set<std::vector<std::uint32_t>>> quiet_orders;
  for (const auto& r : generate_rag(quiet)) {
    const auto ps = passages_of(r);
    auto set = ps;
    std::sort(set.begin(), set.end());
    quiet_orders[set].insert(ps);
  }
  for (const auto& [set, os] : quiet_orders) EXPECT_EQ(os.size(), 1u);
  EXPECT_LT(quiet_orders.size(), orders.size());
}

TEST(RagGen, PassageFrequencyIsSkewed) {
  // Popular topics and popular passages: the most retrieved 1% of the
  // retrieved passages carry far more than 1% of the retrievals.
  std::map<std::uint32_t, int> freq;
  int total = 0;
  for (const auto& r : generate_rag(topical()))
    for (std::uint32_t p : passages_of(r)) ++freq[p], ++total;
  std::vector<int> counts;
  for (const auto& [p, n] : freq) counts.push_back(n);
  std::sort(counts.rbegin(), counts.rend());
  const std::size_t top = std::max<std::size_t>(1, counts.size() / 100);
  int head = 0;
  for (std::size_t i = 0; i < top; ++i) head += counts[i];
  EXPECT_GT(head, 0.15 * total) << top << " passages of " << counts.size();
  // The most popular passage id (rank 0) is among the most retrieved.
  EXPECT_LT(std::count_if(counts.begin(), counts.end(), [&](int n) { return n > freq[0]; }), 5);
}

TEST(RagGen, SeveralSystemPromptsWithSkew) {
  const auto rs = generate_rag(topical());
  std::map<std::string, int> sys;
  for (const auto& r : rs) {
    ASSERT_EQ(r.prompt.front().id.rfind("rag:sys:", 0), 0u) << r.prompt.front().id;
    EXPECT_EQ(r.prompt.front().tokens, 512u);
    ++sys[r.prompt.front().id];
  }
  EXPECT_EQ(sys.size(), 4u);
  // Zipf 1.0 over 4: P(template 0) = 1 / (1 + 1/2 + 1/3 + 1/4) = 0.48.
  const double p0 = 1 / (1 + 1.0 / 2 + 1.0 / 3 + 1.0 / 4), n = rs.size();
  EXPECT_NEAR(sys["rag:sys:0"], n * p0, 5 * std::sqrt(n * p0 * (1 - p0)));
  EXPECT_GT(sys["rag:sys:0"], sys["rag:sys:3"]);
  RagConfig one = topical();
  one.system_prompts = 1;
  for (const auto& r : generate_rag(one)) EXPECT_EQ(r.prompt.front().id, "rag:sys");
}

TEST(RagGen, DefaultsAreDeterministicAndEachNewKnobMatters) {
  const RagConfig c = topical();
  const auto a = generate_rag(c);
  EXPECT_EQ(a, generate_rag(c));
  auto differs = [&](auto change) {
    RagConfig d = c;
    change(d);
    return generate_rag(d) != a;
  };
  EXPECT_TRUE(differs([](RagConfig& d) { d.topics = 50; }));
  EXPECT_TRUE(differs([](RagConfig& d) { d.topic_zipf = 0.5; }));
  EXPECT_TRUE(differs([](RagConfig& d) { d.rank_noise = 2; }));
  EXPECT_TRUE(differs([](RagConfig& d) { d.system_prompts = 8; }));
  EXPECT_TRUE(differs([](RagConfig& d) { d.system_zipf = 0; }));
  EXPECT_TRUE(differs([](RagConfig& d) { d.topics = 0; }));
  EXPECT_NE(c.describe().find("topics=10000 topic-zipf=1 rank-noise=1"), std::string::npos)
      << c.describe();
  // A passage has one length everywhere, from the DPR-sized default corpus.
  std::map<std::string, std::uint32_t> length;
  for (const auto& r : a)
    for (const auto& s : r.prompt)
      if (s.id.rfind("rag:p:", 0) == 0) {
        EXPECT_GE(s.tokens, 110u);
        EXPECT_LE(s.tokens, 150u);
        EXPECT_EQ(length.emplace(s.id, s.tokens).first->second, s.tokens) << s.id;
      }
}

TEST(RagGen, NewKeysAreValidated) {
  auto error = [](RagConfig bad) {
    try {
      bad.validate();
    } catch (const u3m::InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto expect = [&](void (*change)(RagConfig&), const char* key) {
    RagConfig b = topical();
    change(b);
    EXPECT_NE(error(b).find(key), std::string::npos) << key << ": " << error(b);
  };
  expect([](RagConfig& b) { b.topic_zipf = -1; }, "--topic-zipf");
  expect([](RagConfig& b) { b.topic_zipf = NAN; }, "--topic-zipf");
  expect([](RagConfig& b) { b.rank_noise = -0.5; }, "--rank-noise");
  expect([](RagConfig& b) { b.rank_noise = INFINITY; }, "--rank-noise");
  expect([](RagConfig& b) { b.system_prompts = 0; }, "--system-prompts");
  expect([](RagConfig& b) { b.system_prompts = 2'000'000; }, "--system-prompts");
  expect([](RagConfig& b) { b.system_zipf = -2; }, "--system-zipf");
  expect([](RagConfig& b) { b.topics = 2'000'000'000; }, "--topics");
  expect([](RagConfig& b) { b.corpus = 2'000'000'000; }, "--corpus");
  RagConfig spec = topical();
  spec.rank_noise = -1;
  try {
    spec.validate(RagConfig::kSpecPrefix);
    ADD_FAILURE() << "no error";
  } catch (const u3m::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--requests rag:rank-noise"), std::string::npos)
        << e.what();
  }
}

TEST(RagReuse, HandWorkedPrefixAndAnyPositionShares) {
  auto req = [](std::vector<PromptSegment> p) {
    ServeRequest r;
    r.prompt = std::move(p);
    r.output_tokens = 1;
    return r;
  };
  // 1: S A B q1; 2: S B A q2 (prefix S, any-position S A B); 3: S A B q3
  // (prefix S A B, any-position the same).
  const std::vector<ServeRequest> rs = {
      req({{"S", 10}, {"A", 5}, {"B", 7}, {"q1", 3}}),
      req({{"S", 10}, {"B", 7}, {"A", 5}, {"q2", 3}}),
      req({{"S", 10}, {"A", 5}, {"B", 7}, {"q3", 3}}),
  };
  const SegmentReuse u = segment_reuse(rs);
  EXPECT_EQ(u.prompt_tokens, 75u);
  EXPECT_EQ(u.prefix_tokens, 10u + 22u);
  EXPECT_EQ(u.any_position_tokens, 22u + 22u);
  EXPECT_DOUBLE_EQ(u.prefix_share(), 32.0 / 75);
  EXPECT_DOUBLE_EQ(u.any_position_share(), 44.0 / 75);
  EXPECT_EQ(segment_reuse({}).prefix_share(), 0.0);
}

TEST(RagReuse, DefaultTraceReusesMoreAtAnyPositionThanByPrefix) {
  // The figures docs/requests.md quotes: defaults, 2,000 requests, seed 1.
  RagConfig c;
  c.requests = 2000;
  const SegmentReuse u = segment_reuse(generate_rag(c));
  std::printf("rag defaults, 2000 requests, seed 1: prefix %.2f%%, any position %.2f%%\n",
              100 * u.prefix_share(), 100 * u.any_position_share());
  EXPECT_GT(u.any_position_share(), u.prefix_share() + 0.05);
  // Passage order only matters for the prefix: sorting raises it, not the other.
  c.sort_passages = true;
  const SegmentReuse sorted = segment_reuse(generate_rag(c));
  EXPECT_GT(sorted.prefix_share(), u.prefix_share());
  EXPECT_EQ(sorted.any_position_tokens, u.any_position_tokens);
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
