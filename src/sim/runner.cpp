#include "u3m/sim/runner.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>

#include "u3m/engine/replay.hpp"
#include "u3m/sim/cost.hpp"
#include "u3m/sim/sim_host.hpp"
#include "u3m/sim/virtual_time.hpp"
#include "u3m/util/error.hpp"

namespace u3m::sim {

using engine::Access;
using engine::Lease;
using engine::Tier;

PrefetchHook no_prefetch() {
  return [](std::size_t, PrefetchContext&) {};
}

PrefetchHook lookahead_prefetch(unsigned k) {
  if (k == 0) return no_prefetch();
  return [k](std::size_t j, PrefetchContext& ctx) {
    const auto& steps = ctx.steps();
    // Each step is prefetched once, k steps ahead; the first step also
    // covers the k steps that no earlier step reached.
    const std::size_t first = j == 0 ? 1 : j + k;
    for (std::size_t a = first; a <= j + k && a < steps.size(); ++a) {
      if (ctx.step_tier(a) != Tier::device) continue;
      for (const Touch& t : steps[a].touches) ctx.prefetch(t.tensor);
    }
  };
}

namespace {

std::uint64_t seconds_to_ns(double s, const trace::Op& op) {
  if (!std::isfinite(s) || s < 0)
    input_error("simulate", "op '{}': compute time {} s is not a finite number >= 0", op.name, s);
  return static_cast<std::uint64_t>(std::llround(s * 1e9));
}

OpTimeFn compute_model(const SimOptions& o) {
  if (o.op_time) return o.op_time;
  if (o.hw) {
    return [hw = *o.hw](const trace::Op& op) { return op_cost(hw, op).total_s; };
  }
  if (o.flop_rate > 0 || o.mem_bandwidth > 0 || o.op_overhead_s > 0) {
    return [f = o.flop_rate, b = o.mem_bandwidth, c = o.op_overhead_s](const trace::Op& op) {
      return (f > 0 && op.flops > 0 ? op.flops / f : 0.0) +
             (b > 0 ? static_cast<double>(op.bytes) / b : 0.0) + c;
    };
  }
  input_error("simulate",
              "no compute model: give op_time, a hardware profile, or flop_rate / mem_bandwidth");
}

// Note [Simulation loop]
// Each step acquires every tensor it touches on the device with try_acquire
// (a write lease if it writes the tensor or the tensor holds no data yet, as
// replay does), which never blocks: a busy answer has scheduled the demand
// fetch or the eviction that makes room. While any is busy, virtual time
// jumps to the next event (a transfer completion, which lets the engine
// start more); that time is stall. Then the op's compute time passes, with
// transfers completing meanwhile (overlap), and the leases are released. A
// step that can make no progress (nothing granted, no transfer pending, no
// eviction made) cannot run within the budgets: the run stops and says why.
//
// The prefetch hook runs once the step holds its leases, not before: the
// room a prefetch makes is taken from least recently used copies, and
// before the acquire the step's own inputs (often a copy an earlier
// prefetch brought, touched only when it landed) rank among the oldest, so
// prefetching first evicted exactly what the step was about to read.
class Simulation final : public PrefetchContext {
 public:
  Simulation(const trace::Trace& trace, const std::vector<Step>& steps, engine::Engine& eng,
             VirtualTime& vt)
      : trace_(trace),
        steps_(steps),
        eng_(eng),
        vt_(vt),
        registered_(trace.tensors.size(), 0),
        has_data_(trace.tensors.size(), 0),
        removing_(trace.tensors.size(), 0) {}

  const std::vector<Step>& steps() const override { return steps_; }
  const trace::Trace& trace() const override { return trace_; }
  const engine::Engine& engine() const override { return eng_; }
  std::uint64_t now_ns() const override { return vt_.now_ns(); }
  Tier step_tier(std::size_t step) const override {
    return op_tier_ ? op_tier_(trace_.ops[steps_[step].op]) : Tier::device;
  }
  void set_op_tier(std::function<Tier(const trace::Op&)> f) { op_tier_ = std::move(f); }
  void prefetch(std::uint32_t t) override {
    if (registered_[t] && has_data_[t] && !removing_[t]) eng_.prefetch(id(t), Tier::device);
  }
  void demote(std::uint32_t t, Tier from) override {
    if (registered_[t] && has_data_[t] && !removing_[t]) eng_.evict(id(t), from);
  }

