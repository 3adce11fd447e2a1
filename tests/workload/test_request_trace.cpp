// The u3m request format, the Mooncake and Azure importers, and the
// prefix-sharing analysis (src/workload/request_trace.cpp), including the
// `u3m requests import|stats` commands end to end.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_testing.hpp"
#include "u3m/util/error.hpp"
#include "u3m/util/file.hpp"
#include "u3m/workload/request_trace.hpp"

namespace {

using namespace u3m::workload;

const std::string kData = std::string(U3M_SOURCE_DIR) + "/data/requests/";

std::filesystem::path temp_dir() {
  auto d = std::filesystem::temp_directory_path() / ("u3m-req-" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d;
}

// The InputError text of parsing `text`, or "" if it parsed.
std::string error_of(const std::string& text, ImportOptions opt = {}) {
  try {
    parse_requests(text, "t.jsonl", opt);
  } catch (const u3m::InputError& e) {
    return e.what();
  }
  return "";
}

ServeRequest req(double t, std::uint32_t out, std::vector<PromptSegment> prompt,
                 std::string session = "") {
  return ServeRequest{t, out, std::move(prompt), std::move(session)};
}

// ---------------------------------------------------------------- u3m format

TEST(RequestFormat, ReadsTheDocumentedFormat) {
  const std::string text =
      "{\"timestamp_ms\": 0, \"output_tokens\": 5, \"prompt\": [{\"id\": \"sys\", \"tokens\": 7}, "
      "{\"tokens\": 3, \"id\": \"q1\"}]}\n"
      "\n"  // blank lines are skipped
      "{\"prompt\": [{\"id\": \"sys\", \"tokens\": 7}], \"output_tokens\": 1, \"timestamp_ms\": "
      "2.5, \"session\": \"chat-9\"}\r\n";
  const auto rs = parse_requests(text, "t.jsonl");
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0], req(0, 5, {{"sys", 7}, {"q1", 3}}));
  EXPECT_EQ(rs[0].prompt_tokens(), 10u);
  EXPECT_EQ(rs[1], req(2.5, 1, {{"sys", 7}}, "chat-9"));
}

TEST(RequestFormat, WriterRoundTripsThroughTheStrictReader) {
  const std::vector<ServeRequest> in = {
      req(0, 3, {{"sys", 100}, {"p \"quoted\" \\ é", 20}}),
      req(0, 1, {{"q", 1}}, "sess\n1"),
      req(1234.5678, 4294967295u, {{"sys", 100}, {"big", 4000000000u}}),
  };
  const auto path = (temp_dir() / "round.jsonl").string();
  RequestWriter w(path);
  for (const auto& r : in) w.write(r);
  w.finish();
  EXPECT_EQ(w.written(), 3u);
  EXPECT_EQ(load_requests(path), in);
  ImportOptions u3m;
  u3m.format = RequestFormat::u3m;
  EXPECT_EQ(load_requests(path, u3m), in);
  std::filesystem::remove_all(temp_dir());
}

