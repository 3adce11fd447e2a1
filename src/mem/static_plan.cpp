// Static memory planning from a trace, and its comparison with the pool.
#include "u3m/mem/static_plan.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::mem {

namespace {

constexpr std::uint64_t kNone = std::numeric_limits<std::uint64_t>::max();

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) {
  return (x + a - 1) / a * a;
}

}  // namespace

Lifetimes tensor_lifetimes(const trace::Trace& t, std::string_view source) {
  Lifetimes out;
  out.events = t.events.size();
  const std::size_t nt = t.tensors.size();
  std::vector<std::uint8_t> has_alloc(nt, 0);
  for (const trace::Event& e : t.events) {
    if (e.tensor >= nt) {
      input_error(source, "an event names tensor {} but the trace declares {}", e.tensor, nt);
    }
    if (e.kind == trace::EventKind::alloc) has_alloc[e.tensor] = 1;
  }
  std::vector<std::uint64_t> open(nt, kNone);  // index into out.items of the live lifetime
  std::vector<std::uint32_t> occurrences(nt, 0);
  std::vector<std::uint8_t> whole(nt, 0);
  auto start = [&](std::uint32_t tensor, std::uint64_t at) {
    open[tensor] = out.items.size();
    out.items.push_back(
        Lifetime{tensor, occurrences[tensor]++, at, out.events, t.tensors[tensor].bytes});
  };
  for (std::uint64_t i = 0; i < t.events.size(); ++i) {
    const trace::Event& e = t.events[i];
    const trace::Tensor& x = t.tensors[e.tensor];
    if (x.bytes == 0) continue;
    switch (e.kind) {
      case trace::EventKind::alloc:
        if (open[e.tensor] != kNone) {
          input_error(source, "event {}: tensor '{}' allocated while live (since event {})", i,
                      x.name, out.items[open[e.tensor]].start);
        }
        start(e.tensor, i);
        break;
      case trace::EventKind::free:
        if (open[e.tensor] == kNone) {
          input_error(source, "event {}: tensor '{}' freed while not allocated", i, x.name);
        }
        out.items[open[e.tensor]].end = i;
        open[e.tensor] = kNone;
        break;
      case trace::EventKind::read:
      case trace::EventKind::write:
        if (open[e.tensor] != kNone || whole[e.tensor]) break;
        if (!has_alloc[e.tensor]) {
          whole[e.tensor] = 1;  // a parameter or input: resident for the whole trace
          out.items.push_back(Lifetime{e.tensor, occurrences[e.tensor]++, 0, out.events, x.bytes});
        } else {
          ++out.implicit;
          start(e.tensor, i);
        }
        break;
    }
  }
  return out;
}

