// Simulator speed (issue 5: >= 5 M trace events/s, so a capacity sweep takes
// minutes on 2 cores). Each iteration simulates a generated llama training
// trace through the engine on virtual time under one policy; the counter is
// trace events simulated per second of the benchmark thread's CPU time
// (Google Benchmark's rate counters divide by CPU time, not wall time), so a
// shared, loaded machine slows the wall clock more than the figure.
#include <benchmark/benchmark.h>

#include "u3m/experiments/train.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/workload/shape.hpp"

namespace {

using namespace u3m;

void BM_TrainSim(benchmark::State& state, const char* model, const char* policy) {
  experiments::TrainScenario s;
  s.shape = workload::preset(model);
  s.hw = sim::load_profile("ascend-910b-32g");
  s.cards = 4;
  s.train.seq_len = 1024;
  s.policy = policy;
  std::uint64_t events = 0;
  for (auto _ : state) {
    experiments::TrainResult r = experiments::simulate_training(s);
    benchmark::DoNotOptimize(r.step_s);
    events += r.trace_events;
  }
  state.counters["events_per_s"] = benchmark::Counter(double(events), benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_TrainSim, llama2_13b_u3m, "llama2-13b", "u3m")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainSim, llama2_13b_lru, "llama2-13b", "lru")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainSim, llama3_8b_belady, "llama3-8b", "belady")
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
