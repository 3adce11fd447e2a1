// Error breakdown for one predictor; see include/u3m/predict/diagnose.hpp and
// docs/prediction.md ("Diagnosis"). Slow on purpose (O(Σ|A|) per horizon):
// it is a tool for finding mechanisms that are wrong, not part of scoring.
#include "u3m/predict/diagnose.hpp"

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "predictors_impl.hpp"

namespace u3m::predict {
namespace {

constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

// One breakdown: a label per category and the bytes of each error kind.
struct Table {
  std::string title;
  std::vector<std::string> labels;
  std::vector<double> fp, miss, first;
  Table(std::string t, std::vector<std::string> l)
      : title(std::move(t)),
        labels(std::move(l)),
        fp(labels.size()),
        miss(labels.size()),
        first(labels.size()) {}
};

enum class Err { fp, miss, first };

enum Dim { kRole, kJob, kPhase, kClass, kToSwitch, kFromSwitch, kToIter, kOrdinal, kAhead, kNext };

}  // namespace

struct Diagnoser::Impl {
  const TraceFeed& feed;
  std::uint32_t h;
  StepTensors st;
  std::vector<std::size_t> acc_begin, cursor;
  std::vector<std::uint64_t> acc_steps, first_event;
  // Per step: distance to the next / since the previous job switch, to the
  // next iteration boundary (kNever if none), and the switch's ordinal.
  std::vector<std::uint64_t> to_switch, from_switch, to_iter;
  std::vector<std::uint32_t> ordinal;    // of the switch at step s (if any)
  std::vector<std::uint64_t> run_start;  // first step of each run of one job
  std::vector<double> fp_by_run, miss_by_run;
  std::vector<Table> tables;
  std::vector<double> fp_by_tensor, miss_by_tensor, first_by_tensor;
  double pred_bytes = 0, fp_bytes = 0, known_bytes = 0, miss_bytes = 0, first_bytes = 0,
         accessed_bytes = 0;
  std::vector<std::size_t> stamp_p, stamp_a;

  Impl(const TraceFeed& f, std::uint32_t horizon) : feed(f), h(std::max(1u, horizon)) {
    const trace::Trace& tr = feed.trace();
    const std::size_t n = feed.num_steps(), nt = tr.tensors.size();
    st = build_step_tensors(feed);
    acc_begin.assign(nt + 1, 0);
    for (std::uint32_t t : st.tensors) ++acc_begin[t + 1];
    for (std::size_t i = 0; i < nt; ++i) acc_begin[i + 1] += acc_begin[i];
    acc_steps.resize(st.tensors.size());
    std::vector<std::size_t> fill(acc_begin.begin(), acc_begin.end() - 1);
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t k = st.begin[s]; k < st.begin[s + 1]; ++k)
        acc_steps[fill[st.tensors[k]]++] = s;
    cursor.assign(acc_begin.begin(), acc_begin.end() - 1);
    first_event.assign(nt, kNever);
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t i = feed.step_begin(s); i < feed.step_begin(s + 1); ++i)
        first_event[tr.events[i].tensor] =
            std::min<std::uint64_t>(first_event[tr.events[i].tensor], s);

