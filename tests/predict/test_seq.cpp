// u3m's mechanisms (Note [u3m]), the incremental window, the
// diagnosis and the per-job trace-replay, on hand-made sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "u3m/predict/diagnose.hpp"
#include "u3m/predict/seq.hpp"
#include "u3m/predict/synthetic.hpp"

namespace u3m::predict {
namespace {

using testing::horizon;
using testing::TraceMaker;
using trace::EventKind;
using trace::OpClass;

std::set<std::uint32_t> names(const std::vector<Predicted>& v) {
  std::set<std::uint32_t> s;
  for (const Predicted& p : v) s.insert(p.tensor);
  return s;
}

// Adds an event of the last op (same step).
void also(TraceMaker& m, std::uint32_t t, EventKind k) {
  m.t.events.push_back({m.time_ns, static_cast<std::uint32_t>(m.t.ops.size() - 1), t, k});
}

TEST(SeqPredictor, IterationWhoseFirstOpWasAOneOffIsFoundByItsOps) {
  // Iteration 0 = init + A B C; later iterations are A B C: no record begins
  // with A, but the one that contains it tells what follows.
  TraceMaker m;
  std::uint32_t w = m.tensor("w", 8), a = m.tensor("a", 8), b = m.tensor("b", 8),
                c = m.tensor("c", 8);
  m.op("init", OpClass::other, 0, {w, a, b, c}, 0, EventKind::alloc);
  for (std::uint32_t it = 0; it < 2; ++it) {
    m.op("A", OpClass::matmul, it, {a});
    m.op("B", OpClass::matmul, it, {b});
    m.op("C", OpClass::matmul, it, {c});
  }
  TraceFeed feed(m.t);
  SeqPredictor p;
  std::vector<Predicted> out;
  feed.feed(p, 0, 5);  // init, A B C, then iteration 1's A
  p.predict(2, out);
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{b, c}));
}

TEST(SeqPredictor, UnseenKindOfIterationPredictsNothingRatherThanGarbage) {
  TraceMaker m;
  std::uint32_t a = m.tensor("a", 8), b = m.tensor("b", 8), x = m.tensor("x", 8),
                y = m.tensor("y", 8);
  for (std::uint32_t it = 0; it < 2; ++it) {
    m.op("A", OpClass::matmul, it, {a});
    m.op("B", OpClass::matmul, it, {b});
  }
  m.op("X", OpClass::attn_decode, 2, {x});  // a kind of iteration never seen
  m.op("Y", OpClass::attn_decode, 2, {y});
  TraceFeed feed(m.t);
  SeqPredictor p;
  std::vector<Predicted> out;
  feed.feed(p, 0, 4);
  p.predict(4, out);
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{a, b}));  // replaying A B
  feed.feed(p, 4, 5);
  p.predict(4, out);
  EXPECT_TRUE(out.empty());
}

TEST(SeqPredictor, ReplacedTransientsAreWithheld) {
  // Each iteration: P allocates and writes an activation, Q reads it, R reads
  // a weight, S allocates a second activation that U reads. Iteration 2's P
  // allocates a different activation (its batch changed, so another size):
  // the recorded ones are no longer predicted, neither the one Q would read
  // (Q reads what P bore in its place, Note [Named by birth]) nor the one S
  // has yet to replace.
  TraceMaker m;
  std::uint32_t w = m.tensor("w", 8), t1 = m.tensor("act", 100), t2 = m.tensor("act", 60),
                u1 = m.tensor("act2", 50), u2 = m.tensor("act2", 30);
  auto iteration = [&](std::uint32_t it, std::uint32_t act, std::uint32_t act2) {
    m.op("P", OpClass::matmul, it, {act}, 0, EventKind::alloc);
    also(m, act, EventKind::write);
    m.op("Q", OpClass::matmul, it, {act});
    also(m, act, EventKind::free);
    m.op("R", OpClass::matmul, it, {w});
    m.op("S", OpClass::matmul, it, {act2}, 0, EventKind::alloc);
    also(m, act2, EventKind::write);
    m.op("U", OpClass::matmul, it, {act2});
    also(m, act2, EventKind::free);
  };
  iteration(0, t1, u1);
  iteration(1, t1, u1);
  iteration(2, t2, u2);
  TraceFeed feed(m.t);
  SeqPredictor p;
  std::vector<Predicted> out;
  feed.feed(p, 0, 6);  // iteration 0 and iteration 1's P (same activation)
  p.predict(4, out);
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{t1, w, u1}));
  feed.feed(p, 6, 11);  // the rest of iteration 1, then iteration 2's P
  p.predict(4, out);
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{t2, w}));
}

