#include "u3m/drive/replay.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <sys/prctl.h>

#include "u3m/engine/real_stack.hpp"
#include "u3m/engine/steps.hpp"
#include "u3m/mem/device_emu.hpp"
#include "u3m/policy/tiering.hpp"
#include "u3m/util/error.hpp"

namespace u3m::drive {

using engine::Access;
using engine::BackendTransport;
using engine::build_steps;
using engine::Engine;
using engine::Lease;
using engine::Link;
using engine::RealStack;
using engine::StackSpec;
using engine::Status;
using engine::Step;
using engine::TensorId;
using engine::Tier;
using engine::Touch;
using engine::trace_footprint;
using engine::Transfer;

namespace {

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Contents unique to (tensor, version): the 8-byte word at offset i holds
// seed + i, a short tail byte-wise. With a stride above 8 only every
// stride-th word is written and checked, plus the last whole word and the
// tail (ReplayOptions::check_stride).
template <typename F>
void for_each_word(std::uint64_t bytes, std::uint64_t stride, F f) {
  std::uint64_t i = 0;
  for (; i + 8 <= bytes; i += stride) f(i);
  if (bytes >= 8 && i - stride != bytes / 8 * 8 - 8) f(bytes / 8 * 8 - 8);
}
void fill(void* p, std::uint64_t bytes, std::uint64_t id, std::uint64_t version,
          std::uint64_t stride) {
  const std::uint64_t seed = mix(id ^ mix(version));
  auto* b = static_cast<unsigned char*>(p);
  for_each_word(bytes, stride, [&](std::uint64_t i) {
    std::uint64_t w = seed + i;
    std::memcpy(b + i, &w, 8);
  });
  for (std::uint64_t i = bytes / 8 * 8; i < bytes; ++i)
    b[i] = static_cast<unsigned char>((seed + i) >> 3);
}
bool check(const void* p, std::uint64_t bytes, std::uint64_t id, std::uint64_t version,
           std::uint64_t stride) {
  const std::uint64_t seed = mix(id ^ mix(version));
  auto* b = static_cast<const unsigned char*>(p);
  std::uint64_t bad = 0;  // no early exit: a mismatch is rare, a branch-free loop is fast
  for_each_word(bytes, stride, [&](std::uint64_t i) {
    std::uint64_t w;
    std::memcpy(&w, b + i, 8);
    bad |= w ^ (seed + i);
  });
  for (std::uint64_t i = bytes / 8 * 8; i < bytes; ++i)
    bad |= b[i] ^ static_cast<unsigned char>((seed + i) >> 3);
  return bad == 0;
}

// Note [All demand fetches at once]
// An op first asks for each of its tensors with try_acquire, which never
// blocks and schedules a demand fetch (or the eviction that makes room) for
// each one not ready, and only then waits, tensor by tensor, for those. One
// blocking acquire after another would issue the second fetch only when the
// first had landed, and the link would idle between them. The simulator
// asks the same way (Note [Simulation loop] in src/sim/runner.cpp): the
// first asks are the same calls in the same order (the differential test
// checks them); after that the replay blocks in acquire where the simulator
// re-polls try_acquire at each completion (issue 15: one driver would end
// that difference). (On the tiny-mha check
// configurations the measured stall barely changed: most ops miss at most one
// tensor there, so the difference shows only for ops that miss several.)
//
// Note [Compute in replay]
// With ReplayOptions::op_time, each op stands for a kernel running on the
// device for that long: from the moment the op holds all its tensors, the
// replay thread sleeps until the op's deadline (sleep_until on steady_clock),
// and releases its leases after. Sleeping, not spinning: on a device the host
// thread waits while the kernel runs, and on a small machine a spinning
// thread would take a core from the copy engines and transport workers that
// the overlap being measured depends on. The replay's own CPU work (checking
// and filling the op's bytes, prefetch calls) runs inside the op's window;
// when it outlasts the op, the excess is counted (overrun), since a device
// would not spend it. The lateness of each wake-up is counted (oversleep).
//
// Note [Timer slack]
// Linux lets a sleep end up to the thread's timer slack late, 50 us by
// default. Every throttled device-emu copy ends in a sleep_until, so with the
// default slack a 4 KiB copy at 4 GB/s took 76 us instead of 1 us (measured
// on the 2-core VM): the slack, not the link, set the cost of small
// transfers, and the compute sleeps above drifted the same way. A timed
// replay (op_time or a throttle) cuts the slack to 1 ns before it creates the
// device-emu and the transport, whose threads inherit it (a new thread copies
// its creator's slack); the same 4 KiB copy then took 16 us, 28 us through
// the transport (the rest is thread hand-offs). The old slack is restored at
// the end.
class TimerSlack {
 public:
  explicit TimerSlack(bool on) {
    if (!on) return;
    const int old = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (old > 0 && prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0) == 0) old_ = old;
  }
  ~TimerSlack() {
    if (old_ > 0) prctl(PR_SET_TIMERSLACK, old_, 0, 0, 0);
  }
  TimerSlack(const TimerSlack&) = delete;
  TimerSlack& operator=(const TimerSlack&) = delete;

