// serve::ServingSim, the serving simulator of issue 6 (`u3m serve sim`, and every run of
// the capacity search): a request trace served by one tensor-parallel group with
// continuous batching, its KV cache held by the tiered block manager (src/kv) under a
// named policy and carried out by kv::TieredStore over a simulated stack (sim::SimStack on
// virtual time), costs from the hardware profile. Every figure it gives is simulated.
// The scenario and result types are experiments' (serve.hpp): the CLI, the Python
// bindings and the capacity search share them. docs/serving.md explains the model.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include <memory>

#include "u3m/experiments/serve.hpp"
#include "u3m/kv/block_manager.hpp"
#include "u3m/kv/tiered_store.hpp"
#include "u3m/sim/sim_stack.hpp"
#include "u3m/sim/virtual_time.hpp"

namespace u3m::serve {

using experiments::ServeResult;
using experiments::ServeScenario;

class ServingSim {
 public:
  // `stop_after`: stop once more requests than this missed an SLO (the capacity search's
  // early exit); 0 = run to the end. InputError for a scenario that does not work.
  ServingSim(const ServeScenario& s, std::uint64_t stop_after = 0);
  ~ServingSim();
  ServingSim(const ServingSim&) = delete;
  ServingSim& operator=(const ServingSim&) = delete;

  ServeResult run();  // once

 private:
  struct Req {
    const workload::ServeRequest* r = nullptr;
    double arrival = 0;
    std::uint64_t prompt = 0;
    std::uint32_t output = 1;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> todo;  // prefill ranges left
    std::uint32_t generated = 0;
    std::vector<double> host_prefix;  // host-resident KV bytes of token blocks [0, i)
    bool running = false, done = false;
    bool ready = false;   // its blocks are in place (it stays so while it runs)
    bool missed = false;  // already counted as a miss (TTFT over the SLO)
  };
  kv::KvConfig make_config();
  kv::BlockManager& bm() { return store_->manager(); }
  // Runs the stack's events up to `t` (seconds), polling the store after each.
  void advance(double t);
  void poll();  // the store's poll(); plans made before it are booked by then
  // Seconds until `bytes` moved from `from` to `to` now would be through (the links'
  // backlog, and this call's fetches not started yet).
  double fetch_s(kv::Tier from, kv::Tier to, std::uint64_t bytes) const;
  void submit(std::size_t i);
  void admitted(const std::vector<kv::Admission>& adms);
  void finish(std::size_t i);
  void retry_backlog();
  void spill();
  void miss() {
    if (stop_after_ && ++misses_ > stop_after_) stopped_ = true;
  }

  const ServeScenario& s_;
  experiments::ServePolicy pol_;
  std::uint64_t stop_after_;
  kv::KvGeometry geo_;
  ServeResult res_;
  double eff_flops_ = 0;
  double now_ = 0;
  double spill_credit_ = 0, last_spill_ = 0;
  // The data path (Note [Serving on the store]): clock, simulated stack and store, in
  // construction order.
  sim::VirtualTime clock_;
  std::unique_ptr<sim::SimStack> stack_;
  std::unique_ptr<kv::TieredStore> store_;
  std::array<double, 4> planned_{};  // link seconds of fetches chosen and not started
  std::vector<Req> reqs_;
  std::deque<std::size_t> backlog_;   // refused_queue_full, to submit again in order
  std::vector<std::size_t> running_;  // admission order
  std::uint64_t misses_ = 0;
  bool stopped_ = false;
};

}  // namespace u3m::serve
