#include "u3m/engine/replay.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "u3m/mem/backend_source.hpp"
#include "u3m/mem/device_emu.hpp"
#include "u3m/mem/host.hpp"
#include "u3m/mem/ssd_store.hpp"
#include "u3m/util/error.hpp"

namespace u3m::engine {
namespace {

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Contents unique to (tensor, version), word by word; a short tail byte-wise.
void fill(void* p, std::uint64_t bytes, std::uint64_t id, std::uint64_t version) {
  const std::uint64_t seed = mix(id ^ mix(version));
  auto* b = static_cast<unsigned char*>(p);
  std::uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w = seed + i;
    std::memcpy(b + i, &w, 8);
  }
  for (; i < bytes; ++i) b[i] = static_cast<unsigned char>((seed + i) >> 3);
}
bool check(const void* p, std::uint64_t bytes, std::uint64_t id, std::uint64_t version) {
  const std::uint64_t seed = mix(id ^ mix(version));
  auto* b = static_cast<const unsigned char*>(p);
  std::uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, b + i, 8);
    if (w != seed + i) return false;
  }
  for (; i < bytes; ++i) {
    if (b[i] != static_cast<unsigned char>((seed + i) >> 3)) return false;
  }
  return true;
}

}  // namespace

std::uint64_t trace_footprint(const trace::Trace& trace) {
  std::vector<std::uint8_t> live(trace.tensors.size(), 0);
  std::uint64_t now = 0, peak = 0;
  for (const trace::Event& ev : trace.events) {
    const std::uint64_t b = trace.tensors[ev.tensor].bytes;
    if (ev.kind == trace::EventKind::free) {
      if (live[ev.tensor]) now -= b;
      live[ev.tensor] = 0;
    } else if (!live[ev.tensor]) {
      live[ev.tensor] = 1;
      now += b;
      peak = std::max(peak, now);
    }
  }
  return peak;
}

