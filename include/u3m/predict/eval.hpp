// Honest evaluation of access predictors on a trace. The definitions are in
// docs/prediction.md ("Metrics"); in short, at every decision point (before
// each op step) the predicted set P is compared with the actual set A of
// tensors read or written within the next H steps, byte- and count-weighted.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "u3m/predict/predictor.hpp"

namespace u3m::predict {

struct EvalOptions {
  std::vector<std::uint32_t> horizons = {8, 64};  // in op steps
  bool iteration_horizon = true;                  // also the "one iteration" horizon
  std::uint32_t fallback_horizon = 64;            // iteration horizon before a job finished one
  // Decision points in the first `warmup_iterations` iterations of the job
  // that ran the step before them are excluded from the headline figures
  // (reported, never silent).
  std::uint32_t warmup_iterations = 1;
  // Evaluate the iteration horizon at every n-th decision point; 0 = auto
  // (1 up to 20000 steps, then steps / 20000). Reported.
  std::uint32_t iteration_stride = 0;
  // Policy view: if non-zero, the predictor is asked predict_window_delta
  // with this horizon instead of predict(), and P is the window the deltas
  // build up (what a policy holds). Score it at this horizon only.
  std::uint32_t window_delta = 0;
  // Called at every decision point k with the predictor's answer (asked for
  // the largest horizon) and whether k is in warm-up; e.g. Diagnoser.
  // (The hook, like the scoring, may read the future; the predictor's
  // arguments never do: Note [No future in the query] in eval.cpp.)
  std::function<void(std::size_t k, const std::vector<Predicted>& out, bool warm)> on_decision;
  // Around mode switches: decision points in the first `switch_ops` steps
  // after a switch (the step before them ran another job than the one before
  // it) are also summed apart, at the largest fixed horizon.
  std::uint32_t switch_ops = 64;
};

// Sums over decision points for one horizon.
struct HorizonSums {
  double pred_bytes = 0, pred_count = 0;  // Σ|P|
  double hit_bytes = 0, hit_count = 0;    // Σ|P ∩ A_all|
  double hitk_bytes = 0, hitk_count = 0;  // Σ|P ∩ A_known|
  double act_bytes = 0, act_count = 0;    // Σ|A_all|
  double actk_bytes = 0, actk_count = 0;  // Σ|A_known|
  std::uint64_t decisions = 0;
  void add(const HorizonSums& o);
};

struct HorizonMetrics {
  std::string horizon;  // "8", "64", "iteration"
  HorizonSums sums;     // after warm-up
  HorizonSums with_warmup;
  // Derived (NaN when the denominator is 0). The unqualified recall is the
  // issue's: over every access, first touches counting as misses.
  double precision() const;     // bytes(P∩A) / bytes(P)
  double recall() const;        // bytes(P∩A) / bytes(A)
  double recall_known() const;  // bytes(P∩A_known) / bytes(A_known)
  // bytes(A_known) / bytes(A): the most recall() any online predictor can
  // reach (it can only name tensors it has seen); what the oracle reaches.
  double recall_ceiling() const;
  double precision_count() const;
  double recall_count() const;
  double recall_known_count() const;
  double recall_ceiling_count() const;
};

// Sums of one slice of the decision points (a job, or the steps after switches).
struct SliceMetrics {
  std::string name;
  HorizonSums sums;  // after warm-up, at the largest fixed horizon
  HorizonMetrics metrics() const { return {"", sums, sums}; }
};

struct EvalResult {
  std::string predictor;
  std::vector<HorizonMetrics> horizons;
  // Per job (of the step before the decision), and the decisions in the first
  // EvalOptions::switch_ops steps after each switch between jobs.
  std::vector<SliceMetrics> per_job;
  SliceMetrics after_switch;
  std::uint64_t switches = 0;            // job changes between consecutive steps (the trace's)
  std::int64_t switches_detected = -1;   // the predictor's own detector; -1: it has none
  std::uint32_t switch_ops = 0;
  std::string slice_horizon;             // the horizon the slices are scored at
  std::uint64_t events = 0, steps = 0;
  // Excluded decision points (warmup_steps; each precedes one step) and the
  // events of the steps they precede.
  std::uint64_t warmup_events = 0, warmup_steps = 0;
  std::uint64_t iteration_fallback_decisions = 0;  // used fallback_horizon
  std::uint32_t iteration_stride = 1;
  double predictor_ns = 0;  // measured: wall time inside the predictor's calls
  double ns_per_event() const { return events ? predictor_ns / events : 0; }
};

// Feeds the whole trace to `p` and scores it.
EvalResult evaluate(const TraceFeed& feed, Predictor& p, const EvalOptions& opt = {});

// Pools `r` into `into` (same options): sums add, so pooled figures weight
// every decision point of every trace equally.
void accumulate(EvalResult& into, const EvalResult& r);

double f1(double precision, double recall);  // 0 if either is 0 or NaN
// {"precision", "recall", "f1", "precision_count", "recall_count",
//  "f1_count", "recall_known", "f1_known", "recall_ceiling", ...,
//  "warmup_events", "ns_per_event", ...} at `headline` (a horizon name), plus
// every horizon under "horizons".
nlohmann::json to_json(const EvalResult& r, const std::string& headline);

}  // namespace u3m::predict