  // A step that only creates tensors, with a home for each: created one at a
  // time where they rest (SimOptions::home_tier). Returns "" or why not.
  std::string materialize(std::size_t j, const std::function<Tier(const trace::Tensor&)>& home) {
    const Step& s = steps_[j];
    for (const Touch& t : s.touches) {
      ensure(t.tensor);
      Lease l;
      for (;;) {
        const engine::Status st =
            eng_.try_acquire(id(t.tensor), home(trace_.tensors[t.tensor]), Access::write, &l);
        if (mem::ok(st)) break;
        if (st != engine::Status::busy || !vt_.run_next())
          return fmt::format("step {}: cannot create '{}' in its home tier: {}", j,
                             trace_.tensors[t.tensor].name, mem::to_string(st));
      }
      eng_.release(l);
      has_data_[t.tensor] = 1;
    }
    return {};
  }
  bool creates_only(std::size_t j) const {
    const Step& s = steps_[j];
    if (s.touches.empty()) return false;
    for (const Touch& t : s.touches) {
      if (!t.writes || has_data_[t.tensor]) return false;
    }
    return true;
  }

  // Runs one step; returns "" or why it could not run.
  std::string run_step(std::size_t j, const OpTimeFn& op_time, const PrefetchHook& hook,
                       const std::function<Tier(const trace::Op&)>& op_tier, SimReport& rep) {
    const Step& s = steps_[j];
    const trace::Op& op = trace_.ops[s.op];
    const Tier tier = op_tier ? op_tier(op) : Tier::device;
    OpFamilyReport& fam = family(op.name);
    ++fam.steps;
    leases_.assign(s.touches.size(), Lease{});
    missed_.assign(s.touches.size(), 0);
    std::size_t held = 0;
    for (const Touch& t : s.touches) ensure(t.tensor);
    const std::uint64_t t0 = vt_.now_ns();
    std::string error;
    auto cannot_place = [&](const char* why) {
      std::uint64_t need = 0;
      for (const Touch& t : s.touches) need += trace_.tensors[t.tensor].bytes;
      return fmt::format(
          "step {} op '{}': its {} tensors ({} bytes) cannot all be placed on the device: {} "
          "(device budget {} bytes, host budget {} bytes, SSD {} bytes)",
          j, op.name, s.touches.size(), need, why, rep.device_budget, rep.host_budget,
          rep.ssd_capacity);
    };
    if (tier == Tier::device) {
      std::uint64_t need = 0;
      for (const Touch& t : s.touches) need += trace_.tensors[t.tensor].bytes;
      if (need > rep.device_budget) error = cannot_place("together they exceed the budget");
    }
    // Note [No progress]: the step's own tensors can evict each other when
    // they fit only without the space the others' copies take in flight, so
    // fetches complete forever and nothing is granted. A bound on events
    // without a grant ends such a step with an error instead of a hang; it
    // is far above any real wait (the queues ahead of a demand fetch).
    constexpr std::uint64_t kMaxEventsWithoutGrant = 200'000;
    std::uint64_t since_grant = 0;
    while (held < s.touches.size() && error.empty()) {
      const std::uint64_t evictions = eng_.evictions();
      bool granted = false;
      for (std::size_t i = 0; i < s.touches.size(); ++i) {
        if (leases_[i]) continue;
        const Touch& t = s.touches[i];
        const Access a = t.writes || !has_data_[t.tensor] ? Access::write : Access::read;
        const engine::Status st = eng_.try_acquire(id(t.tensor), tier, a, &leases_[i]);
        if (mem::ok(st)) {
          ++held;
          granted = true;
        } else if (st == engine::Status::busy) {
          if (!missed_[i]) fam.missed_bytes += trace_.tensors[t.tensor].bytes;
          missed_[i] = 1;
        } else {
          error = fmt::format("step {} op '{}' tensor '{}': {}", j, op.name,
                              trace_.tensors[t.tensor].name, mem::to_string(st));
          break;
        }
      }
      if (held == s.touches.size() || !error.empty()) break;
      since_grant = granted ? 0 : since_grant + 1;
      if (since_grant > kMaxEventsWithoutGrant) {
        error = cannot_place("they keep evicting each other (no progress in 200,000 events)");
        break;
      }
      if (vt_.run_next()) continue;  // wait for the next completion: stall
      if (!granted && eng_.evictions() == evictions)
        error = cannot_place("nothing is in flight and nothing more can be evicted");
    }
    rep.stall_ns += vt_.now_ns() - t0;
    fam.stall_ns += vt_.now_ns() - t0;
    if (error.empty()) {
      hook(j, *this);  // with this step's tensors pinned: Note [Simulation loop]
      const std::uint64_t dt = seconds_to_ns(op_time(op), op);
      vt_.run_until(vt_.now_ns() + dt);
      rep.compute_ns += dt;
      fam.compute_ns += dt;
      if (op.job == 0) {
        if (rep.iteration_end_ns.size() <= op.iteration)
          rep.iteration_end_ns.resize(op.iteration + 1, 0);
        rep.iteration_end_ns[op.iteration] = vt_.now_ns();
      }
    }
    for (std::size_t i = 0; i < s.touches.size(); ++i) {
      if (!leases_[i]) continue;
      eng_.release(leases_[i]);
      if (error.empty()) has_data_[s.touches[i].tensor] = 1;
    }
    if (!error.empty()) return error;
    for (std::uint32_t t : s.frees) {
      if (registered_[t] && !removing_[t]) {
        removing_[t] = 1;
        removals_.push_back(t);
      }
    }
    retry_removals();
    return {};
  }

