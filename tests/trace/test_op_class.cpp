#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "trace_testing.hpp"
#include "u3m/trace/op_class.hpp"

namespace u3m::trace {
namespace {

TEST(OpClass, EveryTableLineIsARule) {
  // A misspelt class in data/op_classes.tsv would silently drop the line.
  std::ifstream in(testing::source_dir() + "/data/op_classes.tsv");
  ASSERT_TRUE(in) << "data/op_classes.tsv not found";
  std::size_t lines = 0;
  for (std::string l; std::getline(in, l);)
    if (!l.empty() && l[0] != '#') ++lines;
  EXPECT_GT(lines, 100u);
  EXPECT_EQ(op_class_rule_count(), lines);
}

struct Case {
  const char* name;
  Phase phase;
  OpClass want;
};

class OpClassCases : public ::testing::TestWithParam<Case> {};

TEST_P(OpClassCases, Maps) {
  const Case& c = GetParam();
  EXPECT_EQ(classify_op(c.name, c.phase), c.want)
      << c.name << " -> " << to_string(classify_op(c.name, c.phase));
}

INSTANTIATE_TEST_SUITE_P(
    Table, OpClassCases,
    ::testing::Values(
        Case{"aten::mm", Phase::forward, OpClass::matmul},
        Case{"aten::addmm", Phase::backward, OpClass::matmul},
        Case{"aten::convolution", Phase::forward, OpClass::matmul},
        Case{"aten::convolution_backward", Phase::backward, OpClass::matmul},
        Case{"AddmmBackward0", Phase::backward, OpClass::matmul},
        Case{"aten::scaled_dot_product_attention", Phase::forward, OpClass::attn_prefill},
        Case{"aten::scaled_dot_product_attention", Phase::prefill, OpClass::attn_prefill},
        Case{"aten::scaled_dot_product_attention", Phase::decode, OpClass::attn_decode},
        Case{"u3m::attention", Phase::decode, OpClass::attn_decode},
        Case{"aten::native_layer_norm", Phase::forward, OpClass::norm},
        Case{"aten::cudnn_batch_norm", Phase::forward, OpClass::norm},
        Case{"aten::_softmax", Phase::forward, OpClass::softmax},
        Case{"aten::nll_loss_forward", Phase::forward, OpClass::loss},
        Case{"aten::embedding", Phase::prefill, OpClass::embedding},
        Case{"aten::_foreach_add_", Phase::optimizer, OpClass::optimizer},
        Case{"Optimizer.step#SGD.step", Phase::optimizer, OpClass::optimizer},
        Case{"nccl:all_reduce", Phase::collective, OpClass::collective},
        Case{"record_param_comms", Phase::collective, OpClass::collective},
        Case{"aten::copy_", Phase::forward, OpClass::copy},
        Case{"aten::relu_", Phase::forward, OpClass::elementwise},
        Case{"aten::add_", Phase::optimizer, OpClass::elementwise},
        Case{"ReluBackward0", Phase::backward, OpClass::elementwise},
        Case{"ATEN::MM", Phase::forward, OpClass::matmul},  // case-insensitive
        Case{"aten::empty_strided", Phase::forward, OpClass::other},
        Case{"my_custom::thing", Phase::forward, OpClass::other},
        Case{"", Phase::forward, OpClass::other}));

}  // namespace
}  // namespace u3m::trace
