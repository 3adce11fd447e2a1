// u3m bench alloc: the pool allocator's fast path (a cached size: allocate
// then free under the pool lock, no source call; Note [Fast path] in
// src/mem/pool.cpp) and glibc malloc/free, measured in the same run on this
// machine.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "u3m/mem/pool.hpp"
#include "u3m/util/error.hpp"

namespace u3m::cli {
namespace {

using mem::GiB;
using mem::KiB;
using mem::MiB;

struct AllocBenchArgs {
  bool json = false;
  // 512 B-4 KiB: the sizes glibc serves from its per-thread tcache, the
  // hardest comparison; 64 KiB-16 MiB: from its arena bins.
  std::string sizes = "512,1K,4K,64K,1M,16M";
  double seconds = 4;
  int rounds = 5;
  std::string pool_config;
};

// Keeps the compiler from proving a malloc/free pair dead and deleting it.
inline void escape(void* p) {
  asm volatile("" : : "g"(p) : "memory");
}

// This thread's CPU time: on a shared machine, wall time also counts the
// slices other processes run in, which land on pool and malloc rounds at
// random and swamp a 10 ns difference; CPU time counts only this thread's
// own work, the same way for both sides.
double thread_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// Runs `pair` in batches of 4096 (the clock read, a system call, is then
// under 0.1 ns per pair) for about `slice` seconds of CPU time; ns per call.
template <typename F>
double ns_per_pair(F&& pair, double slice) {
  constexpr int kBatch = 4096;
  const double t0 = thread_seconds();
  std::uint64_t n = 0;
  double elapsed = 0;
  do {
    for (int i = 0; i < kBatch; ++i) pair();
    n += kBatch;
    elapsed = thread_seconds() - t0;
  } while (elapsed < slice);
  return elapsed * 1e9 / double(n);
}

double load_average() {
  double l[1] = {0};
  return ::getloadavg(l, 1) == 1 ? l[0] : -1;
}

void run_alloc_bench(const AllocBenchArgs& a) {
  std::vector<std::uint64_t> sizes = parse_size_list(a.sizes, "--sizes", 4ull << 30);
  if (a.seconds <= 0) input_error("--seconds", "must be > 0, got {}", a.seconds);
  if (a.rounds < 1) input_error("--rounds", "must be >= 1, got {}", a.rounds);
  mem::PoolConfig config = mem::PoolConfig::parse(a.pool_config, "--pool-config");

  mem::CpuSegmentSource source;
  mem::DevicePool pool(source, config);
  const double slice = a.seconds / double(sizes.size() * 2 * a.rounds);
  nlohmann::json results = nlohmann::json::array();
  std::uint64_t calls_after_warmup = 0, calls_at_end = 0;
  auto source_calls = [&] { return pool.stats().source_calls; };
  for (std::uint64_t size : sizes) {
    auto pool_pair = [&pool, size] {
      mem::PoolAllocation x;
      if (!mem::ok(pool.allocate(size, &x)) || !mem::ok(pool.free(x))) {
        throw std::runtime_error(fmt::format("bench alloc: pool failed at {} bytes", size));
      }
    };
    auto malloc_pair = [&] {
      void* p = std::malloc(size);
      escape(p);
      std::free(p);
    };
    pool_pair();  // caches the size: from here on the pool's fast path
    malloc_pair();
    calls_after_warmup += source_calls();
    std::vector<double> b, r;
    for (int i = 0; i < a.rounds; ++i) {
      b.push_back(ns_per_pair(pool_pair, slice));
      r.push_back(ns_per_pair(malloc_pair, slice));
    }
    calls_at_end += source_calls();
    double ns = median(b), ref = median(r);
    results.push_back({{"op", "alloc+free"},
                       {"size", size},
                       {"ns_per_op", ns},
                       {"reference_ns_per_op", ref},
                       {"ratio", ref / ns}});
  }
  if (calls_at_end != calls_after_warmup) {
    throw std::runtime_error("bench alloc: the pool called its source after warm-up");
  }

  const std::string where = machine();
  const std::string method = fmt::format(
      "one thread; per size: one warm-up pair, then {} alternating rounds of ~{:.0f} ms each of "
      "DevicePool allocate+free (a cached size, no source call: the pool cache under the pool "
      "lock) and glibc malloc+free of the same size (memory untouched by both); the same loop "
      "for both, timed by this thread's CPU time (CLOCK_THREAD_CPUTIME_ID, so other processes' "
      "load does not count); median ns per pair; ratio = malloc ns / pool ns (> 1: the pool is "
      "faster); load average {:.2f} at the end",
      a.rounds, slice * 1e3, load_average());
  if (a.json) {
    nlohmann::json out;
    out["machine"] = where;
    out["figures"] = "measured on " + where;
    out["method"] = method;
    out["pool_config"] = pool.config().describe();
    out["seconds"] = a.seconds;
    out["load_average"] = load_average();
    out["results"] = results;
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("u3m bench alloc: measured on {}\n{}\n\n", where, method);
  fmt::print("{:>10}  {:>16}  {:>16}  {:>14}\n", "size", "pool ns/pair", "malloc ns/pair",
             "pool speed-up");
  for (const auto& r : results) {
    fmt::print("{:>10}  {:>16.1f}  {:>16.1f}  {:>13.2f}x\n",
               human_bytes(r["size"].get<std::uint64_t>()), r["ns_per_op"].get<double>(),
               r["reference_ns_per_op"].get<double>(), r["ratio"].get<double>());
  }
}

}  // namespace

void add_bench_alloc_command(CLI::App& bench) {
  auto args = std::make_shared<AllocBenchArgs>();
  auto* cmd = bench.add_subcommand(
      "alloc",
      "Pool allocator fast path (cached sizes, under the pool lock) vs glibc malloc/free: ns "
      "per alloc+free pair, measured on this machine");
  cmd->add_flag("--json", args->json,
                "Print JSON: {machine, method, results: [{op, size, "
                "ns_per_op, reference_ns_per_op, ratio}]}");
  cmd->add_option("--sizes", args->sizes, "Comma-separated sizes (suffix K, M, G)")
      ->capture_default_str();
  cmd->add_option(
         "--seconds", args->seconds,
         "Total measuring time (CPU seconds of the bench thread), split over sizes and rounds")
      ->capture_default_str();
  cmd->add_option("--rounds", args->rounds, "Alternating rounds per size (median reported)")
      ->capture_default_str();
  cmd->add_option("--pool-config", args->pool_config,
                  "Pool configuration, e.g. expandable_segments:true,alignment:512");
  cmd->callback([args] { run_alloc_bench(*args); });
}

}  // namespace u3m::cli
