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

#include <list>
#include <memory>
#include <unordered_map>

#include "u3m/experiments/serve.hpp"
#include "u3m/kv/block_manager.hpp"
#include "u3m/kv/tiered_store.hpp"
#include "u3m/sim/sim_stack.hpp"
#include "u3m/sim/virtual_time.hpp"

namespace u3m::serve {

using experiments::ServeResult;
using experiments::ServeScenario;
using experiments::ServeLinkStats;

// The shared KV pool of several instances (Note [Pooled KV] in serving_sim.cpp): token blocks
// by content key, LRU, a block readable from the time its put is through.
class KvPool {
 public:
  explicit KvPool(std::uint64_t capacity_blocks) : capacity_(capacity_blocks) {}
  // How many of keys[from, to) the pool holds, in a run from `from`, readable at `t_ns`;
  // touches them.
  std::size_t lookup(const std::vector<std::uint64_t>& keys, std::size_t from, std::size_t to,
                     std::uint64_t t_ns);
  bool holds(std::uint64_t key) const { return map_.contains(key); }
  // Adds a block readable from `visible_ns`, evicting the least recently used beyond capacity.
  void put(std::uint64_t key, std::uint64_t visible_ns);
  std::uint64_t capacity_blocks() const { return capacity_; }
  std::uint64_t peak_blocks() const { return peak_; }
  std::uint64_t evicted() const { return evicted_; }

 private:
  struct Entry {
    std::uint64_t visible_ns;
    std::list<std::uint64_t>::iterator lru;
  };
  std::uint64_t capacity_, peak_ = 0, evicted_ = 0;
  std::list<std::uint64_t> lru_;  // least recently used first
  std::unordered_map<std::uint64_t, Entry> map_;
};

// What the instances of one simulation share: the pool (null when separate) and the SLO misses
// the capacity search's early exit counts.
struct Fleet {
  KvPool* pool = nullptr;
  std::uint64_t misses = 0;
};

class ServingSim {
 public:
  // `stop_after`: stop once more requests than this missed an SLO (the capacity search's
  // early exit); 0 = run to the end. `fleet`: shared with the other instances of the run (must
  // outlive this). InputError for a scenario that does not work.
  ServingSim(const ServeScenario& s, std::uint64_t stop_after, Fleet& fleet);
  ~ServingSim();
  ServingSim(const ServingSim&) = delete;
  ServingSim& operator=(const ServingSim&) = delete;

  // start() once, then step() until it returns false, then result() once. Each step is one
  // batching iteration (or a wait for an arrival or a transfer); now() is where it ended.
  void start();
  bool step();
  double now() const { return now_; }
  // This instance's result: per-request outcomes in its requests' order and its counters;
  // the summary figures (percentiles, goodput) are simulate_serving's (summarize_serving).
  ServeResult result();

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
    kv::PromptBlocks layout;  // its shareable blocks under the policy's reuse (and the pool's keys)
    // Its blocks fetched from the pool (Note [Pooled KV]) and its blend copies (Note [Blend
    // cost]) are in by then.
    std::uint64_t fetch_ready_ns = 0;
    std::vector<kv::Admission::Blend> blends;  // Note [Segment reuse]
    bool copied = true;                        // its blend copies are booked
    double blend_hbm_bytes = 0;                // HBM traffic of copies and re-rotation
  };
  kv::KvConfig make_config();
  std::uint32_t block_tokens() const {
    return pol_.block_tokens ? pol_.block_tokens : s_.block_tokens;
  }
  // Note [Blend cost]: books request i's blend copies once its blocks are in place.
  void copy_blends(Req& q, std::size_t i);
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
  void grant_ssd_credit();  // Note [SSD admission]
  void miss() { ++fleet_.misses; }
  bool stopped() const { return stop_after_ && fleet_.misses > stop_after_; }
  // Note [Pooled KV]: books `bytes` on a NIC link now; returns when they are through (ns).
  struct NetLink {
    mem::LinkModel model;
    mem::LinkSchedule schedule;
    ServeLinkStats stats;
    std::uint64_t book(std::uint64_t now_ns, std::uint64_t bytes);
  };
  void put_prompt(Req& q);  // the prompt's full blocks the pool lacks, written to it

  const ServeScenario& s_;
  experiments::ServePolicy pol_;
  std::uint64_t stop_after_;
  kv::KvGeometry geo_;
  ServeResult res_;
  double eff_flops_ = 0;
  double now_ = 0;
  double spill_credit_ = 0, last_spill_ = 0;
  double last_credit_ = 0, credit_carry_ = 0;  // SSD write credit granted up to last_credit_
  // The data path (Note [Serving on the store]): clock, simulated stack and store, in
  // construction order.
  sim::VirtualTime clock_;
  std::unique_ptr<sim::SimStack> stack_;
  std::unique_ptr<kv::TieredStore> store_;
  std::array<double, 4> planned_{};  // link seconds of fetches chosen and not started
  std::vector<Req> reqs_;
  std::deque<std::size_t> backlog_;   // refused_queue_full, to submit again in order
  std::vector<std::size_t> running_;  // admission order
  Fleet& fleet_;
  NetLink net_rx_, net_tx_;
  std::uint64_t block_bytes_ = 0;  // one token block, all layers
  std::size_t next_ = 0;           // the next arrival to submit
  std::vector<std::pair<std::size_t, std::uint64_t>> batch_;
};

// The summary figures of a result from its per-request outcomes (`s`: the whole trace, in the
// order of r.per_request): met, percentiles, span, makespan, goodput, throughput.
void summarize_serving(const ServeScenario& s, ServeResult& r);

}  // namespace u3m::serve