// Note [Replay under a budget]
// Each op's events are one unit: the op acquires every tensor it touches on
// the device (a write lease if it writes the tensor, else a read lease),
// checks what it reads, writes new versions, and releases everything when the
// op ends, so an op's inputs and outputs are co-resident as on a real device.
// Before op j runs, the tensors of op j + lookahead are prefetched: the trace
// is its own predictor (the trace-replay baseline), enough to show overlap;
// the policy layer's predictors plug in the same way.
ReplayReport replay_trace(const trace::Trace& trace, const ReplayOptions& o,
                          const ReplayProgress& progress) {
  ReplayReport rep;
  for (const trace::Tensor& t : trace.tensors) {
    if (t.bytes == 0) input_error("trace", "tensor '{}' has 0 bytes; cannot replay it", t.name);
  }
  rep.footprint = trace_footprint(trace);
  rep.tensors = trace.tensors.size();
  const std::uint64_t fp = std::max<std::uint64_t>(rep.footprint, 1);
  rep.device_budget = o.device_budget ? o.device_budget
                                      : std::max<std::uint64_t>(
                                            static_cast<std::uint64_t>(o.device_fraction * fp), 1);
  // Twice the footprint by default: a host budget of exactly the footprint
  // sits above its high watermark and churns write-backs (seen in simulation).
  rep.host_budget = o.host_budget ? o.host_budget : 2 * fp;
  rep.ssd_capacity =
      o.ssd_dir.empty() ? 0 : (o.ssd_capacity ? o.ssd_capacity : 2 * fp + (64 << 20));

  // The real stack: emulated HBM behind the pool, pinned host, SSD store.
  mem::DeviceEmuOptions dopt;
  dopt.capacity = 2 * rep.device_budget + 64 * mem::MiB;  // the pool's rounding slack
  dopt.throttle_bytes_per_s[static_cast<int>(mem::CopyKind::h2d)] = o.h2d_gbps * 1e9;
  dopt.throttle_bytes_per_s[static_cast<int>(mem::CopyKind::d2h)] = o.d2h_gbps * 1e9;
  mem::DeviceEmuBackend device(dopt);
  mem::BackendSegmentSource source(device);
  mem::PoolConfig pc;
  pc.capacity = dopt.capacity;
  pc.expandable_segments = o.expandable_segments && source.supports_vmm();
  mem::DevicePool pool(source, pc);
  mem::HostBackend host(mem::HostOptions{});
  std::unique_ptr<mem::SsdStore> ssd;
  if (!o.ssd_dir.empty()) {
    mem::SsdStoreOptions so;
    so.path = o.ssd_dir + "/u3m-replay.ssd";
    so.capacity = rep.ssd_capacity;
    std::string why;
    if (!mem::ok(mem::SsdStore::open(so, ssd, &why)))
      input_error(o.ssd_dir, "cannot open the SSD tier there: {}", why);
  }
  BackendTransport transport(device, ssd.get());
  SteadyClock clock;
  EngineConfig cfg;
  cfg.device.capacity = rep.device_budget;
  cfg.host.capacity = rep.host_budget;
  Engine engine(cfg, pool, host, transport, clock);

  const auto& ev = trace.events;
  const std::uint64_t n =
      o.max_events ? std::min<std::uint64_t>(o.max_events, ev.size()) : ev.size();
  // Op boundaries: runs of consecutive events of one op.
  std::vector<std::uint64_t> starts;
  for (std::uint64_t i = 0; i < n; ++i) {
    if (i == 0 || ev[i].op != ev[i - 1].op) starts.push_back(i);
  }
  starts.push_back(n);
  rep.ops = starts.size() - 1;

  std::vector<std::uint64_t> version(trace.tensors.size(), 0);  // 0 = never written
  std::vector<std::uint8_t> registered(trace.tensors.size(), 0);
  auto id_of = [&](std::uint32_t t) { return static_cast<TensorId>(t) + 1; };
  auto ensure = [&](std::uint32_t t) {
    if (!registered[t]) {
      // add() fails only for a freed tensor not yet removed; the entry is
      // reused, and its first lease below writes fresh contents.
      engine.add(id_of(t), trace.tensors[t].bytes);
      registered[t] = 1;
    }
  };
  auto fail = [&](std::string what) {
    if (rep.first_error.empty()) rep.first_error = std::move(what);
    ++rep.errors;
  };

  const auto t0 = std::chrono::steady_clock::now();
  std::unordered_map<std::uint32_t, bool> touched;  // tensor -> writes, within one op
  std::vector<Lease> leases;
  // A freed tensor whose write-back is still in flight is removed later.
  std::vector<std::uint32_t> deferred;
  auto retry_removals = [&] {
    std::erase_if(deferred, [&](std::uint32_t t) {
      if (registered[t]) return true;  // allocated again meanwhile: it lives on
      Status s = engine.remove(id_of(t));
      if (s == Status::busy) return false;
      if (!mem::ok(s) && s != Status::not_found)
        fail(fmt::format("free '{}': {}", trace.tensors[t].name, mem::to_string(s)));
      return true;
    });
  };
  for (std::size_t op = 0; op + 1 < starts.size(); ++op) {
    touched.clear();
    std::vector<std::uint32_t> frees;
    for (std::uint64_t i = starts[op]; i < starts[op + 1]; ++i) {
      const trace::Event& e = ev[i];
      switch (e.kind) {
        case trace::EventKind::alloc:
          ensure(e.tensor);
          break;
        case trace::EventKind::read:
          ensure(e.tensor);
          touched.try_emplace(e.tensor, false);
          break;
        case trace::EventKind::write:
          ensure(e.tensor);
          touched[e.tensor] = true;
          break;
        case trace::EventKind::free:
          frees.push_back(e.tensor);
          break;
      }
    }
    leases.clear();
    for (auto [t, writes] : touched) {
      // A tensor read before anything wrote it (a parameter, an input) gets
      // its first contents here.
      const bool init = version[t] == 0;
      Lease l;
      Status s =
          engine.acquire(id_of(t), Tier::device, writes || init ? Access::write : Access::read, &l);
      if (!mem::ok(s)) {
        fail(fmt::format("op {} tensor '{}': {}", op, trace.tensors[t].name, mem::to_string(s)));
        continue;
      }
      if (!init) {
        if (check(l.ptr, l.bytes, t, version[t]))
          rep.bytes_verified += l.bytes;
        else
          ++rep.mismatches;
      }
      if (writes || init) {
        fill(l.ptr, l.bytes, t, ++version[t]);
        rep.bytes_written += l.bytes;
      }
      leases.push_back(l);
    }
    // Prefetch while this op holds its leases: room made now cannot be taken
    // from this op's own inputs (they are pinned), only from colder data.
    if (o.lookahead && op + o.lookahead + 1 < starts.size()) {
      const std::size_t ahead = op + o.lookahead;
      for (std::uint64_t i = starts[ahead]; i < starts[ahead + 1]; ++i) {
        const std::uint32_t t = ev[i].tensor;
        if (registered[t] && version[t]) engine.prefetch(id_of(t), Tier::device);
      }
    }
    for (const Lease& l : leases) engine.release(l);
    for (std::uint32_t t : frees) {
      if (!registered[t]) continue;
      registered[t] = 0;
      version[t] = 0;
      deferred.push_back(t);
    }
    retry_removals();
    rep.events = starts[op + 1];
    if (progress && (op & 255) == 0) progress(rep.events, n);
  }
  engine.drain();
  retry_removals();
  if (!deferred.empty())
    fail(fmt::format("{} freed tensors could not be removed", deferred.size()));
  rep.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rep.engine = engine.stats();
  rep.device = engine.monitor(Tier::device);
  rep.host = engine.monitor(Tier::host);
  rep.pool = pool.stats();
  return rep;
}

}  // namespace u3m::engine
