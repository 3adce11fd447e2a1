// The schedule bound (include/u3m/predict/bound.hpp, docs/prediction.md).
//
// Note [Schedule bound]
// What is withheld. A program whose schedule is a sequence of items (a
// training step, a request: prefill and its decode steps), each item's job
// drawn at random, e.g. by a coin flip or a shuffle, reveals an item's job
// only when the item's first op runs. Nothing a predictor observes before that
// (accesses, op names, sizes, times) depends on the draw.
//
// The genie G knows, at decision k (before step k): every event before k; the
// contents of every item of every job, in each job's order (so where the
// current item ends, and which tensors the next item of each job touches); and
// the composition, how many items of each job the trace holds. Not the order.
// Two assumptions, stated per trace where the bound is applied:
//  (E) the order of the items is exchangeable: given the composition, every
//      arrangement is equally likely (true of i.i.d. draws and of a shuffle);
//  (C) an item's contents do not depend on where it runs: a job's r-th item
//      touches the same tensors whatever ran before it (the importer and the
//      recorder name tensors by job, role and op, not by time).
// Under (E), given G's knowledge, the jobs of the next items are draws without
// replacement from what is left of the composition. Enumerating those draws
// until H steps are covered gives every possible window [k, k+H) with its
// probability, hence q_k(t) = P(t read or written in [k, k+H) | G_k) for every
// tensor t seen before k (a tensor not yet seen cannot be named; the oracle's
// ceiling already removes those).
//
// Why no causal predictor beats it. A causal predictor's answer P_k depends on
// the events before k (and its own coins), which G_k contains, so given G_k its
// expected hit bytes at k are sum_{t in P_k} b_t q_k(t), and the expected known
// accessed bytes are sum_t b_t q_k(t), the same for every predictor. Summed
// over the scored decisions: any set of choices x_{k,t} in [0,1] with
// predicted mass M = sum b x has expected hits h <= F(M), where F is the
// greedy frontier (the (k,t) pairs in decreasing q, a fractional knapsack),
// concave, with F(M)/M non-increasing. An expected precision h/M >= pi then
// needs F(M) >= pi M, i.e. M <= M*(pi), so h <= F(M*(pi)): the expected
// recall over known tensors is at most R*(pi) = F(M*(pi)) / sum b q. Likewise
// the expected precision at an expected recall >= rho is at most P*(rho).
// Randomised predictors are covered (x fractional). If R*(0.97) < 0.95 no
// causal predictor meets the bar in expectation: the bound rules it out.
//
// What it does not say. It bounds expected figures, given at each decision
// what that decision could know. The figures scored on one trace also hold
// the luck of that trace's draws (a zero-mean sum over the decisions), so a
// predictor that bets on "the same job again" scores above R* on a trace
// where the job did repeat, and below it elsewhere. ExpectedScore reports
// every predictor's expected figures with the same q, so predictors are
// compared with the bound without that luck. Giving G the contents and the
// composition only makes the bound higher (looser for the predictor, never in
// its favour).
//
// Cost: per decision, the orders of the items starting inside the window
// (2^depth with two jobs) times the window's steps; a decision with more than
// max_paths orders makes the bound "not computed" rather than approximate.
#include "u3m/predict/bound.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include <nlohmann/json.hpp>

#include "predictors_impl.hpp"