TEST(SeqPredictor, AStepThatBearsTheRecordedTensorsAgainEndsTheWithholding) {
  // P bears a tensor whose size follows the input (a stack over time steps):
  // iteration 2's is another. S and V bear the same tensors every iteration.
  // After P, the record's later transients are withheld; once S has borne
  // its recorded tensor again, V's is predicted again.
  TraceMaker m;
  std::uint32_t t1 = m.tensor("stack", 100), t2 = m.tensor("stack", 60), u = m.tensor("u", 50),
                v = m.tensor("v", 50);
  auto bear = [&](const char* name, std::uint32_t it, std::uint32_t x) {
    m.op(name, OpClass::matmul, it, {x}, 0, EventKind::alloc);
    also(m, x, EventKind::write);
  };
  auto iteration = [&](std::uint32_t it, std::uint32_t stack) {
    bear("P", it, stack);
    m.op("Q", OpClass::matmul, it, {stack});
    also(m, stack, EventKind::free);
    bear("S", it, u);
    m.op("U", OpClass::matmul, it, {u});
    also(m, u, EventKind::free);
    bear("V", it, v);
    m.op("W", OpClass::matmul, it, {v});
    also(m, v, EventKind::free);
  };
  iteration(0, t1);
  iteration(1, t1);
  iteration(2, t2);
  TraceFeed feed(m.t);
  SeqPredictor p;
  std::vector<Predicted> out;
  feed.feed(p, 0, 13);  // iterations 0 and 1, then iteration 2's P
  p.predict(5, out);
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{t2}));  // Q reads what P bore
  feed.feed(p, 13, 15);                                  // Q, then S bears u again
  p.predict(3, out);
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{u, v}));
}

TEST(SeqPredictor, ALoopWhoseTripCountVariesIsNamedByBirth) {
  // Note [Named by birth]. F bears one activation per time step, named by
  // position (as the ET importer names them: a_k is "the k-th"), and the
  // backward ops B walk them in reverse, each also reading the weight. The
  // recorded iteration had 3 time steps, this one has 4: its first B reads
  // a_3 where the record's read a_2, so the next ones read a_2 and a_1, not
  // the a_1 and a_0 the record names.
  TraceMaker m;
  std::uint32_t w = m.tensor("w", 8);
  std::vector<std::uint32_t> a;
  for (int k = 0; k < 4; ++k) a.push_back(m.tensor("a" + std::to_string(k), 16));
  auto iteration = [&](std::uint32_t it, std::uint32_t steps) {
    std::vector<std::uint32_t> born(a.begin(), a.begin() + steps);
    m.op("F", OpClass::other, it, born, 0, EventKind::alloc);
    for (std::uint32_t x : born) also(m, x, EventKind::write);
    for (std::uint32_t j = 0; j < steps; ++j) {
      m.op("B", OpClass::elementwise, it, {a[steps - 1 - j], w});
      also(m, a[steps - 1 - j], EventKind::free);
    }
  };
  iteration(0, 3);
  iteration(1, 4);
  TraceFeed feed(m.t);
  SeqPredictor p;
  std::vector<Predicted> out;
  feed.feed(p, 0, 6);  // iteration 0, then iteration 1's F and first B
  p.predict(2, out);
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{a[2], a[1], w}));
}

