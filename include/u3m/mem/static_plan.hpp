// A static memory plan computed ahead of time from a trace: every tensor
// lifetime gets a fixed offset in one arena, so that tensors alive at the same
// time never share bytes. Compared with the dynamic pool (DevicePool replaying
// the same alloc/free sequence over a VirtualSegmentSource) on peak bytes and
// fragmentation. docs/memory.md ("Pool allocator") shows figures.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "u3m/mem/pool.hpp"
#include "u3m/trace/model.hpp"

namespace u3m::mem {

// One lifetime of one tensor: live over event indices [start, end). A tensor
// allocated every step has one lifetime per step (occurrence 0, 1, ...).
struct Lifetime {
  std::uint32_t tensor = 0;      // index into Trace::tensors
  std::uint32_t occurrence = 0;  // how many lifetimes of this tensor came before
  std::uint64_t start = 0, end = 0;
  std::uint64_t bytes = 0;  // Tensor::bytes
};

// Note [Tensor lifetimes]
// From the events, in order (index = time):
//  * alloc opens a lifetime, free closes it; a lifetime still open at the end
//    lasts to the end (end = number of events);
//  * a tensor that is read or written but never allocated anywhere in the
//    trace (parameters, inputs) lives for the whole trace [0, events);
//  * a read or write of a tensor that has allocs, while it is not live, opens
//    a lifetime there (counted in `implicit`: the trace uses a freed tensor);
//  * alloc of a live tensor and free of a dead one are errors (InputError
//    naming `source`, the event index and the tensor).
// Tensors of 0 bytes get no lifetime.
struct Lifetimes {
  std::vector<Lifetime> items;
  std::uint64_t events = 0;
  std::uint64_t implicit = 0;  // lifetimes opened by an access, not an alloc
};
Lifetimes tensor_lifetimes(const trace::Trace& t, std::string_view source = "trace");

struct StaticPlan {
  std::vector<Lifetime> lifetimes;
  std::vector<std::uint64_t> sizes;    // bytes rounded up to the alignment
  std::vector<std::uint64_t> offsets;  // parallel to lifetimes; multiples of the alignment
  std::uint64_t alignment = 512;
  std::uint64_t events = 0;
  std::uint64_t peak_bytes = 0;      // arena size: max(offset + size)
  std::uint64_t max_live_bytes = 0;  // most rounded bytes live at once: a lower bound on any plan
  std::uint64_t max_live_event = 0;  // the event where that happens
  std::string algorithm;
};

// Note [Static plan heuristic] in static_plan.cpp: greedy by size, best-fit
// into gaps. `alignment` must be a power of two.
StaticPlan plan_static(const Lifetimes& lt, std::uint64_t alignment = 512);

// Peak and fragmentation of one allocator on one trace.
struct AllocatorFigures {
  std::string name;
  std::uint64_t peak_bytes = 0;          // arena size (static) or peak reserved bytes (pool)
  double fragmentation_at_max_live = 0;  // at the event of most live bytes
  double mean_fragmentation = 0;         // averaged over evenly spaced events
  std::uint64_t source_calls = 0;        // pool only
  Status status = Status::ok;            // a pool that ran out of memory says so
};

struct PlanComparison {
  StaticPlan plan;
  std::vector<AllocatorFigures> rows;  // static plan, then each pool config
  std::uint64_t samples = 0;           // events sampled for mean_fragmentation
};

// Fragmentation (1 - largest_free / free, over the arena [0, peak)) of the
// plan after event `t`.
double static_fragmentation_at(const StaticPlan& p, std::uint64_t t);

// Replays the lifetimes through a DevicePool over a VirtualSegmentSource
// (nothing is touched): at each event, lifetimes ending there are freed, then
// those starting there allocated; whole-trace lifetimes first.
AllocatorFigures replay_pool(const Lifetimes& lt, const PoolConfig& config, std::string name,
                             const std::vector<std::uint64_t>& sample_events,
                             std::uint64_t max_live_event);

// The plan (at the pool's alignment) next to the pool with plain segments and
// with expandable segments (`base` otherwise). Fragmentation is sampled at up
// to `samples` evenly spaced events.
PlanComparison compare_static_dynamic(const trace::Trace& t, const PoolConfig& base = {},
                                      std::uint32_t samples = 256,
                                      std::string_view source = "trace");

}  // namespace u3m::mem
