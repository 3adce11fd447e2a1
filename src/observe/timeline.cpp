#include "u3m/observe/timeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "u3m/engine/engine.hpp"
#include "u3m/util/error.hpp"

namespace u3m::observe {
namespace {

// Note [Timeline tracks]
// The trace-event format shows complete events ("X") of one thread as a
// stack: two spans on one track must nest or not overlap at all. Transfers
// on a link overlap (a link has several slots), and so may ops of co-located
// jobs, so spans are dealt onto lanes: sorted by start, each goes to the
// first lane free by then (interval partitioning, the fewest lanes). Lane 0
// of a link is named after it ("h2d"), the others "h2d 2", "h2d 3"... Times
// are whole nanoseconds after the earliest event, written as microseconds
// with three decimals, so a span's end is exact and touching spans do not
// overlap by a rounding error.
struct Interval {
  std::int64_t t0, t1;
};
std::vector<int> deal_lanes(const std::vector<Interval>& v) {
  std::vector<std::size_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return v[a].t0 < v[b].t0; });
  std::vector<int> lane(v.size());
  std::vector<std::int64_t> free_at;  // per lane
  for (std::size_t i : order) {
    std::size_t l = 0;
    while (l < free_at.size() && free_at[l] > v[i].t0) ++l;
    if (l == free_at.size()) free_at.push_back(0);
    free_at[l] = v[i].t1;
    lane[i] = static_cast<int>(l);
  }
  return lane;
}

constexpr int kLinkTid = 1000;  // tids of link lanes: 1000 + 100 * link + lane
int link_tid(engine::Link l, int lane) {
  return kLinkTid + 100 * static_cast<int>(l) + lane;
}

std::string us(std::int64_t ns) {
  return fmt::format("{}.{:03}", ns / 1000, ns % 1000);
}

}  // namespace

void Timeline::op(int card, std::int64_t step, std::size_t index, std::string_view name,
                  engine::OpWork, double t0_s, double t1_s) {
  std::lock_guard g(mu_);
  auto [it, fresh] = name_ids_.try_emplace(std::string(name), names_.size());
  if (fresh) names_.emplace_back(name);
  spans_.push_back({card, false, step, index, it->second, t0_s, t1_s});
}

void Timeline::stall(int card, std::int64_t step, std::size_t index, double t0_s, double t1_s) {
  std::lock_guard g(mu_);
  spans_.push_back({card, true, step, index, 0, t0_s, t1_s});
}

void Timeline::step_end(int card, std::int64_t step, double t_s) {
  std::lock_guard g(mu_);
  steps_.push_back({card, step, t_s});
}

void Timeline::transfer(const engine::TransferRecord& t) {
  std::lock_guard g(mu_);
  transfers_.push_back(t);
}

void Timeline::occupancy(int card, mem::Tier tier, std::uint64_t used, double t_s) {
  std::lock_guard g(mu_);
  const std::uint64_t key =
      static_cast<std::uint64_t>(static_cast<std::uint32_t>(card)) << 8 | static_cast<int>(tier);
  auto it = last_sample_.find(key);
  if (it != last_sample_.end() && t_s - samples_[it->second].t < kOccupancyResolutionS) {
    samples_[it->second].used = used;
    return;
  }
  last_sample_[key] = samples_.size();
  samples_.push_back({card, tier, used, t_s});
}

Timeline::Counts Timeline::counts() const {
  std::lock_guard g(mu_);
  Counts c;
  for (const Span& s : spans_) ++(s.stall ? c.stalls : c.ops);
  c.steps = steps_.size();
  c.transfers = transfers_.size();
  c.occupancy = samples_.size();
  return c;
}

