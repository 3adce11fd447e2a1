// Speed of the trace layer and the workload generators: the "10 M-event file
// loads in seconds" and "a 25 MB ET imports in well under 10 s" goals live
// here, not in timed tests. Figures are measured on the machine that runs it.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <benchmark/benchmark.h>

#include "u3m/trace/et_import.hpp"
#include "u3m/trace/io.hpp"
#include "u3m/trace/stats.hpp"
#include "u3m/util/file.hpp"
#include "u3m/workload/generate.hpp"

namespace {

using namespace u3m;

// A mixed llama3-8b time-shared trace (~0.9 M events), generated once.
const trace::Trace& mixed_trace() {
  static const trace::Trace t = [] {
    trace::Trace out;
    workload::MixedConfig cfg;
    cfg.pattern = workload::MixedConfig::Pattern::timeshare;
    workload::PoissonSource src(workload::PoissonConfig{});
    workload::generate_mixed(workload::preset("llama3-8b"), cfg, src, out);
    return out;
  }();
  return t;
}

std::string encode(const trace::Trace& t, bool jsonl) {
  auto path = std::filesystem::temp_directory_path() /
              (jsonl ? "u3m-bench.jsonl" : "u3m-bench.u3mt");
  {
    auto w = trace::open_writer(path.string());
    t.replay(*w);
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::filesystem::remove(path);
  return ss.str();
}

void set_counters(benchmark::State& s, std::size_t events, std::size_t bytes) {
  s.counters["events/s"] = benchmark::Counter(static_cast<double>(events) * s.iterations(),
                                              benchmark::Counter::kIsRate);
  s.counters["bytes/event"] = static_cast<double>(bytes) / events;
  s.SetBytesProcessed(static_cast<std::int64_t>(bytes) * s.iterations());
}

void BM_GenerateMixed(benchmark::State& s) {
  std::uint64_t events = 0;
  for (auto _ : s) {
    workload::CountingSink sink;
    workload::MixedConfig cfg;
    cfg.pattern = workload::MixedConfig::Pattern::timeshare;
    workload::PoissonSource src(workload::PoissonConfig{});
    workload::generate_mixed(workload::preset("llama3-8b"), cfg, src, sink);
    events = sink.events();
  }
  s.counters["events/s"] =
      benchmark::Counter(static_cast<double>(events) * s.iterations(), benchmark::Counter::kIsRate);
}

void BM_ReadBinary(benchmark::State& s) {
  const std::string data = encode(mixed_trace(), false);
  for (auto _ : s) {
    trace::StatsSink sink;
    trace::read_binary(data, "bench", sink);
    benchmark::DoNotOptimize(sink);
  }
  set_counters(s, mixed_trace().events.size(), data.size());
}

void BM_LoadBinaryIntoMemory(benchmark::State& s) {
  const std::string data = encode(mixed_trace(), false);
  for (auto _ : s) {
    trace::Trace t;
    trace::read_binary(data, "bench", t);
    benchmark::DoNotOptimize(t.events.data());
  }
  set_counters(s, mixed_trace().events.size(), data.size());
}

void BM_ReadJsonl(benchmark::State& s) {
  const std::string data = encode(mixed_trace(), true);
  for (auto _ : s) {
    trace::StatsSink sink;
    trace::read_jsonl(data, "bench", sink);
    benchmark::DoNotOptimize(sink);
  }
  set_counters(s, mixed_trace().events.size(), data.size());
}

void BM_WriteBinary(benchmark::State& s) {
  std::size_t size = 0;
  for (auto _ : s) size = encode(mixed_trace(), false).size();
  set_counters(s, mixed_trace().events.size(), size);
}

void BM_ImportResnetEt(benchmark::State& s) {
  const std::string json = read_file(std::string(U3M_SOURCE_DIR) + "/data/pytorch-et/resnet_et.json.gz");
  std::size_t events = 0;
  for (auto _ : s) {
    trace::Trace t;
    trace::import_pytorch_et(json, "resnet_et", t);
    events = t.events.size();
  }
  set_counters(s, events, json.size());  // bytes = uncompressed JSON
}

BENCHMARK(BM_GenerateMixed)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WriteBinary)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReadBinary)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoadBinaryIntoMemory)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReadJsonl)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ImportResnetEt)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