 private:
  int old_ = 0;
};

bool timed(const ReplayOptions& o) {
  return o.op_time || o.h2d_gbps > 0 || o.d2h_gbps > 0;
}

// The emulated device a replay with these options runs on, for `bytes` of
// device memory (plus the pool's rounding slack).
mem::DeviceEmuOptions device_options(const ReplayOptions& o, std::uint64_t bytes) {
  mem::DeviceEmuOptions d;
  d.capacity = bytes + 64 * mem::MiB;
  d.throttle_bytes_per_s[static_cast<int>(mem::CopyKind::h2d)] = o.h2d_gbps * 1e9;
  d.throttle_bytes_per_s[static_cast<int>(mem::CopyKind::d2h)] = o.d2h_gbps * 1e9;
  return d;
}

}  // namespace

double transfer_overhead_s(const ReplayOptions& o, std::uint64_t bytes, int reps) {
  if (bytes == 0 || reps <= 0)
    input_error("transfer_overhead_s", "bytes and reps must be > 0, got {} and {}", bytes, reps);
  const TimerSlack slack(timed(o));  // as replay_trace: Note [Timer slack]
  mem::DeviceEmuBackend device(device_options(o, bytes));
  void* dev = nullptr;
  if (!mem::ok(device.allocate(bytes, &dev)))
    throw std::runtime_error("transfer_overhead_s: device-emu allocate failed");
  std::vector<unsigned char> host(bytes, 1);
  BackendTransport transport(device, nullptr);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  transport.set_completion([&](const Transfer&, Status) {
    std::lock_guard g(mu);
    done = true;
    cv.notify_all();
  });
  std::vector<double> rt;
  for (int i = 0; i < reps; ++i) {
    Transfer t;
    t.ticket = static_cast<std::uint64_t>(i) + 1;
    t.link = i % 2 ? Link::d2h : Link::h2d;
    t.bytes = bytes;
    t.src = i % 2 ? dev : static_cast<const void*>(host.data());
    t.dst = i % 2 ? static_cast<void*>(host.data()) : dev;
    const double gbps = i % 2 ? o.d2h_gbps : o.h2d_gbps;
    done = false;
    const auto t0 = std::chrono::steady_clock::now();
    transport.start(t);
    std::unique_lock g(mu);
    cv.wait(g, [&] { return done; });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rt.push_back(s - (gbps > 0 ? static_cast<double>(bytes) / (gbps * 1e9) : 0.0));
  }
  device.free(dev);
  std::nth_element(rt.begin(), rt.begin() + rt.size() / 2, rt.end());
  return std::max(0.0, rt[rt.size() / 2]);
}