std::string Timeline::json(const std::string& clock) const {
  std::lock_guard g(mu_);
  double origin = std::numeric_limits<double>::infinity();
  for (const Span& s : spans_) origin = std::min(origin, s.t0);
  for (const StepEnd& s : steps_) origin = std::min(origin, s.t);
  for (const auto& t : transfers_) origin = std::min(origin, t.start_s);
  for (const Sample& s : samples_) origin = std::min(origin, s.t);
  if (!std::isfinite(origin)) origin = 0;
  auto ns = [origin](double t) { return std::llround((t - origin) * 1e9); };

  std::string out;
  auto o = std::back_inserter(out);
  bool first = true;
  auto event = [&](const std::string& body) {
    fmt::format_to(o, "{}\n{{{}}}", first ? "" : ",", body);
    first = false;
  };
  std::map<std::pair<int, int>, std::string> threads;  // (pid, tid) -> name
  auto lane_name = [](const std::string& base, int lane) {
    return lane == 0 ? base : fmt::format("{} {}", base, lane + 1);
  };
  fmt::format_to(o, "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");

  // Ops and stalls on each card's compute lanes (Note [Timeline tracks]).
  std::map<int, std::vector<std::size_t>> by_card;
  for (std::size_t i = 0; i < spans_.size(); ++i) by_card[spans_[i].card].push_back(i);
  for (const auto& [card, idx] : by_card) {
    std::vector<Interval> iv;
    for (std::size_t i : idx) iv.push_back({ns(spans_[i].t0), ns(std::max(spans_[i].t0, spans_[i].t1))});
    const std::vector<int> lane = deal_lanes(iv);
    for (std::size_t k = 0; k < idx.size(); ++k) {
      const Span& s = spans_[idx[k]];
      threads[{card, lane[k]}] = lane_name("compute", lane[k]);
      const std::string name =
          s.stall ? std::string("\"stall\"") : nlohmann::json(names_[s.name]).dump();
      event(fmt::format(
          "\"name\":{},\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{},\"dur\":{},"
          "\"args\":{{\"step\":{},\"index\":{}}}",
          name, s.stall ? "stall" : "op", card, lane[k], us(iv[k].t0), us(iv[k].t1 - iv[k].t0),
          s.step, s.index));
    }
  }
  // Transfers on each (card, link)'s lanes.
  std::map<std::pair<int, int>, std::vector<std::size_t>> by_link;
  for (std::size_t i = 0; i < transfers_.size(); ++i)
    by_link[{transfers_[i].card, static_cast<int>(transfers_[i].link)}].push_back(i);
  for (const auto& [key, idx] : by_link) {
    const auto link = static_cast<engine::Link>(key.second);
    std::vector<Interval> iv;
    for (std::size_t i : idx)
      iv.push_back({ns(transfers_[i].start_s),
                    ns(std::max(transfers_[i].start_s, transfers_[i].end_s))});
    const std::vector<int> lane = deal_lanes(iv);
    for (std::size_t k = 0; k < idx.size(); ++k) {
      const engine::TransferRecord& t = transfers_[idx[k]];
      const int tid = link_tid(link, lane[k]);
      threads[{key.first, tid}] = lane_name(std::string(engine::to_string(link)), lane[k]);
      const auto prio = engine::to_string(static_cast<engine::Priority>(t.priority));
      event(fmt::format(
          "\"name\":\"{}{}\",\"cat\":\"transfer\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{},"
          "\"dur\":{},\"args\":{{\"link\":\"{}\",\"priority\":\"{}\",\"bytes\":{},\"ok\":{}}}",
          t.ok ? "" : "failed ", prio, key.first, tid, us(iv[k].t0), us(iv[k].t1 - iv[k].t0),
          engine::to_string(link), prio, t.bytes, t.ok));
    }
  }
  // Tier occupancy as counters: one track per (card, tier), named "<tier> used".
  for (const Sample& s : samples_) {
    threads.try_emplace({s.card, 0}, "compute");
    event(fmt::format(
        "\"name\":\"{} used\",\"cat\":\"occupancy\",\"ph\":\"C\",\"pid\":{},\"tid\":0,\"ts\":{},"
        "\"args\":{{\"bytes\":{}}}",
        mem::to_string(s.tier), s.card, us(ns(s.t)), s.used));
  }
  for (const StepEnd& s : steps_) {
    threads.try_emplace({s.card, 0}, "compute");
    event(fmt::format(
        "\"name\":\"step {} end\",\"cat\":\"step\",\"ph\":\"i\",\"s\":\"p\",\"pid\":{},\"tid\":0,"
        "\"ts\":{},\"args\":{{\"step\":{}}}",
        s.step, s.card, us(ns(s.t)), s.step));
  }
  // Names of the processes (cards) and threads (tracks).
  int last_pid = std::numeric_limits<int>::min();
  for (const auto& [key, name] : threads) {
    if (key.first != last_pid) {
      event(fmt::format(
          "\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":"
          "\"card {}\"}}",
          key.first, key.first));
      last_pid = key.first;
    }
    event(fmt::format(
        "\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"{}\"}}",
        key.first, key.second, name));
    event(fmt::format(
        "\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"sort_"
        "index\":{}}}",
        key.first, key.second, key.second));
  }
  fmt::format_to(o,
                 "\n],\"otherData\":{{\"format\":\"u3m timeline 1\",\"clock\":{},\"origin_s\":{}}}}}\n",
                 nlohmann::json(clock).dump(), origin);
  return out;
}

void Timeline::write(const std::string& path, const std::string& clock,
                     const std::string& what) const {
  const std::string doc = json(clock);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) input_error(what, "cannot write the timeline to '{}'", path);
  const bool ok = std::fwrite(doc.data(), 1, doc.size(), f) == doc.size();
  if (std::fclose(f) != 0 || !ok) input_error(what, "cannot write the timeline to '{}'", path);
}

}  // namespace u3m::observe