TEST(SeqPredictor, RelabelledOpIsPlacedByItsTensorsNotByTheNearestSignature) {
  // Per parameter p an optimizer does add_(step_p) then add_(m_p). In
  // iteration 0 the first add_ carries no layer (its state was created
  // unnamed), later it carries layer 0 like the second: its signature then
  // matches the nearest add_(m_p) slot, one group ahead, every time.
  TraceMaker m;
  std::vector<std::uint32_t> st, mo;
  const std::uint32_t w = m.tensor("w", 8);
  for (int p = 0; p < 4; ++p) {
    st.push_back(m.tensor("step" + std::to_string(p), 8, trace::Role::other));
    mo.push_back(m.tensor("m" + std::to_string(p), 64, trace::Role::optim_m));
  }
  for (std::uint32_t it = 0; it < 2; ++it) {
    m.op("aten::mm", OpClass::matmul, it, {w});  // the step's forward
    for (int p = 0; p < 4; ++p) {
      m.op("aten::add_", OpClass::optimizer, it, {st[p]});
      m.t.ops.back().layer = it == 0 ? trace::kNoLayer : 0;
      m.op("aten::add_", OpClass::optimizer, it, {mo[p]});
      m.t.ops.back().layer = 0;
    }
  }
  TraceFeed feed(m.t);
  SeqPredictor p;
  std::vector<Predicted> out;
  feed.feed(p, 0, 13);  // iteration 0, then mm add_(step0) add_(m0) add_(step1)
  p.predict(2, out);
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{mo[1], st[2]}));
}

TEST(SeqPredictor, InsertedOpsTouchingWhatTheRecordJustTouchedKeepTheJobInStep) {
  // Iteration 0's backward produces the gradients g1, g2; from iteration 1 on
  // (zero_grad(set_to_none=False)) the same ops write temporaries and two
  // add_ ops, never recorded, accumulate them into g1, g2. Two unmatched ops
  // in a row used to make the job lost (nothing predicted until B); and G1
  // leaving g1 untouched is no batch change (g1 lives on), so the activation
  // B allocates every iteration is still predicted.
  TraceMaker m;
  std::uint32_t x = m.tensor("x", 8), g1 = m.tensor("g1", 64, trace::Role::grad),
                g2 = m.tensor("g2", 64, trace::Role::grad),
                t1 = m.tensor("t1", 64, trace::Role::activation),
                t2 = m.tensor("t2", 64, trace::Role::activation),
                a = m.tensor("a", 64, trace::Role::activation), z = m.tensor("z", 8);
  auto tail = [&](std::uint32_t it) {
    m.op("B", OpClass::matmul, it, {a}, 0, EventKind::alloc);
    also(m, a, EventKind::write);
    m.op("C", OpClass::matmul, it, {a, z});
    also(m, a, EventKind::free);
  };
  m.op("A", OpClass::matmul, 0, {x});
  m.op("G1", OpClass::matmul, 0, {g1}, 0, EventKind::alloc);
  also(m, g1, EventKind::write);
  m.op("G2", OpClass::matmul, 0, {g2}, 0, EventKind::alloc);
  also(m, g2, EventKind::write);
  tail(0);
  for (std::uint32_t it = 1; it < 3; ++it) {
    m.op("A", OpClass::matmul, it, {x});
    m.op("G1", OpClass::matmul, it, {t1}, 0, EventKind::write);
    m.op("G2", OpClass::matmul, it, {t2}, 0, EventKind::write);
    m.op("add_", OpClass::elementwise, it, {g1, t1});
    m.op("add_", OpClass::elementwise, it, {g2, t2});
    tail(it);
  }
  TraceFeed feed(m.t);
  SeqPredictor p;
  std::vector<Predicted> out;
  feed.feed(p, 0, 10);  // iteration 0, then A G1 G2 add_ add_
  p.predict(2, out);
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{a, z}));
}

