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
// Both halves are here; the tuning half is the one the predictor's constants
// were chosen on, the held-out half was never looked at for that.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

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
  for (const char* base : {"design-ema", "lru", "markov-reuse", "trace-replay"}) {
    const HorizonMetrics b = at64(feed, base);
    EXPECT_GT(f1k, f1(b.precision(), b.recall_known())) << base;
  }
}

// Floors from the table in docs/prediction.md ("The corpus").
INSTANTIATE_TEST_SUITE_P(
    Issue17, Corpus,
    ::testing::Values(Case{"bert-mlm-train.et.json.gz", "heldout"},
                      Case{"bert-mlm-train.u3m.jsonl.gz", "heldout"},
                      Case{"bert-timeshare.et.json.gz", "tuning"},
                      Case{"bert-timeshare.u3m.jsonl.gz", "tuning", 0.970, 0.927},
                      Case{"cnn-timeshare.et.json.gz", "tuning", 0.924, 0.935},
                      Case{"cnn-timeshare.u3m.jsonl.gz", "tuning", 0.824, 0.874},
                      Case{"cnn-train.et.json.gz", "heldout", 0.959, 0.980},
                      Case{"cnn-train.u3m.jsonl.gz", "heldout", 0.961, 0.952},
                      Case{"gpt2-rlhf.et.json.gz", "heldout", 0.969, 0.970},
                      Case{"gpt2-rlhf.u3m.jsonl.gz", "heldout", 0.961, 0.953},
                      Case{"gpt2-timeshare.et.json.gz", "tuning", 0.892, 0.861},
                      Case{"gpt2-timeshare.u3m.jsonl.gz", "tuning", 0.891, 0.923},
                      Case{"gpt2-train.et.json.gz", "tuning"},
                      Case{"gpt2-train.u3m.jsonl.gz", "tuning"},
                      Case{"llama-rlhf.et.json.gz", "tuning", 0.977, 0.949},
                      Case{"llama-rlhf.u3m.jsonl.gz", "tuning", 0.957, 0.936},
                      Case{"llama-timeshare.et.json.gz", "heldout", 0.936, 0.890},
                      Case{"llama-timeshare.u3m.jsonl.gz", "heldout", 0.938, 0.861},
                      Case{"llama-train.et.json.gz", "heldout"},
                      Case{"llama-train.u3m.jsonl.gz", "heldout"},
                      Case{"lstm-rlhf.et.json.gz", "heldout", 0.975, 0.862},
                      Case{"lstm-rlhf.u3m.jsonl.gz", "heldout"},
                      Case{"lstm-train.et.json.gz", "tuning", 0.572, 0.320},
                      Case{"lstm-train.u3m.jsonl.gz", "tuning", 0.621, 0.420},
                      Case{"moe-rlhf.et.json.gz", "heldout", 0.982, 0.903},
                      Case{"moe-rlhf.u3m.jsonl.gz", "heldout"},
                      Case{"moe-train.et.json.gz", "tuning"},
                      Case{"moe-train.u3m.jsonl.gz", "tuning"},
                      Case{"seq2seq-timeshare.et.json.gz", "heldout", 0.945, 0.758},
                      Case{"seq2seq-timeshare.u3m.jsonl.gz", "heldout", 0.904, 0.796},
                      Case{"seq2seq-train.et.json.gz", "tuning"},
                      Case{"seq2seq-train.u3m.jsonl.gz", "tuning", 0.954, 0.889}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string s = i.param.file;
      for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

}  // namespace
}  // namespace u3m::predict