TEST(RequestFormat, EveryBadInputNamesLineAndField) {
  const std::string ok =
      R"({"timestamp_ms": 0, "output_tokens": 1, "prompt": [{"id": "a", "tokens": 4}]})";
  auto line = [](const std::string& body) { return "{" + body + "}"; };
  const std::string ts = R"("timestamp_ms": 1, )";
  const std::string out = R"("output_tokens": 2, )";
  const std::string pr = R"("prompt": [{"id": "a", "tokens": 4}])";
  struct Case {
    std::string second_line, want;
  };
  const std::vector<Case> cases = {
      {"{\"timestamp_ms\": 1,", "t.jsonl:2: invalid JSON"},
      {"[1, 2]", "t.jsonl:2: expected a JSON object"},
      {R"({"timestamp_ms": 1, "output_tokens": 2})", "t.jsonl:2: field 'prompt': missing"},
      {line(out + pr), "t.jsonl:2: field 'timestamp_ms': missing"},
      {line(ts + pr), "t.jsonl:2: field 'output_tokens': missing"},
      {line(ts + out + pr + R"(, "priority": 3)"), "t.jsonl:2: field 'priority': unknown field"},
      {line(ts + out + pr + R"(, "output_tokens": 3)"), "field 'output_tokens': repeated"},
      {line(R"("timestamp_ms": "1", )" + out + pr), "field 'timestamp_ms': expected a number"},
      {line(R"("timestamp_ms": -1, )" + out + pr),
       "field 'timestamp_ms': must be a finite number >= 0"},
      {line(ts + R"("output_tokens": 0, )" + pr), "field 'output_tokens': value 0 out of range"},
      {line(ts + R"("output_tokens": 1.5, )" + pr), "field 'output_tokens': expected an integer"},
      {line(ts + R"("output_tokens": 4294967296, )" + pr),
       "field 'output_tokens': value 4294967296 out of range"},
      {line(ts + out + R"("prompt": [])"), "t.jsonl:2: field 'prompt': empty"},
      {line(ts + out + R"("prompt": {"id": "a"})"), "field 'prompt': expected an array"},
      {line(ts + out + R"("prompt": [{"id": "a", "tokens": 4}, 7])"),
       "field 'prompt[1]': expected an object"},
      {line(ts + out + R"("prompt": [{"id": "a", "tokens": 4}, {"id": "b", "tokens": 0}])"),
       "t.jsonl:2: field 'prompt[1].tokens': value 0 out of range"},
      {line(ts + out + R"("prompt": [{"id": "b"}])"), "field 'prompt[0].tokens': missing"},
      {line(ts + out + R"("prompt": [{"tokens": 2}])"), "field 'prompt[0].id': missing"},
      {line(ts + out + R"("prompt": [{"id": 5, "tokens": 2}])"),
       "field 'prompt[0].id': expected a string"},
      {line(ts + out + R"("prompt": [{"id": "", "tokens": 2}])"), "field 'prompt[0].id': empty"},
      {line(ts + out + R"("prompt": [{"id": "b", "tokens": 2, "text": "hi"}])"),
       "field 'prompt[0].text': unknown field"},
      {line(ts + out + pr + R"(, "session": 7)"), "field 'session': expected a string"},
      // The same id must always have the same length (ids name content).
      {line(ts + out + R"("prompt": [{"id": "a", "tokens": 5}])"),
       "t.jsonl:2: field 'prompt[0].tokens': segment \"a\" has 5 tokens here but 4 at line 1"},
      {line(ts + out +
            R"("prompt": [{"id": "b", "tokens": 4294967295}, {"id": "c", "tokens": 1}])"),
       "t.jsonl:2: field 'prompt': prompt of 4294967296 tokens"},
  };
  for (const Case& c : cases) {
    const std::string err = error_of(ok + "\n" + c.second_line + "\n");
    EXPECT_NE(err.find(c.want), std::string::npos)
        << "input: " << c.second_line << "\nerror: " << err;
  }
  // Time must not go backwards; equal times are fine.
  const std::string later =
      R"({"timestamp_ms": 9, "output_tokens": 1, "prompt": [{"id": "a", "tokens": 4}]})";
  EXPECT_EQ(error_of(ok + "\n" + ok + "\n"), "");
  const std::string err = error_of(later + "\n" + ok + "\n");
  EXPECT_NE(
      err.find("t.jsonl:2: field 'timestamp_ms': timestamps must not decrease: 0 ms after 9 ms"),
      std::string::npos)
      << err;
  ImportOptions unsorted;
  unsorted.require_sorted = false;
  auto rs = parse_requests(later + "\n" + ok + "\n", "t", unsorted);
  sort_by_timestamp(rs);
  EXPECT_EQ(rs[0].timestamp_ms, 0);
  EXPECT_EQ(rs[1].timestamp_ms, 9);
}

TEST(RequestFormat, DetectsEachFormatFromTheFirstLine) {
  EXPECT_EQ(detect_request_format(R"({"timestamp_ms": 0, "prompt": []})"), RequestFormat::u3m);
  EXPECT_EQ(detect_request_format(R"({"timestamp": 0, "input_length": 5, "hash_ids": [1]})"),
            RequestFormat::mooncake);
  EXPECT_EQ(detect_request_format("TIMESTAMP,ContextTokens,GeneratedTokens\r"),
            RequestFormat::azure_csv);
  EXPECT_EQ(detect_request_format(R"({"foo": 1})"), std::nullopt);
  EXPECT_EQ(detect_request_format("a,b,c"), std::nullopt);
  const std::string err = error_of("\n\nhello\n");
  EXPECT_NE(err.find("t.jsonl:3: cannot tell the request format"), std::string::npos) << err;
  EXPECT_TRUE(parse_requests("", "empty").empty());
}

// ---------------------------------------------------------------- Mooncake

