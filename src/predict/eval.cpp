// The evaluator; definitions in docs/prediction.md ("Metrics").
//
// Note [Evaluator cost]
// Traces have millions of events, so nothing here is quadratic:
// - Σ|A| over a horizon [k, k+H) comes from Fenwick trees indexed by step,
//   where each tensor contributes (bytes, 1) at its next access step: moving a
//   tensor's contribution when it is accessed is O(log steps) per event.
// - Membership of a predicted tensor in A is O(1): its next access step is
//   known (the evaluator, unlike the predictors, reads the future).
// - The predictor is asked once per decision with the largest horizon; the
//   smaller horizons' sets are the entries with ops_ahead below them.
// Total: O(events log steps + Σ|P|).
//
// Note [No future in the query]
// Everything the predictor is given at decision point k (the events, and
// the horizon it is asked for) depends only on steps before k. The evaluator
// reads the future for one thing only: the actual sets A. So the context of
// a decision (which job is "running", its warm-up, its one-iteration
// horizon) is that of step k-1, the last one that happened, never of step k:
// taking the horizon from the upcoming op would tell the predictor, through
// the size of the question, that step k starts a new iteration or belongs to
// another job. A job's iteration span is known once the first op of its next
// iteration has been observed. tests/predict/test_eval.cpp (QueryIgnoresTheFuture)
// checks this with a spy predictor on two traces that differ only from step k.
#include "u3m/predict/eval.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "predictors_impl.hpp"
#include "u3m/predict/bound.hpp"

namespace u3m::predict {
namespace {

constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

class Fenwick {
 public:
  explicit Fenwick(std::size_t n) : t_(n + 1, 0) {}
  void add(std::size_t i, std::int64_t v) {
    for (++i; i < t_.size(); i += i & -i) t_[i] += v;
  }
  std::int64_t prefix(std::size_t end) const {  // sum of [0, end)
    std::int64_t s = 0;
    for (std::size_t i = std::min(end, t_.size() - 1); i > 0; i -= i & -i) s += t_[i];
    return s;
  }
  std::int64_t range(std::size_t b, std::size_t e) const { return prefix(e) - prefix(b); }

