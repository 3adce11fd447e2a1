// A schema check of the Chrome trace-event format (the JSON object form that
// chrome://tracing and ui.perfetto.dev load): what every event must carry for
// its phase, and that complete events ("X") of one thread nest, which the
// viewers need to draw them as a stack. Returns the problems found, each
// naming the event's index; empty = valid.
#pragma once

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace u3m::observe::testing {

inline std::vector<std::string> check_trace_events(const nlohmann::json& doc) {
  std::vector<std::string> bad;
  auto fail = [&](std::size_t i, const std::string& what) {
    if (bad.size() < 20) bad.push_back(fmt::format("event {}: {}", i, what));
  };
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array())
    return {"the document is not an object with a traceEvents array"};
  if (doc.contains("displayTimeUnit") &&
      !(doc["displayTimeUnit"] == "ms" || doc["displayTimeUnit"] == "ns"))
    bad.push_back("displayTimeUnit must be \"ms\" or \"ns\"");
  static const std::set<std::string> kPhases = {"B", "E", "X", "i", "I", "C", "M", "b", "e",
                                                "n", "s", "t", "f", "P", "O", "N", "D"};
  static const std::set<std::string> kMeta = {"process_name", "process_labels",
                                              "process_sort_index", "thread_name",
                                              "thread_sort_index"};
  struct Span {
    double t0, t1;
    std::size_t i;
  };
  std::map<std::pair<long long, long long>, std::vector<Span>> spans;  // (pid, tid)
  std::map<std::pair<long long, long long>, int> open;                 // B/E depth
  const auto& ev = doc["traceEvents"];
  for (std::size_t i = 0; i < ev.size(); ++i) {
    const auto& e = ev[i];
    if (!e.is_object()) {
      fail(i, "not an object");
      continue;
    }
    if (!e.contains("ph") || !e["ph"].is_string() || !kPhases.count(e["ph"].get<std::string>())) {
      fail(i, "ph missing or not a known phase");
      continue;
    }
    const std::string ph = e["ph"];
    if (!e.contains("name") || !e["name"].is_string()) fail(i, "name missing or not a string");
    if (!e.contains("pid") || !e["pid"].is_number_integer()) fail(i, "pid missing or not an integer");
    if (e.contains("tid") && !e["tid"].is_number_integer()) fail(i, "tid not an integer");
    if (e.contains("args") && !e["args"].is_object()) fail(i, "args not an object");
    if (e.contains("cat") && !e["cat"].is_string()) fail(i, "cat not a string");
    if (ph == "M") {
      if (!e.contains("name") || !e["name"].is_string() || !kMeta.count(e["name"].get<std::string>()))
        fail(i, "metadata event with an unknown name");
      else if (!e.contains("args") || !e["args"].is_object())
        fail(i, "metadata event without args");
      else if (e["name"].get<std::string>().ends_with("_name") &&
               !(e["args"].contains("name") && e["args"]["name"].is_string()))
        fail(i, "a *_name metadata event needs args.name, a string");
      else if (e["name"].get<std::string>().ends_with("_sort_index") &&
               !(e["args"].contains("sort_index") && e["args"]["sort_index"].is_number_integer()))
        fail(i, "a *_sort_index metadata event needs args.sort_index, an integer");
      continue;
    }
    if (!e.contains("ts") || !e["ts"].is_number() || !std::isfinite(e["ts"].get<double>()) ||
        e["ts"].get<double>() < 0) {
      fail(i, "ts missing, not a finite number or negative");
      continue;
    }
    const double ts = e["ts"];
    const std::pair<long long, long long> thread = {
        e.value("pid", 0LL), e.contains("tid") && e["tid"].is_number_integer() ? e["tid"].get<long long>() : 0};
    if (ph == "X") {
      if (!e.contains("dur") || !e["dur"].is_number() || !(e["dur"].get<double>() >= 0))
        fail(i, "complete event without a duration >= 0");
      else
        spans[thread].push_back({ts, ts + e["dur"].get<double>(), i});
    } else if (ph == "C") {
      if (!e.contains("args") || !e["args"].is_object() || e["args"].empty())
        fail(i, "counter event without args");
      else
        for (const auto& [k, v] : e["args"].items())
          if (!v.is_number()) fail(i, fmt::format("counter value '{}' is not a number", k));
    } else if (ph == "i" || ph == "I") {
      if (e.contains("s") && !(e["s"] == "g" || e["s"] == "p" || e["s"] == "t"))
        fail(i, "instant event scope must be g, p or t");
    } else if (ph == "B") {
      ++open[thread];
    } else if (ph == "E") {
      if (--open[thread] < 0) fail(i, "end event without a begin");
    } else if (ph == "b" || ph == "e" || ph == "n") {
      if (!e.contains("id") && !e.contains("id2")) fail(i, "async event without an id");
    }
  }
  for (const auto& [thread, n] : open)
    if (n > 0) bad.push_back(fmt::format("pid {} tid {}: {} begin events never end", thread.first, thread.second, n));
  // Complete events of one thread must nest: sorted by start (longer first
  // on ties), each starts after the enclosing one ends or ends inside it.
  constexpr double kEps = 1e-3;  // 1 ns, in microseconds: decimal rounding of ts + dur
  for (auto& [thread, v] : spans) {
    std::sort(v.begin(), v.end(), [](const Span& a, const Span& b) {
      return a.t0 != b.t0 ? a.t0 < b.t0 : a.t1 > b.t1;
    });
    std::vector<Span> stack;
    for (const Span& s : v) {
      while (!stack.empty() && stack.back().t1 <= s.t0 + kEps) stack.pop_back();
      if (!stack.empty() && s.t1 > stack.back().t1 + kEps)
        fail(s.i, fmt::format("overlaps event {} on pid {} tid {} without nesting", stack.back().i,
                              thread.first, thread.second));
      stack.push_back(s);
    }
  }
  return bad;
}

}  // namespace u3m::observe::testing
