#include "u3m/drive/replay.hpp"

#include "u3m/drive/step_driver.hpp"

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

using engine::BackendTransport;
using engine::build_steps;
using engine::Engine;
using engine::Lease;
using engine::Link;
using engine::RealStack;
using engine::StackSpec;
using engine::Status;
using engine::Step;
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
// the tier its policy runs it in, checks what it reads, writes new
// versions, and releases everything when the op ends, so an op's inputs and
// outputs are co-resident as on a real device. The steps are run by the one
// step driver (drive::StepDriver, Note [Step driver]), the very class the
// simulator runs, with its real-time waiter (run_real_time: the engine's
// wait_for_change between asks, a sleep through compute), and the policy
// objects are the simulator's; so the two make the same decisions, and time
// differs. On errors: an acquire that fails other than for room is counted
// and the op runs without that tensor (DriverOptions::go_on_after_fault),
// where the simulator stops the card.

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
       .u3m = o.u3m,
       .design = o.design},
      "policy");
  engine.set_victim_order(pol->victim_order());

  // Each tensor's version: the pattern its next fill writes, and what a
  // read of it must find (the driver says whether it holds data).
  std::vector<std::uint64_t> version(trace.tensors.size(), 0);
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  const auto t0 = Clock::now();
  const engine::SteadyClock clock;
  DriverOptions d;
  d.log = o.log;
  d.observer = o.observer;
  d.go_on_after_fault = true;
  d.op_time = o.op_time;
  d.created = [&](std::uint32_t t, const Lease& l) {
    fill(l.ptr, l.bytes, t, ++version[t], o.check_stride);
    rep.bytes_written += l.bytes;
  };
  StepDriver driver(trace, steps, engine, clock, *pol, std::move(d));
  // Note [Compute in replay]: the op "runs on the device" from the moment it
  // holds its tensors until its compute ends; the checks and fills are host
  // work that a device would not do, so they run inside that window.
  const RealTimeReport rt = run_real_time(driver, engine, static_cast<bool>(o.op_time),
                                          [&](const StepDriver& dr) {
    for (const Held& h : dr.held()) {
      if (!h.lease) continue;
      const std::uint32_t t = h.tensor;
      if (h.had_data) {  // check it, even when about to overwrite it
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
    if (progress && (dr.step() & 255) == 0) progress(steps[dr.step()].end_event, n);
  });
  engine.drain();
  driver.retry_removals();
  const DriverReport& dr = driver.report();
  rep.errors = dr.errors;
  rep.first_error = dr.first_error;
  rep.out_of_memory = dr.out_of_memory;
  if (driver.removals_pending()) {
    if (rep.first_error.empty())
      rep.first_error = fmt::format("{} freed tensors could not be removed",
                                    driver.removals_pending());
    ++rep.errors;
  }
  rep.events = dr.steps ? steps[dr.steps - 1].end_event : 0;
  for (std::uint64_t ns : dr.iteration_end_ns) rep.iteration_end_s.push_back(double(ns) * 1e-9);
  rep.stall_s = double(dr.stall_ns) * 1e-9;
  rep.compute_s = double(dr.compute_ns) * 1e-9;
  rep.overrun_ops = rt.overrun_ops;
  rep.overrun_s = rt.overrun_s;
  rep.oversleep_s = rt.oversleep_s;
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
