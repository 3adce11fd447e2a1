// Prometheus metrics of a run (issue 20, docs/operators.md): what each
// engine holds and moves, its monitor, the driver's ops and stalls, and the
// KV cache's prefix hits, served as the text exposition on /metrics.
//
// Metrics is a RunObserver: Engine::set_observer(&metrics, card) attaches an
// engine, whose counters and monitor are then read at each scrape (they are
// the engine's own figures, not a second count); the driver's op(), stall()
// and step_end() calls are counted here. A detached engine's counters stay in
// the totals, so counters never go back when a run ends and another begins.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "u3m/engine/run_observer.hpp"

namespace u3m::observe {

// What the KV cache's owner reports (set_kv): prefix-cache queries and hits
// in tokens, as vLLM counts them, and the fraction of its blocks in use.
struct KvSample {
  std::uint64_t query_tokens = 0, hit_tokens = 0;  // cumulative
  double usage = 0;                                // in [0, 1]
};

class Metrics final : public engine::RunObserver {
 public:
  Metrics();
  ~Metrics() override;  // stops serving; attached engines must be detached first
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Serves http://address:port/metrics from a small HTTP server's threads;
  // port 0 = any free port. Returns the port it listens on. InputError naming
  // `what` (the flag) if the address cannot be bound; logic_error if called twice.
  int serve(int port, const std::string& address = "127.0.0.1",
            const std::string& what = "--metrics-port");
  int port() const;  // 0 before serve()
  // The exposition a scrape returns now.
  std::string text() const;

  void set_kv(int card, const KvSample& kv);

  void op(int card, std::int64_t step, std::size_t index, std::string_view name,
          engine::OpWork work, double t0_s, double t1_s) override;
  void stall(int card, std::int64_t step, std::size_t index, double t0_s, double t1_s) override;
  void step_end(int card, std::int64_t step, double t_s) override;
  void attached(int card, const engine::Engine& e) override;
  void detached(int card, const engine::Engine& e) override;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;  // the collectable the server holds a weak_ptr to
};

}  // namespace u3m::observe
