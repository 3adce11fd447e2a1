#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "trace_testing.hpp"
#include "u3m/trace/stats.hpp"

namespace u3m::trace {
namespace {

TEST(Stats, CountsAndDeduplicatesBytes) {
  Trace t = testing::sample_trace();
  // Declaring the same logical tensor twice must not double its bytes.
  t.tensor(t.tensors[0]);
  StatsSink s;
  t.replay(s);
  auto j = s.to_json();
  EXPECT_EQ(j["events"], 6);
  EXPECT_EQ(j["ops"], 3);
  EXPECT_EQ(j["tensors"], 5);
  EXPECT_EQ(j["bytes_unique"], 8192 + (1 << 20) + 65536 + (1ull << 40));
  EXPECT_EQ(j["op_classes"]["matmul"], 1);
  EXPECT_EQ(j["op_classes"]["attn_decode"], 1);
  EXPECT_EQ(j["op_classes"]["optimizer"], 1);
  EXPECT_EQ(j["phases"]["decode"], 1);
  EXPECT_EQ(j["jobs"]["train-0"]["ops"], 2);
  EXPECT_EQ(j["jobs"]["infer-0"]["events"], 1);
  EXPECT_EQ(j["jobs"]["infer-0"]["iterations"], 1);
  EXPECT_EQ(j["iterations"], 2);  // train-0 iteration 0, infer-0 iteration 7
  EXPECT_EQ(j["bytes_by_role"]["kv"], 65536);
  EXPECT_EQ(j["event_kinds"]["free"], 1);
  EXPECT_EQ(j["duration_ns"], 5000000001ull - 90);
  EXPECT_EQ(j["meta"]["source"], "unit test \"quoted\"\n");
}

}  // namespace
}  // namespace u3m::trace
