#include "u3m/observe/diagnosis.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "u3m/trace/model.hpp"

namespace u3m::observe {
namespace {

using Intervals = std::vector<std::pair<double, double>>;

// Sorted, disjoint.
Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& [a, b] : v) {
    if (!out.empty() && a <= out.back().second)
      out.back().second = std::max(out.back().second, b);
    else
      out.emplace_back(a, b);
  }
  return out;
}
double length(const Intervals& v) {
  double s = 0;
  for (const auto& [a, b] : v) s += b - a;
  return s;
}
// Length of the intersection of two merged lists.
double overlap(const Intervals& x, const Intervals& y) {
  double s = 0;
  for (std::size_t i = 0, j = 0; i < x.size() && j < y.size();) {
    s += std::max(0.0, std::min(x[i].second, y[j].second) - std::max(x[i].first, y[j].first));
    (x[i].second < y[j].second ? i : j)++;
  }
  return s;
}
Intervals clipped(const Intervals& v, double a, double b) {
  Intervals out;
  for (const auto& [x, y] : v)
    if (std::min(y, b) > std::max(x, a)) out.emplace_back(std::max(x, a), std::min(y, b));
  return out;
}

std::vector<OpLoad> top10(std::vector<OpLoad> v, bool by_bytes) {
  std::stable_sort(v.begin(), v.end(), [&](const OpLoad& a, const OpLoad& b) {
    return by_bytes ? a.bytes > b.bytes : a.stall_s > b.stall_s;
  });
  std::erase_if(v, [&](const OpLoad& o) { return by_bytes ? o.bytes == 0 : o.stall_s <= 0; });
  if (v.size() > 10) v.resize(10);
  return v;
}

}  // namespace

void Diagnosis::op(int card, std::int64_t step, std::size_t index, std::string_view name,
                   engine::OpWork work, double t0_s, double t1_s) {
  std::lock_guard g(mu_);
  spans_.push_back({card, step, index, trace::op_family(name), work, t0_s, t1_s, false});
}

void Diagnosis::stall(int card, std::int64_t step, std::size_t index, double t0_s, double t1_s) {
  std::lock_guard g(mu_);
  spans_.push_back({card, step, index, {}, {}, t0_s, t1_s, true});
}

void Diagnosis::transfer(const engine::TransferRecord& t) {
  std::lock_guard g(mu_);
  transfers_.push_back(t);
}

