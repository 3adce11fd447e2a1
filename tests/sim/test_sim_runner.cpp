// simulate_trace: the real engine on virtual time. Traces are built by hand
// so every expected figure follows from the numbers here. All figures are
// simulated with the links given in each test, never measured.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "u3m/engine/steps.hpp"
#include "u3m/sim/cost.hpp"
#include "u3m/sim/runner.hpp"
#include "u3m/sim/sim_transport.hpp"
#include "u3m/sim/virtual_time.hpp"
#include "u3m/util/error.hpp"

namespace u3m::sim {
namespace {

using engine::Link;
using trace::EventKind;
constexpr std::uint64_t MB = 1'000'000;

// Appends tensors and ops with their events to a Trace.
struct Builder {
  trace::Trace t;
  std::uint64_t now = 0;
  std::uint32_t tensor(const std::string& name, std::uint64_t bytes) {
    t.tensor(trace::make_tensor(name, bytes, trace::DType::f16, trace::Role::param));
    return static_cast<std::uint32_t>(t.tensors.size() - 1);
  }
  void op(const std::string& name, std::vector<std::pair<std::uint32_t, EventKind>> touches,
          double flops = 0) {
    trace::Op o;
    o.name = name;
    o.flops = flops;
    t.op(o);
    const auto idx = static_cast<std::uint32_t>(t.ops.size() - 1);
    for (auto [tensor, kind] : touches) t.event(trace::Event{now += 1000, idx, tensor, kind});
  }
};

// n weights of `bytes`: one op writes each (initialisation), then `passes`
// passes read them in order, as forward passes over the layers do.
trace::Trace layers(int n, std::uint64_t bytes, int passes) {
  Builder b;
  std::vector<std::uint32_t> w;
  for (int i = 0; i < n; ++i) w.push_back(b.tensor("w" + std::to_string(i), bytes));
  for (int i = 0; i < n; ++i) b.op("init" + std::to_string(i), {{w[i], EventKind::write}});
  for (int p = 0; p < passes; ++p) {
    for (int i = 0; i < n; ++i) b.op("fwd" + std::to_string(i), {{w[i], EventKind::read}});
  }
  return b.t;
}

// 1 GB/s + 10 us each way on the host link; no SSD.
SimOptions options(std::uint64_t device_budget, double op_seconds) {
  SimOptions o;
  o.device_budget = device_budget;
  o.links.links[static_cast<int>(Link::d2h)] = {1e9, 10e-6};
  o.links.links[static_cast<int>(Link::h2d)] = {1e9, 10e-6};
  o.op_time = [op_seconds](const trace::Op&) { return op_seconds; };
  return o;
}

// A 2 MB device and 3 MB host over an SSD: layers(8, 1 MB, 2) spills to it.
SimOptions spilling_options() {
  SimOptions o = options(2 * MB, 1e-3);
  o.host_budget = 3 * MB;
  o.links.ssd_capacity = 64 * MB;
  o.links.links[static_cast<int>(Link::h2s)] = {1e9, 20e-6};
  o.links.links[static_cast<int>(Link::s2h)] = {2e9, 80e-6};
  return o;
}

TEST(SimRunner, BuildStepsGroupsRunsOfOneOpAndMergesTouches) {
  Builder b;
  auto x = b.tensor("x", 10), y = b.tensor("y", 10);
  b.op("a", {{x, EventKind::alloc},
             {x, EventKind::read},
             {y, EventKind::read},
             {x, EventKind::write},
             {y, EventKind::free}});
  b.op("b", {{y, EventKind::write}});
  auto steps = build_steps(b.t);
  ASSERT_EQ(steps.size(), 2u);
  ASSERT_EQ(steps[0].touches.size(), 2u);
  EXPECT_EQ(steps[0].touches[0].tensor, x);
  EXPECT_TRUE(steps[0].touches[0].writes);  // read, then written: a write lease
  EXPECT_FALSE(steps[0].touches[1].writes);
  EXPECT_EQ(steps[0].frees, std::vector<std::uint32_t>{y});
  EXPECT_EQ(steps[1].op, 1u);

  b.t.events.push_back(trace::Event{0, 7, x, EventKind::read});
  EXPECT_THROW(build_steps(b.t), InputError);  // op 7 does not exist
}

TEST(SimRunner, EverythingFitsSoTimeIsComputeAlone) {
  const trace::Trace t = layers(4, 1 * MB, 2);
  const SimReport r = simulate_trace(t, options(16 * MB, 1e-3));
  ASSERT_TRUE(r.ok()) << r.first_error;
  EXPECT_EQ(r.steps, 12u);
  EXPECT_EQ(r.compute_ns, 12'000'000u);
  EXPECT_EQ(r.stall_ns, 0u);
  EXPECT_EQ(r.total_ns, r.compute_ns);
  EXPECT_EQ(r.throughput_loss(), 0.0);
  for (const SimLinkReport& l : r.links) EXPECT_EQ(l.bytes, 0u);
  EXPECT_EQ(r.engine.evictions, 0u);
  EXPECT_EQ(r.peak_device, 4 * MB);
  EXPECT_EQ(r.footprint, 4 * MB);
}

TEST(SimRunner, BudgetBelowFootprintStallsAndMovesBytes) {
  const trace::Trace t = layers(8, 1 * MB, 2);
  SimOptions o = options(3 * MB, 1e-3);
  o.lookahead = 0;
  const SimReport r = simulate_trace(t, o);
  ASSERT_TRUE(r.ok()) << r.first_error;
  EXPECT_EQ(r.steps, 24u);
  EXPECT_GT(r.stall_ns, 0u);
  EXPECT_GT(r.links[static_cast<int>(Link::d2h)].bytes, 0u);  // dirty weights written back
  EXPECT_GT(r.links[static_cast<int>(Link::h2d)].bytes, 0u);  // and fetched again
  EXPECT_GT(r.engine.evictions, 0u);
  EXPECT_LE(r.peak_device, 3 * MB);
  // Time moves only for compute or for stalls.
  EXPECT_EQ(r.total_ns, r.compute_ns + r.stall_ns);
  EXPECT_GT(r.throughput_loss(), 0.0);
  // Every read of a weight not on the device waited for a whole 1 MB fetch
  // (1 ms + 10 us): at least the 16 reads of the passes, minus what fit.
  EXPECT_GE(r.stall_ns, (16 - 3) * 1'010'000u);
  EXPECT_EQ(r.links[static_cast<int>(Link::h2d)].busy_ns,
            r.links[static_cast<int>(Link::h2d)].bytes);  // 1 GB/s: a byte per ns
}

TEST(SimRunner, NeverTouchesTheBytesItModels) {
  // 48 GB of weights through a 16 GB device and 64 GB of host: nothing is
  // materialised, so this runs in milliseconds on a machine far smaller.
  const std::uint64_t GB = 1000 * MB;
  const trace::Trace t = layers(48, 1 * GB, 1);
  SimOptions o = options(16 * GB, 1e-3);
  o.host_budget = 64 * GB;
  o.links.links[static_cast<int>(Link::d2h)] = {25e9, 10e-6};
  o.links.links[static_cast<int>(Link::h2d)] = {25e9, 10e-6};
  const SimReport r = simulate_trace(t, o);
  ASSERT_TRUE(r.ok()) << r.first_error;
  EXPECT_GT(r.links[static_cast<int>(Link::d2h)].bytes, 16 * GB);
  EXPECT_LE(r.peak_device, 16 * GB);
  EXPECT_GT(r.peak_host, 16 * GB);
}

TEST(SimRunner, LookaheadPrefetchHidesTransfersBehindCompute) {
  const trace::Trace t = layers(8, 1 * MB, 3);
  SimOptions none = options(4 * MB, 2e-3);  // 2 ms per op vs ~1 ms per fetch
  none.lookahead = 0;
  SimOptions ahead = options(4 * MB, 2e-3);
  ahead.lookahead = 1;
  const SimReport a = simulate_trace(t, none);
  const SimReport b = simulate_trace(t, ahead);
  ASSERT_TRUE(a.ok()) << a.first_error;
  ASSERT_TRUE(b.ok()) << b.first_error;
  EXPECT_EQ(a.compute_ns, b.compute_ns);
  EXPECT_GT(a.stall_ns, 0u);
  EXPECT_LT(b.stall_ns, a.stall_ns / 2) << "none " << a.stall_ns << " ns, lookahead " << b.stall_ns;
  EXPECT_GT(b.engine.prefetch_hits, 0u);
  EXPECT_EQ(a.engine.prefetches, 0u);
  // Two ahead needs room for two landed copies above the one in use; at
  // 6 MB (watermarks 5.4 / 4.8 MB) it has it and hides every fetch after
  // the first pass's warm-up.
  SimOptions two = options(6 * MB, 2e-3);
  two.lookahead = 2;
  const SimReport c = simulate_trace(t, two);
  ASSERT_TRUE(c.ok()) << c.first_error;
  EXPECT_LT(c.stall_ns, a.stall_ns / 2);
  EXPECT_EQ(c.engine.prefetch_hits, c.engine.prefetches);
}

TEST(SimRunner, TwoRunsGiveIdenticalResults) {
  const trace::Trace t = layers(8, 1 * MB, 3);
  const SimOptions o = options(3 * MB, 0.7e-3);
  const SimReport a = simulate_trace(t, o), b = simulate_trace(t, o);
  EXPECT_GT(a.stall_ns, 0u);
  EXPECT_EQ(a.total_ns, b.total_ns);
  EXPECT_EQ(a.stall_ns, b.stall_ns);
  EXPECT_EQ(a.drain_ns, b.drain_ns);
  EXPECT_EQ(a.events, b.events);
  EXPECT_EQ(a.engine.evictions, b.engine.evictions);
  EXPECT_EQ(a.engine.prefetch_hits, b.engine.prefetch_hits);
  for (int l = 0; l < kNumLinks; ++l) {
    EXPECT_EQ(a.links[l].bytes, b.links[l].bytes);
    EXPECT_EQ(a.links[l].busy_ns, b.links[l].busy_ns);
  }
}

// The overload for callers that built the steps already gives the same run.
TEST(SimRunner, PrebuiltStepsGiveTheSameRun) {
  const trace::Trace t = layers(8, 1 * MB, 3);
  const SimOptions o = options(3 * MB, 0.7e-3);
  const SimReport a = simulate_trace(t, o), b = simulate_trace(t, build_steps(t), o);
  EXPECT_GT(a.engine.evictions, 0u);
  EXPECT_EQ(a.total_ns, b.total_ns);
  EXPECT_EQ(a.stall_ns, b.stall_ns);
  EXPECT_EQ(a.events, b.events);
  EXPECT_EQ(a.engine.evictions, b.engine.evictions);
  for (int l = 0; l < kNumLinks; ++l) EXPECT_EQ(a.links[l].bytes, b.links[l].bytes);
}

TEST(SimRunner, ThreeTiersSpillToTheSsd) {
  const trace::Trace t = layers(8, 1 * MB, 2);
  const SimOptions o = spilling_options();
  const SimReport r = simulate_trace(t, o);
  ASSERT_TRUE(r.ok()) << r.first_error;
  EXPECT_GT(r.links[static_cast<int>(Link::h2s)].bytes, 0u);
  EXPECT_GT(r.links[static_cast<int>(Link::s2h)].bytes, 0u);
  EXPECT_GT(r.peak_ssd, 0u);
  EXPECT_LE(r.peak_host, 3 * MB);
}

TEST(SimRunner, AStepThatCannotFitStopsTheRunAndSaysWhy) {
  Builder b;
  auto x = b.tensor("big_x", 2 * MB), y = b.tensor("big_y", 2 * MB);
  b.op("needs_both", {{x, EventKind::write}, {y, EventKind::write}});
  b.op("after", {{x, EventKind::read}});
  const SimReport r = simulate_trace(b.t, options(3 * MB, 1e-3));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.steps, 0u);
  EXPECT_NE(r.first_error.find("needs_both"), std::string::npos) << r.first_error;
  EXPECT_NE(r.first_error.find("together they exceed the budget"), std::string::npos)
      << r.first_error;
}

TEST(SimRunner, RooflineFromTheProfileIsTheDefaultComputeModel) {
  Builder b;
  auto x = b.tensor("x", 1 * MB);
  b.op("mm", {{x, EventKind::write}}, /*flops=*/1e12);
  b.op("mm2", {{x, EventKind::read}}, /*flops=*/3e12);
  SimOptions o = options(16 * MB, 0);
  o.op_time = nullptr;
  o.hw = load_profile("ascend-910b-32g");
  const SimReport r = simulate_trace(b.t, o);
  ASSERT_TRUE(r.ok()) << r.first_error;
  const double want = op_cost(*o.hw, b.t.ops[0]).total_s + op_cost(*o.hw, b.t.ops[1]).total_s;
  EXPECT_NEAR(static_cast<double>(r.compute_ns), want * 1e9, 2.0);
  EXPECT_GT(r.compute_ns, 10'000'000u);  // 4e12 FLOP at ~212 TFLOP/s: ~19 ms

  o.hw.reset();
  EXPECT_THROW(simulate_trace(b.t, o), InputError);  // no compute model at all
  o.flop_rate = 1e12;
  EXPECT_EQ(simulate_trace(b.t, o).compute_ns, 4'000'000'000u);
}

TEST(SimRunner, ZeroByteTensorIsRefused) {
  Builder b;
  auto x = b.tensor("empty", 0);
  b.op("a", {{x, EventKind::write}});
  EXPECT_THROW(simulate_trace(b.t, options(MB, 1e-3)), InputError);
}

// ---- several cards (Note [Cards]) -------------------------------------------

// A card's trace: `before` compute ops (named "pre<i>"), one collective "ag",
// one op "post"; each op writes its own 1 MB tensor, so everything fits.
trace::Trace card_trace(int before) {
  Builder b;
  for (int i = 0; i < before; ++i)
    b.op("pre" + std::to_string(i), {{b.tensor("p" + std::to_string(i), MB), EventKind::write}});
  b.op("ag", {{b.tensor("gathered", MB), EventKind::write}});
  b.t.ops.back().cls = trace::OpClass::collective;
  b.op("post", {{b.tensor("out", MB), EventKind::write}});
  return b.t;
}

// Op times by name: "pre*" take `pre` seconds, the collective 0.5 ms, "post" 1 ms.
SimOptions card_options(double pre) {
  SimOptions o = options(64 * MB, 0);
  o.op_time = [pre](const trace::Op& op) {
    if (op.cls == trace::OpClass::collective) return 0.5e-3;
    return op.name == "post" ? 1e-3 : pre;
  };
  return o;
}

// A slow card delays the others at the collective by exactly its extra time;
// cards match collectives by ordinal, not step (card 1 runs two ops before it).
TEST(SimCards, ACollectiveWaitsForTheSlowestCard) {
  const trace::Trace fast = card_trace(1), slow = card_trace(2);
  const auto fast_steps = build_steps(fast), slow_steps = build_steps(slow);
  std::vector<CardSpec> cards;
  cards.push_back(CardSpec{fast, fast_steps, card_options(1e-3)});    // reaches "ag" at 1 ms
  cards.push_back(CardSpec{slow, slow_steps, card_options(1.5e-3)});  // at 3 ms
  const CardsReport r = simulate_cards(cards, /*share_ssd=*/false);
  ASSERT_TRUE(r.ok()) << r.first_error;
  ASSERT_EQ(r.cards.size(), 2u);
  const SimReport alone = simulate_trace(fast, card_options(1e-3));
  EXPECT_EQ(alone.total_ns, 2'500'000u);  // 1 + 0.5 + 1 ms
  EXPECT_EQ(r.cards[0].barrier_ns, 2'000'000u);
  EXPECT_EQ(r.cards[1].barrier_ns, 0u);
  EXPECT_EQ(r.cards[0].total_ns, alone.total_ns + 2'000'000u);
  EXPECT_EQ(r.cards[1].total_ns, 4'500'000u);  // 3 + 0.5 + 1 ms
  EXPECT_EQ(r.total_ns, 4'500'000u);
  EXPECT_EQ(r.cards[0].collectives, 1u);
  EXPECT_EQ(r.cards[1].collectives, 1u);
  // Waiting at the barrier is not compute and not stall.
  EXPECT_EQ(r.cards[0].compute_ns, alone.compute_ns);
  EXPECT_EQ(r.cards[0].stall_ns, alone.stall_ns);
}

// A card that finished its trace no longer holds the others back.
TEST(SimCards, AFinishedCardDoesNotHoldABarrier) {
  Builder b;
  b.op("only", {{b.tensor("x", MB), EventKind::write}});
  const trace::Trace done_early = b.t, full = card_trace(1);
  const auto s0 = build_steps(done_early), s1 = build_steps(full);
  std::vector<CardSpec> cards;
  cards.push_back(CardSpec{done_early, s0, card_options(1e-3)});
  cards.push_back(CardSpec{full, s1, card_options(1e-3)});
  const CardsReport r = simulate_cards(cards, false);
  ASSERT_TRUE(r.ok()) << r.first_error;
  EXPECT_EQ(r.cards[1].barrier_ns, 0u);
  EXPECT_EQ(r.cards[1].total_ns, 2'500'000u);
  EXPECT_EQ(r.cards[0].total_ns, 1'000'000u);
}

// Note [Link model]: on a shared SSD link, two cards writing at once take
// twice as long as one; out of phase, each gets the whole link.
TEST(SimCards, TwoCardsWritingToASharedSsdAtOnceTakeTwiceAsLong) {
  SimTransportConfig c;
  for (auto l : {Link::d2h, Link::h2d}) c.links[static_cast<int>(l)] = {1e9, 0};
  c.links[static_cast<int>(Link::h2s)] = {1e9, 20e-6};
  c.links[static_cast<int>(Link::s2h)] = {2e9, 80e-6};
  c.ssd_capacity = 64 * MB;
  auto write_mb = [](SimTransport& tr, std::uint64_t key) {
    engine::Transfer t;
    t.ticket = key;
    t.tensor = key;
    t.link = Link::h2s;
    t.bytes = MB;
    tr.start(t);
  };
  auto run = [&](bool shared, std::uint64_t second_at) {
    VirtualTime vt;
    SharedLinks ssd;
    SimTransport a(vt, c, shared ? &ssd : nullptr), b(vt, c, shared ? &ssd : nullptr);
    std::vector<std::uint64_t> done;
    for (SimTransport* tr : {&a, &b})
      tr->set_completion([&](const engine::Transfer&, engine::Status st) {
        EXPECT_TRUE(mem::ok(st));
        done.push_back(vt.now_ns());
      });
    write_mb(a, 1);
    vt.run_until(second_at);
    write_mb(b, 2);
    vt.run_all();
    EXPECT_EQ(ssd.stats[static_cast<int>(Link::h2s)].bytes, shared ? 2 * MB : 0);
    return done;
  };
  // 1 MB at 1 GB/s is 1 ms, plus 20 us of latency.
  EXPECT_EQ(run(false, 0), (std::vector<std::uint64_t>{1'020'000, 1'020'000}));
  EXPECT_EQ(run(true, 0), (std::vector<std::uint64_t>{1'020'000, 2'020'000}));
  EXPECT_EQ(run(true, 5'000'000), (std::vector<std::uint64_t>{1'020'000, 6'020'000}));
}

// `b`, a card of a multi-card run, ran exactly as the single-card run `a`.
void expect_same_run(const SimReport& a, const SimReport& b) {
  EXPECT_EQ(a.total_ns, b.total_ns);
  EXPECT_EQ(a.stall_ns, b.stall_ns);
  EXPECT_EQ(a.drain_ns, b.drain_ns);
  EXPECT_EQ(a.engine.evictions, b.engine.evictions);
  EXPECT_EQ(a.iteration_end_ns, b.iteration_end_ns);
  EXPECT_EQ(b.barrier_ns, 0u);
  for (int l = 0; l < kNumLinks; ++l) {
    EXPECT_EQ(a.links[l].bytes, b.links[l].bytes) << l;
    EXPECT_EQ(a.links[l].busy_ns, b.links[l].busy_ns) << l;
    EXPECT_EQ(a.links[l].queue_ns, b.links[l].queue_ns) << l;
  }
}

// One card is simulate_trace exactly, shared SSD link or not.
TEST(SimCards, OneCardIsTheSingleCardRun) {
  const trace::Trace t = layers(8, 1 * MB, 2);
  const SimOptions o = spilling_options();
  const auto steps = build_steps(t);
  const SimReport a = simulate_trace(t, steps, o);
  ASSERT_TRUE(a.ok()) << a.first_error;
  EXPECT_GT(a.links[static_cast<int>(Link::s2h)].bytes, 0u);
  for (bool shared : {false, true}) {
    const CardsReport r = simulate_cards({CardSpec{t, steps, o}}, shared);
    ASSERT_EQ(r.cards.size(), 1u);
    expect_same_run(a, r.cards[0]);
    EXPECT_EQ(a.events, r.cards[0].events);  // one card: the clock's events are all its own
    EXPECT_EQ(r.ssd[static_cast<int>(Link::s2h)].bytes,
              shared ? a.links[static_cast<int>(Link::s2h)].bytes : 0u);
  }
}

// Two cards that share nothing (no collectives, SSD links their own) run
// through the multi-card driver's event loop, not the lone card's: under
// memory pressure each must still match its single-card run exactly.
TEST(SimCards, IndependentCardsUnderPressureEachMatchTheSingleCardRun) {
  const trace::Trace t = layers(8, 1 * MB, 2);
  const SimOptions o = spilling_options();
  const auto steps = build_steps(t);
  const SimReport a = simulate_trace(t, steps, o);
  ASSERT_TRUE(a.ok()) << a.first_error;
  ASSERT_GT(a.engine.evictions, 0u);
  const CardsReport r = simulate_cards({CardSpec{t, steps, o}, CardSpec{t, steps, o}}, false);
  ASSERT_TRUE(r.ok()) << r.first_error;
  ASSERT_EQ(r.cards.size(), 2u);
  for (const SimReport& b : r.cards) expect_same_run(a, b);
}

// Tables the caller built once (Note [Trace tables]) give the same run as
// tables built inside; tables of another trace are refused, naming the card.
TEST(SimCards, PrebuiltTraceTablesGiveTheSameRun) {
  const trace::Trace t = layers(8, 1 * MB, 2), other = layers(4, 1 * MB, 2);
  const SimOptions o = spilling_options();
  const auto steps = build_steps(t), other_steps = build_steps(other);
  const TraceTables tables(t, steps), wrong(other, other_steps);
  EXPECT_EQ(tables.footprint, engine::trace_footprint(t));
  const SimReport a = simulate_trace(t, steps, o);
  ASSERT_TRUE(a.ok()) << a.first_error;
  const CardsReport r = simulate_cards(
      {CardSpec{t, steps, o, CardSpec::kIndex, &tables}, CardSpec{t, steps, o}}, false);
  ASSERT_TRUE(r.ok()) << r.first_error;
  for (const SimReport& b : r.cards) expect_same_run(a, b);
  try {
    simulate_cards({CardSpec{t, steps, o}, CardSpec{t, steps, o, 7, &wrong}}, false);
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("card 7: CardSpec::tables: built for another trace"),
              std::string::npos)
        << e.what();
  }
}

// Two identical cards spilling to a shared SSD link queue behind each other
// there; the link's figures are both cards' traffic.
TEST(SimCards, CardsInPhaseContendForTheSharedSsd) {
  const trace::Trace t = layers(8, 1 * MB, 2);
  const SimOptions o = spilling_options();
  const auto steps = build_steps(t);
  const SimReport alone = simulate_trace(t, steps, o);
  const CardsReport r = simulate_cards({CardSpec{t, steps, o}, CardSpec{t, steps, o}}, true);
  ASSERT_TRUE(r.ok()) << r.first_error;
  for (auto l : {Link::h2s, Link::s2h}) {
    const int i = static_cast<int>(l);
    EXPECT_EQ(r.ssd[i].bytes, r.cards[0].links[i].bytes + r.cards[1].links[i].bytes);
  }
  const int w = static_cast<int>(Link::h2s);
  EXPECT_GT(r.cards[0].links[w].queue_ns + r.cards[1].links[w].queue_ns,
            2 * alone.links[w].queue_ns);
  EXPECT_GE(r.total_ns, alone.total_ns);
}

TEST(SimCards, ErrorsNameTheCard) {
  Builder b;
  auto x = b.tensor("big_x", 2 * MB), y = b.tensor("big_y", 2 * MB);
  b.op("needs_both", {{x, EventKind::write}, {y, EventKind::write}});
  const trace::Trace ok = card_trace(1);
  const auto s_ok = build_steps(ok), s_bad = build_steps(b.t);
  SimOptions small = options(3 * MB, 1e-3);
  const CardsReport r =
      simulate_cards({CardSpec{ok, s_ok, card_options(1e-3)}, CardSpec{b.t, s_bad, small}}, false);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.first_error.rfind("card 1: step 0 op 'needs_both'", 0), 0u) << r.first_error;

  // A shared SSD link needs one model of it.
  SimOptions ssd = card_options(1e-3);
  ssd.links.ssd_capacity = 64 * MB;
  ssd.links.links[static_cast<int>(Link::h2s)] = {1e9, 20e-6};
  ssd.links.links[static_cast<int>(Link::s2h)] = {2e9, 80e-6};
  SimOptions other = ssd;
  other.links.links[static_cast<int>(Link::s2h)].bandwidth = 4e9;
  try {
    simulate_cards({CardSpec{ok, s_ok, ssd}, CardSpec{ok, s_ok, other}}, true);
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("card 1: its s2h link"), std::string::npos) << e.what();
  }
  EXPECT_THROW(simulate_cards({}, false), InputError);
}

}  // namespace
}  // namespace u3m::sim