namespace u3m::predict {

std::vector<bool> warmup_decisions(const TraceFeed& feed, std::uint32_t warmup_iterations) {
  const std::size_t n = feed.num_steps();
  std::vector<bool> warm(n, false);
  struct Seen {
    bool started = false;
    std::uint32_t iteration = 0, count = 0;
  };
  std::vector<Seen> jobs(feed.trace().jobs.size() + 1);
  std::size_t prev = SIZE_MAX;  // the job of step k-1
  for (std::size_t k = 0; k < n; ++k) {
    warm[k] = warmup_iterations > 0 && (prev == SIZE_MAX || jobs[prev].count <= warmup_iterations);
    const trace::Op& op = feed.step_op(k);
    if (op.job >= jobs.size()) jobs.resize(op.job + 1);
    Seen& j = jobs[op.job];
    if (!j.started || op.iteration != j.iteration) {
      j.started = true;
      j.iteration = op.iteration;
      ++j.count;
    }
    prev = op.job;
  }
  return warm;
}

ScheduleItems schedule_items(const TraceFeed& feed) {
  ScheduleItems s;
  const std::size_t n = feed.num_steps();
  // Item starts, then fragments: a job's iteration that another job's item
  // interrupts (a capture that files a request's batch drawing under the
  // training job) resumes after it; the piece before the interruption is the
  // beginning of the item that follows it, not an item of its own.
  std::vector<ScheduleItems::Item> raw;
  for (std::size_t k = 0; k < n; ++k) {
    const trace::Op& op = feed.step_op(k);
    bool begins = k == 0;
    if (!begins) {
      const trace::Op& prev = feed.step_op(k - 1);
      begins = op.job != prev.job ||
               (op.iteration != prev.iteration && op.phase != trace::Phase::decode);
    }
    if (begins) {
      if (!raw.empty()) raw.back().end = k;
      raw.push_back({op.job, k, k});
    }
  }
  if (!raw.empty()) raw.back().end = n;
  std::vector<bool> fragment(raw.size(), false);
  std::vector<std::size_t> last_of_job;  // per job, its latest item, SIZE_MAX if none
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const std::uint32_t j = raw[i].job;
    if (j >= last_of_job.size()) last_of_job.resize(j + 1, SIZE_MAX);
    const std::size_t f = last_of_job[j];
    const std::uint32_t it = feed.step_op(raw[i].begin).iteration;
    if (f != SIZE_MAX && f + 1 < i && feed.step_op(raw[f].begin).iteration == it &&
        feed.step_op(raw[f].end - 1).iteration == it)
      fragment[f] = true;
    last_of_job[j] = i;
  }
  std::uint64_t carry = UINT64_MAX;  // the begin of a fragment waiting for its item
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (fragment[i]) {
      carry = std::min(carry, raw[i].begin);
      continue;
    }
    ScheduleItems::Item it = raw[i];
    if (carry != UINT64_MAX) it.begin = carry, carry = UINT64_MAX;
    s.items.push_back(it);
  }
  s.item_of_step.resize(n);
  s.of_job.resize(feed.trace().jobs.size());
  for (std::size_t i = 0; i < s.items.size(); ++i) {
    const ScheduleItems::Item& it = s.items[i];
    if (it.job >= s.of_job.size()) s.of_job.resize(it.job + 1);
    s.of_job[it.job].push_back(static_cast<std::uint32_t>(i));
    for (std::uint64_t k = it.begin; k < it.end; ++k)
      s.item_of_step[k] = static_cast<std::uint32_t>(i);
  }
  return s;
}

ExchangeableSchedule::ExchangeableSchedule(const TraceFeed& feed, std::uint32_t horizon,
                                           std::size_t max_paths)
    : feed_(&feed), horizon_(horizon), max_paths_(max_paths), items_(schedule_items(feed)) {
  StepTensors st = build_step_tensors(feed);
  st_begin_ = std::move(st.begin);
  st_tensors_ = std::move(st.tensors);
  const trace::Trace& tr = feed.trace();
  first_event_.assign(tr.tensors.size(), UINT64_MAX);
  for (std::size_t s = 0; s < feed.num_steps(); ++s)
    for (std::size_t i = feed.step_begin(s); i < feed.step_begin(s + 1); ++i)
      first_event_[tr.events[i].tensor] = std::min<std::uint64_t>(first_event_[tr.events[i].tensor], s);
  started_.assign(items_.of_job.size(), 0);
  q_.assign(tr.tensors.size(), 0);
  stamp_.assign(tr.tensors.size(), 0);
}

