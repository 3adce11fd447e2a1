#include "u3m/experiments/traffic_bound.hpp"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "u3m/policy/tiering.hpp"

namespace u3m::experiments {

// Note [Traffic lower bound]
// What must cross a link whatever the schedule, from the order of uses.
// A tier of capacity C serves a sequence of uses; a byte not in the tier at
// its use crosses the link into it. Treating every byte as a page of its
// own relaxes the problem (a real policy moves whole tensors, or at least
// whole blocks), and for unit pages Belady (evict the page used farthest
// ahead) fetches the fewest: so byte-granular Belady's count is no more
// than any real policy's. Uses of one op are served one after another, so
// a byte the op has already used may go before the op's next use arrives:
// a further relaxation, still a lower bound.
//
// A training step is one iteration of a loop that runs for hours, so the
// bound is on the sustained rate: the iteration's requests repeated R
// times, starting empty, cost B_R; any schedule that repeats each R
// iterations starts them with at most C bytes in the tier, so it moves at
// least (B_R - C) / R per iteration. R = 16 leaves C / 16 of slack. (A single
// iteration measured after a warm-up could in principle borrow up to C of
// state from the one before; the simulator's figures are one such
// iteration, and TrainBound.NoPolicyBeatsTheBoundAtItsShape holds them to
// the bound.)
//
// Two tiers, two relaxations, each a lower bound on its link:
//  * HBM (C = H): device ops use their tensors on the device. A tensor an
//    op first writes without reading (produced, overwritten) is created: it
//    takes room, nothing is fetched. With the optimizer on the host, its
//    ops are not device uses: what they rewrite (weights, master, moments)
//    makes the device copy stale, and a gradient a device op wrote must
//    cross the d2h link before a host op reads it (d2h).
//  * HBM + DRAM (C = H + D): every op uses its tensors in the fast tiers;
//    what is fetched comes from the SSD (ssd_read). And the bytes the
//    iteration writes that are still alive at its end must rest somewhere:
//    beyond H + D of them were written to the SSD during the iteration
//    (ssd_write).
// Tensors live from their first touch to their free. At each repetition's
// start, what the iteration created and left alive is dropped and what it
// freed is created anew at its first touch, free of charge (it is the
// previous iteration's data under another id): both undercount, neither
// overcounts.

std::uint64_t belady_fetch_bytes(const std::vector<BoundRequest>& requests,
                                 const std::vector<std::uint64_t>& bytes, std::uint64_t capacity) {
  using Kind = BoundRequest::Kind;
  constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();
  // next[p]: the position of the tensor's next use after p within this
  // life of its data (a drop, stale or create ends it), kNever if none.
  std::vector<std::uint64_t> next(requests.size(), kNever);
  std::vector<std::uint64_t> ahead(bytes.size(), kNever);
  for (std::size_t p = requests.size(); p-- > 0;) {
    const BoundRequest& r = requests[p];
    switch (r.kind) {
      case Kind::use:
        next[p] = ahead[r.tensor];
        ahead[r.tensor] = p;
        break;
      case Kind::create:
        next[p] = ahead[r.tensor];
        ahead[r.tensor] = kNever;
        break;
      case Kind::drop:
      case Kind::stale:
        ahead[r.tensor] = kNever;
        break;
    }
  }
  std::vector<std::uint64_t> held(bytes.size(), 0), key(bytes.size(), kNever);
  std::set<std::pair<std::uint64_t, std::uint32_t>> order;  // (next use, tensor) of held tensors
  std::uint64_t used = 0, fetched = 0;
  auto forget = [&](std::uint32_t t) {
    if (held[t] == 0) return;
    order.erase({key[t], t});
    used -= held[t];
    held[t] = 0;
  };
  for (std::size_t p = 0; p < requests.size(); ++p) {
    const BoundRequest& r = requests[p];
    const std::uint32_t t = r.tensor;
    if (r.kind == Kind::drop || r.kind == Kind::stale) {
      forget(t);
      continue;
    }
    if (r.kind == Kind::create) forget(t);  // the old data is dead
    const std::uint64_t b = bytes[t];
    const std::uint64_t missing = b - held[t];
    if (r.kind == Kind::use) fetched += missing;
    if (held[t] > 0) order.erase({key[t], t});
    used -= held[t];
    // Room for the whole tensor (or all of the tier, if it is larger):
    // bytes used farthest ahead go first.
    const std::uint64_t want = std::min(b, capacity);
    while (used + want > capacity && !order.empty()) {
      auto far = std::prev(order.end());
      const std::uint32_t v = far->second;
      const std::uint64_t take = std::min(held[v], used + want - capacity);
      held[v] -= take;
      used -= take;
      if (held[v] == 0) order.erase(far);
    }
    held[t] = want;
    used += want;
    key[t] = next[p];
    if (want > 0) order.insert({key[t], t});
  }
  return fetched;
}

namespace {

struct SpanSim {
  std::vector<BoundRequest> device, fast;
  std::uint64_t d2h = 0;
};

}  // namespace

TrafficBound traffic_bound(const TrafficInputs& in) {
  using Kind = BoundRequest::Kind;
  const trace::Trace& tr = in.trace;
  const std::size_t n = tr.tensors.size();
  std::vector<std::uint64_t> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = tr.tensors[i].bytes;
  // Alive at the span's start: touched before it and not freed since.
  std::vector<std::uint8_t> alive(n, 0);
  for (std::size_t j = 0; j < in.span_begin && j < in.steps.size(); ++j) {
    for (const engine::Touch& x : in.steps[j].touches) alive[x.tensor] = 1;
    for (std::uint32_t f : in.steps[j].frees) alive[f] = 0;
  }
  const std::vector<std::uint8_t> at_start = alive;
  // reads[j]: per touch of step j, whether the op reads the tensor.
  std::vector<std::uint32_t> read_stamp(n, UINT32_MAX);
  std::vector<std::vector<std::uint8_t>> reads(in.span_end - in.span_begin);
  for (std::size_t j = in.span_begin; j < in.span_end; ++j) {
    const engine::Step& s = in.steps[j];
    const std::uint64_t first = j == 0 ? 0 : in.steps[j - 1].end_event;
    for (std::uint64_t e = first; e < s.end_event; ++e)
      if (tr.events[e].kind == trace::EventKind::read)
        read_stamp[tr.events[e].tensor] = static_cast<std::uint32_t>(j);
    auto& r = reads[j - in.span_begin];
    r.resize(s.touches.size());
    for (std::size_t i = 0; i < s.touches.size(); ++i)
      r[i] = read_stamp[s.touches[i].tensor] == static_cast<std::uint32_t>(j);
  }

  TrafficBound out;
  out.creates_only.assign(in.span_end - in.span_begin, 0);
  {
    std::vector<std::uint8_t> a = alive;
    for (std::size_t j = in.span_begin; j < in.span_end; ++j) {
      const engine::Step& s = in.steps[j];
      out.creates_only[j - in.span_begin] =
          engine::creates_only(s, [&](std::uint32_t t) { return a[t] != 0; });
      for (const engine::Touch& x : s.touches) a[x.tensor] = 1;
      for (std::uint32_t f : s.frees) a[f] = 0;
    }
  }
  SpanSim sim;
  std::vector<std::uint8_t> dirty(n, 0);    // the device holds the only current copy
  std::vector<std::uint8_t> written(n, 0);  // written in the last repetition
  for (std::uint32_t rep = 0; rep < std::max(in.repeats, 1u); ++rep) {
    if (rep > 0) {
      for (std::uint32_t t = 0; t < n; ++t) {
        if (alive[t] && !at_start[t]) {
          sim.device.push_back({Kind::drop, t});
          sim.fast.push_back({Kind::drop, t});
          alive[t] = dirty[t] = 0;
        }
      }
    }
    std::fill(written.begin(), written.end(), 0);
    for (std::size_t j = in.span_begin; j < in.span_end; ++j) {
      const engine::Step& s = in.steps[j];
      const bool host = policy::tier_of_op(tr.ops[s.op], in.host_optimizer) == mem::Tier::host;
      const auto& r = reads[j - in.span_begin];
      for (std::size_t i = 0; i < s.touches.size(); ++i) {
        const std::uint32_t t = s.touches[i].tensor;
        const bool w = s.touches[i].writes, rd = r[i] && alive[t];
        alive[t] = 1;
        if (w) written[t] = 1;
        sim.fast.push_back({rd ? Kind::use : Kind::create, t});
        if (!host) {
          sim.device.push_back({rd ? Kind::use : Kind::create, t});
          if (w) dirty[t] = 1;
          continue;
        }
        if (rd && dirty[t]) sim.d2h += bytes[t];
        dirty[t] = 0;
        if (w) sim.device.push_back({Kind::stale, t});
      }
      for (std::uint32_t f : s.frees) {
        sim.device.push_back({Kind::drop, f});
        sim.fast.push_back({Kind::drop, f});
        alive[f] = dirty[f] = 0;
      }
    }
  }
  const std::uint64_t R = std::max(in.repeats, 1u);
  auto per_iteration = [R](std::uint64_t total, std::uint64_t cap) {
    return total > cap ? (total - cap) / R : 0;
  };
  const std::uint64_t fast_cap = in.hbm + in.dram;
  out.h2d = per_iteration(belady_fetch_bytes(sim.device, bytes, in.hbm), in.hbm);
  out.ssd_read = per_iteration(belady_fetch_bytes(sim.fast, bytes, fast_cap), fast_cap);
  out.d2h = sim.d2h / R;
  std::uint64_t kept = 0;  // written in an iteration and alive at its end
  for (std::uint32_t t = 0; t < n; ++t)
    if (alive[t] && written[t]) kept += bytes[t];
  out.ssd_write = kept > fast_cap ? kept - fast_cap : 0;
  return out;
}

}  // namespace u3m::experiments