// Note [Static plan heuristic]
// Offline placement of lifetimes in one arena is NP-hard in general (dynamic
// storage allocation); this is the "greedy by size" heuristic used by
// TensorFlow Lite's arena planner and described by Pisarchyk and Lee,
// "Efficient Memory Management for Deep Neural Net Inference" (2020):
//   1. sort lifetimes by size, largest first (ties: longer lifetime first,
//      then earlier start, then trace order, so the plan is deterministic);
//   2. for each, look at the already placed lifetimes that overlap it in time,
//      and put it into the smallest gap between their byte ranges that holds
//      it (best fit); if no gap does, put it on top of the highest of them.
// Placing the big blocks first leaves the small ones to fill the gaps. A time
// index (lifetimes bucketed by event range) keeps the overlap query near
// linear in the number of overlapping lifetimes.
StaticPlan plan_static(const Lifetimes& lt, std::uint64_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1))) {
    input_error("static plan", "alignment {} is not a power of two", alignment);
  }
  StaticPlan p;
  p.lifetimes = lt.items;
  p.alignment = alignment;
  p.events = lt.events;
  p.algorithm = "greedy by size, best-fit into gaps (TFLite arena planner; Pisarchyk & Lee 2020)";
  const std::size_t n = p.lifetimes.size();
  p.sizes.resize(n);
  p.offsets.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    Lifetime& l = p.lifetimes[i];
    if (l.end <= l.start) l.end = l.start + 1;  // an alloc with its free right after still exists
    p.sizes[i] = align_up(l.bytes, alignment);
  }

  // Lower bound: the most bytes live after any event.
  std::uint64_t horizon = p.events;
  for (const Lifetime& l : p.lifetimes) horizon = std::max(horizon, l.end);
  std::vector<std::int64_t> delta(horizon + 1, 0);
  for (std::size_t i = 0; i < n; ++i) {
    delta[p.lifetimes[i].start] += static_cast<std::int64_t>(p.sizes[i]);
    delta[p.lifetimes[i].end] -= static_cast<std::int64_t>(p.sizes[i]);
  }
  std::int64_t live = 0;
  for (std::uint64_t t = 0; t < horizon; ++t) {
    live += delta[t];
    if (static_cast<std::uint64_t>(live) > p.max_live_bytes) {
      p.max_live_bytes = static_cast<std::uint64_t>(live);
      p.max_live_event = t;
    }
  }

  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    const Lifetime &x = p.lifetimes[a], &y = p.lifetimes[b];
    if (p.sizes[a] != p.sizes[b]) return p.sizes[a] > p.sizes[b];
    if (x.end - x.start != y.end - y.start) return x.end - x.start > y.end - y.start;
    if (x.start != y.start) return x.start < y.start;
    return a < b;
  });

  constexpr std::uint64_t kBuckets = 1024;
  const std::uint64_t width = std::max<std::uint64_t>(1, (horizon + kBuckets - 1) / kBuckets);
  std::vector<std::vector<std::uint32_t>> buckets(horizon / width + 1);
  std::vector<std::uint32_t> stamp(n, std::numeric_limits<std::uint32_t>::max());
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;  // [offset, end) of overlapping
  for (std::uint32_t rank = 0; rank < n; ++rank) {
    const std::uint32_t i = order[rank];
    const Lifetime& l = p.lifetimes[i];
    const std::uint64_t b0 = l.start / width, b1 = (l.end - 1) / width;
    ranges.clear();
    for (std::uint64_t b = b0; b <= b1; ++b) {
      for (std::uint32_t j : buckets[b]) {
        if (stamp[j] == rank) continue;
        stamp[j] = rank;
        const Lifetime& o = p.lifetimes[j];
        if (o.start < l.end && l.start < o.end)
          ranges.emplace_back(p.offsets[j], p.offsets[j] + p.sizes[j]);
      }
    }
    std::sort(ranges.begin(), ranges.end());
    std::uint64_t best = kNone, best_gap = kNone, top = 0;
    for (const auto& [lo, hi] : ranges) {
      if (lo > top && lo - top >= p.sizes[i] && lo - top < best_gap) {
        best_gap = lo - top;
        best = top;
      }
      top = std::max(top, hi);
    }
    p.offsets[i] = best != kNone ? best : top;
    p.peak_bytes = std::max(p.peak_bytes, p.offsets[i] + p.sizes[i]);
    for (std::uint64_t b = b0; b <= b1; ++b) buckets[b].push_back(i);
  }
  return p;
}

double static_fragmentation_at(const StaticPlan& p, std::uint64_t t) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
  std::uint64_t used = 0;
  for (std::size_t i = 0; i < p.lifetimes.size(); ++i) {
    if (p.lifetimes[i].start <= t && t < p.lifetimes[i].end) {
      live.emplace_back(p.offsets[i], p.offsets[i] + p.sizes[i]);
      used += p.sizes[i];
    }
  }
  std::sort(live.begin(), live.end());
  std::uint64_t top = 0, largest = 0;
  for (const auto& [lo, hi] : live) {
    if (lo > top) largest = std::max(largest, lo - top);
    top = std::max(top, hi);
  }
  if (p.peak_bytes > top) largest = std::max(largest, p.peak_bytes - top);
  return fragmentation(largest, p.peak_bytes - used);
}