// Note [Bandwidth diagnosis]
// A transfer is charged to the op that was waiting or running when it ended
// (the op that needed it, or the one whose time it overlapped); an op family
// (its name with layer numbers folded) collects its charges over the steps.
// A step runs from its first stall or op to its last op's end; its transfer
// time is the union of transfer spans inside it (overlapping transfers count
// once), of which the part under an op's compute was hidden, and its stalls
// are the exposed time. The first step is left out of everything per op and
// per step: it fetches everything cold, so counting it blames the ops of the
// first layers for a one-off (a run of one step keeps it, and says so). The
// links' totals cover the whole run: they are what the links carried.
DiagnosisReport Diagnosis::report(const std::array<double, engine::kNumLinks>& limit_bps, int card,
                                  const Roofline& roofline, std::string_view profile) const {
  std::lock_guard g(mu_);
  DiagnosisReport r;
  double t0 = std::numeric_limits<double>::infinity(), t1 = -t0;
  std::vector<const Span*> spans;
  for (const Span& s : spans_)
    if (s.card == card) {
      spans.push_back(&s);
      t0 = std::min(t0, s.t0);
      t1 = std::max(t1, s.t1);
    }
  std::vector<const engine::TransferRecord*> tr;
  for (const auto& t : transfers_)
    if (t.card == card && t.ok) {
      tr.push_back(&t);
      t0 = std::min(t0, t.start_s);
      t1 = std::max(t1, t.end_s);
    }
  if (t1 <= t0) return r;
  r.span_s = t1 - t0;
  // The first step is cold; with one step only, it is all there is.
  const auto [lo, hi] = std::minmax_element(
      spans.begin(), spans.end(), [](const Span* a, const Span* b) { return a->step < b->step; });
  const bool several = !spans.empty() && (*lo)->step != (*hi)->step;
  const std::int64_t first_step = several ? (*lo)->step : 0;
  r.cold_step_included = !several;
  auto steady = [&](std::int64_t step) { return !several || step != first_step; };
  std::array<Intervals, engine::kNumLinks> per_link;
  Intervals all;
  for (const auto* t : tr) {
    const int l = static_cast<int>(t->link);
    r.links[l].bytes += t->bytes;
    per_link[l].emplace_back(t->start_s, t->end_s);
    all.emplace_back(t->start_s, t->end_s);
  }
  for (int l = 0; l < engine::kNumLinks; ++l) {
    r.links[l].busy_s = length(merged(per_link[l]));
    r.links[l].achieved_bps = static_cast<double>(r.links[l].bytes) / r.span_s;
    r.links[l].utilisation = limit_bps[l] > 0 ? r.links[l].achieved_bps / limit_bps[l] : 0;
  }
  // Each op's window: its stall (if any) and its run, keyed by (step, index).
  std::map<std::pair<std::int64_t, std::size_t>, std::pair<double, double>> window;
  std::map<std::pair<std::int64_t, std::size_t>, std::string> name_of;
  std::map<std::string, OpLoad> load;
  for (const Span* s : spans) {
    const auto key = std::make_pair(s->step, s->index);
    auto [it, fresh] = window.try_emplace(key, s->t0, s->t1);
    if (!fresh) it->second = {std::min(it->second.first, s->t0), std::max(it->second.second, s->t1)};
    if (!s->stall) name_of[key] = s->name;
  }
  for (const Span* s : spans)
    if (s->stall && steady(s->step) && name_of.count({s->step, s->index})) {
      OpLoad& o = load[name_of[{s->step, s->index}]];
      o.stall_s += s->t1 - s->t0;
    }
  std::vector<std::pair<double, std::pair<std::int64_t, std::size_t>>> by_end;  // window end
  for (const auto& [key, w] : window) by_end.push_back({w.second, key});
  std::sort(by_end.begin(), by_end.end());
  for (const auto* t : tr) {
    // The first window ending at or after the transfer's end, if it began by then.
    auto it = std::lower_bound(by_end.begin(), by_end.end(),
                               std::make_pair(t->end_s, std::make_pair(std::int64_t{-1}, std::size_t{0})),
                               [](const auto& a, const auto& b) { return a.first < b.first; });
    if (it == by_end.end() || window[it->second].first > t->end_s || !steady(it->second.first) ||
        !name_of.count(it->second))
      continue;
    load[name_of[it->second]].bytes += t->bytes;
  }
  std::vector<OpLoad> loads;
  for (auto& [name, o] : load) {
    o.name = name;
    loads.push_back(o);
  }
  r.top_by_bytes = top10(loads, true);
  r.top_by_stall = top10(loads, false);
  // What bounds each steady-state op run on the roofline.
  r.bound.known = static_cast<bool>(roofline);
  r.bound.profile = std::string(profile);
  if (roofline)
    for (const Span* s : spans) {
      if (s->stall || !steady(s->step)) continue;
      const double dt = s->t1 - s->t0;
      if (!(s->work.flops > 0) && !(s->work.bytes > 0)) {
        ++r.bound.ops_unknown;
        r.bound.unknown_s += dt;
      } else if (const RooflineTime rt = roofline(s->work.flops, s->work.bytes);
                 rt.memory_s > rt.compute_s) {
        ++r.bound.ops_hbm;
        r.bound.hbm_s += dt;
      } else {
        ++r.bound.ops_compute;
        r.bound.compute_s += dt;
      }
    }
  // Steady-state steps.
  std::map<std::int64_t, std::pair<double, double>> step_win;
  std::map<std::int64_t, Intervals> compute;
  std::map<std::int64_t, double> stalled;
  for (const Span* s : spans) {
    auto [it, fresh] = step_win.try_emplace(s->step, s->t0, s->t1);
    if (!fresh) it->second = {std::min(it->second.first, s->t0), std::max(it->second.second, s->t1)};
    if (s->stall)
      stalled[s->step] += s->t1 - s->t0;
    else
      compute[s->step].emplace_back(s->t0, s->t1);
  }
  const Intervals moving = merged(all);
  bool first = true;
  for (const auto& [step, w] : step_win) {
    if (first) {
      first = false;
      continue;
    }
    StepOverlap so;
    so.step = step;
    const Intervals in = clipped(moving, w.first, w.second);
    so.transfer_s = length(in);
    so.hidden_s = overlap(in, merged(compute[step]));
    so.exposed_s = stalled[step];
    r.steps.push_back(so);
  }
  return r;
}

