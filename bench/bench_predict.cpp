// Per-event cost of each access predictor (measured; run on the machine you
// want figures for). Two cases per predictor:
//   observe/NAME   observe() every event + step_done() every op step: the
//                  cost of keeping the predictor current;
//   query64/NAME   the same plus predict(64) before every op step, i.e. what
//                  `u3m predict eval` times and what a policy asking for the
//                  full 64-op set at every op would pay.
// The "time_per_event" counter is CPU time divided by events fed. Use
// --benchmark_repetitions=N to get the median.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "u3m/predict/predictor.hpp"
#include "u3m/predict/synthetic.hpp"

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

void run(benchmark::State& state, const std::string& name, bool query) {
  const TraceFeed& feed = bench_feed();
  std::vector<Access> events;
  std::vector<std::size_t> step_end;
  for (std::size_t s = 0; s < feed.num_steps(); ++s) {
    for (std::size_t i = feed.step_begin(s); i < feed.step_begin(s + 1); ++i)
      events.push_back(feed.access_at(i, s));
    step_end.push_back(events.size());
  }
  std::vector<Predicted> out;
  std::size_t answered = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::unique_ptr<Predictor> p = make_predictor(name, &feed);
    state.ResumeTiming();
    std::size_t i = 0;
    for (std::size_t end : step_end) {
      if (query) {
        p->predict(64, out);
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
  if (query)
    state.counters["answer_per_step"] =
        double(answered) / double(state.iterations()) / double(step_end.size());
}

int register_all = [] {
  for (const std::string& n : predictor_names()) {
    benchmark::RegisterBenchmark(("observe/" + n).c_str(), [n](benchmark::State& s) {
      run(s, n, false);
    })->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("query64/" + n).c_str(), [n](benchmark::State& s) {
      run(s, n, true);
    })->Unit(benchmark::kMillisecond);
  }
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