// Note [Replay under a budget]
// Each op's events are one unit: the op acquires every tensor it touches in
// the tier its policy runs it in (policy::TieringPolicy::op_tier; a write
// lease if it writes the tensor, else a read lease), checks what it reads,
// writes new versions, and releases everything when the op ends, so an op's
// inputs and outputs are co-resident as on a real device. While op j holds
// its tensors, the policy's on_step runs (prefetch, demotion, scores); a step
// that only creates tensors, under a policy with home tiers, creates each in
// its home tier, one at a time. Tensors are acquired in the order the op
// first touches them. These choices match sim::simulate_trace (Note
// [Simulation loop]), and the policy objects are the simulator's, so the two
// make the same decisions; time differs, and so does the waiting (see Note
// [All demand fetches at once]). One difference on errors: an acquire that
// fails other than for room is counted and the replay goes on, where the
// simulator stops the card.
//
// The policy's view of the replay (policy::StepContext) on the replay's own
// clock: nanoseconds of steady_clock since the replay began.
class ReplayContext final : public policy::StepContext {
 public:
  using Clock = std::chrono::steady_clock;
  ReplayContext(const trace::Trace& t, const std::vector<Step>& steps, Engine& e,
                const policy::TieringPolicy& p, const std::vector<std::uint8_t>& registered,
                const std::vector<std::uint64_t>& version, Clock::time_point t0,
                policy::DriverLog* log)
      : trace_(t), steps_(steps), eng_(e), policy_(p), registered_(registered), version_(version),
        t0_(t0), log_(log) {}
  void at_step(std::size_t step) { step_ = static_cast<std::uint32_t>(step); }
  void record(policy::DriverCall::Kind k, std::uint32_t t, Tier tier = Tier::device,
              bool write = false) {
    if (log_) log_->push_back({k, step_, t, tier, write});
  }
  const std::vector<Step>& steps() const override { return steps_; }
  const trace::Trace& trace() const override { return trace_; }
  const Engine& engine() const override { return eng_; }
  std::uint64_t now_ns() const override {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count());
  }
  Tier step_tier(std::size_t step) const override {
    return policy_.op_tier(trace_.ops[steps_[step].op]);
  }
  void prefetch(std::uint32_t t) override {
    if (!(registered_[t] && version_[t])) return;
    record(policy::DriverCall::Kind::prefetch, t);
    eng_.prefetch(engine_id(t), Tier::device);
  }
  void demote(std::uint32_t t, Tier from) override {
    if (!(registered_[t] && version_[t])) return;
    record(policy::DriverCall::Kind::demote, t, from);
    eng_.evict(engine_id(t), from);
  }
  void publish(std::span<const Engine::ScoreUpdate> scores) override {
    if (log_)
      for (const auto& u : scores) {
        record(policy::DriverCall::Kind::publish, tensor_of(u.id));
        log_->back().score = u.scores.device;
      }
    eng_.publish_scores(scores);
  }

 private:
  const trace::Trace& trace_;
  const std::vector<Step>& steps_;
  Engine& eng_;
  const policy::TieringPolicy& policy_;
  const std::vector<std::uint8_t>& registered_;
  const std::vector<std::uint64_t>& version_;
  Clock::time_point t0_;
  policy::DriverLog* log_;
  std::uint32_t step_ = 0;
};