nlohmann::json Diagnosis::to_json(const DiagnosisReport& r) {
  nlohmann::json links = nlohmann::json::object();
  for (int l = 0; l < engine::kNumLinks; ++l)
    links[std::string(engine::to_string(engine::Link(l)))] = {
        {"bytes", r.links[l].bytes},
        {"busy_s", r.links[l].busy_s},
        {"achieved_bytes_per_s", r.links[l].achieved_bps},
        {"utilisation", r.links[l].utilisation}};
  auto ops = [](const std::vector<OpLoad>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const OpLoad& o : v) a.push_back({{"op", o.name}, {"bytes", o.bytes}, {"stall_s", o.stall_s}});
    return a;
  };
  nlohmann::json steps = nlohmann::json::array();
  for (const StepOverlap& s : r.steps)
    steps.push_back({{"step", s.step},
                     {"transfer_s", s.transfer_s},
                     {"hidden_s", s.hidden_s},
                     {"exposed_s", s.exposed_s}});
  nlohmann::json bound = nullptr;
  if (r.bound.known) {
    const BoundShare& b = r.bound;
    const double ops = double(b.ops_hbm + b.ops_compute + b.ops_unknown);
    const double time = b.hbm_s + b.compute_s + b.unknown_s;
    auto share = [](double x, double of) { return of > 0 ? x / of : 0.0; };
    bound = {
        {"profile", b.profile},
        {"ops",
         {{"hbm_bound", b.ops_hbm}, {"compute_bound", b.ops_compute}, {"unknown", b.ops_unknown}}},
        {"time_s",
         {{"hbm_bound", b.hbm_s}, {"compute_bound", b.compute_s}, {"unknown", b.unknown_s}}},
        {"hbm_bound_share_of_ops", share(double(b.ops_hbm), ops)},
        {"hbm_bound_share_of_time", share(b.hbm_s, time)},
        {"compute_bound_share_of_time", share(b.compute_s, time)}};
  }
  return {{"span_s", r.span_s},
          {"links", links},
          {"top_ops_by_bytes", ops(r.top_by_bytes)},
          {"top_ops_by_stall", ops(r.top_by_stall)},
          {"cold_step_included", r.cold_step_included},
          {"steady_steps", steps},
          {"roofline", bound}};
}

std::string Diagnosis::to_text(const DiagnosisReport& r, std::string_view where) {
  std::string out =
      fmt::format("bandwidth diagnosis ({}), over {:.3f} s:\n  {:<5} {:>12} {:>10} {:>12} {:>8}\n",
                  where, r.span_s, "link", "bytes", "busy s", "achieved/s", "of limit");
  for (int l = 0; l < engine::kNumLinks; ++l) {
    const LinkUse& u = r.links[l];
    out += fmt::format("  {:<5} {:>12} {:>10.3f} {:>10.2f}GB {:>8}\n",
                       engine::to_string(engine::Link(l)), u.bytes, u.busy_s, u.achieved_bps / 1e9,
                       u.utilisation > 0 ? fmt::format("{:.1f}%", 100 * u.utilisation)
                                         : std::string("no limit"));
  }
  auto top = [&](const char* title, const std::vector<OpLoad>& v) {
    out += fmt::format("  top op families by {} ({}):\n", title,
                       r.cold_step_included ? "the only step, cold" : "steady-state steps");
    for (const OpLoad& o : v)
      out += fmt::format("    {:<40} {:>12} bytes {:>9.4f} s stalled\n", o.name, o.bytes, o.stall_s);
  };
  top("bytes moved", r.top_by_bytes);
  top("stall", r.top_by_stall);
  out += "  steady-state steps (the first, cold step left out): transfer time hidden / exposed\n";
  for (const StepOverlap& s : r.steps)
    out += fmt::format("    step {}: transfers {:.4f} s, hidden {:.4f} s, exposed (stalls) {:.4f} s\n",
                       s.step, s.transfer_s, s.hidden_s, s.exposed_s);
  if (r.steps.empty()) out += "    none: the run has one step\n";
  const BoundShare& b = r.bound;
  if (b.known) {
    const double ops = double(b.ops_hbm + b.ops_compute + b.ops_unknown);
    const double time = b.hbm_s + b.compute_s + b.unknown_s;
    auto pct = [](double x, double of) { return of > 0 ? 100 * x / of : 0.0; };
    out += fmt::format(
        "  roofline of profile {} (steady-state op runs): HBM-bound {} ops ({:.1f}%), {:.1f}% of "
        "op time; compute-bound {} ops ({:.1f}%), {:.1f}% of op time; no flops or bytes known "
        "{} ops, {:.1f}% of op time\n",
        b.profile, b.ops_hbm, pct(double(b.ops_hbm), ops), pct(b.hbm_s, time), b.ops_compute,
        pct(double(b.ops_compute), ops), pct(b.compute_s, time), b.ops_unknown,
        pct(b.unknown_s, time));
  } else {
    out += "  roofline: no hardware profile given (run replay: --profile)\n";
  }
  return out;
}

}  // namespace u3m::observe
