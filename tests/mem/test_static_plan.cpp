// Static plan: lifetimes from a trace, a placement where tensors alive at the
// same time never share bytes, and the comparison with the dynamic pool.
#include "u3m/mem/static_plan.hpp"

#include <gtest/gtest.h>

#include "u3m/util/error.hpp"
#include "u3m/workload/generate.hpp"
#include "u3m/workload/shape.hpp"

namespace u3m::mem {
namespace {

using trace::EventKind;

// A trace builder: one job, one op, tensors by name.
struct Builder {
  trace::Trace t;
  Builder() {
    t.job("job");
    t.op(trace::Op{"op"});
  }
  std::uint32_t tensor(const std::string& name, std::uint64_t bytes) {
    t.tensor(trace::make_tensor(name, bytes, trace::DType::u8, trace::Role::activation));
    return static_cast<std::uint32_t>(t.tensors.size() - 1);
  }
  void ev(std::uint32_t tensor, EventKind k) {
    t.event(trace::Event{t.events.size(), 0, tensor, k});
  }
};

// Every pair of lifetimes that overlap in time must be disjoint in bytes.
void expect_no_overlap(const StaticPlan& p) {
  const std::size_t n = p.lifetimes.size();
  std::size_t overlapping_pairs = 0;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(p.offsets[i] % p.alignment, 0u);
    EXPECT_LE(p.offsets[i] + p.sizes[i], p.peak_bytes);
    for (std::size_t j = i + 1; j < n; ++j) {
      const Lifetime &a = p.lifetimes[i], &b = p.lifetimes[j];
      if (a.start >= b.end || b.start >= a.end) continue;
      ++overlapping_pairs;
      bool disjoint =
          p.offsets[i] + p.sizes[i] <= p.offsets[j] || p.offsets[j] + p.sizes[j] <= p.offsets[i];
      ASSERT_TRUE(disjoint) << "lifetimes " << i << " and " << j << " overlap in memory";
    }
  }
  EXPECT_GT(overlapping_pairs, 0u);  // else the check proved nothing
}

TEST(LifetimesTest, FromEvents) {
  Builder b;
  auto a = b.tensor("a", 1000), x = b.tensor("b", 2000), c = b.tensor("c", 500),
       w = b.tensor("w", 4096);
  b.ev(a, EventKind::alloc);  // 0
  b.ev(x, EventKind::alloc);  // 1
  b.ev(w, EventKind::read);   // 2: never allocated -> whole trace
  b.ev(a, EventKind::free);   // 3
  b.ev(c, EventKind::alloc);  // 4: never freed -> to the end
  b.ev(x, EventKind::free);   // 5
  b.ev(a, EventKind::alloc);  // 6: a's second lifetime
  b.ev(a, EventKind::free);   // 7
  b.ev(x, EventKind::write);  // 8: used after its free -> implicit lifetime
  Lifetimes lt = tensor_lifetimes(b.t);
  EXPECT_EQ(lt.events, 9u);
  EXPECT_EQ(lt.implicit, 1u);
  ASSERT_EQ(lt.items.size(), 6u);
  auto expect = [&](std::size_t k, std::uint32_t tensor, std::uint32_t occ, std::uint64_t s,
                    std::uint64_t e) {
    EXPECT_EQ(lt.items[k].tensor, tensor) << k;
    EXPECT_EQ(lt.items[k].occurrence, occ) << k;
    EXPECT_EQ(lt.items[k].start, s) << k;
    EXPECT_EQ(lt.items[k].end, e) << k;
  };
  expect(0, a, 0, 0, 3);
  expect(1, x, 0, 1, 5);
  expect(2, w, 0, 0, 9);
  expect(3, c, 0, 4, 9);
  expect(4, a, 1, 6, 7);
  expect(5, x, 1, 8, 9);
  EXPECT_EQ(lt.items[2].bytes, 4096u);
}

TEST(LifetimesTest, BadSequencesNameTheEvent) {
  Builder b;
  auto a = b.tensor("layer_0.out", 64);
  b.ev(a, EventKind::alloc);
  b.ev(a, EventKind::alloc);
  try {
    tensor_lifetimes(b.t, "x.u3mt");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "x.u3mt: event 1: tensor 'layer_0.out' allocated while live (since event 0)");
  }
  Builder f;
  auto z = f.tensor("z", 64);
  f.ev(z, EventKind::free);
  EXPECT_THROW(tensor_lifetimes(f.t), InputError);
}

