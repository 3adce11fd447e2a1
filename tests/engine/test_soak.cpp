// A short soak in CI (tests/engine/soak.hpp; scripts/soak.sh runs the long
// one): faults of every class go in, and none comes back out as a wrong
// byte with an ok status.
#include <gtest/gtest.h>

#include "engine/soak.hpp"

namespace u3m::engine::testing {
namespace {

TEST(Soak, EveryFaultClassIsInjectedAndNoneReadsBackSilently) {
  SoakOptions o;
  o.seconds = 3;
  o.fault_rate = 0.01;
  const SoakReport r = run_soak(o);
  EXPECT_EQ(r.silent_bad_reads, 0u);
  EXPECT_TRUE(r.first_unexpected.empty()) << r.first_unexpected;
  EXPECT_GT(r.reads, 1000u);
  for (int i = 0; i < 8; ++i) EXPECT_GT(r.injected_by_fault[i], 0u) << "fault class " << i;
  EXPECT_GT(r.injected_at_rest, 0u);
  // Silent write faults are caught by the write read-back; at-rest ones by
  // reads, verifies or the scrubber.
  EXPECT_GT(r.store.write_verify_failures, 0u);
  EXPECT_GT(r.store.checksum_failures, 0u);
  // What is reported lost is counted in bytes, and only tensors that had data.
  EXPECT_LE(r.lost_tensors, r.engine.lost_tensors);
  if (r.lost_tensors) EXPECT_GT(r.lost_bytes, 0u);
}

}  // namespace
}  // namespace u3m::engine::testing
