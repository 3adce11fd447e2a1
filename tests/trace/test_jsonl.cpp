#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "trace_testing.hpp"
#include "u3m/trace/io.hpp"
#include "u3m/util/error.hpp"

namespace u3m::trace {
namespace {

constexpr const char* kHeader = "{\"u3m_trace\": 1}\n";

std::string to_jsonl(const Trace& t, const std::filesystem::path& p) {
  {
    JsonlWriter w(p.string());
    t.replay(w);
  }
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Expects read_jsonl to fail with a message containing every needle.
void expect_error(const std::string& text, std::initializer_list<std::string> needles) {
  Trace out;
  try {
    read_jsonl(text, "in.jsonl", out);
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const InputError& e) {
    for (auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(Jsonl, RoundTrips) {
  auto dir = testing::temp_dir();
  Trace src = testing::sample_trace();
  std::string text = to_jsonl(src, dir / "a.jsonl");
  Trace back;
  read_jsonl(text, "a.jsonl", back);
  ASSERT_EQ(back.tensors.size(), src.tensors.size());
  ASSERT_EQ(back.ops.size(), src.ops.size());
  ASSERT_EQ(back.events.size(), src.events.size());
  EXPECT_EQ(back.metadata, src.metadata);
  for (std::size_t i = 0; i < src.tensors.size(); ++i) {
    EXPECT_EQ(back.tensors[i].id, src.tensors[i].id);
    EXPECT_EQ(back.tensors[i].bytes, src.tensors[i].bytes);
    EXPECT_EQ(back.tensors[i].role, src.tensors[i].role);
    EXPECT_EQ(back.tensors[i].layer, src.tensors[i].layer);
  }
  for (std::size_t i = 0; i < src.ops.size(); ++i) {
    EXPECT_EQ(back.ops[i].cls, src.ops[i].cls);
    EXPECT_EQ(back.ops[i].flops, src.ops[i].flops);
    EXPECT_EQ(back.ops[i].iteration, src.ops[i].iteration);
  }
  for (std::size_t i = 0; i < src.events.size(); ++i) {
    EXPECT_EQ(back.events[i].time_ns, src.events[i].time_ns);
    EXPECT_EQ(back.events[i].kind, src.events[i].kind);
  }
  std::filesystem::remove_all(dir);
}

TEST(Jsonl, DerivesClassFromNameAndAcceptsMinimalRecords) {
  std::string text =
      std::string(kHeader) +
      "\n"
      "{\"job\": \"infer-0\"}\r\n"
      "{\"tensor\": {\"name\": \"k\", \"bytes\": 10}}\n"
      "{\"op\": {\"name\": \"aten::scaled_dot_product_attention\", \"phase\": \"decode\"}}\n"
      "{\"event\": {\"t\": 5, \"op\": 0, \"tensor\": 0, \"kind\": \"read\"}}\n";
  Trace t;
  read_jsonl(text, "m.jsonl", t);
  ASSERT_EQ(t.ops.size(), 1u);
  EXPECT_EQ(t.ops[0].cls, OpClass::attn_decode);
  EXPECT_EQ(t.tensors[0].id, stable_id("k"));
  EXPECT_EQ(t.tensors[0].layer, kNoLayer);
  EXPECT_EQ(t.events.size(), 1u);
}

TEST(Jsonl, ErrorsNameLineAndField) {
  std::string h = kHeader;
  std::string job = "{\"job\": \"j\"}\n";
  std::string tensor = "{\"tensor\": {\"name\": \"x\", \"bytes\": 4}}\n";
  std::string op = "{\"op\": {\"name\": \"aten::mm\"}}\n";
  expect_error("", {"missing header"});
  expect_error("{\"tensor\": {}}\n", {"in.jsonl:1", "u3m_trace"});
  expect_error("{\"u3m_trace\": 2}\n", {"unsupported version 2"});
  expect_error(h + job + "{\"tensor\": {\"name\": \"x\", \"bytes\": -4}}\n",
               {"in.jsonl:3", "'bytes'", "non-negative"});
  expect_error(h + job + "{\"tensor\": {\"name\": \"x\"}}\n", {"in.jsonl:3", "'bytes'", "missing"});
  expect_error(h + job + "{\"tensor\": {\"name\": \"x\", \"bytes\": 1, \"role\": \"weights\"}}\n",
               {"'role'", "weights"});
  expect_error(h + job + "{\"tensor\": {\"name\": \"x\", \"bytes\": 1, \"job\": 1}}\n",
               {"'job'", "out of range"});
  expect_error(
      h + job + "{\"tensor\": {\"name\": \"x\", \"bytes\": 1, \"id\": \"0000000000000001\"}}\n",
      {"'id'"});
  expect_error(h + job + tensor + op +
                   "{\"event\": {\"t\": 1, \"op\": 0, \"tensor\": 1, \"kind\": \"read\"}}\n",
               {"in.jsonl:5", "'tensor'", "out of range"});
  expect_error(h + job + tensor + op +
                   "{\"event\": {\"t\": 1, \"op\": 0, \"tensor\": 0, \"kind\": \"peek\"}}\n",
               {"'kind'", "peek"});
  expect_error(h + job + tensor + "{\"op\": {\"name\": \"aten::mm\", \"flops\": -1}}\n",
               {"in.jsonl:4", "'flops'"});
  expect_error(h + job + "{\"tensor\": {\"name\": \"x\", \"bytes\": 4}\n",
               {"in.jsonl:3", "invalid JSON"});
  expect_error(h + "{\"bogus\": 1}\n", {"in.jsonl:2", "unknown record type"});
  expect_error(h + "[1, 2]\n", {"in.jsonl:2", "object"});
  expect_error(h + job + "{\"tensor\": {\"name\": \"x\", \"bytes\": 5, \"rol\": \"param\"}}\n",
               {"in.jsonl:3", "'rol'", "unknown field"});
  expect_error(h + "{\"tensor\": {\"name\": \"x\", \"bytes\": 5}}\n",
               {"in.jsonl:2", "'job'", "no job declared"});
  expect_error(h + "{\"job\": \"a\", \"meta\": {}}\n", {"exactly one record"});
}

}  // namespace
}  // namespace u3m::trace