TEST(StaticPlanTest, HandMadeTrace) {
  // a [0,2) 1 KiB, b [1,4) 2 KiB, c [2,4) 1 KiB: a and c can share bytes.
  Builder b;
  auto a = b.tensor("a", 1024), x = b.tensor("b", 2048), c = b.tensor("c", 1000);
  b.ev(a, EventKind::alloc);
  b.ev(x, EventKind::alloc);
  b.ev(a, EventKind::free);
  b.ev(c, EventKind::alloc);
  b.ev(x, EventKind::free);
  b.ev(c, EventKind::free);
  StaticPlan p = plan_static(tensor_lifetimes(b.t), 512);
  expect_no_overlap(p);
  EXPECT_EQ(p.sizes[2], 1024u);  // 1000 rounded up
  EXPECT_EQ(p.max_live_bytes, 3072u);
  EXPECT_EQ(p.peak_bytes, 3072u);  // optimal here: c reuses a's bytes
  EXPECT_EQ(p.offsets[0], p.offsets[2]);
  // After event 4 only c is live (1 KiB of the 3 KiB arena); b's 2 KiB are
  // one free piece, so fragmentation is 0; after event 1 nothing is free.
  EXPECT_EQ(static_fragmentation_at(p, 1), 0.0);
  EXPECT_EQ(static_fragmentation_at(p, 4), 0.0);
  EXPECT_THROW(plan_static(tensor_lifetimes(b.t), 1000), InputError);
}

TEST(StaticPlanTest, BestFitFillsTheSmallestGap) {
  // Sizes make the greedy order big, g2, mid, top, g1, lo, small, stacking
  // each on the last: big [0,4K) g2 [4K,6K) mid [6K,7.5K) top [7.5K,9K)
  // g1 [9K,10K) lo [10K,11K). When small arrives g2 and g1 are dead: their
  // bytes are gaps of 2 KiB and 1 KiB; best fit takes g1's 1 KiB gap.
  Builder b;
  auto big = b.tensor("big", 4096), g2 = b.tensor("g2", 2048), mid = b.tensor("mid", 1536),
       g1 = b.tensor("g1", 1024), top = b.tensor("top", 1536), lo = b.tensor("lo", 1024),
       small = b.tensor("small", 1024);
  for (auto t : {big, g2, mid, g1, top, lo}) b.ev(t, EventKind::alloc);
  b.ev(g2, EventKind::free);
  b.ev(g1, EventKind::free);
  b.ev(small, EventKind::alloc);
  StaticPlan p = plan_static(tensor_lifetimes(b.t), 512);
  expect_no_overlap(p);
  // Lifetimes are in trace order: big g2 mid g1 top lo small.
  EXPECT_EQ(p.offsets[1], 4096u);   // g2
  EXPECT_EQ(p.offsets[3], 9216u);   // g1
  EXPECT_EQ(p.offsets[6], 9216u);   // small: g1's gap, not g2's larger one
  EXPECT_EQ(p.peak_bytes, 11264u);  // optimal: equals the most bytes ever live
  EXPECT_EQ(p.max_live_bytes, 11264u);
  EXPECT_EQ(p.max_live_event, 5u);
  // After event 8: live big, mid, top, small, lo; g2's 2 KiB is the only hole.
  EXPECT_EQ(static_fragmentation_at(p, 8), 0.0);
  // After event 7: g2's 2 KiB and g1's 1 KiB are free: 1 - 2/3.
  EXPECT_NEAR(static_fragmentation_at(p, 7), 1.0 / 3, 1e-12);
}

trace::Trace tiny_training_trace(std::uint32_t steps) {
  trace::Trace t;
  workload::TrainConfig cfg;
  cfg.steps = steps;
  cfg.seq_len = 256;
  workload::generate_train(workload::preset("tiny"), cfg, t);
  return t;
}

TEST(StaticPlanTest, TinyTrainingTraceIsSafeAndBeatsThePool) {
  trace::Trace t = tiny_training_trace(2);
  PlanComparison c = compare_static_dynamic(t);
  const StaticPlan& p = c.plan;
  ASSERT_GT(p.lifetimes.size(), 50u);
  EXPECT_EQ(p.events, t.events.size());
  expect_no_overlap(p);
  EXPECT_GE(p.peak_bytes, p.max_live_bytes);
  // Activations live once per step: some tensor has two lifetimes.
  bool repeated = false;
  for (const Lifetime& l : p.lifetimes) repeated |= l.occurrence > 0;
  EXPECT_TRUE(repeated);
  ASSERT_EQ(c.rows.size(), 3u);
  EXPECT_EQ(c.rows[0].peak_bytes, p.peak_bytes);
  for (const AllocatorFigures& r : c.rows) {
    EXPECT_EQ(r.status, Status::ok) << r.name;
    EXPECT_GE(r.peak_bytes, p.max_live_bytes) << r.name;
    EXPECT_LE(p.peak_bytes, r.peak_bytes) << r.name;
    EXPECT_GE(r.fragmentation_at_max_live, 0.0);
    EXPECT_LT(r.fragmentation_at_max_live, 1.0);
  }
  EXPECT_GT(c.rows[1].source_calls, 0u);
}

TEST(StaticPlanTest, PoolReplayReportsOutOfMemory) {
  trace::Trace t = tiny_training_trace(1);
  Lifetimes lt = tensor_lifetimes(t);
  PoolConfig c;
  c.capacity = 2 * MiB;
  AllocatorFigures f = replay_pool(lt, c, "small", {}, 0);
  EXPECT_EQ(f.status, Status::out_of_memory);
  EXPECT_LE(f.peak_bytes, 2 * MiB);
}

}  // namespace
}  // namespace u3m::mem