    // Switches, iteration boundaries and ordinals.
    std::vector<bool> is_switch(n, false), is_iter(n, false);
    ordinal.assign(n, 0);
    std::vector<std::uint32_t> last_iter(tr.jobs.size() + 1, UINT32_MAX);
    std::vector<std::uint32_t> pair_count;
    const std::size_t nj = tr.jobs.size() + 1;
    pair_count.assign(nj * nj, 0);
    for (std::size_t s = 0; s < n; ++s) {
      const trace::Op& o = feed.step_op(s);
      const std::uint32_t j = std::min<std::uint32_t>(o.job, nj - 1);
      if (s > 0) {
        const std::uint32_t pj = std::min<std::uint32_t>(feed.step_op(s - 1).job, nj - 1);
        if (pj != j) {
          is_switch[s] = true;
          run_start.push_back(s);
          ordinal[s] = pair_count[pj * nj + j]++;
        }
      }
      if (last_iter[j] != o.iteration) is_iter[s] = true;
      last_iter[j] = o.iteration;
    }
    if (run_start.empty() || run_start.front() != 0) run_start.insert(run_start.begin(), 0);
    fp_by_run.assign(run_start.size(), 0);
    miss_by_run.assign(run_start.size(), 0);
    to_switch.assign(n, kNever);
    to_iter.assign(n, kNever);
    from_switch.assign(n, kNever);
    std::uint64_t ns = kNever, ni = kNever;
    for (std::size_t s = n; s-- > 0;) {
      if (is_switch[s]) ns = s;
      if (is_iter[s]) ni = s;
      to_switch[s] = ns == kNever ? kNever : ns - s;
      to_iter[s] = ni == kNever ? kNever : ni - s;
    }
    std::uint64_t ps = kNever;
    for (std::size_t s = 0; s < n; ++s) {
      if (is_switch[s]) ps = s;
      from_switch[s] = ps == kNever ? kNever : s - ps;
    }