  // A freed tensor may still be moving (a write-back in flight): the engine
  // answers busy, and the removal is retried after later steps.
  void retry_removals() {
    std::size_t kept = 0;
    for (std::uint32_t t : removals_) {
      if (!removing_[t]) continue;  // touched again: ensure() took it back
      if (eng_.remove(id(t)) == engine::Status::busy) {
        removals_[kept++] = t;
        continue;
      }
      registered_[t] = has_data_[t] = removing_[t] = 0;
    }
    removals_.resize(kept);
  }

  std::vector<OpFamilyReport> families() const {
    std::vector<OpFamilyReport> out;
    for (const auto& [name, f] : families_) out.push_back(f);
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
      return a.missed_bytes != b.missed_bytes ? a.missed_bytes > b.missed_bytes : a.name < b.name;
    });
    return out;
  }

 private:
  static engine::TensorId id(std::uint32_t t) { return engine_id(t); }

  // "layer_12.attn.q_proj" -> "layer_*.attn.q_proj": one family per op kind.
  // Once per step: the key is built in a reused buffer (op names outgrow the
  // small-string buffer) and looked up by hash.
  OpFamilyReport& family(const std::string& name) {
    auto digit = [&name](std::size_t i) {
      return std::isdigit(static_cast<unsigned char>(name[i])) != 0;
    };
    std::string& key = key_;
    key.clear();
    std::size_t from = 0;  // start of the run not copied yet
    for (std::size_t i = 0; i + 1 < name.size(); ++i) {
      if (name[i] != '_' || !digit(i + 1)) continue;
      key.append(name, from, i + 1 - from);
      key += '*';
      std::size_t j = i + 1;
      while (j < name.size() && digit(j)) ++j;
      from = j;
      i = j - 1;
    }
    key.append(name, from);
    auto [it, inserted] = families_.try_emplace(key);
    if (inserted) it->second.name = key;
    return it->second;
  }

  void ensure(std::uint32_t t) {
    if (removing_[t]) {
      // Freed, then allocated again before its removal went through: the
      // same registration serves the new tensor, whose data is undefined, so
      // its first touch is a write (which drops the stale copies).
      removing_[t] = 0;
      has_data_[t] = 0;
      return;
    }
    if (!registered_[t]) {
      eng_.add(id(t), trace_.tensors[t].bytes);
      registered_[t] = 1;
      has_data_[t] = 0;
    }
  }

