// The schedule bound: what no causal predictor can know when the order of a
// trace's schedule items is random (docs/prediction.md, "The schedule bound";
// Note [Schedule bound] in src/predict/bound.cpp).
//
// The oracle's ceiling only removes first touches: it knows the schedule. When
// each schedule item (a training step, a request) is a random draw, which job
// runs next is not in the past events, and every decision whose horizon
// reaches past the end of the current item bets on it. The bound gives an
// idealised predictor (the "genie") everything but that draw: the past, the
// contents of every future item of every job, and how many items of each job
// the trace holds. It enumerates the possible orders of the next items (an
// exchangeable schedule makes them draws without replacement from what is
// left), so it knows q_k(t), the probability that tensor t is read or written
// in [k, k+H) given all it knows. Every causal predictor knows less, so its
// expected hits at decision k are sum over its predicted t of bytes * q_k(t),
// and the genie's best trade of predicted bytes for expected hits (tensors in
// decreasing q, one threshold over the whole trace) bounds them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "u3m/predict/predictor.hpp"

namespace u3m::predict {

// Decision points excluded as warm-up (docs/prediction.md, "Metrics"): before
// step k, the job of step k-1 has begun at most `warmup_iterations`
// iterations; decision 0 always. One implementation for the evaluator and the
// bound, so both score the same decisions.
std::vector<bool> warmup_decisions(const TraceFeed& feed, std::uint32_t warmup_iterations);

// A trace cut into schedule items: an item begins at step 0, at a change of
// job, and at a new iteration of its job unless that iteration's first op is a
// decode step (a request's decode steps continue its prefill).
struct ScheduleItems {
  struct Item {
    std::uint32_t job = 0;
    std::uint64_t begin = 0, end = 0;  // op steps [begin, end)
  };
  std::vector<Item> items;
  std::vector<std::uint32_t> item_of_step;
  std::vector<std::vector<std::uint32_t>> of_job;  // item indices per job, in order
};
ScheduleItems schedule_items(const TraceFeed& feed);

// q_k(t) for the genie, decision by decision (Note [Schedule bound]).
class ExchangeableSchedule {
 public:
  // `max_paths`: orders of the next items enumerated per decision at most; a
  // decision that needs more makes window() return false.
  ExchangeableSchedule(const TraceFeed& feed, std::uint32_t horizon,
                       std::size_t max_paths = 1u << 14);
  // Decision k (before step k), called with k = 0, 1, 2, ... in order.
  // Replaces `out` with (tensor, q) for each tensor already seen before step k
  // that some possible order reads or writes in [k, k+H), q > 0. `paths`: the
  // orders enumerated (1 = the window lies inside the current item or the
  // rest is forced).
  bool window(std::size_t k, std::vector<std::pair<std::uint32_t, double>>& out,
              std::size_t* paths = nullptr);
  const ScheduleItems& items() const { return items_; }

 private:
  const TraceFeed* feed_;
  std::uint32_t horizon_;
  std::size_t max_paths_;
  ScheduleItems items_;
  std::vector<std::size_t> st_begin_;
  std::vector<std::uint32_t> st_tensors_;
  std::vector<std::uint64_t> first_event_;
  std::vector<std::uint32_t> started_;  // items of each job begun before the decision
  std::vector<double> q_;
  std::vector<std::uint64_t> stamp_;
  std::vector<std::uint32_t> touched_;
  std::uint64_t leaf_ = 0;
};

struct ScheduleBoundOptions {
  std::uint32_t horizon = 64;
  std::uint32_t warmup_iterations = 1;
  double precision_bar = 0.97;  // the bar
  double recall_bar = 0.95;     // over known tensors
  std::size_t max_paths = 1u << 14;
};

struct ScheduleBound {
  bool computed = false;
  std::string why_not;  // when !computed
  std::uint64_t items = 0, decisions = 0;
  std::uint64_t uncertain_decisions = 0;  // decisions with more than one possible order
  std::vector<std::pair<std::string, std::uint64_t>> composition;  // items per job
  double known_bytes = 0;      // sum_k sum_t bytes*q: expected bytes(A_known)
  double uncertain_bytes = 0;  // the part with q < 1
  // The most expected recall over known tensors any causal predictor reaches
  // with expected precision >= precision_bar, and the most expected precision
  // with expected recall over known >= recall_bar.
  double recall_known_at_bar = 0, precision_at_bar = 0;
  double precision_bar = 0, recall_bar = 0;
  // The q at which the frontier reaches precision_bar: the genie predicts a
  // tensor when its probability of access within H is above it (0: all).
  double threshold = 0;
  bool rules_out_bar() const { return computed && recall_known_at_bar < recall_bar; }
};

// The bound on `feed` at one horizon, over the decisions the evaluator scores.
ScheduleBound schedule_bound(const TraceFeed& feed, const ScheduleBoundOptions& opt = {});
nlohmann::json to_json(const ScheduleBound& b);

// A predictor's expected figures under the same q (what its precision and
// recall over known tensors are worth once the luck of the draws is taken
// out): feed it every decision's answer, as EvalOptions::on_decision does.
class ExpectedScore {
 public:
  ExpectedScore(const TraceFeed& feed, std::uint32_t horizon, std::uint32_t warmup_iterations,
                std::size_t max_paths = 1u << 14);
  void on_decision(std::size_t k, const std::vector<Predicted>& out);
  bool computed() const { return ok_; }
  double precision() const;
  double recall_known() const;

 private:
  ExchangeableSchedule sched_;
  std::vector<bool> warm_;
  std::uint32_t horizon_;
  std::size_t n_;
  std::vector<std::pair<std::uint32_t, double>> q_;
  std::vector<double> qt_;
  std::vector<std::uint64_t> qstamp_, pstamp_;
  std::vector<double> bytes_;
  double pred_ = 0, hit_ = 0, act_ = 0;
  bool ok_ = true;
};

}  // namespace u3m::predict
