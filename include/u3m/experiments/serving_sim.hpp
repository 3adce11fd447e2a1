// serve::ServingSim, the serving simulator of issue 6 (`u3m serve sim`, and every run of
// the capacity search): a request trace served by one tensor-parallel group with
// continuous batching, its KV cache held by the tiered block manager (src/kv) under a
// named policy, costs from the hardware profile. Every figure it gives is simulated.
// The scenario and result types are experiments' (serve.hpp): the CLI, the Python
// bindings and the capacity search share them. docs/serving.md explains the model.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "u3m/experiments/serve.hpp"
#include "u3m/kv/block_manager.hpp"

namespace u3m::serve {

using experiments::ServeResult;
using experiments::ServeScenario;

class ServingSim {
 public:
  // `stop_after`: stop once more requests than this missed an SLO (the capacity search's
  // early exit); 0 = run to the end. InputError for a scenario that does not work.
  ServingSim(const ServeScenario& s, std::uint64_t stop_after = 0);
  ServingSim(const ServingSim&) = delete;
  ServingSim& operator=(const ServingSim&) = delete;

  ServeResult run();  // once

 private:
  // One direction of a modelled link, FIFO (sim::LinkModel, Note [Link model]).
  struct Fifo {
    double bw = 0, lat = 0;
    double free_at = 0;
    experiments::ServeLinkStats* st = nullptr;
    double book(double t, double bytes) {
      const double start = std::max(t, free_at);
      free_at = start + bytes / bw;
      st->bytes += static_cast<std::uint64_t>(bytes);
      ++st->transfers;
      st->busy_s += bytes / bw;
      return free_at + lat;
    }
  };

  struct Req {
    const workload::ServeRequest* r = nullptr;
    double arrival = 0;
    std::uint64_t prompt = 0;
    std::uint32_t output = 1;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> todo;  // prefill ranges left
    std::uint32_t generated = 0;
    double ready_at = 0;
    std::vector<double> host_prefix;  // host-resident KV bytes of token blocks [0, i)
    bool running = false, done = false;
    bool missed = false;  // already counted as a miss (TTFT over the SLO)
  };
  kv::KvConfig make_config();
  // The completion time of a move from `from` to `to` issued at `t` (Note [KV streaming]).
  double book_move(double t, kv::Tier from, kv::Tier to, double bytes);
  // Books a demotion or spill; returns when its source slot may be reused.
  double demote(const kv::Action& a);
  double estimate_move(double t, kv::Tier from, kv::Tier to, double bytes) const;
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
  kv::BlockManager bm_;
  ServeResult res_;
  std::array<Fifo, 4> links_{};
  double eff_flops_ = 0;
  double staging_bytes_ = 0;  // Note [Write-behind]
  double now_ = 0;
  double spill_credit_ = 0, last_spill_ = 0;
  std::vector<Req> reqs_;
  std::deque<std::size_t> backlog_;   // refused_queue_full, to submit again in order
  std::vector<std::size_t> running_;  // admission order
  std::uint64_t misses_ = 0;
  bool stopped_ = false;
};

}  // namespace u3m::serve