 private:
  std::vector<std::int64_t> t_;
};

double ratio(double a, double b) {
  return b > 0 ? a / b : std::nan("");
}

}  // namespace

void HorizonSums::add(const HorizonSums& o) {
  pred_bytes += o.pred_bytes;
  pred_count += o.pred_count;
  hit_bytes += o.hit_bytes;
  hit_count += o.hit_count;
  hitk_bytes += o.hitk_bytes;
  hitk_count += o.hitk_count;
  act_bytes += o.act_bytes;
  act_count += o.act_count;
  actk_bytes += o.actk_bytes;
  actk_count += o.actk_count;
  decisions += o.decisions;
}

double HorizonMetrics::precision() const {
  return ratio(sums.hit_bytes, sums.pred_bytes);
}
double HorizonMetrics::recall() const {
  return ratio(sums.hit_bytes, sums.act_bytes);
}
double HorizonMetrics::recall_known() const {
  return ratio(sums.hitk_bytes, sums.actk_bytes);
}
double HorizonMetrics::recall_ceiling() const {
  return ratio(sums.actk_bytes, sums.act_bytes);
}
double HorizonMetrics::precision_count() const {
  return ratio(sums.hit_count, sums.pred_count);
}
double HorizonMetrics::recall_count() const {
  return ratio(sums.hit_count, sums.act_count);
}
double HorizonMetrics::recall_known_count() const {
  return ratio(sums.hitk_count, sums.actk_count);
}
double HorizonMetrics::recall_ceiling_count() const {
  return ratio(sums.actk_count, sums.act_count);
}

double f1(double p, double r) {
  if (!(p > 0) || !(r > 0)) return 0;
  return 2 * p * r / (p + r);
}

EvalResult evaluate(const TraceFeed& feed, Predictor& pred, const EvalOptions& opt) {
  using Clock = std::chrono::steady_clock;
  const trace::Trace& tr = feed.trace();
  const std::size_t n = feed.num_steps();
  const std::size_t nt = tr.tensors.size();
  StepTensors st = build_step_tensors(feed);

  // Each tensor's access steps, in order (CSR), and the step of its first event.
  std::vector<std::size_t> acc_begin(nt + 1, 0);
  for (std::uint32_t t : st.tensors) ++acc_begin[t + 1];
  for (std::size_t i = 0; i < nt; ++i) acc_begin[i + 1] += acc_begin[i];
  std::vector<std::uint64_t> acc_steps(st.tensors.size());
  {
    std::vector<std::size_t> fill(acc_begin.begin(), acc_begin.end() - 1);
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t k = st.begin[s]; k < st.begin[s + 1]; ++k)
        acc_steps[fill[st.tensors[k]]++] = s;
  }
  std::vector<std::uint64_t> first_event(nt, kNever);
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t i = feed.step_begin(s); i < feed.step_begin(s + 1); ++i) {
      std::uint32_t t = tr.events[i].tensor;
      if (first_event[t] == kNever) first_event[t] = s;
    }
  std::vector<std::size_t> cursor(acc_begin.begin(), acc_begin.end() - 1);
  auto next_access = [&](std::uint32_t t) {
    return cursor[t] < acc_begin[t + 1] ? acc_steps[cursor[t]] : kNever;
  };

  Fenwick all_b(n), all_c(n), known_b(n), known_c(n);
  for (std::uint32_t t = 0; t < nt; ++t)
    if (acc_begin[t] < acc_begin[t + 1]) {
      all_b.add(acc_steps[acc_begin[t]], static_cast<std::int64_t>(tr.tensors[t].bytes));
      all_c.add(acc_steps[acc_begin[t]], 1);
    }

  EvalResult res;
  res.predictor = std::string(pred.name());
  res.events = feed.num_events();
  res.steps = n;
  std::vector<std::uint32_t> hs = opt.horizons;
  std::sort(hs.begin(), hs.end());
  hs.erase(std::unique(hs.begin(), hs.end()), hs.end());
  const std::size_t nfix = hs.size();
  for (std::uint32_t h : hs) res.horizons.push_back({std::to_string(h), {}, {}});
  if (opt.iteration_horizon) res.horizons.push_back({"iteration", {}, {}});
  std::uint32_t max_fixed = hs.empty() ? 0 : hs.back();
  res.iteration_stride = opt.iteration_stride
                             ? opt.iteration_stride
                             : static_cast<std::uint32_t>(std::max<std::size_t>(1, n / 20000));

  // Per job, from the steps already observed: the span, in global steps, of
  // its last complete iteration (the "one iteration" horizon); the warm-up
  // comes from the same past (warmup_decisions). Note [No future in the query].
  struct JobTrack {
    bool started = false;
    std::uint32_t iteration = 0;
    std::uint64_t first = 0, last = 0, span = 0;
  };
  const std::vector<bool> warmup = warmup_decisions(feed, opt.warmup_iterations);
  std::vector<JobTrack> jobs(tr.jobs.size() + 1);
  std::size_t prev_job = SIZE_MAX;  // the job of step k-1 (an index: jobs may grow)

  std::vector<Predicted> out, entered;
  std::vector<std::uint32_t> left;
  constexpr std::uint32_t kNone = UINT32_MAX;
  std::vector<std::uint32_t> win, win_pos(nt, kNone);  // window_delta: the held set
  std::vector<std::uint64_t> win_at(nt, 0);            // its predicted step at entry
  std::vector<Access> step_events;
  std::vector<std::size_t> seen_stamp(nt, kNever);  // dedups P per decision
  std::vector<bool> known_added(nt, false);
  std::vector<HorizonSums> cur(res.horizons.size());
  double ns = 0;
  // Slices at the largest fixed horizon (Note [No future in the query]: the
  // job of a decision is that of the step before it).
  const std::size_t slice_h = nfix > 0 ? nfix - 1 : SIZE_MAX;
  res.slice_horizon = nfix > 0 ? res.horizons[nfix - 1].horizon : std::string();
  res.switch_ops = opt.switch_ops;
  res.after_switch.name = "after switches";
  for (const std::string& j : tr.jobs) res.per_job.push_back({j, {}});
  std::size_t since_switch = SIZE_MAX;  // steps since the last switch, as of step k-1

  for (std::size_t k = 0; k < n; ++k) {
    const JobTrack* current = prev_job == SIZE_MAX ? nullptr : &jobs[prev_job];
    const bool warm = warmup[k];
    const bool do_iter = opt.iteration_horizon && k % res.iteration_stride == 0;
    std::uint32_t h_iter = 0;
    if (do_iter) {
      h_iter = current && current->span ? static_cast<std::uint32_t>(current->span)
                                        : opt.fallback_horizon;
      if (!current || !current->span) ++res.iteration_fallback_decisions;
    }
    const std::uint32_t ask = std::max(max_fixed, h_iter);

    // Decision point before step k.
    auto t0 = Clock::now();
    if (opt.window_delta)
      pred.predict_window_delta(opt.window_delta, entered, left);
    else
      pred.predict(ask, out);
    auto t1 = Clock::now();
    ns += std::chrono::duration<double, std::nano>(t1 - t0).count();
    if (opt.window_delta) {  // the policy's window, kept from the deltas
      for (std::uint32_t t : left)
        if (t < nt && win_pos[t] != kNone) {
          win_pos[win.back()] = win_pos[t];
          win[win_pos[t]] = win.back();
          win.pop_back();
          win_pos[t] = kNone;
        }
      for (const Predicted& p : entered)
        if (p.tensor < nt) {
          if (win_pos[p.tensor] == kNone) {
            win_pos[p.tensor] = static_cast<std::uint32_t>(win.size());
            win.push_back(p.tensor);
          }
          win_at[p.tensor] = k + p.ops_ahead;
        }
      out.clear();
      for (std::uint32_t t : win)
        out.push_back({t, static_cast<std::uint32_t>(std::min<std::uint64_t>(
                              win_at[t] > k ? win_at[t] - k : 0, opt.window_delta - 1))});
    }
    if (opt.on_decision) opt.on_decision(k, out, warm);

    for (auto& c : cur) c = HorizonSums{};
    auto score = [&](std::size_t hi, std::uint32_t h) {
      HorizonSums& c = cur[hi];
      c.decisions = 1;
      std::size_t end = std::min<std::size_t>(n, k + h);
      c.act_bytes = double(all_b.range(k, end));
      c.act_count = double(all_c.range(k, end));
      c.actk_bytes = double(known_b.range(k, end));
      c.actk_count = double(known_c.range(k, end));
    };
    for (std::size_t hi = 0; hi < nfix; ++hi) score(hi, hs[hi]);
    if (do_iter) score(nfix, h_iter);
    for (const Predicted& p : out) {
      if (p.tensor >= nt || seen_stamp[p.tensor] == k) continue;  // duplicate or bogus
      seen_stamp[p.tensor] = k;
      const double b = double(tr.tensors[p.tensor].bytes);
      const std::uint64_t nx = next_access(p.tensor);
      const bool known = first_event[p.tensor] < k;
      // A prediction for a step past the end of the trace can be neither
      // confirmed nor refuted: it is left out (docs/prediction.md).
      if (k + p.ops_ahead >= n) continue;
      auto count = [&](HorizonSums& c, std::uint32_t h) {
        if (p.ops_ahead >= h) return;
        c.pred_bytes += b;
        c.pred_count += 1;
        if (nx < k + h) {
          c.hit_bytes += b;
          c.hit_count += 1;
          if (known) {
            c.hitk_bytes += b;
            c.hitk_count += 1;
          }
        }
      };
      for (std::size_t hi = 0; hi < nfix; ++hi) count(cur[hi], hs[hi]);
      if (do_iter) count(cur[nfix], h_iter);
    }
    for (std::size_t hi = 0; hi < res.horizons.size(); ++hi) {
      if (hi == nfix && !do_iter) continue;
      res.horizons[hi].with_warmup.add(cur[hi]);
      if (!warm) res.horizons[hi].sums.add(cur[hi]);
    }
    if (!warm && slice_h != SIZE_MAX && prev_job != SIZE_MAX) {
      if (prev_job >= res.per_job.size()) res.per_job.resize(prev_job + 1);
      res.per_job[prev_job].sums.add(cur[slice_h]);
      if (since_switch < opt.switch_ops) res.after_switch.sums.add(cur[slice_h]);
    }

    // Step k happens.
    const std::size_t eb = feed.step_begin(k), ee = feed.step_begin(k + 1);
    if (warm) {
      ++res.warmup_steps;
      res.warmup_events += ee - eb;
    }
    step_events.clear();
    for (std::size_t i = eb; i < ee; ++i) step_events.push_back(feed.access_at(i, k));
    t0 = Clock::now();
    for (const Access& a : step_events) pred.observe(a);
    pred.step_done();
    t1 = Clock::now();
    ns += std::chrono::duration<double, std::nano>(t1 - t0).count();

    // Move each accessed tensor's contribution to its next access; tensors
    // first seen in this step start counting as known.
    for (std::size_t j = st.begin[k]; j < st.begin[k + 1]; ++j) {
      std::uint32_t t = st.tensors[j];
      ++cursor[t];
      std::uint64_t nx = next_access(t);
      if (nx == kNever) continue;
      auto b = static_cast<std::int64_t>(tr.tensors[t].bytes);
      all_b.add(nx, b);
      all_c.add(nx, 1);
      if (first_event[t] < k) {
        known_b.add(nx, b);
        known_c.add(nx, 1);
      }
    }
    for (std::size_t i = eb; i < ee; ++i) {
      std::uint32_t t = tr.events[i].tensor;
      if (first_event[t] != k || known_added[t]) continue;
      known_added[t] = true;
      std::uint64_t nx = next_access(t);
      if (nx == kNever) continue;
      known_b.add(nx, static_cast<std::int64_t>(tr.tensors[t].bytes));
      known_c.add(nx, 1);
    }
    // Step k is now the past: it sets the context of the next decision.
    const trace::Op& op = feed.step_op(k);
    if (op.job >= jobs.size()) jobs.resize(op.job + 1);
    JobTrack& jt = jobs[op.job];
    if (prev_job != SIZE_MAX && op.job != prev_job) {
      ++res.switches;
      since_switch = 0;
    } else if (since_switch != SIZE_MAX) {
      ++since_switch;
    }
    if (!jt.started || op.iteration != jt.iteration) {
      if (jt.started) jt.span = jt.last - jt.first + 1;
      jt.started = true;
      jt.iteration = op.iteration;
      jt.first = k;
    }
    jt.last = k;
    prev_job = op.job;
  }
  res.predictor_ns = ns;
  res.switches_detected = pred.mode_switches();
  for (std::size_t j = 0; j < res.per_job.size(); ++j)
    if (res.per_job[j].name.empty()) res.per_job[j].name = "job " + std::to_string(j);
  return res;
}