TEST(MooncakeImport, SampleBecomes512TokenSegmentsSummingToInputLength) {
  const std::string path = kData + "samples/mooncake_conversation_head20.jsonl";
  const auto rs = load_requests(path);
  std::ifstream in(path);
  std::string line;
  std::size_t i = 0;
  for (; std::getline(in, line); ++i) {
    ASSERT_LT(i, rs.size());
    const auto j = nlohmann::json::parse(line);
    const ServeRequest& r = rs[i];
    EXPECT_EQ(r.timestamp_ms, j["timestamp"].get<double>());
    EXPECT_EQ(r.output_tokens, j["output_length"].get<std::uint32_t>());
    EXPECT_EQ(r.prompt_tokens(), j["input_length"].get<std::uint64_t>());
    const auto ids = j["hash_ids"].get<std::vector<std::uint64_t>>();
    ASSERT_EQ(r.prompt.size(), ids.size());
    for (std::size_t k = 0; k < ids.size(); ++k) {
      EXPECT_EQ(r.prompt[k].id, "mc:" + std::to_string(ids[k]));
      if (k + 1 < ids.size()) {
        EXPECT_EQ(r.prompt[k].tokens, 512u);
      }
    }
    EXPECT_GE(r.prompt.back().tokens, 1u);
    EXPECT_LE(r.prompt.back().tokens, 512u);
  }
  EXPECT_EQ(i, rs.size());
  EXPECT_EQ(rs.size(), 20u);
}

TEST(MooncakeImport, WholeCheckedInTraceAgreesWithAnIndependentParse) {
  const std::string path = kData + "mooncake_conversation_trace.jsonl.gz";
  const auto rs = load_requests(path);
  std::istringstream in(u3m::read_file(path));
  std::string line;
  std::uint64_t n = 0, input = 0, output = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    ++n;
    input += j["input_length"].get<std::uint64_t>();
    output += j["output_length"].get<std::uint64_t>();
  }
  EXPECT_EQ(rs.size(), n);
  EXPECT_EQ(n, 12031u);  // the count the data README gives
  std::uint64_t p = 0, o = 0;
  for (const auto& r : rs) p += r.prompt_tokens(), o += r.output_tokens;
  EXPECT_EQ(p, input);
  EXPECT_EQ(o, output);
}

TEST(MooncakeImport, MismatchIsAnErrorUnlessFitted) {
  const std::string few =
      R"({"timestamp": 0, "input_length": 1100, "output_length": 2, "hash_ids": [1, 2]})";
  const std::string many =
      R"({"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": [7, 8, 9]})";
  const std::string none =
      R"({"timestamp": 2, "input_length": 30, "output_length": 2, "hash_ids": []})";
  const std::string text = few + "\n" + many + "\n" + none + "\n";
  const std::string err = error_of(text);
  EXPECT_NE(err.find("t.jsonl:1: field 'hash_ids': 2 ids, but input_length 1100 needs 3 blocks"),
            std::string::npos)
      << err;
  ImportOptions fit;
  fit.mooncake_mismatch = MooncakeMismatch::fit;
  const auto rs = parse_requests(text, "t", fit);
  ASSERT_EQ(rs.size(), 3u);
  // Too few: the last id takes the rest. Too many: extra ids dropped. None: a unique segment.
  EXPECT_EQ(rs[0].prompt, (std::vector<PromptSegment>{{"mc:1", 512}, {"mc:2", 588}}));
  EXPECT_EQ(rs[1].prompt, (std::vector<PromptSegment>{{"mc:7", 512}, {"mc:8", 88}}));
  EXPECT_EQ(rs[2].prompt, (std::vector<PromptSegment>{{"mc:line:3", 30}}));
  // Another block size is an option, not a mismatch.
  fit.mooncake_mismatch = MooncakeMismatch::error;
  fit.mooncake_block_tokens = 600;
  EXPECT_EQ(parse_requests(many.substr(0, many.find("[7")) + "[7]}", "t", fit)[0].prompt,
            (std::vector<PromptSegment>{{"mc:7", 600}}));
}

