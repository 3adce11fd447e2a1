// One predictor's window deltas over a trace, computed once and read by
// every consumer that replays the same trace (Note [Shared window log]).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "u3m/predict/predictor.hpp"

namespace u3m::predict {

// Note [Shared window log]
// A simulated scenario runs the u3m policy on one trace many times: once per
// card (4) and per optimizer placement (2). Each run feeds its own predictor
// the same steps and asks the same window deltas, so the predictor did the
// same work 8 times. The log runs one predictor and records, per call, the
// step fed, the horizon and the answer; a Reader replays the record while
// its caller's calls are the ones recorded (same step, same horizon, and the
// same time if the predictor's answers depend on time), and computes only
// the calls nobody made before. A caller that asks something else (a step
// another run skipped, another horizon) forks: it gets a predictor of its
// own, fed the calls it made so far from the record, and goes on alone. So
// every reader gets exactly the answers its own predictor would have given.
// Readers expose answers only: a predictor's own figures (ns_per_op) are the
// first reader's, not each run's. Single-threaded: the readers of one log
// must not run concurrently.
class WindowLog {
 public:
  // `predictor`: a make_predictor() name. The log keeps its own TraceFeed;
  // `t` must outlive it.
  WindowLog(const trace::Trace& t, std::string predictor);
  WindowLog(const WindowLog&) = delete;
  WindowLog& operator=(const WindowLog&) = delete;

  const TraceFeed& feed() const { return feed_; }
  const std::string& predictor() const { return name_; }
  // Predictor calls computed (not replayed) so far, by the log and by forks.
  std::uint64_t computed() const { return computed_; }

  struct Delta {
    std::span<const Predicted> entered;
    std::span<const std::uint32_t> left;
  };

  class Reader {
   public:
    explicit Reader(std::shared_ptr<WindowLog> log) : log_(std::move(log)) {}
    // Feeds step `step` (each event stamped `now_ns`), then step_done(), and
    // returns predict_window_delta(horizon): what a predictor of this
    // reader's own would answer. Valid until the next call on any reader.
    Delta step(std::size_t step, std::uint32_t horizon, std::uint64_t now_ns);
    bool forked() const { return own_ != nullptr; }

   private:
    std::shared_ptr<WindowLog> log_;
    std::size_t next_ = 0;            // this reader's next call's index in the record
    std::unique_ptr<Predictor> own_;  // after a fork
    std::vector<Predicted> entered_;
    std::vector<std::uint32_t> left_;
  };

 private:
  struct Call {
    std::size_t step;
    std::uint32_t horizon;
    std::uint64_t now_ns;
    std::size_t entered_end, left_end;  // the answer: [previous call's end, end)
  };
  void run(Predictor& p, const Call& c, std::vector<Predicted>& entered,
           std::vector<std::uint32_t>& left);
  Delta answer(std::size_t i) const;

  TraceFeed feed_;
  std::string name_;
  std::unique_ptr<Predictor> pred_;
  bool timed_;  // the predictor's answers depend on event times
  std::vector<Call> calls_;
  std::vector<Predicted> entered_;
  std::vector<std::uint32_t> left_;
  std::vector<Predicted> scratch_entered_;
  std::vector<std::uint32_t> scratch_left_;
  std::uint64_t computed_ = 0;
};

}  // namespace u3m::predict