bool ExchangeableSchedule::window(std::size_t k, std::vector<std::pair<std::uint32_t, double>>& out,
                                  std::size_t* paths) {
  out.clear();
  const std::size_t n = feed_->num_steps();
  if (paths) *paths = 0;
  if (k >= n || horizon_ == 0) return true;
  // Items begun before step k (decisions come in increasing k).
  std::fill(started_.begin(), started_.end(), 0);
  const std::uint32_t last = k > 0 ? items_.item_of_step[k - 1] : UINT32_MAX;
  if (last != UINT32_MAX)
    for (std::size_t j = 0; j < items_.of_job.size(); ++j) {
      const auto& v = items_.of_job[j];
      started_[j] = static_cast<std::uint32_t>(std::upper_bound(v.begin(), v.end(), last) - v.begin());
    }
  const std::uint64_t limit = std::min<std::uint64_t>(horizon_, n - k);
  // The rest of the current item is known to G.
  std::uint64_t rest_end = k;
  if (last != UINT32_MAX && items_.item_of_step[k] == last)
    rest_end = std::min<std::uint64_t>(items_.items[last].end, k + limit);
  std::vector<std::uint32_t> rem(items_.of_job.size()), nxt(started_);
  for (std::size_t j = 0; j < rem.size(); ++j)
    rem[j] = static_cast<std::uint32_t>(items_.of_job[j].size()) - started_[j];
  std::vector<std::pair<std::uint64_t, std::uint64_t>> segs{{k, rest_end}};
  std::size_t leaves = 0;
  touched_.clear();
  bool ok = true;
  std::function<void(std::uint64_t, double)> dfs = [&](std::uint64_t filled, double prob) {
    if (!ok) return;
    if (filled >= limit) {
      if (++leaves > max_paths_) {
        ok = false;
        return;
      }
      ++leaf_;
      for (const auto& [b, e] : segs)
        for (std::uint64_t s = b; s < e; ++s)
          for (std::size_t i = st_begin_[s]; i < st_begin_[s + 1]; ++i) {
            const std::uint32_t t = st_tensors_[i];
            if (first_event_[t] >= k || stamp_[t] == leaf_) continue;
            stamp_[t] = leaf_;
            if (q_[t] == 0) touched_.push_back(t);
            q_[t] += prob;
          }
      return;
    }
    std::uint64_t total = 0;
    for (std::uint32_t r : rem) total += r;
    if (total == 0) {  // cannot happen when items cover the trace; stop the window
      dfs(limit, prob);
      return;
    }
    for (std::size_t j = 0; j < rem.size(); ++j) {
      if (rem[j] == 0) continue;
      const ScheduleItems::Item& it = items_.items[items_.of_job[j][nxt[j]]];
      const std::uint64_t take = std::min<std::uint64_t>(it.end - it.begin, limit - filled);
      segs.push_back({it.begin, it.begin + take});
      const double p = prob * double(rem[j]) / double(total);
      --rem[j];
      ++nxt[j];
      dfs(filled + take, p);
      ++rem[j];
      --nxt[j];
      segs.pop_back();
    }
  };
  dfs(rest_end - k, 1.0);
  for (std::uint32_t t : touched_) {
    if (ok) out.emplace_back(t, std::min(1.0, q_[t]));
    q_[t] = 0;
  }
  if (paths) *paths = leaves;
  if (!ok) out.clear();
  return ok;
}

ScheduleBound schedule_bound(const TraceFeed& feed, const ScheduleBoundOptions& opt) {
  ScheduleBound b;
  b.precision_bar = opt.precision_bar;
  b.recall_bar = opt.recall_bar;
  ExchangeableSchedule sched(feed, opt.horizon, opt.max_paths);
  const trace::Trace& tr = feed.trace();
  b.items = sched.items().items.size();
  for (std::size_t j = 0; j < sched.items().of_job.size(); ++j)
    b.composition.emplace_back(j < tr.jobs.size() ? tr.jobs[j] : "job " + std::to_string(j),
                               sched.items().of_job[j].size());
  const std::vector<bool> warm = warmup_decisions(feed, opt.warmup_iterations);
  constexpr double kSure = 1 - 1e-9;
  double sure = 0;                                  // mass with q = 1: hits at precision 1
  std::vector<std::pair<double, double>> unsure;  // (q, bytes), q < 1
  std::vector<std::pair<std::uint32_t, double>> w;
  for (std::size_t k = 0; k < feed.num_steps(); ++k) {
    if (warm[k]) continue;
    std::size_t paths = 0;
    if (!sched.window(k, w, &paths)) {
      b.why_not = "decision " + std::to_string(k) + " has more than " +
                  std::to_string(opt.max_paths) + " possible orders of the next items";
      return b;
    }
    ++b.decisions;
    b.uncertain_decisions += paths > 1;
    for (const auto& [t, q] : w) {
      const double bytes = double(tr.tensors[t].bytes);
      b.known_bytes += bytes * q;
      if (q >= kSure) {
        sure += bytes;
      } else {
        b.uncertain_bytes += bytes * q;
        unsure.emplace_back(q, bytes);
      }
    }
  }
  if (!(b.known_bytes > 0)) {
    b.why_not = "no known tensor is read or written after the warm-up";
    return b;
  }
  std::sort(unsure.begin(), unsure.end(), std::greater<>());
  // R*(pi): the greedy frontier until its precision falls to pi.
  {
    const double pi = opt.precision_bar;
    double h = sure, m = sure;
    for (const auto& [q, bytes] : unsure) {
      if (h + bytes * q >= pi * (m + bytes)) {
        h += bytes * q;
        m += bytes;
        continue;
      }
      if (q < pi && h >= pi * m) h += q * (h - pi * m) / (pi - q);  // the fraction that fits
      b.threshold = q;
      break;
    }
    b.recall_known_at_bar = h / b.known_bytes;
  }
  // P*(rho): the greedy frontier until its expected recall reaches rho.
  {
    const double need = opt.recall_bar * b.known_bytes;
    double h = sure, m = sure;
    for (const auto& [q, bytes] : unsure) {
      if (h >= need) break;
      if (h + bytes * q >= need) {
        m += (need - h) / q;
        h = need;
        break;
      }
      h += bytes * q;
      m += bytes;
    }
    b.precision_at_bar = m > 0 && h >= need * kSure ? h / m : 0;
  }
  b.computed = true;
  return b;
}