namespace {
nlohmann::json num(double v) {
  return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v);
}

nlohmann::json metrics_json(const HorizonMetrics& m) {
  const double p = m.precision(), pc = m.precision_count();
  auto with = [&](nlohmann::json& j, const char* name, double r, double rc) {
    const std::string n = name;
    j["recall" + n] = num(r);
    j["f1" + n] = f1(p, r);
    j["recall" + n + "_count"] = num(rc);
    j["f1" + n + "_count"] = f1(pc, rc);
  };
  nlohmann::json j = {{"precision", num(p)}, {"precision_count", num(pc)}};
  with(j, "", m.recall(), m.recall_count());
  with(j, "_known", m.recall_known(), m.recall_known_count());
  j["recall_ceiling"] = num(m.recall_ceiling());
  j["recall_ceiling_count"] = num(m.recall_ceiling_count());
  j["decisions"] = m.sums.decisions;
  const HorizonMetrics w{m.horizon, m.with_warmup, m.with_warmup};
  j["including_warmup"] = {
      {"precision", num(w.precision())},           {"recall", num(w.recall())},
      {"f1", f1(w.precision(), w.recall())},       {"recall_known", num(w.recall_known())},
      {"recall_ceiling", num(w.recall_ceiling())}, {"decisions", w.sums.decisions}};
  return j;
}
}  // namespace