TEST(SeqPredictor, SuccessorIsTheMostFrequentNotTheLast) {
  // Kind D (ops D0 D1) repeats; kind F (op F0) came once after a D. At the
  // end of a D the next iteration is predicted to be a D.
  TraceMaker m;
  std::uint32_t d0 = m.tensor("d0", 8), d1 = m.tensor("d1", 8), f = m.tensor("f", 8);
  std::uint32_t it = 0;
  auto D = [&] {
    m.op("D0", OpClass::attn_decode, it, {d0});
    m.op("D1", OpClass::attn_decode, it++, {d1});
  };
  for (int i = 0; i < 4; ++i) D();
  m.op("F0", OpClass::attn_prefill, it++, {f});
  D();  // the D record now on file is the one F followed
  TraceFeed feed(m.t);
  SeqPredictor p;
  std::vector<Predicted> out;
  feed.feed(p, 0, feed.num_steps());
  p.predict(1, out);
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{d0}));
}

TEST(SeqPredictor, AnOpStepRunPastItsLastLengthGoesOn) {
  // Job 0's iterations (A..F) are cut by job 1's X Y into runs of 3 op
  // steps that alternately do and do not begin an iteration, so its runs are
  // counted in op steps. A run of job 0 now 4 steps long has outlived the
  // last one: it goes on (B next), rather than being predicted to end at
  // once (job 1's X) at every step up to twice its last length.
  TraceMaker m;
  std::vector<std::uint32_t> t0;
  for (const char* n : {"a", "b", "c", "d", "e", "f"}) t0.push_back(m.tensor(n, 8));
  const std::uint32_t x = m.tensor("x", 8, trace::Role::param, 1),
                      y = m.tensor("y", 8, trace::Role::param, 1);
  m.t.job("job-1");
  const char* ops0[] = {"A", "B", "C", "D", "E", "F"};
  std::uint32_t it1 = 0;
  auto job1 = [&] {
    m.op("X", OpClass::matmul, it1, {x}, 1);
    m.op("Y", OpClass::matmul, it1++, {y}, 1);
  };
  for (std::uint32_t it = 0; it < 2; ++it)
    for (int half = 0; half < 2; ++half) {
      for (int k = 3 * half; k < 3 * half + 3; ++k) m.op(ops0[k], OpClass::matmul, it, {t0[k]});
      job1();
    }
  for (int k = 0; k < 3; ++k) m.op(ops0[k], OpClass::matmul, 2, {t0[k]});
  job1();
  for (int k = 3; k < 6; ++k) m.op(ops0[k], OpClass::matmul, 2, {t0[k]});
  m.op("A", OpClass::matmul, 3, {t0[0]});  // the 4th step of the run
  TraceFeed feed(m.t);
  SeqPredictor p;
  std::vector<Predicted> out;
  feed.feed(p, 0, feed.num_steps());
  p.predict(1, out);
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{t0[1]}));
}

TEST(SeqPredictor, AnOpFarBehindInTheRecordDoesNotPullThePointerBack) {
  // An optimizer updates the state m_p of parameters p = 0..5 with add_, the
  // recorder labelling each op with its parameter's layer. In iteration 1
  // parameter 4's op carries layer 0 (relabelled): its signature is that of
  // slot 1, far behind the pointer and outside the resync window, while its
  // tensor is m_4's, at the pointer. It is taken for m_4's slot (m_5 next),
  // not for parameter 0's, which would replay m_1 onwards.
  TraceMaker m;
  const std::uint32_t w = m.tensor("w", 8);
  std::vector<std::uint32_t> mo;
  for (int q = 0; q < 6; ++q)
    mo.push_back(m.tensor("m" + std::to_string(q), 64, trace::Role::optim_m));
  for (std::uint32_t it = 0; it < 2; ++it) {
    m.op("aten::mm", OpClass::matmul, it, {w});
    for (int q = 0; q < 6; ++q) {
      m.op("aten::add_", OpClass::optimizer, it, {mo[q]});
      m.t.ops.back().layer = it == 1 && q == 4 ? 0 : q;
    }
  }
  TraceFeed feed(m.t);
  SeqParams sp;
  sp.resync_window = 2;
  SeqPredictor p(sp);
  std::vector<Predicted> out;
  feed.feed(p, 0, 13);  // iteration 0, then iteration 1 up to parameter 4's op
  p.predict(1, out);
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{mo[5]}));
}