ReplayReport replay_trace(const trace::Trace& trace, const ReplayOptions& o,
                          const ReplayProgress& progress) {
  ReplayReport rep;
  // First, so a bad trace (a tensor of 0 bytes, a dangling index) fails before
  // any memory is set up.
  const std::uint64_t n = o.max_events ? std::min<std::uint64_t>(o.max_events, trace.events.size())
                                       : trace.events.size();
  const std::vector<Step> steps = build_steps(trace, n);
  rep.ops = steps.size();
  if (o.check_stride < 8 || o.check_stride % 8 != 0)
    input_error("check_stride", "must be a multiple of 8 bytes, got {}", o.check_stride);
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
  const TimerSlack slack(timed(o));  // before any thread starts: Note [Timer slack]
  StackSpec so;
  so.device_bytes = rep.device_budget;
  so.host_bytes = rep.host_budget;
  so.ssd_bytes = rep.ssd_capacity;
  so.ssd_dir = o.ssd_dir;
  so.ssd_file = "u3m-replay.ssd";
  so.links[static_cast<int>(Link::h2d)].bandwidth = o.h2d_gbps * 1e9;
  so.links[static_cast<int>(Link::d2h)].bandwidth = o.d2h_gbps * 1e9;
  so.pool = o.pool;
  so.ssd_faults = o.ssd_faults;
  RealStack stack(so);
  Engine& engine = stack.engine();
  rep.policy = o.policy;
  const std::unique_ptr<policy::TieringPolicy> pol = policy::make_tiering_policy(
      o.policy,
      {.trace = trace,
       .steps = steps,
       .host_optimizer = o.host_optimizer,
       .h2d = {o.h2d_gbps * 1e9, 0.0},
       .s2h = {},
       .has_ssd = !o.ssd_dir.empty(),
       .lookahead = o.lookahead,
       .u3m = o.u3m},
      "policy");
  engine.set_victim_order(pol->victim_order());

  std::vector<std::uint64_t> version(trace.tensors.size(), 0);  // 0 = never written
  std::vector<std::uint8_t> registered(trace.tensors.size(), 0);
  auto id_of = [&](std::uint32_t t) { return static_cast<TensorId>(t) + 1; };
  auto ensure = [&](std::uint32_t t, std::size_t op) {
    if (!registered[t]) {
      // add() fails only for a freed tensor not yet removed; the entry is
      // reused, and its first lease below writes fresh contents.
      engine.add(id_of(t), trace.tensors[t].bytes, pol->initial_scores(t, op));
      registered[t] = 1;
    }
  };
  // A step that only creates tensors, each with a home (the simulator's rule).
  auto creates_only = [&](const Step& st) {
    if (st.touches.empty()) return false;
    for (const Touch& x : st.touches)
      if (!x.writes || version[x.tensor] != 0 || !pol->home_tier(trace.tensors[x.tensor]))
        return false;
    return true;
  };
  auto fail = [&](std::string what) {
    if (rep.first_error.empty()) rep.first_error = std::move(what);
    ++rep.errors;
  };

  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  const auto t0 = Clock::now();
  ReplayContext ctx(trace, steps, engine, *pol, registered, version, t0, o.log);
  struct Held {
    Lease lease;
    std::uint32_t tensor;
    bool fresh;  // writes it, or it holds no data yet: new contents
  };
  std::vector<Held> leases, waiting;
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
  for (std::size_t op = 0; op < steps.size(); ++op) {
    const Step& step = steps[op];
    ctx.at_step(op);
    if (creates_only(step)) {
      // Created where they rest, one at a time, taking no compute time.
      for (const Touch& x : step.touches) {
        ensure(x.tensor, op);
        const Tier home = *pol->home_tier(trace.tensors[x.tensor]);
        ctx.record(policy::DriverCall::Kind::acquire, x.tensor, home, true);
        Lease l;
        const Status s = engine.acquire(id_of(x.tensor), home, Access::write, &l);
        if (!mem::ok(s)) {
          rep.out_of_memory = s == Status::out_of_memory || s == Status::busy;
          fail(fmt::format("op {} ('{}'): cannot create '{}' in its home tier: {}", op,
                           trace.ops[step.op].name, trace.tensors[x.tensor].name,
                           Engine::last_failure()));
          break;
        }
        fill(l.ptr, l.bytes, x.tensor, ++version[x.tensor], o.check_stride);
        rep.bytes_written += l.bytes;
        engine.release(l);
      }
      if (rep.errors) break;
      rep.events = step.end_event;
      continue;
    }
    const Tier tier = pol->op_tier(trace.ops[step.op]);
    for (const Touch& t : step.touches) ensure(t.tensor, op);
    leases.clear();
    const auto op_begin = Clock::now();
    // Two passes (Note [All demand fetches at once]): ask for every tensor
    // without blocking, then wait for those that were not ready.
    waiting.clear();
    for (const Touch& touch : step.touches) {
      const std::uint32_t t = touch.tensor;
      // A tensor read before anything wrote it (a parameter, an input) gets
      // its first contents here.
      const bool fresh = touch.writes || version[t] == 0;
      ctx.record(policy::DriverCall::Kind::acquire, t, tier, fresh);
      Lease l;
      const Status s =
          engine.try_acquire(id_of(t), tier, fresh ? Access::write : Access::read, &l);
      if (mem::ok(s))
        leases.push_back(Held{l, t, fresh});
      else if (s == Status::busy)
        waiting.push_back(Held{Lease{}, t, fresh});
      else
        fail(fmt::format("op {} tensor '{}': {}", op, trace.tensors[t].name, mem::to_string(s)));
    }
    for (Held& h : waiting) {
      const Status s = engine.acquire(id_of(h.tensor), tier,
                                      h.fresh ? Access::write : Access::read, &h.lease);
      if (mem::ok(s)) {
        leases.push_back(h);
      } else if (s == Status::out_of_memory || s == Status::busy) {
        // No progress is possible (Note [No progress] in engine.cpp): every
        // later op would wait for the same room, so the replay ends here.
        rep.out_of_memory = true;
        fail(fmt::format("op {} ('{}') tensor '{}': {}", op, trace.ops[step.op].name,
                         trace.tensors[h.tensor].name, Engine::last_failure()));
        break;
      } else {
        fail(fmt::format("op {} tensor '{}': {}", op, trace.tensors[h.tensor].name,
                         mem::to_string(s)));
      }
    }
    if (rep.out_of_memory) {
      for (const Held& h : leases) engine.release(h.lease);
      break;
    }
    // Note [Compute in replay]: the op "runs on the device" from the moment
    // it holds its tensors until `deadline`; the checks and fills below are
    // host work that a device would not do, so they run inside that window.
    const auto acquired = Clock::now();
    rep.stall_s += seconds(acquired - op_begin);
    const trace::Op& this_op = trace.ops[step.op];
    const double dt = o.op_time ? o.op_time(this_op) : 0.0;
    if (!std::isfinite(dt) || dt < 0)
      input_error("replay", "op '{}': compute time {} s is not a finite number >= 0", this_op.name,
                  dt);
    rep.compute_s += dt;
    const auto deadline =
        acquired + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(dt));
    // The policy decides once this op holds its leases, as in the simulator
    // (before the op's writes count as data): room made now cannot be taken
    // from this op's own inputs (they are pinned), only from colder data.
    pol->on_step(op, ctx);
    for (const Held& h : leases) {
      const std::uint32_t t = h.tensor;
      if (version[t] != 0) {  // holds data: check it, even when about to overwrite it
        if (check(h.lease.ptr, h.lease.bytes, t, version[t], o.check_stride))
          rep.bytes_verified += h.lease.bytes;
        else
          ++rep.mismatches;
      }
      if (h.fresh) {
        fill(h.lease.ptr, h.lease.bytes, t, ++version[t], o.check_stride);
        rep.bytes_written += h.lease.bytes;
      }
    }
    if (o.op_time) {
      const auto now = Clock::now();
      if (now > deadline) {
        ++rep.overrun_ops;
        rep.overrun_s += seconds(now - deadline);
      } else {
        std::this_thread::sleep_until(deadline);
        rep.oversleep_s += seconds(Clock::now() - deadline);
      }
    }
    if (this_op.job == 0) {
      if (rep.iteration_end_s.size() <= this_op.iteration)
        rep.iteration_end_s.resize(this_op.iteration + 1, 0.0);
      rep.iteration_end_s[this_op.iteration] = seconds(Clock::now() - t0);
    }
    for (const Held& h : leases) engine.release(h.lease);
    for (std::uint32_t t : step.frees) {
      if (!registered[t]) continue;
      ctx.record(policy::DriverCall::Kind::free, t);
      registered[t] = 0;
      version[t] = 0;
      deferred.push_back(t);
    }
    retry_removals();
    rep.events = step.end_event;
    if (progress && (op & 255) == 0) progress(rep.events, n);
  }
  engine.drain();
  retry_removals();
  if (!deferred.empty())
    fail(fmt::format("{} freed tensors could not be removed", deferred.size()));
  rep.wall_s = seconds(Clock::now() - t0);
  rep.engine = engine.stats();
  rep.device = engine.monitor(Tier::device);
  rep.host = engine.monitor(Tier::host);
  rep.pool = stack.pool().stats();
  rep.pool_config = stack.pool().config().describe();
  if (stack.ssd()) rep.ssd = stack.ssd()->stats();
  rep.ssd_notice = stack.ssd_notice();
  if (const mem::FaultInjectionIoEngine* f = stack.faults())
    for (std::size_t k = 0; k < mem::kIoFaultKinds; ++k)
      rep.faults_injected[k] = f->injected(static_cast<mem::IoFault>(k));
  return rep;
}

}  // namespace u3m::drive
