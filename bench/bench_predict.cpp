// Per-event cost of each access predictor (measured; run on the machine you
// want figures for). Three cases per predictor, each fed the whole trace:
//   observe/NAME   observe() every event + step_done() every op step: the
//                  cost of keeping the predictor current;
//   window64/NAME  the same plus predict_window_delta(64) before every op
//                  step: what a policy that keeps its own schedule pays
//                  (Note [Window delta] in predictor.hpp);
//   full64/NAME    the same plus predict(64) before every op step: the whole
//                  64-step set recomputed at every op (what `u3m predict eval`
//                  times by default).
// Each on two traces: the synthetic mixed trace (name as above) and, with
// the suffix "@real", a real RLHF-style capture from the corpus
// (data/pytorch-et/corpus/gpt2-rlhf.et.json.gz, torch's ExecutionGraphObserver;
// skipped if the file is missing).
// The "time_per_event" counter is CPU time divided by events fed. Use
// --benchmark_repetitions=N --benchmark_report_aggregates_only=true to get
// the median.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include <cstdlib>
#include <filesystem>

#include "u3m/predict/predictor.hpp"
#include "u3m/predict/synthetic.hpp"
#include "u3m/trace/io.hpp"

namespace {

using namespace u3m::predict;

const TraceFeed& bench_feed() {
  static const u3m::trace::Trace trace = [] {
    SyntheticMixed p;
    p.pattern = SyntheticMixed::Pattern::alternate;
    p.layers = 16;
    p.train_iterations = 6;
    p.decode_steps = 96;
    p.decode_per_train = 16;
    p.max_requests = 8;
    return make_synthetic_mixed(p);
  }();
  static const TraceFeed feed(trace);
  return feed;
}

// Null when the corpus is not there.
const TraceFeed* real_feed() {
  static const std::unique_ptr<u3m::trace::Trace> trace = []() -> std::unique_ptr<u3m::trace::Trace> {
    const char* env = std::getenv("U3M_SOURCE_DIR");
    const std::string path = std::string(env ? env : U3M_SOURCE_DIR) +
                             "/data/pytorch-et/corpus/gpt2-rlhf.et.json.gz";
    if (!std::filesystem::exists(path)) return nullptr;
    return std::make_unique<u3m::trace::Trace>(u3m::trace::load_trace(path));
  }();
  static const std::unique_ptr<TraceFeed> feed =
      trace ? std::make_unique<TraceFeed>(*trace) : nullptr;
  return feed.get();
}

enum class Query { none, window, full };

void run(benchmark::State& state, const std::string& name, Query query, const TraceFeed* fp) {
  if (!fp) {
    state.SkipWithError("corpus trace not found (data/pytorch-et/corpus/)");
    return;
  }
  const TraceFeed& feed = *fp;
  std::vector<Access> events;
  std::vector<std::size_t> step_end;
  for (std::size_t s = 0; s < feed.num_steps(); ++s) {
    for (std::size_t i = feed.step_begin(s); i < feed.step_begin(s + 1); ++i)
      events.push_back(feed.access_at(i, s));
    step_end.push_back(events.size());
  }
  std::vector<Predicted> out;
  std::vector<std::uint32_t> left;
  std::size_t answered = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::unique_ptr<Predictor> p = make_predictor(name, &feed);
    state.ResumeTiming();
    std::size_t i = 0;
    for (std::size_t end : step_end) {
      if (query == Query::full) {
        p->predict(64, out);
        answered += out.size();
      } else if (query == Query::window) {
        p->predict_window_delta(64, out, left);
        answered += out.size();
      }
      for (; i < end; ++i) p->observe(events[i]);
      p->step_done();
    }
    benchmark::DoNotOptimize(answered);
  }
  // CPU seconds per event, printed with an SI prefix ("15.6n" = 15.6 ns).
  state.counters["time_per_event"] = benchmark::Counter(
      static_cast<double>(events.size()),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["events"] = static_cast<double>(events.size());
  if (query != Query::none)
    state.counters["answer_per_step"] =
        double(answered) / double(state.iterations()) / double(step_end.size());
}

int register_all = [] {
  for (const std::string& n : predictor_names()) {
    for (auto [label, q] :
         {std::pair{"observe/", Query::none}, std::pair{"window64/", Query::window},
          std::pair{"full64/", Query::full}}) {
      benchmark::RegisterBenchmark((label + n).c_str(), [n, q = q](benchmark::State& s) {
        run(s, n, q, &bench_feed());
      })->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((label + n + "@real").c_str(), [n, q = q](benchmark::State& s) {
        run(s, n, q, real_feed());
      })->Unit(benchmark::kMillisecond);
    }
  }
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