TEST(SeqPredictor, AJobLostInAnInterruptedIterationResumesAtItsNext) {
  // Job 0's iterations (A B C) alternate with job 1's (X Y), each run one
  // iteration. Job 0's third iteration begins with an op never seen (N): it
  // is lost, and job 1 runs. Job 0's next run begins its next iteration,
  // which the records tell (A B), whatever its lost iteration was.
  TraceMaker m;
  const std::uint32_t a = m.tensor("a", 8), b = m.tensor("b", 8), c = m.tensor("c", 8),
                      n = m.tensor("n", 8), x = m.tensor("x", 8, trace::Role::param, 1),
                      y = m.tensor("y", 8, trace::Role::param, 1);
  m.t.job("job-1");
  for (std::uint32_t it = 0; it < 2; ++it) {
    m.op("A", OpClass::matmul, it, {a});
    m.op("B", OpClass::matmul, it, {b});
    m.op("C", OpClass::matmul, it, {c});
    m.op("X", OpClass::matmul, it, {x}, 1);
    m.op("Y", OpClass::matmul, it, {y}, 1);
  }
  m.op("N", OpClass::other, 2, {n});
  m.op("X", OpClass::matmul, 2, {x}, 1);
  TraceFeed feed(m.t);
  SeqPredictor p;
  std::vector<Predicted> out;
  feed.feed(p, 0, feed.num_steps());
  p.predict(3, out);  // job 1's Y, then job 0's A B
  EXPECT_EQ(names(out), (std::set<std::uint32_t>{y, a, b}));
}

// The window built from predict_window_delta equals predict()'s set: exactly
// for the default implementation, and for u3m on a trace whose slots'
// tensors do not change while in the window.
void expect_window_matches(const trace::Trace& t, const std::string& name, double min_jaccard) {
  SCOPED_TRACE(name);
  TraceFeed feed(t);
  auto a = make_predictor(name, &feed), b = make_predictor(name, &feed);
  std::vector<Predicted> out, entered;
  std::vector<std::uint32_t> left;
  std::set<std::uint32_t> win;
  double inter = 0, uni = 0;
  std::size_t entered_total = 0, full_total = 0;
  for (std::size_t s = 0; s < feed.num_steps(); ++s) {
    a->predict(64, out);
    b->predict_window_delta(64, entered, left);
    for (std::uint32_t x : left) EXPECT_EQ(win.erase(x), 1u) << "left but not held";
    for (const Predicted& p : entered) EXPECT_TRUE(win.insert(p.tensor).second) << "entered twice";
    std::set<std::uint32_t> full = names(out);
    std::size_t both = 0;
    for (std::uint32_t x : full) both += win.count(x);
    inter += both;
    uni += full.size() + win.size() - both;
    entered_total += entered.size();
    full_total += out.size();
    feed.feed(*a, s, s + 1);
    feed.feed(*b, s, s + 1);
  }
  ASSERT_GT(uni, 0);
  EXPECT_GE(inter / uni, min_jaccard);
  // The point of the delta: far fewer entries than the full sets.
  EXPECT_LT(entered_total * 10, full_total);
}

TEST(WindowDelta, DefaultIsExactAndSeqIsNearExact) {
  SyntheticMixed sp;
  trace::Trace t = make_synthetic_mixed(sp);
  expect_window_matches(t, "lru", 1.0);
  expect_window_matches(t, "u3m", 0.97);
}