nlohmann::json to_json(const ScheduleBound& b) {
  nlohmann::json comp = nlohmann::json::object();
  for (const auto& [job, n] : b.composition) comp[job] = n;
  nlohmann::json j = {{"computed", b.computed},
                      {"assumption",
                       "the order of the schedule items is exchangeable and an item's contents do "
                       "not depend on where it runs (docs/prediction.md, \"The schedule bound\")"},
                      {"items", b.items},
                      {"composition", comp},
                      {"decisions", b.decisions},
                      {"uncertain_decisions", b.uncertain_decisions}};
  if (!b.computed) {
    j["why_not"] = b.why_not;
    return j;
  }
  j["uncertain_share"] = b.uncertain_bytes / b.known_bytes;
  j["precision_bar"] = b.precision_bar;
  j["recall_bar"] = b.recall_bar;
  j["recall_known_at_precision_bar"] = b.recall_known_at_bar;
  j["precision_at_recall_bar"] = b.precision_at_bar;
  j["threshold_q"] = b.threshold;
  j["rules_out_bar"] = b.rules_out_bar();
  return j;
}

ExpectedScore::ExpectedScore(const TraceFeed& feed, std::uint32_t horizon,
                             std::uint32_t warmup_iterations, std::size_t max_paths)
    : sched_(feed, horizon, max_paths),
      warm_(warmup_decisions(feed, warmup_iterations)),
      horizon_(horizon),
      n_(feed.num_steps()),
      qt_(feed.trace().tensors.size(), 0),
      qstamp_(feed.trace().tensors.size(), 0),
      pstamp_(feed.trace().tensors.size(), 0) {
  for (const trace::Tensor& t : feed.trace().tensors) bytes_.push_back(double(t.bytes));
}

void ExpectedScore::on_decision(std::size_t k, const std::vector<Predicted>& out) {
  if (!ok_ || k >= n_ || warm_[k]) return;
  if (!sched_.window(k, q_)) {
    ok_ = false;
    return;
  }
  const std::uint64_t mark = k + 1;
  for (const auto& [t, q] : q_) {
    qt_[t] = q;
    qstamp_[t] = mark;
    act_ += q * bytes_[t];
  }
  for (const Predicted& p : out) {  // scored as the evaluator scores it
    if (p.tensor >= qt_.size() || pstamp_[p.tensor] == mark) continue;
    pstamp_[p.tensor] = mark;
    if (p.ops_ahead >= horizon_ || k + p.ops_ahead >= n_) continue;
    pred_ += bytes_[p.tensor];
    if (qstamp_[p.tensor] == mark) hit_ += bytes_[p.tensor] * qt_[p.tensor];
  }
}

double ExpectedScore::precision() const {
  return pred_ > 0 ? hit_ / pred_ : std::nan("");
}
double ExpectedScore::recall_known() const {
  return act_ > 0 ? hit_ / act_ : std::nan("");
}

}  // namespace u3m::predict