AllocatorFigures replay_pool(const Lifetimes& lt, const PoolConfig& config, std::string name,
                             const std::vector<std::uint64_t>& sample_events,
                             std::uint64_t max_live_event) {
  AllocatorFigures f;
  f.name = std::move(name);
  constexpr std::uint64_t kGranularity = 2 * MiB;  // CUDA's and ACL's VMM granularity
  PoolConfig cfg = config;
  if (cfg.expandable_segments && cfg.expandable_reserve == 0) {
    // The virtual range must hold everything at once in the worst case.
    std::uint64_t total = 0;
    for (const Lifetime& l : lt.items) total += align_up(l.bytes, cfg.alignment);
    cfg.expandable_reserve = align_up(total + kGranularity, kGranularity);
  }
  VirtualSegmentSource src(kGranularity);
  DevicePool pool(src, cfg);
  const std::size_t n = lt.items.size();
  std::vector<std::uint32_t> by_start(n), by_end(n);
  std::iota(by_start.begin(), by_start.end(), 0);
  std::iota(by_end.begin(), by_end.end(), 0);
  auto end_of = [&](std::uint32_t i) { return std::max(lt.items[i].end, lt.items[i].start + 1); };
  std::sort(by_start.begin(), by_start.end(), [&](std::uint32_t a, std::uint32_t b) {
    if (lt.items[a].start != lt.items[b].start) return lt.items[a].start < lt.items[b].start;
    return end_of(a) > end_of(b);  // whole-trace lifetimes first
  });
  std::sort(by_end.begin(), by_end.end(),
            [&](std::uint32_t a, std::uint32_t b) { return end_of(a) < end_of(b); });
  std::vector<PoolAllocation> held(n);
  std::size_t ps = 0, pe = 0, sample = 0;
  double frag_sum = 0;
  for (std::uint64_t t = 0; t < lt.events && ok(f.status); ++t) {
    for (; pe < n && end_of(by_end[pe]) <= t; ++pe) {
      if (held[by_end[pe]]) pool.free(held[by_end[pe]]);
    }
    for (; ps < n && lt.items[by_start[ps]].start <= t; ++ps) {
      f.status = pool.allocate(lt.items[by_start[ps]].bytes, &held[by_start[ps]]);
      if (!ok(f.status)) break;
    }
    if (t == max_live_event || (sample < sample_events.size() && sample_events[sample] == t)) {
      double frag = pool.stats().fragmentation;
      if (t == max_live_event) f.fragmentation_at_max_live = frag;
      if (sample < sample_events.size() && sample_events[sample] == t) {
        frag_sum += frag;
        ++sample;
      }
    }
  }
  PoolStats s = pool.stats();
  f.peak_bytes = s.peak_reserved_bytes;
  f.source_calls = s.source_calls;
  f.mean_fragmentation = sample ? frag_sum / static_cast<double>(sample) : 0;
  return f;
}

PlanComparison compare_static_dynamic(const trace::Trace& t, const PoolConfig& base,
                                      std::uint32_t samples, std::string_view source) {
  base.validate();
  PlanComparison c;
  Lifetimes lt = tensor_lifetimes(t, source);
  c.plan = plan_static(lt, base.alignment);
  std::vector<std::uint64_t> sample_events;
  const std::uint64_t s = std::min<std::uint64_t>(samples, lt.events);
  for (std::uint64_t k = 0; k < s; ++k) sample_events.push_back(k * lt.events / s);
  c.samples = sample_events.size();

  AllocatorFigures st;
  st.name = "static plan";
  st.peak_bytes = c.plan.peak_bytes;
  st.fragmentation_at_max_live = static_fragmentation_at(c.plan, c.plan.max_live_event);
  double sum = 0;
  for (std::uint64_t e : sample_events) sum += static_fragmentation_at(c.plan, e);
  st.mean_fragmentation =
      sample_events.empty() ? 0 : sum / static_cast<double>(sample_events.size());
  c.rows.push_back(st);

  PoolConfig plain = base, expandable = base;
  plain.expandable_segments = false;
  expandable.expandable_segments = true;
  c.rows.push_back(replay_pool(lt, plain, "pool, segments", sample_events, c.plan.max_live_event));
  c.rows.push_back(replay_pool(lt, expandable, "pool, expandable segments", sample_events,
                               c.plan.max_live_event));
  return c;
}

}  // namespace u3m::mem