TEST(WindowDelta, ASlotNamedByBirthIsNamedAnewOnceItsBirthSlotHasRun) {
  // W and C read a weight, B bears an activation (a new tensor every
  // iteration, as a changed batch would), X reads it. X enters the window
  // before B has run, naming the recorded activation; once B has run it
  // must name B's (Note [Named by birth]), as predict() does.
  TraceMaker m;
  const std::uint32_t w = m.tensor("w", 8);
  for (std::uint32_t it = 0; it < 5; ++it) {
    const std::uint32_t a = m.tensor("a" + std::to_string(it), 16);
    m.op("W", OpClass::matmul, it, {w});
    m.op("B", OpClass::matmul, it, {a}, 0, EventKind::alloc);
    also(m, a, EventKind::write);
    m.op("C", OpClass::matmul, it, {w});
    m.op("X", OpClass::matmul, it, {a});
    also(m, a, EventKind::free);
  }
  TraceFeed feed(m.t);
  SeqPredictor full, delta;
  std::vector<Predicted> out, entered;
  std::vector<std::uint32_t> left;
  std::set<std::uint32_t> win;
  for (std::size_t s = 0; s < feed.num_steps(); ++s) {
    full.predict(3, out);
    delta.predict_window_delta(3, entered, left);
    for (std::uint32_t x : left) win.erase(x);
    for (const Predicted& p : entered) win.insert(p.tensor);
    if (s >= 8) EXPECT_EQ(win, names(out)) << "before step " << s;  // from iteration 2 on
    feed.feed(full, s, s + 1);
    feed.feed(delta, s, s + 1);
  }
}

TEST(Diagnoser, TotalsAgreeWithTheEvaluator) {
  SyntheticMixed sp;
  sp.pattern = SyntheticMixed::Pattern::timeshare;
  trace::Trace t = make_synthetic_mixed(sp);
  TraceFeed feed(t);
  auto p = make_predictor("lru", &feed);
  Diagnoser d(feed, 64);
  EvalOptions opt;
  opt.on_decision = [&](std::size_t k, const std::vector<Predicted>& out, bool warm) {
    d.on_decision(k, out, warm);
  };
  EvalResult r = evaluate(feed, *p, opt);
  const HorizonSums& s = horizon(r, "64").sums;
  EXPECT_DOUBLE_EQ(d.predicted_bytes(), s.pred_bytes);
  EXPECT_DOUBLE_EQ(d.false_positive_bytes(), s.pred_bytes - s.hit_bytes);
  EXPECT_DOUBLE_EQ(d.accessed_bytes(), s.act_bytes);
  EXPECT_DOUBLE_EQ(d.known_bytes(), s.actk_bytes);
  EXPECT_DOUBLE_EQ(d.missed_bytes(), s.actk_bytes - s.hitk_bytes);
  // First touches exist here (new KV blocks) and are reported apart.
  EXPECT_GT(d.first_touch_missed_bytes(), 0);
  EXPECT_DOUBLE_EQ(d.first_touch_missed_bytes(),
                   (s.act_bytes - s.actk_bytes) - (s.hit_bytes - s.hitk_bytes));
  EXPECT_GT(d.false_positive_bytes(), 0);  // lru errs here: the tables have content
  EXPECT_NE(d.report().find("tensor role"), std::string::npos);
  const nlohmann::json j = d.to_json();
  EXPECT_DOUBLE_EQ(j.at("false_positive_bytes").get<double>(), d.false_positive_bytes());
  EXPECT_FALSE(j.at("top_patterns").at("first_touch").empty());
}

TEST(TraceReplay, EachJobKeepsItsOwnRecordAcrossInterleavings) {
  // Job 0 repeats A B C D; job 1's single op lands at a different place in
  // every iteration of job 0. A global record would diverge every time.
  TraceMaker m;
  m.t.job("job-1");
  std::vector<std::uint32_t> ts;
  for (int i = 0; i < 4; ++i) ts.push_back(m.tensor("t" + std::to_string(i), 8));
  std::uint32_t s = m.tensor("s", 8, trace::Role::activation, 1);
  for (std::uint32_t it = 0; it < 8; ++it)
    for (int k = 0; k < 4; ++k) {
      m.op(std::string(1, char('A' + k)), OpClass::matmul, it, {ts[k]});
      if (k == static_cast<int>(it % 4)) m.op("S", OpClass::attn_decode, it, {s}, 1);
    }
  EvalResult r = testing::run(m.t, "trace-replay");
  EXPECT_GE(horizon(r, "8").precision(), 0.9);
  // Each coordinator predicts as if its job ran alone, so job 1's op costs
  // recall around it; a single global record would predict almost nothing.
  EXPECT_GE(horizon(r, "8").recall(), 0.5);
}

}  // namespace
}  // namespace u3m::predict
