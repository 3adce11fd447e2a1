// The issue-17 bar on the prediction corpus: real PyTorch programs (PyTorch's
// own modules and well-known architectures) captured with torch's
// ExecutionGraphObserver and with u3m's recorder (data/pytorch-et/corpus/,
// python/u3m_capture/corpus.py). At H = 64, after the default warm-up:
// - on every trace the default's F1 (precision with recall over known
//   tensors) beats every baseline's;
// - the traces listed as meeting the bar keep precision >= 0.97 and recall
//   over known tensors >= 0.95;
// - the others are known shortfalls (docs/prediction.md, "The corpus"): each
//   is held at what it reaches today, less half a point, so a regression
//   shows and the gap can only close.
// - on the random time-sharing traces the schedule bound (Note [Schedule
//   bound] in src/predict/bound.cpp) is computed: where it rules the bar out
//   it says so here (and the trace is held to its floor), and the default's
//   expected figures under the bound's probabilities never exceed it.
// Both halves are here; the tuning half is the one the predictor's constants
// were chosen on, the held-out half was never looked at for that.
#include <cstdlib>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "u3m/predict/bound.hpp"
#include "u3m/predict/eval.hpp"
#include "u3m/predict/predictor.hpp"
#include "u3m/trace/io.hpp"

namespace u3m::predict {
namespace {

struct Case {
  const char* file;
  const char* half;  // tuning | heldout (corpus.py)
  // Known shortfall: the floors (precision, recall over known); 0 = meets the bar.
  double floor_p = 0, floor_rk = 0;
  // Random time-sharing (corpus.py's "timeshare" schedule): the schedule
  // bound applies; `ruled_out`: it rules the bar out.
  bool random_schedule = false, ruled_out = false;
};

std::string path_of(const char* file) {
  const char* env = std::getenv("U3M_SOURCE_DIR");
  return std::string(env ? env : U3M_SOURCE_DIR) + "/data/pytorch-et/corpus/" + file;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.file;
}

class Corpus : public ::testing::TestWithParam<Case> {};

HorizonMetrics at64(const TraceFeed& feed, const std::string& name) {
  EvalOptions o;
  o.horizons = {64};
  o.iteration_horizon = false;
  auto p = make_predictor(name, &feed);
  return evaluate(feed, *p, o).horizons.at(0);
}

TEST_P(Corpus, DefaultMeetsTheBarOrItsFloorAndBeatsEveryBaseline) {
  const Case& c = GetParam();
  trace::Trace t = trace::load_trace(path_of(c.file));
  TraceFeed feed(t);
  const HorizonMetrics m = at64(feed, std::string(kDefaultPredictor));
  const double f1k = f1(m.precision(), m.recall_known());
  std::printf("%-34s %-8s u3m P %.4f Rk %.4f F1k %.4f ceiling %.4f\n", c.file, c.half,
              m.precision(), m.recall_known(), f1k, m.recall_ceiling());
  if (c.floor_p == 0) {
    EXPECT_GE(m.precision(), 0.97);
    EXPECT_GE(m.recall_known(), 0.95);
  } else {
    EXPECT_GE(m.precision(), c.floor_p - 0.005) << "known shortfall regressed";
    EXPECT_GE(m.recall_known(), c.floor_rk - 0.005) << "known shortfall regressed";
  }
  if (c.random_schedule) {
    const ScheduleBound b = schedule_bound(feed, {});
    ASSERT_TRUE(b.computed) << b.why_not;
    std::printf("%-34s schedule bound: recall over known <= %.4f at precision >= 0.97\n", c.file,
                b.recall_known_at_bar);
    EXPECT_EQ(b.rules_out_bar(), c.ruled_out);
    // The frontier bounds every causal predictor's expected figures: the
    // default's too (a check on the bound as much as on the predictor).
    EvalOptions o;
    o.horizons = {64};
    o.iteration_horizon = false;
    ExpectedScore e(feed, 64, o.warmup_iterations);
    o.on_decision = [&](std::size_t k, const std::vector<Predicted>& out, bool) {
      e.on_decision(k, out);
    };
    auto p = make_predictor(std::string(kDefaultPredictor), &feed);
    evaluate(feed, *p, o);
    ASSERT_TRUE(e.computed());
    const ScheduleBound at_p = [&] {
      ScheduleBoundOptions bo;
      bo.precision_bar = e.precision();
      return schedule_bound(feed, bo);
    }();
    EXPECT_LE(e.recall_known(), at_p.recall_known_at_bar + 1e-9);
  } else {
    EXPECT_FALSE(c.ruled_out);
  }
  for (const char* base : {"design-ema", "lru", "markov-reuse", "trace-replay"}) {
    const HorizonMetrics b = at64(feed, base);
    EXPECT_GT(f1k, f1(b.precision(), b.recall_known())) << base;
  }
}

TEST(RecorderCorpus, ARequestBeginsWithItsOwnInputDraw) {
  // corpus.py tells the recorder a request's iteration before its input is
  // drawn (the prompt's randint, an image batch's randn), so the draw opens
  // the request's prefill instead of trailing whatever iteration ran last.
  for (const char* prog : {"gpt2-rlhf", "gpt2-timeshare", "llama-rlhf", "llama-timeshare",
                           "seq2seq-timeshare", "bert-timeshare", "lstm-rlhf", "cnn-timeshare",
                           "moe-rlhf"}) {
    SCOPED_TRACE(prog);
    const trace::Trace t = trace::load_trace(path_of((std::string(prog) + ".u3m.jsonl.gz").c_str()));
    std::map<std::pair<std::uint32_t, std::uint32_t>, std::pair<const trace::Op*, bool>> iters;
    for (const trace::Op& o : t.ops) {
      auto& [first, prefill] = iters.emplace(std::pair{o.job, o.iteration}, std::pair{&o, false})
                                   .first->second;
      prefill |= o.phase == trace::Phase::prefill;
    }
    std::size_t requests = 0;
    for (const auto& [key, it] : iters) {
      if (t.jobs.at(key.first) != "infer-0" || !it.second) continue;
      ++requests;
      EXPECT_TRUE(it.first->name == "aten::randint" || it.first->name == "aten::randn")
          << "iteration " << key.second << " begins with " << it.first->name;
    }
    EXPECT_GT(requests, 0u);
  }
}

// Floors from the table in docs/prediction.md ("The corpus"), truncated to 0.001.
INSTANTIATE_TEST_SUITE_P(
    Issue17, Corpus,
    ::testing::Values(Case{"bert-mlm-train.et.json.gz", "heldout"},
                      Case{"bert-mlm-train.u3m.jsonl.gz", "heldout"},
                      Case{"bert-timeshare.et.json.gz", "tuning", 0, 0, true, false},
                      Case{"bert-timeshare.u3m.jsonl.gz", "tuning", 0, 0, true, false},
                      Case{"cnn-timeshare.et.json.gz", "tuning", 0.924, 0.935, true, false},
                      Case{"cnn-timeshare.u3m.jsonl.gz", "tuning", 0.924, 0.937, true, false},
                      Case{"cnn-train.et.json.gz", "heldout", 0.965, 0.998},
                      Case{"cnn-train.u3m.jsonl.gz", "heldout", 0.963, 0.998},
                      Case{"gpt2-rlhf.et.json.gz", "heldout", 0.967, 0.973},
                      Case{"gpt2-rlhf.u3m.jsonl.gz", "heldout", 0.960, 0.969},
                      Case{"gpt2-timeshare.et.json.gz", "tuning", 0.919, 0.923, true, true},
                      Case{"gpt2-timeshare.u3m.jsonl.gz", "tuning", 0.919, 0.925, true, true},
                      Case{"gpt2-train.et.json.gz", "tuning"},
                      Case{"gpt2-train.u3m.jsonl.gz", "tuning"},
                      Case{"llama-rlhf.et.json.gz", "tuning"},
                      Case{"llama-rlhf.u3m.jsonl.gz", "tuning"},
                      Case{"llama-timeshare.et.json.gz", "heldout", 0.968, 0.949, true, false},
                      Case{"llama-timeshare.u3m.jsonl.gz", "heldout", 0.961, 0.952, true, false},
                      Case{"llama-train.et.json.gz", "heldout"},
                      Case{"llama-train.u3m.jsonl.gz", "heldout"},
                      Case{"lstm-rlhf.et.json.gz", "heldout"},
                      Case{"lstm-rlhf.u3m.jsonl.gz", "heldout"},
                      Case{"lstm-train.et.json.gz", "tuning", 0.744, 0.765},
                      Case{"lstm-train.u3m.jsonl.gz", "tuning", 0.701, 0.696},
                      Case{"moe-rlhf.et.json.gz", "heldout"},
                      Case{"moe-rlhf.u3m.jsonl.gz", "heldout"},
                      Case{"moe-train.et.json.gz", "tuning"},
                      Case{"moe-train.u3m.jsonl.gz", "tuning"},
                      Case{"seq2seq-timeshare.et.json.gz", "heldout", 0.951, 0.918, true, false},
                      Case{"seq2seq-timeshare.u3m.jsonl.gz", "heldout", 0.930, 0.894, true, false},
                      Case{"seq2seq-train.et.json.gz", "tuning"},
                      Case{"seq2seq-train.u3m.jsonl.gz", "tuning"}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string s = i.param.file;
      for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

}  // namespace
}  // namespace u3m::predict