TEST(MooncakeImport, BadLinesNameLineAndField) {
  const std::string ok =
      R"({"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]})";
  struct Case {
    std::string line, want;
  };
  const std::vector<Case> cases = {
      {R"({"timestamp": 0, "output_length": 2, "hash_ids": [3]})",
       "t.jsonl:2: field 'input_length': missing"},
      {R"({"timestamp": 0, "input_length": 0, "output_length": 2, "hash_ids": []})",
       "field 'input_length': value 0 out of range"},
      {R"({"timestamp": 0, "input_length": 10, "output_length": -2, "hash_ids": [3]})",
       "field 'output_length': value -2 out of range"},
      {R"({"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [-3]})",
       "field 'hash_ids[0]': expected an integer >= 0"},
      {R"({"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": 3})",
       "field 'hash_ids': expected an array"},
      {R"({"timestamp": "x", "input_length": 10, "output_length": 2, "hash_ids": [3]})",
       "field 'timestamp': expected a number"},
      {R"({"timestamp": 0, "input_length": 11, "output_length": 2, "hash_ids": [1]})",
       "t.jsonl:2: field 'hash_ids[0]': segment \"mc:1\" has 11 tokens here but 10 at line 1"},
  };
  for (const Case& c : cases) {
    const std::string err = error_of(ok + "\n" + c.line + "\n");
    EXPECT_NE(err.find(c.want), std::string::npos) << "input: " << c.line << "\nerror: " << err;
  }
  // Unknown keys of a third-party format are ignored (documented).
  EXPECT_EQ(
      error_of(
          R"({"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1], "extra": 1})"),
      "");
}

// ---------------------------------------------------------------- Azure

TEST(AzureImport, SampleTimesAreMillisecondsFromTheFirstLine) {
  const auto rs = load_requests(kData + "samples/azure_conv_head20.csv");
  ASSERT_EQ(rs.size(), 20u);
  // First lines: 18:15:46.6805900,374,44 then 18:15:50.9951690,396,109.
  EXPECT_EQ(rs[0], req(0, 44, {{"az:0", 374}}));
  EXPECT_NEAR(rs[1].timestamp_ms, 4314.579, 1e-6);
  EXPECT_EQ(rs[1].prompt, (std::vector<PromptSegment>{{"az:1", 396}}));
  EXPECT_EQ(rs[1].output_tokens, 109u);
  for (std::size_t i = 1; i < rs.size(); ++i) EXPECT_GE(rs[i].timestamp_ms, rs[i - 1].timestamp_ms);
}

TEST(AzureImport, WholeCheckedInTraceLoads) {
  const auto rs = load_requests(kData + "azure_llm_inference_2023_conv.csv.gz");
  EXPECT_EQ(rs.size(), 19366u);  // data rows of the published file
  // 18:15:46.68059 to 19:14:08.402527, as the first and last rows say.
  EXPECT_NEAR(rs.back().timestamp_ms, 3501721.937, 1e-3);
}

TEST(AzureImport, DateTimesWithZonesAndBadRowsNameLineAndField) {
  const std::string h = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  // The same instant three ways, then 1.5 s later across midnight and a month end.
  const auto rs = parse_requests(h + "2024-01-31 23:59:59.5,10,1\n"
                                     "2024-01-31T23:59:59.500Z,10,1\n"
                                     "2024-02-01 01:59:59.5+02:00,10,1\n"
                                     "2024-02-01 00:00:01,10,1\n",
                                 "a.csv");
  ASSERT_EQ(rs.size(), 4u);
  EXPECT_EQ(rs[1].timestamp_ms, 0);
  EXPECT_EQ(rs[2].timestamp_ms, 0);
  EXPECT_EQ(rs[3].timestamp_ms, 1500);
  struct Case {
    std::string text, want;
  };
  const std::vector<Case> cases = {
      {"TIMESTAMP,Context,Generated\n", "t.jsonl:1: cannot tell the request format"},
      {h + "2023-11-16 18:15:46,10\n", "t.jsonl:2: expected 3 comma-separated columns"},
      {h + "2023-11-16 18:15:46,10,1,4\n", "t.jsonl:2: expected 3 comma-separated columns"},
      {h + "2023-13-16 18:15:46,10,1\n", "t.jsonl:2: field 'TIMESTAMP': \"2023-13-16 18:15:46\""},
      {h + "yesterday,10,1\n", "field 'TIMESTAMP'"},
      // Found by fuzz_requests: nanoseconds of year 3722 overflow 64 bits.
      {h + "3722-01-31 23:59:59,10,1\n", "(years 1970-2200)"},
      {h + "2023-11-16 18:15:46,ten,1\n", "t.jsonl:2: field 'ContextTokens': \"ten\" is not"},
      {h + "2023-11-16 18:15:46,10,0\n",
       "t.jsonl:2: field 'GeneratedTokens': value 0 out of range"},
      {h + "2023-11-16 18:15:46,10,1\n2023-11-16 18:15:45,10,1\n",
       "t.jsonl:3: field 'TIMESTAMP': timestamps must not decrease: -1000 ms after 0 ms"},
  };
  for (const Case& c : cases) {
    const std::string err = error_of(c.text);
    EXPECT_NE(err.find(c.want), std::string::npos) << "input: " << c.text << "\nerror: " << err;
  }
  ImportOptions azure;
  azure.format = RequestFormat::azure_csv;
  EXPECT_NE(
      error_of("TIMESTAMP,Context,Generated\n", azure)
          .find("t.jsonl:1: expected the CSV header \"TIMESTAMP,ContextTokens,GeneratedTokens\""),
      std::string::npos);
  // Sorted on request: an earlier row moves first and the times start at 0.
  ImportOptions unsorted;
  unsorted.require_sorted = false;
  auto back =
      parse_requests(h + "2023-11-16 18:15:46,10,1\n2023-11-16 18:15:45,20,2\n", "t", unsorted);
  sort_by_timestamp(back);
  EXPECT_EQ(back[0], req(0, 2, {{"az:1", 20}}));
  EXPECT_EQ(back[1], req(1000, 1, {{"az:0", 10}}));
}