    auto dist_labels = [&] {
      return std::vector<std::string>{
          fmt::format("[0,{})", h / 8), fmt::format("[{},{})", h / 8, h / 4),
          fmt::format("[{},{})", h / 4, h / 2), fmt::format("[{},{})", h / 2, h),
          fmt::format(">={} or none", h)};
    };
    std::vector<std::string> roles, phases, classes, jobs;
    for (int r = 0; r <= static_cast<int>(trace::Role::other); ++r)
      roles.emplace_back(trace::to_string(static_cast<trace::Role>(r)));
    for (std::size_t j = 0; j < nj; ++j) jobs.push_back(j < tr.jobs.size() ? tr.jobs[j] : "?");
    for (std::size_t j = 0; j < nj; ++j)
      for (int p = 0; p < trace::kNumPhases; ++p)
        phases.push_back(
            fmt::format("{}:{}", jobs[j], trace::to_string(static_cast<trace::Phase>(p))));
    for (int c = 0; c < trace::kNumOpClasses; ++c)
      classes.emplace_back(trace::to_string(static_cast<trace::OpClass>(c)));
    tables.emplace_back("tensor role", roles);
    tables.emplace_back("tensor job", jobs);
    tables.emplace_back("job:phase of the op at the decision point", phases);
    tables.emplace_back("op class at the decision point", classes);
    tables.emplace_back("steps from the decision to the next job switch", dist_labels());
    tables.emplace_back("steps since the previous job switch", dist_labels());
    tables.emplace_back("steps to the next iteration boundary (any job)", dist_labels());
    tables.emplace_back("how often the next switch (same from->to jobs) happened before",
                        std::vector<std::string>{"0 (first of its kind)", "1", "2+",
                                                 fmt::format("no switch within {}", h)});
    tables.emplace_back("steps ahead: predicted (FP), actual first access (miss, first touch)",
                        dist_labels());
    tables.emplace_back("FP only: when the tensor was really accessed next",
                        std::vector<std::string>{fmt::format("[{},{})", h, 2 * h),
                                                 fmt::format("[{},{})", 2 * h, 8 * h),
                                                 fmt::format(">={}", 8 * h), "never again"});
    fp_by_tensor.assign(nt, 0);
    miss_by_tensor.assign(nt, 0);
    first_by_tensor.assign(nt, 0);
    stamp_p.assign(nt, SIZE_MAX);
    stamp_a.assign(nt, SIZE_MAX);
  }

  std::size_t dist_bucket(std::uint64_t d) const {
    if (d < h / 8) return 0;
    if (d < h / 4) return 1;
    if (d < h / 2) return 2;
    if (d < h) return 3;
    return 4;
  }
  std::uint64_t next_access(std::uint32_t t, std::size_t k) {
    std::size_t& c = cursor[t];
    while (c < acc_begin[t + 1] && acc_steps[c] < k) ++c;
    return c < acc_begin[t + 1] ? acc_steps[c] : kNever;
  }
  // The categories the decision point k puts an error in (all dims but
  // role/job/ahead/next, which depend on the tensor).
  std::array<std::size_t, 10> context(std::size_t k) const {
    const trace::Op& o = feed.step_op(k);
    std::array<std::size_t, 10> c{};
    const std::size_t nj = tables[kJob].labels.size();
    c[kPhase] = std::min<std::size_t>(o.job, nj - 1) * trace::kNumPhases +
                static_cast<std::size_t>(o.phase);
    c[kClass] = static_cast<std::size_t>(o.cls);
    c[kToSwitch] = dist_bucket(to_switch[k]);
    c[kFromSwitch] = dist_bucket(from_switch[k]);
    c[kToIter] = dist_bucket(to_iter[k]);
    if (to_switch[k] >= h)
      c[kOrdinal] = 3;
    else
      c[kOrdinal] = std::min<std::uint32_t>(ordinal[k + to_switch[k]], 2);
    return c;
  }
  void add(std::array<std::size_t, 10> c, std::uint32_t t, Err e, double b) {
    const trace::Tensor& x = feed.trace().tensors[t];
    c[kRole] = static_cast<std::size_t>(x.role);
    c[kJob] = std::min<std::size_t>(x.job, tables[kJob].labels.size() - 1);
    for (std::size_t d = 0; d < tables.size(); ++d) {
      if (e != Err::fp && d == kNext) continue;
      Table& tb = tables[d];
      (e == Err::fp ? tb.fp : e == Err::miss ? tb.miss : tb.first)[c[d]] += b;
    }
    (e == Err::fp ? fp_by_tensor : e == Err::miss ? miss_by_tensor : first_by_tensor)[t] += b;
    if (e == Err::fp) fp_by_run[cur_run] += b;
    if (e == Err::miss) miss_by_run[cur_run] += b;
  }
  std::size_t cur_run = 0;

  void decision(std::size_t k, const std::vector<Predicted>& out) {
    const trace::Trace& tr = feed.trace();
    const std::size_t n = feed.num_steps();
    auto ctx = context(k);
    while (cur_run + 1 < run_start.size() && run_start[cur_run + 1] <= k) ++cur_run;
    for (const Predicted& p : out) {
      if (p.ops_ahead >= h || p.tensor >= tr.tensors.size() || stamp_p[p.tensor] == k) continue;
      if (k + p.ops_ahead >= n) continue;  // unscorable, as in the evaluator
      stamp_p[p.tensor] = k;
      const double b = double(tr.tensors[p.tensor].bytes);
      pred_bytes += b;
      const std::uint64_t nx = next_access(p.tensor, k);
      if (nx < k + h) continue;
      fp_bytes += b;
      auto c = ctx;
      c[kAhead] = dist_bucket(p.ops_ahead);
      c[kNext] = nx == kNever ? 3 : nx < k + 2 * h ? 0 : nx < k + 8 * h ? 1 : 2;
      add(c, p.tensor, Err::fp, b);
    }
    for (std::size_t s = k; s < std::min<std::size_t>(n, k + h); ++s)
      for (std::size_t i = st.begin[s]; i < st.begin[s + 1]; ++i) {
        const std::uint32_t t = st.tensors[i];
        if (stamp_a[t] == k) continue;
        stamp_a[t] = k;
        const double b = double(tr.tensors[t].bytes);
        const bool first = first_event[t] >= k;  // a first touch: no online predictor names it
        accessed_bytes += b;
        if (!first) known_bytes += b;
        if (stamp_p[t] == k) continue;
        (first ? first_bytes : miss_bytes) += b;
        auto c = ctx;
        c[kAhead] = dist_bucket(s - k);
        const trace::Op& o = feed.step_op(s);
        c[kPhase] =
            std::min<std::size_t>(o.job, tables[kJob].labels.size() - 1) * trace::kNumPhases +
            static_cast<std::size_t>(o.phase);
        add(c, t, first ? Err::first : Err::miss, b);
      }
  }
};