void accumulate(EvalResult& into, const EvalResult& r) {
  if (into.horizons.empty()) {
    into = r;
    return;
  }
  if (into.horizons.size() != r.horizons.size())
    throw std::invalid_argument("accumulate: results scored at different horizons");
  for (std::size_t i = 0; i < into.horizons.size(); ++i) {
    if (into.horizons[i].horizon != r.horizons[i].horizon)
      throw std::invalid_argument("accumulate: results scored at different horizons");
    into.horizons[i].sums.add(r.horizons[i].sums);
    into.horizons[i].with_warmup.add(r.horizons[i].with_warmup);
  }
  if (into.per_job.size() < r.per_job.size()) into.per_job.resize(r.per_job.size());
  for (std::size_t j = 0; j < r.per_job.size(); ++j) {
    if (into.per_job[j].name.empty()) into.per_job[j].name = r.per_job[j].name;
    if (into.per_job[j].name != r.per_job[j].name) into.per_job[j].name = "job " + std::to_string(j);
    into.per_job[j].sums.add(r.per_job[j].sums);
  }
  into.after_switch.sums.add(r.after_switch.sums);
  into.switches += r.switches;
  if (r.switches_detected >= 0)
    into.switches_detected = std::max<std::int64_t>(into.switches_detected, 0) + r.switches_detected;
  into.events += r.events;
  into.steps += r.steps;
  into.warmup_events += r.warmup_events;
  into.warmup_steps += r.warmup_steps;
  into.iteration_fallback_decisions += r.iteration_fallback_decisions;
  into.predictor_ns += r.predictor_ns;
}