// ---------------------------------------------------------------- prefix sharing

// data/requests/samples/prefix_handmade.jsonl, worked by hand:
//   r0 [sys 100, a 50]          unbounded hit 0
//   r1 [sys 100, b 30]          hit 100 (sys)
//   r2 [sys 100, a 50, c 20]    hit 150 (sys, sys/a)
//   r3 [x 10, sys 100]          hit 0: "sys" after "x" is another prefix
//   r4 [sys 100, a 50]          hit 150
// prompt tokens 150 + 130 + 170 + 110 + 150 = 710; unbounded hits 400.
// LRU of 160 tokens (keys touched last segment first, evicted from the tail):
//   r0 resident {sys, sys/a} 150
//   r1 hit 100; adds sys/b -> 180: evicts sys/a -> 130
//   r2 hit 100 (sys/a gone); adds sys/a/c, sys/a -> 200: evicts sys/b, sys/a/c -> 150
//   r3 hit 0; adds x/sys, x -> 260: evicts sys/a, sys -> 110
//   r4 hit 0 (sys evicted); adds sys/a, sys -> 260: evicts x/sys -> 160
// LRU hits 200.
TEST(PrefixStats, HandMadeTraceMatchesTheHandWorkedHitRates) {
  RequestStats stats({160, 1000});
  for (const auto& r : load_requests(kData + "samples/prefix_handmade.jsonl")) stats.add(r);
  const RequestStatsReport rep = stats.report();
  EXPECT_EQ(rep.requests, 5u);
  EXPECT_DOUBLE_EQ(rep.rate_per_s, 1.0);  // 4 gaps over 4 s
  EXPECT_EQ(rep.total_prompt_tokens, 710u);
  EXPECT_EQ(rep.total_output_tokens, 150u);
  EXPECT_EQ(rep.prompt_tokens.p50, 150u);  // sorted 110 130 150 150 170, nearest rank
  EXPECT_EQ(rep.prompt_tokens.p90, 170u);
  EXPECT_EQ(rep.prompt_tokens.min, 110u);
  EXPECT_DOUBLE_EQ(rep.prompt_tokens.mean, 142.0);
  EXPECT_EQ(rep.segments.max, 3u);
  EXPECT_EQ(rep.distinct_segments, 5u);         // sys a b c x
  EXPECT_EQ(rep.distinct_prefix_tokens, 310u);  // sys a b a/c x x/sys: 100+50+30+20+10+100
  EXPECT_EQ(rep.sessions, 1u);
  ASSERT_EQ(rep.caches.size(), 3u);
  EXPECT_FALSE(rep.caches[0].capacity_tokens.has_value());
  EXPECT_EQ(rep.caches[0].hit_tokens, 400u);
  EXPECT_DOUBLE_EQ(rep.caches[0].hit_rate, 400.0 / 710);
  EXPECT_EQ(rep.caches[0].requests_with_hit, 3u);
  EXPECT_EQ(rep.caches[1].capacity_tokens, 160u);
  EXPECT_EQ(rep.caches[1].hit_tokens, 200u);
  EXPECT_EQ(rep.caches[1].requests_with_hit, 2u);
  // 1000 tokens hold everything (310), so it equals the unbounded cache.
  EXPECT_EQ(rep.caches[2].hit_tokens, 400u);
}