Diagnoser::Diagnoser(const TraceFeed& feed, std::uint32_t horizon)
    : impl_(std::make_unique<Impl>(feed, horizon)) {}
Diagnoser::~Diagnoser() = default;

void Diagnoser::on_decision(std::size_t k, const std::vector<Predicted>& out, bool warm) {
  if (!warm) impl_->decision(k, out);
}

double Diagnoser::predicted_bytes() const {
  return impl_->pred_bytes;
}
double Diagnoser::false_positive_bytes() const {
  return impl_->fp_bytes;
}
double Diagnoser::known_bytes() const {
  return impl_->known_bytes;
}
double Diagnoser::missed_bytes() const {
  return impl_->miss_bytes;
}
double Diagnoser::accessed_bytes() const {
  return impl_->accessed_bytes;
}
double Diagnoser::first_touch_missed_bytes() const {
  return impl_->first_bytes;
}

nlohmann::json Diagnoser::to_json(std::size_t top) const {
  const Impl& d = *impl_;
  auto pct = [](double a, double b) { return b > 0 ? 100 * a / b : 0.0; };
  nlohmann::json j = {
      {"horizon", d.h},
      {"figures",
       "computed from the trace, after warm-up; fp_pct: share of predicted bytes; miss_pct "
       "(known tensors) and first_touch_pct (tensors never seen before): shares of accessed "
       "bytes"},
      {"predicted_bytes", d.pred_bytes},
      {"false_positive_bytes", d.fp_bytes},
      {"accessed_bytes", d.accessed_bytes},
      {"known_bytes", d.known_bytes},
      {"missed_bytes", d.miss_bytes},
      {"first_touch_missed_bytes", d.first_bytes}};
  nlohmann::json tables = nlohmann::json::array();
  for (const Table& t : d.tables) {
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t i = 0; i < t.labels.size(); ++i) {
      if (t.fp[i] == 0 && t.miss[i] == 0 && t.first[i] == 0) continue;
      rows.push_back({{"label", t.labels[i]},
                      {"fp_pct", pct(t.fp[i], d.pred_bytes)},
                      {"miss_pct", pct(t.miss[i], d.accessed_bytes)},
                      {"first_touch_pct", pct(t.first[i], d.accessed_bytes)}});
    }
    tables.push_back({{"title", t.title}, {"rows", rows}});
  }
  j["tables"] = tables;
  // Names with their numbers folded ("layer_#", "req_#"), so that one
  // mechanism's errors across layers and requests add up to one line.
  auto top_list = [&](const std::vector<double>& v, double total) {
    std::map<std::string, double> by_pattern;
    for (std::size_t t = 0; t < v.size(); ++t) {
      if (v[t] == 0) continue;
      std::string name;
      for (char c : d.feed.trace().tensors[t].name)
        if (!(c >= '0' && c <= '9'))
          name += c;
        else if (name.empty() || name.back() != '#')
          name += '#';
      by_pattern[name] += v[t];
    }
    std::vector<std::pair<double, std::string>> rows;
    for (auto& [n, b] : by_pattern) rows.emplace_back(b, n);
    std::size_t m = std::min(top, rows.size());
    std::partial_sort(rows.begin(), rows.begin() + m, rows.end(), std::greater<>());
    nlohmann::json out = nlohmann::json::array();
    for (std::size_t i = 0; i < m; ++i)
      out.push_back({{"pct", pct(rows[i].first, total)}, {"pattern", rows[i].second}});
    return out;
  };
  j["top_patterns"] = {{"false_positive", top_list(d.fp_by_tensor, d.pred_bytes)},
                       {"missed", top_list(d.miss_by_tensor, d.accessed_bytes)},
                       {"first_touch", top_list(d.first_by_tensor, d.accessed_bytes)}};
  // Where in the trace: the runs of one job whose decision points erred most.
  auto run_list = [&](const std::vector<double>& v, double total) {
    std::vector<std::size_t> idx(v.size());
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::size_t m = std::min(top, idx.size());
    std::partial_sort(idx.begin(), idx.begin() + m, idx.end(),
                      [&](std::size_t a, std::size_t b) { return v[a] > v[b]; });
    const std::size_t n = d.feed.num_steps();
    nlohmann::json out = nlohmann::json::array();
    for (std::size_t i = 0; i < m && v[idx[i]] > 0; ++i) {
      const std::size_t r = idx[i];
      const std::uint64_t b = d.run_start[r],
                          e = r + 1 < d.run_start.size() ? d.run_start[r + 1] : n;
      const trace::Op& o0 = d.feed.step_op(b);
      const trace::Op& o1 = d.feed.step_op(e - 1);
      out.push_back({{"pct", pct(v[r], total)},
                     {"run", r},
                     {"steps", {b, e}},
                     {"job", d.feed.trace().jobs.at(o0.job)},
                     {"iterations", {o0.iteration, o1.iteration}}});
    }
    return out;
  };
  j["top_runs"] = {{"false_positive", run_list(d.fp_by_run, d.pred_bytes)},
                   {"missed", run_list(d.miss_by_run, d.accessed_bytes)}};
  return j;
}