  const trace::Trace& trace_;
  const std::vector<Step>& steps_;
  engine::Engine& eng_;
  VirtualTime& vt_;
  std::vector<std::uint8_t> registered_, has_data_, removing_;
  std::vector<std::uint32_t> removals_;
  std::vector<Lease> leases_;
  std::vector<std::uint8_t> missed_;
  std::unordered_map<std::string, OpFamilyReport> families_;  // families() sorts them
  std::string key_;
  std::function<Tier(const trace::Op&)> op_tier_;
};

}  // namespace

SimReport simulate_trace(const trace::Trace& trace, const SimOptions& o) {
  return simulate_trace(trace, build_steps(trace), o);
}

SimReport simulate_trace(const trace::Trace& trace, const std::vector<Step>& steps,
                         const SimOptions& o) {
  SimReport rep;
  const OpTimeFn op_time = compute_model(o);
  const PrefetchHook hook = o.prefetch ? o.prefetch : lookahead_prefetch(o.lookahead);

  rep.tensors = trace.tensors.size();
  rep.footprint = engine::trace_footprint(trace);
  const std::uint64_t fp = std::max<std::uint64_t>(rep.footprint, 1);
  rep.device_budget = o.device_budget ? o.device_budget
                                      : std::max<std::uint64_t>(
                                            static_cast<std::uint64_t>(o.device_fraction * fp), 1);
  rep.host_budget = o.host_budget ? o.host_budget : 2 * fp;
  rep.ssd_capacity = o.links.ssd_capacity;
  rep.links_label = o.links.describe();

  // The same pool setup as engine::replay_trace, over fake addresses.
  VirtualTime vt;
  SimTransport transport(vt, o.links);
  mem::VirtualSegmentSource source(2 * mem::MiB, 0, /*vmm=*/true);
  mem::PoolConfig pc;
  pc.capacity = 2 * rep.device_budget + 64 * mem::MiB;  // the pool's rounding slack
  pc.expandable_segments = true;
  mem::DevicePool pool(source, pc);
  SimHost host(rep.host_budget);
  engine::EngineConfig cfg = o.engine;
  cfg.device.capacity = rep.device_budget;
  cfg.host.capacity = rep.host_budget;
  engine::Engine eng(cfg, pool, host, transport, vt);
  if (o.victim_score) eng.set_victim_score(o.victim_score);
  // Destroyed before the engine: runs every scheduled completion, so the
  // engine's destructor (which waits for transfers in flight) never waits on
  // a clock nobody advances, even when a step throws.
  struct RunEmpty {
    VirtualTime& vt;
    ~RunEmpty() { vt.run_all(); }
  } run_empty{vt};

  Simulation sim(trace, steps, eng, vt);
  sim.set_op_tier(o.op_tier);
  const std::size_t n =
      o.max_steps ? std::min<std::size_t>(o.max_steps, steps.size()) : steps.size();
  for (std::size_t j = 0; j < n; ++j) {
    std::string error = o.home_tier && sim.creates_only(j)
                            ? sim.materialize(j, o.home_tier)
                            : sim.run_step(j, op_time, hook, o.op_tier, rep);
    if (!error.empty()) {
      ++rep.errors;
      rep.first_error = std::move(error);
      break;
    }
    ++rep.steps;
  }
  rep.total_ns = vt.now_ns();
  vt.run_all();
  sim.retry_removals();
  vt.run_all();
  rep.drain_ns = vt.now_ns() - rep.total_ns;

  for (int l = 0; l < kNumLinks; ++l) {
    const SimLinkStats& s = transport.link(static_cast<engine::Link>(l));
    rep.links[l] = SimLinkReport{s.transfers, s.bytes, s.failures, s.busy_ns, s.queue_ns};
  }
  rep.engine = eng.stats();
  rep.peak_device = rep.engine.peak[static_cast<int>(Tier::device)];
  rep.peak_host = rep.engine.peak[static_cast<int>(Tier::host)];
  rep.peak_ssd = transport.ssd_peak();
  rep.events = vt.events_run();
  rep.op_families = sim.families();
  return rep;
}

}  // namespace u3m::sim
