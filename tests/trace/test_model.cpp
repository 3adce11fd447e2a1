#include <gtest/gtest.h>

#include "trace_testing.hpp"
#include "u3m/trace/model.hpp"

namespace u3m::trace {
namespace {

TEST(StableId, IsXxh64OfTheName) {
  // Reference value of XXH64("", 0) from the xxHash spec; pins the hash choice.
  EXPECT_EQ(stable_id(""), 0xEF46DB3751D8E999ull);
  EXPECT_EQ(stable_id("layer_12.attn.q_proj.out"), stable_id("layer_12.attn.q_proj.out"));
  EXPECT_NE(stable_id("layer_12.attn.q_proj.out"), stable_id("layer_13.attn.q_proj.out"));
}

// Layer numbers after an underscore fold into one family per op kind; other
// digits and a trailing underscore stay.
TEST(OpFamily, FoldsLayerNumbers) {
  EXPECT_EQ(op_family("layer_12.attn_out"), "layer_*.attn_out");
  EXPECT_EQ(op_family("layer_3.attn_out"), "layer_*.attn_out");
  EXPECT_EQ(op_family("blk_1.mlp_20.fc2"), "blk_*.mlp_*.fc2");
  EXPECT_EQ(op_family("head"), "head");
  EXPECT_EQ(op_family("x_"), "x_");
  EXPECT_EQ(op_family("l_7"), "l_*");
  EXPECT_EQ(op_family("fc2"), "fc2");
}

TEST(Enums, RoundTripThroughNames) {
  for (int i = 0; i < 12; ++i) {
    auto d = static_cast<DType>(i);
    EXPECT_EQ(parse_dtype(to_string(d)), d);
  }
  for (int i = 0; i < 9; ++i) {
    auto r = static_cast<Role>(i);
    EXPECT_EQ(parse_role(to_string(r)), r);
  }
  for (int i = 0; i < kNumOpClasses; ++i) {
    auto c = static_cast<OpClass>(i);
    EXPECT_EQ(parse_op_class(to_string(c)), c);
  }
  for (int i = 0; i < kNumPhases; ++i) {
    auto p = static_cast<Phase>(i);
    EXPECT_EQ(parse_phase(to_string(p)), p);
  }
  for (int i = 0; i < 4; ++i) {
    auto k = static_cast<EventKind>(i);
    EXPECT_EQ(parse_event_kind(to_string(k)), k);
  }
  EXPECT_FALSE(parse_role("weights").has_value());
  EXPECT_EQ(dtype_bytes(DType::bf16), 2u);
  EXPECT_EQ(dtype_bytes(DType::f32), 4u);
}

TEST(Trace, ReplayDeclaresBeforeUse) {
  Trace src = testing::sample_trace();
  // A sink that fails on any forward reference.
  struct Checker final : TraceSink {
    std::size_t jobs = 0, tensors = 0, ops = 0, events = 0;
    bool finished = false;
    void meta(std::string_view, std::string_view) override {}
    void job(std::string_view) override { ++jobs; }
    void tensor(const Tensor& t) override {
      EXPECT_LT(t.job, jobs);
      ++tensors;
    }
    void op(const Op& o) override {
      EXPECT_LT(o.job, jobs);
      ++ops;
    }
    void event(const Event& e) override {
      EXPECT_LT(e.tensor, tensors);
      EXPECT_LT(e.op, ops);
      ++events;
    }
    void finish() override { finished = true; }
  } check;
  src.replay(check);
  EXPECT_EQ(check.tensors, src.tensors.size());
  EXPECT_EQ(check.ops, src.ops.size());
  EXPECT_EQ(check.events, src.events.size());
  EXPECT_TRUE(check.finished);
  EXPECT_EQ(src.find_meta("source"), "unit test \"quoted\"\n");
  EXPECT_FALSE(src.find_meta("nope").has_value());
}

}  // namespace
}  // namespace u3m::trace