// The text form is rendered from to_json(), so the two cannot disagree.
std::string Diagnoser::report(std::size_t top) const {
  const nlohmann::json j = to_json(top);
  auto pct = [](double a, double b) { return b > 0 ? 100 * a / b : 0.0; };
  const double pred = j["predicted_bytes"], acc = j["accessed_bytes"];
  std::string s = fmt::format(
      "horizon {} steps, after warm-up, computed from the trace. FP = predicted, not read/written "
      "within the horizon ({:.1f}% of {:.4g} predicted bytes); miss = read/written, already seen, "
      "not predicted ({:.1f}%); first = read/written, never seen before: no online predictor "
      "names it ({:.1f}%); miss and first are shares of {:.4g} accessed bytes. For a miss or "
      "first touch, job:phase is that of the op that accessed it.\n",
      j["horizon"].get<std::uint32_t>(), pct(j["false_positive_bytes"], pred), pred,
      pct(j["missed_bytes"], acc), pct(j["first_touch_missed_bytes"], acc), acc);
  for (const auto& t : j["tables"]) {
    s += fmt::format("\n  {}\n  {:<44} {:>8} {:>8} {:>8}\n", t["title"].get<std::string>(), "",
                     "FP%", "miss%", "first%");
    for (const auto& r : t["rows"])
      s += fmt::format("  {:<44} {:>8.2f} {:>8.2f} {:>8.2f}\n", r["label"].get<std::string>(),
                       r["fp_pct"].get<double>(), r["miss_pct"].get<double>(),
                       r["first_touch_pct"].get<double>());
  }
  for (const char* k : {"false_positive", "missed", "first_touch"}) {
    s += fmt::format("\n  top tensor name patterns by {} bytes\n", k);
    for (const auto& r : j["top_patterns"][k])
      s +=
          fmt::format("  {:>8.2f}%  {}\n", r["pct"].get<double>(), r["pattern"].get<std::string>());
  }
  for (const char* k : {"false_positive", "missed"}) {
    s +=
        fmt::format("\n  runs of one job with the most {} bytes (decision points in the run)\n", k);
    for (const auto& r : j["top_runs"][k])
      s += fmt::format("  {:>8.2f}%  run {} steps [{},{}) job {} iterations {}..{}\n",
                       r["pct"].get<double>(), r["run"].get<std::size_t>(),
                       r["steps"][0].get<std::uint64_t>(), r["steps"][1].get<std::uint64_t>(),
                       r["job"].get<std::string>(), r["iterations"][0].get<std::uint32_t>(),
                       r["iterations"][1].get<std::uint32_t>());
  }
  return s;
}

}  // namespace u3m::predict