nlohmann::json to_json(const EvalResult& r, const std::string& headline) {
  nlohmann::json h = nlohmann::json::object();
  nlohmann::json out = nlohmann::json::object();
  for (const HorizonMetrics& m : r.horizons) {
    h[m.horizon] = metrics_json(m);
    if (m.horizon == headline)
      for (const char* k : {"precision", "recall", "f1", "precision_count", "recall_count",
                            "f1_count", "recall_known", "f1_known", "recall_known_count",
                            "f1_known_count", "recall_ceiling", "recall_ceiling_count"})
        out[k] = h[m.horizon][k];
  }
  out["warmup_events"] = r.warmup_events;
  out["warmup_steps"] = r.warmup_steps;
  out["events"] = r.events;
  out["steps"] = r.steps;
  out["ns_per_event"] = r.ns_per_event();
  out["ns_per_event_source"] =
      "measured: wall time of the predictor's observe/step_done/predict calls";
  auto slice_json = [&](const SliceMetrics& s) {
    const HorizonMetrics m = s.metrics();
    return nlohmann::json{{"precision", num(m.precision())},
                          {"recall", num(m.recall())},
                          {"recall_known", num(m.recall_known())},
                          {"f1_known", f1(m.precision(), m.recall_known())},
                          {"recall_ceiling", num(m.recall_ceiling())},
                          {"decisions", m.sums.decisions}};
  };
  nlohmann::json pj = nlohmann::json::object();
  for (const SliceMetrics& s : r.per_job) pj[s.name] = slice_json(s);
  out["per_job"] = pj;
  out["switches"] = {{"in_trace", r.switches},
                     {"detected_by_predictor", r.switches_detected < 0
                                                   ? nlohmann::json(nullptr)
                                                   : nlohmann::json(r.switches_detected)},
                     {"first_ops", r.switch_ops},
                     {"after", slice_json(r.after_switch)}};
  out["slice_horizon"] = r.slice_horizon;
  out["iteration_stride"] = r.iteration_stride;
  out["iteration_fallback_decisions"] = r.iteration_fallback_decisions;
  out["horizons"] = h;
  return out;
}

}  // namespace u3m::predict
