// The device pool where the product runs it: under engine::Engine's own
// mutex, with several threads calling the engine at once (docs/memory.md,
// "What the pool leaves out"). Two workloads:
//  * churn: each thread adds a tensor, acquires it on the device for writing
//    (its first acquire allocates the device copy), releases and removes it:
//    one pool allocate and one pool free per iteration, and no transfer;
//  * evict: the threads acquire random tensors of a set 4x the device
//    budget, so most acquires evict a copy (a pool free) and fetch one back
//    (a pool allocate and a host-to-device copy).
// The pool runs over real host memory with expandable segments (what both
// stacks configure) or plain ones. Figures are wall and CPU time per
// iteration and thread, measured on the machine that runs it.
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include <benchmark/benchmark.h>

#include "u3m/engine/clock.hpp"
#include "u3m/engine/engine.hpp"
#include "u3m/engine/transport.hpp"
#include "u3m/mem/host.hpp"
#include "u3m/mem/pool.hpp"

namespace {

using namespace u3m;

// Copies at once, on the calling thread: the bench times the engine and the
// pool, not a link.
class MemcpyTransport final : public engine::Transport {
 public:
  void set_completion(engine::TransferDone done) override { done_ = std::move(done); }
  void start(const engine::Transfer& t) override {
    if (t.src && t.dst) std::memcpy(t.dst, t.src, t.bytes);
    done_(t, mem::Status::ok);
  }
  mem::Status erase_ssd(std::uint64_t) override { return mem::Status::ok; }
  bool has_ssd() const override { return false; }
  bool ssd_holds(std::uint64_t) const override { return false; }

 private:
  engine::TransferDone done_;
};

constexpr std::uint64_t kTensorBytes = 64 * mem::KiB;
constexpr int kEvictSet = 256;  // tensors; the device budget holds a quarter

struct Rig {
  mem::CpuSegmentSource source{2 * mem::MiB};
  mem::DevicePool pool;
  mem::HostBackend host{mem::HostOptions{}};
  MemcpyTransport transport;
  engine::SteadyClock clock;
  std::unique_ptr<engine::Engine> eng;
  std::atomic<std::uint64_t> next_id{1u << 20};

  explicit Rig(const mem::PoolConfig& pc) : pool(source, pc) {
    engine::EngineConfig c;
    c.device.capacity = kEvictSet / 4 * kTensorBytes;
    c.host.capacity = 4 * kEvictSet * kTensorBytes;
    eng = std::make_unique<engine::Engine>(c, pool, host, transport, clock);
    for (int i = 0; i < kEvictSet; ++i) {
      eng->add(i, kTensorBytes);
      engine::Lease l;
      eng->acquire(i, mem::Tier::host, engine::Access::write, &l);
      eng->release(l);
    }
  }
};

// One rig per pool config for the whole run: Google Benchmark's threads
// share it.
Rig& rig(const char* config) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Rig>> rigs;
  std::lock_guard g(mu);
  auto& r = rigs[config];
  if (!r) r = std::make_unique<Rig>(mem::PoolConfig::parse(config, "bench pool config"));
  return *r;
}

void must(mem::Status s, benchmark::State& state, const char* what) {
  if (!mem::ok(s)) state.SkipWithError(what);
}

void BM_Churn(benchmark::State& state, const char* config) {
  Rig& r = rig(config);
  // Sizes repeat per thread, as the engine's tensors do from step to step.
  const std::uint64_t sizes[] = {4 * mem::KiB, 16 * mem::KiB, 64 * mem::KiB, 256 * mem::KiB};
  std::size_t i = 0;
  for (auto _ : state) {
    const engine::TensorId id = r.next_id.fetch_add(1, std::memory_order_relaxed);
    must(r.eng->add(id, sizes[i++ % 4]), state, "add");
    engine::Lease l;
    must(r.eng->acquire(id, mem::Tier::device, engine::Access::write, &l), state, "acquire");
    must(r.eng->release(l), state, "release");
    must(r.eng->remove(id), state, "remove");
  }
}

void BM_Evict(benchmark::State& state, const char* config) {
  Rig& r = rig(config);
  std::mt19937 rng(static_cast<unsigned>(state.thread_index()) + 1);
  for (auto _ : state) {
    engine::Lease l;
    must(r.eng->acquire(rng() % kEvictSet, mem::Tier::device, engine::Access::read, &l), state,
         "acquire");
    must(r.eng->release(l), state, "release");
  }
}

// What both stacks configure (no free tail kept mapped: a freed top block
// unmaps its chunk at once, and the next allocation maps it again), the same
// keeping 64 MiB of free tail mapped, and plain segments.
constexpr const char* kExpandable = "expandable_segments:true";
constexpr const char* kExpandableKeep = "expandable_segments:true,expandable_keep:64MiB";
constexpr const char* kPlain = "";

BENCHMARK_CAPTURE(BM_Churn, expandable, kExpandable)->ThreadRange(1, 4)->UseRealTime();
BENCHMARK_CAPTURE(BM_Churn, expandable_keep, kExpandableKeep)->ThreadRange(1, 4)->UseRealTime();
BENCHMARK_CAPTURE(BM_Churn, plain, kPlain)->ThreadRange(1, 4)->UseRealTime();
BENCHMARK_CAPTURE(BM_Evict, expandable, kExpandable)->ThreadRange(1, 4)->UseRealTime();
BENCHMARK_CAPTURE(BM_Evict, expandable_keep, kExpandableKeep)->ThreadRange(1, 4)->UseRealTime();
BENCHMARK_CAPTURE(BM_Evict, plain, kPlain)->ThreadRange(1, 4)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
