// The trace's side of the training bound (Note [Traffic lower bound]):
// byte-granular Belady by hand, and the bound against every policy.
#include <gtest/gtest.h>

#include <string>

#include "u3m/experiments/traffic_bound.hpp"
#include "u3m/experiments/train.hpp"
#include "u3m/policy/tiering.hpp"
#include "u3m/sim/runner.hpp"
#include "u3m/workload/generate.hpp"
#include "u3m/workload/shape.hpp"

namespace u3m::experiments {
namespace {

using Kind = BoundRequest::Kind;

std::vector<BoundRequest> uses(std::initializer_list<std::uint32_t> ts) {
  std::vector<BoundRequest> r;
  for (std::uint32_t t : ts) r.push_back({Kind::use, t});
  return r;
}

// A B C A B C with room for two: Belady keeps A over B at C (A is used
// sooner), then drops A (never used again) for B: 4 fetches; LRU takes 6.
TEST(BeladyBytes, EvictsTheFarthestNextUse) {
  EXPECT_EQ(belady_fetch_bytes(uses({0, 1, 2, 0, 1, 2}), {1, 1, 1}, 2), 4u);
  EXPECT_EQ(belady_fetch_bytes(uses({0, 1, 2, 0, 1, 2}), {1, 1, 1}, 3), 3u);  // cold only
}

// Two 2-byte tensors in 3 bytes, used in turn: whole tensors fetch 8 bytes,
// bytes on their own 6 (4 cold, then one byte each use): the relaxation
// is below any whole-tensor policy.
TEST(BeladyBytes, SplitsATensorWhereWholeTensorsCannot) {
  EXPECT_EQ(belady_fetch_bytes(uses({0, 1, 0, 1}), {2, 2}, 3), 6u);
}

// A created tensor costs room, not bytes; a stale copy is fetched again; a
// dropped one gives its room back.
TEST(BeladyBytes, CreateStaleAndDrop) {
  std::vector<BoundRequest> r = {{Kind::create, 0}, {Kind::use, 0}};
  EXPECT_EQ(belady_fetch_bytes(r, {5}, 8), 0u);
  r = {{Kind::use, 0}, {Kind::stale, 0}, {Kind::use, 0}};
  EXPECT_EQ(belady_fetch_bytes(r, {5}, 8), 10u);
  // 0 and 1 fill the tier; 1 is dropped, so 2 fits beside 0, which stays.
  r = {{Kind::use, 0}, {Kind::create, 1}, {Kind::drop, 1}, {Kind::create, 2}, {Kind::use, 0}};
  EXPECT_EQ(belady_fetch_bytes(r, {4, 4, 4}, 8), 4u);
  // Without the drop, 2 pushes out the farther of 0 (used next) and 1
  // (never again): 1 goes, 0 stays.
  r = {{Kind::use, 0}, {Kind::create, 1}, {Kind::create, 2}, {Kind::use, 0}};
  EXPECT_EQ(belady_fetch_bytes(r, {4, 4, 4}, 8), 4u);
  // A tensor larger than the tier streams through: all its bytes cross.
  EXPECT_EQ(belady_fetch_bytes(uses({0, 0}), {10}, 4), 16u);  // 10, then the 6 not kept
}

struct TinyIteration {
  trace::Trace t;
  std::vector<engine::Step> steps;
  std::size_t begin = 0, end = 0;
  std::uint64_t footprint = 0, grads = 0;
};

TinyIteration tiny_training() {
  TinyIteration x;
  workload::TrainConfig cfg;
  cfg.steps = 3;
  cfg.seq_len = 256;
  workload::generate_train(workload::preset("tiny"), cfg, x.t);
  x.steps = engine::build_steps(x.t);
  x.footprint = engine::trace_footprint(x.t);
  x.begin = x.steps.size();
  for (std::size_t j = 0; j < x.steps.size(); ++j) {
    if (x.t.ops[x.steps[j].op].iteration != 2) continue;
    x.begin = std::min(x.begin, j);
    x.end = j + 1;
  }
  for (const trace::Tensor& z : x.t.tensors)
    if (z.name.find("grad") != std::string::npos) x.grads += z.bytes;
  return x;
}

// On a generated iteration: nothing crosses when HBM holds the footprint;
// less HBM never moves fewer bytes; a host optimizer reads every gradient
// over d2h; nothing reaches the SSD while HBM + DRAM hold the footprint.
TEST(TrafficBound, FollowsTheTiersOnATrainingIteration) {
  const TinyIteration x = tiny_training();
  ASSERT_LT(x.begin, x.end);
  auto at = [&](double hbm_share, bool host, double dram_share) {
    return traffic_bound({x.t, x.steps, x.begin, x.end, host,
                          static_cast<std::uint64_t>(hbm_share * double(x.footprint)),
                          static_cast<std::uint64_t>(dram_share * double(x.footprint))});
  };
  const TrafficBound all = at(1.0, false, 1.0);
  EXPECT_EQ(all.h2d, 0u);
  EXPECT_EQ(all.d2h, 0u);
  EXPECT_EQ(all.ssd_read + all.ssd_write, 0u);
  std::uint64_t last = 0;
  for (double share : {0.9, 0.7, 0.5, 0.3}) {
    const TrafficBound b = at(share, false, 1.0);
    EXPECT_GE(b.h2d, last) << share;
    last = b.h2d;
  }
  EXPECT_GT(last, 0u);
  const TrafficBound host = at(1.0, true, 1.0);
  EXPECT_GT(host.d2h, 0u);
  EXPECT_LE(host.d2h, x.grads);
  EXPECT_GT(host.h2d, 0u);  // the weights the host rewrote come back
  // With HBM + DRAM below what the iteration keeps, it spills to the SSD.
  const TrafficBound spill = at(0.2, false, 0.1);
  EXPECT_GT(spill.ssd_read, 0u);
  EXPECT_GT(spill.ssd_write, 0u);
}

// Note [Physical bound]: at its own shape no policy's loss is below the
// bound's, over HBM sizes, LoRA and full fine-tuning, and a host link slow
// enough that the traffic binds.
TEST(TrainBound, NoPolicyBeatsTheBoundAtItsShape) {
  int checked = 0, binding = 0;
  for (std::uint32_t rank : {0u, 8u}) {
    TrainScenario s;
    s.shape = workload::preset("tiny");
    s.hw = sim::load_profile("ascend-910b-32g");
    s.cards = 1;
    s.train.seq_len = 256;
    s.train.lora_rank = rank;
    s.hw.host_link.bandwidth_practical.si *= 0.002;
    TrainScenario probe = s;
    probe.policy = "lru";
    const double need = double(simulate_training(probe).footprint);
    for (double share : {0.4, 0.6, 0.9}) {
      s.hw.device.hbm_capacity.si = share * need;
      const BoundShape b = bound_at(s);
      for (const policy::PolicyInfo& p : policy::tiering_policies()) {
        s.policy = std::string(p.name);
        const TrainResult r = simulate_training(s);
        if (!r.fits) continue;
        ASSERT_GT(b.params, 0u) << p.name << " runs what the bound calls infeasible";
        EXPECT_GE(r.loss, b.loss - 1e-9)
            << p.name << " rank " << rank << " hbm " << share << ": step " << r.step_s
            << " s, bound " << b.binding << " (h2d " << b.h2d << " B, d2h " << b.d2h << " B)";
        ++checked;
        if (b.loss > 0) ++binding;
      }
    }
  }
  EXPECT_GT(checked, 20);
  EXPECT_GT(binding, 0);
}

}  // namespace
}  // namespace u3m::experiments
