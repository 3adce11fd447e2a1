// The trace's side of the training bound (Note [Traffic lower bound] in
// traffic_bound.cpp): the fewest bytes any schedule must move over the host
// link and the SSD per steady-state iteration, from the order in which the
// iteration uses its tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "u3m/engine/steps.hpp"
#include "u3m/trace/model.hpp"

namespace u3m::experiments {

// One request to a tier of `capacity` bytes, in order.
//  use:    the tensor's data must be in the tier (fetched if it is not);
//  create: the tensor gets new data in the tier (nothing fetched, room taken);
//  drop:   the tensor is freed: its bytes leave the tier;
//  stale:  the tensor was rewritten elsewhere: the tier's copy is void.
struct BoundRequest {
  enum class Kind : std::uint8_t { use, create, drop, stale };
  Kind kind = Kind::use;
  std::uint32_t tensor = 0;
};

// The bytes fetched by byte-granular Belady (evict the bytes whose next use
// is farthest) over `requests`, starting empty: the fewest any policy with
// that capacity fetches, as each byte may go on its own (a relaxation of
// whole tensors). `bytes` is indexed by tensor.
std::uint64_t belady_fetch_bytes(const std::vector<BoundRequest>& requests,
                                 const std::vector<std::uint64_t>& bytes, std::uint64_t capacity);

// The unavoidable bytes of one steady-state iteration, per card.
struct TrafficBound {
  std::uint64_t h2d = 0;        // into HBM
  std::uint64_t d2h = 0;        // device-written data a host op reads
  std::uint64_t ssd_read = 0;   // into HBM + DRAM
  std::uint64_t ssd_write = 0;  // new data alive at the end beyond HBM + DRAM
  // The span's steps that only create tensors: the step driver runs them
  // without compute (engine::creates_only), so a bound charges none.
  std::vector<std::uint8_t> creates_only;  // by step - span_begin
};

struct TrafficInputs {
  const trace::Trace& trace;
  const std::vector<engine::Step>& steps;    // build_steps(trace)
  std::size_t span_begin = 0, span_end = 0;  // the iteration's steps [begin, end)
  bool host_optimizer = false;               // optimizer-phase ops run on the host
  std::uint64_t hbm = 0, dram = 0;           // per card
  std::uint32_t repeats = 16;                // R of the note
};
TrafficBound traffic_bound(const TrafficInputs& in);

}  // namespace u3m::experiments