TEST(PrefixStats, ARequestLongerThanTheCacheKeepsItsLeadingSegments) {
  PrefixCache c(120);
  const ServeRequest r = req(0, 1, {{"s1", 100}, {"s2", 50}});
  EXPECT_EQ(c.access(r, chain_keys(r)), 0u);
  EXPECT_EQ(c.resident_tokens(), 100u);
  EXPECT_EQ(c.access(r, chain_keys(r)), 100u);
  // Chain keys depend on the whole prefix, not on the segment alone.
  EXPECT_NE(chain_keys(req(0, 1, {{"a", 1}, {"b", 1}}))[1], chain_keys(req(0, 1, {{"b", 1}}))[0]);
}

TEST(PrefixStats, ToRequestsSumsSegmentsAndConvertsTime) {
  const auto rs = to_requests({req(1.5, 7, {{"a", 3}, {"b", 4}}), req(2, 1, {{"c", 1}})});
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].arrival_ns, 1500000u);
  EXPECT_EQ(rs[0].prompt_tokens, 7u);
  EXPECT_EQ(rs[0].output_tokens, 7u);
  EXPECT_EQ(rs[1].id, 1u);
  EXPECT_EQ(rs[1].arrival_ns, 2000000u);
}

// ---------------------------------------------------------------- CLI

using u3m::testing::run_cli;

TEST(RequestsCli, ImportWritesTheU3mFormat) {
  const auto out = (temp_dir() / "mc.jsonl").string();
  const std::string in = kData + "samples/mooncake_conversation_head20.jsonl";
  auto r = run_cli("requests import " + in + " -o " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("20 requests (mooncake format)"), std::string::npos) << r.output;
  const auto written = load_requests(out);
  EXPECT_EQ(written, load_requests(in));
  ImportOptions u3m;
  u3m.format = RequestFormat::u3m;
  EXPECT_EQ(load_requests(out, u3m), written);  // the output is u3m format, not a copy
  r = run_cli("requests import " + kData + "samples/azure_conv_head20.csv --limit 5 -o " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(load_requests(out).size(), 5u);
  std::filesystem::remove_all(temp_dir());
}

TEST(RequestsCli, StatsJsonMatchesTheLibrary) {
  const std::string in = kData + "samples/prefix_handmade.jsonl";
  auto r = run_cli("requests stats " + in + " --json --cache-tokens 160", false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["format"], "u3m");
  EXPECT_EQ(j["requests"], 5);
  EXPECT_NE(j["figures"].get<std::string>().find("computed from the trace"), std::string::npos);
  ASSERT_EQ(j["prefix_cache"].size(), 2u);
  EXPECT_TRUE(j["prefix_cache"][0]["capacity_tokens"].is_null());
  EXPECT_EQ(j["prefix_cache"][0]["hit_tokens"], 400);
  EXPECT_EQ(j["prefix_cache"][1]["capacity_tokens"], 160);
  EXPECT_EQ(j["prefix_cache"][1]["hit_tokens"], 200);
  r = run_cli("requests stats " + in + " --cache-tokens 160");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("LRU 160 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("56.34% of prompt tokens"), std::string::npos) << r.output;  // 400/710
}

TEST(RequestsCli, BadInputAndOptionsAreClearErrors) {
  const auto bad = (temp_dir() / "bad.jsonl").string();
  std::ofstream(bad)
      << R"({"timestamp_ms": 0, "output_tokens": 1, "prompt": [{"id": "a", "tokens": 0}]})"
      << "\n";
  auto r = run_cli("requests stats " + bad);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find(bad + ":1: field 'prompt[0].tokens': value 0 out of range"),
            std::string::npos)
      << r.output;
  r = run_cli("requests stats " + kData + "samples/prefix_handmade.jsonl --cache-tokens 10,x");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--cache-tokens: item 2: 'x'"), std::string::npos) << r.output;
  // A failed import leaves no output behind.
  const auto out = (temp_dir() / "never.jsonl").string();
  r = run_cli("requests import " + bad + " -o " + out);
  EXPECT_EQ(r.status, 2);
  EXPECT_FALSE(std::filesystem::exists(out));
  for (const char* cmd : {"requests --help", "requests import --help", "requests stats --help",
                          "requests gen rag --help"}) {
    r = run_cli(cmd);
    EXPECT_EQ(r.status, 0) << cmd << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << cmd;
  }
  std::filesystem::remove_all(temp_dir());
}

}  // namespace
