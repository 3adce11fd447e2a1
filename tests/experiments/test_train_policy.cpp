// The training policies' own decisions (experiments/train_policy): periodic
// threshold recalibration and the link-time prefetch horizon.
#include <gtest/gtest.h>

#include "u3m/experiments/train_policy.hpp"
#include "u3m/util/error.hpp"

namespace u3m::experiments {
namespace {

TEST(TrainPolicy, UnknownNameNamesTheFlag) {
  trace::Trace t;
  std::vector<sim::Step> steps;
  sim::SimTransportConfig links;
  try {
    make_train_policy("fifo", {t, steps, false, links});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--policy"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fifo"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace u3m::experiments
