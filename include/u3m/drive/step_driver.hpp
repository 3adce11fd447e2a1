// The one step driver (issue 15): runs a trace's steps through an engine
// under a tiering policy, with only try_acquire and waits, on whichever
// clock its waiter moves. The simulator (sim::simulate_cards: virtual time,
// several cards on one clock) and real replay (drive::replay_trace: wall
// time, real bytes) run this very class; only what "wait" means differs
// (Note [Step driver]).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "u3m/engine/clock.hpp"
#include "u3m/engine/engine.hpp"
#include "u3m/engine/run_observer.hpp"
#include "u3m/engine/steps.hpp"
#include "u3m/policy/tiering.hpp"
#include "u3m/trace/model.hpp"

namespace u3m::drive {

using engine::Step;
using engine::Touch;
using mem::Tier;

// One tensor of the step in progress.
struct Held {
  engine::Lease lease;  // empty until granted (or when its acquire failed and the run went on)
  std::uint32_t tensor = 0;
  bool fresh = false;     // a write lease: the op writes it, or it holds no data yet
  bool had_data = false;  // it held data when the step began (a read of it can be checked)
};

// What one step cost, for per-family reports (the simulator's op families).
struct StepRecord {
  std::size_t step = 0;
  std::uint32_t op = 0;  // index into Trace::ops
  std::uint64_t stall_ns = 0, compute_ns = 0;
  std::uint64_t missed_bytes = 0;  // bytes not in its tier when first asked for
};

struct DriverOptions {
  std::size_t max_steps = 0;  // 0 = all
  // Appends what the run asks of the engine (Note [Driver calls] in
  // policy/tiering.hpp); null = nothing recorded.
  policy::DriverLog* log = nullptr;
  // Reports ops, stalls and step ends on the run's clock; null = none.
  engine::RunObserver* observer = nullptr;
  int card = 0;  // the card number the observer is told
  // Collectives wait at a barrier (Wait::barrier) until the caller releases
  // them: several cards on one clock. Off: a collective is an op like any.
  bool barriers = false;
  // A step whose device tensors need more bytes than this fails at once
  // (0 = no such check): the simulator's device budget, which spares it the
  // evictions that the engine's no-progress rule would end in anyway.
  std::uint64_t step_limit_bytes = 0;
  // An acquire that fails other than for room (a fetch's I/O error, a lost
  // tensor) is counted and the op runs without that tensor (real replay, so
  // a faulted run reports every fault); off: the run stops there.
  bool go_on_after_fault = false;
  // Seconds of compute per op; empty = none.
  std::function<double(const trace::Op&)> op_time;
  // A step that only creates tensors made one in its home tier (the lease is
  // released right after): real replay writes its first contents.
  std::function<void(std::uint32_t tensor, const engine::Lease&)> created;
  // A step ended (ran, failed or was aborted); not for creating steps.
  std::function<void(const StepRecord&)> step_done;
  // Each tensor's bytes (by trace tensor), if the caller has them in a flat
  // array (sim::TraceTables::bytes); null: read from the trace.
  const std::vector<std::uint64_t>* tensor_bytes = nullptr;
  // Each step's bytes (by step: its touches' bytes), likewise
  // (sim::TraceTables::need); null: summed when step_limit_bytes needs them.
  const std::vector<std::uint64_t>* step_bytes = nullptr;
};

struct DriverReport {
  std::uint64_t steps = 0;  // steps finished
  std::uint64_t compute_ns = 0, stall_ns = 0;
  std::uint64_t barrier_ns = 0, collectives = 0;
  std::uint64_t total_ns = 0;  // the clock when the run ended
  std::uint64_t errors = 0;
  std::string first_error;
  // The run stopped at a step whose tensors can never be placed (the
  // engine's no-progress rule, or step_limit_bytes).
  bool out_of_memory = false;
  // The clock at which each iteration of job 0 finished its last op
  // (index = trace::Op::iteration).
  std::vector<std::uint64_t> iteration_end_ns;
};

// Note [Step driver]
// Each step acquires every tensor it touches in the tier its policy runs it
// in (TieringPolicy::op_tier; a write lease if it writes the tensor or the
// tensor holds no data yet) with try_acquire, which never blocks: a busy
// answer has scheduled the demand fetch or the eviction that makes room, so
// all of a step's fetches are queued before it waits (one blocking acquire
// after another would leave the link idle between them). While any is
// busy, the driver waits for a change of the engine (Wait::change) and asks
// again for those not granted; that time is stall. Once it holds them all,
// the policy's on_step runs (prefetch, demotion, scores: room made now
// cannot be taken from the step's own inputs, they are pinned), then the
// op's compute time passes (Wait::compute) with transfers completing
// meanwhile, and the leases are released. A step that only creates
// tensors, under a policy with home tiers, creates each in its home tier,
// one at a time, with no compute time.
//
// advance() runs what it can at the current instant and says what it waits
// for; the caller is the waiter and decides what waiting means:
//  * virtual time (sim/runner.cpp): a change is the card's transport's next
//    completion; with nothing in flight the engine is asked whether
//    anything can still change (Engine::check_progress); compute ends when
//    the clock is moved to its end; several cards share one clock and meet
//    at barriers;
//  * real time (run_real_time below): a change is waited for in the engine
//    (Engine::wait_for_change); compute is the caller's work on the held
//    tensors, then a sleep to the op's end.
// Either way the one no-progress rule is the engine's (Note [No progress]
// in engine.cpp): when it says nothing can change, no_progress() ends the
// run with its reason.
class StepDriver final : public policy::StepContext {
 public:
  enum class Wait { change, compute, barrier, done };

  // All references must outlive the driver; `steps` = build_steps(trace).
  StepDriver(const trace::Trace& trace, const std::vector<Step>& steps, engine::Engine& eng,
             const engine::Clock& clock, policy::TieringPolicy& policy, DriverOptions options);
  ~StepDriver();  // detaches the observer from the engine

  Wait advance();

  // Wait::change: the last pass over the step's tensors granted a lease or
  // made an eviction (so asking again at once may get further), and the
  // engine's epoch() read before that pass (a change since then is one).
  bool progressed() const { return progressed_; }
  std::uint64_t seen_epoch() const { return seen_; }
  // The waiter found that nothing can change any more: the step fails with
  // `why` (Engine::last_failure()) and the run ends.
  void no_progress(const std::string& why);
  // Wait::compute: when the op's compute ends on the run's clock, and the
  // step's tensors (held now, except those whose acquire failed).
  std::uint64_t compute_end() const { return end_; }
  std::span<const Held> held() const { return held_; }
  std::size_t step() const { return j_; }  // the step in progress (or next)
  void end_compute();
  // Wait::barrier: since when; the caller releases every card at once.
  std::uint64_t barrier_since() const { return barrier_since_; }
  void leave_barrier();
  // Another card failed: the run stops here, with this card's leases returned.
  void abort();
  // A freed tensor may still be moving (a write-back in flight): the engine
  // answers busy, and the removal is retried after later steps and here.
  void retry_removals();
  std::size_t removals_pending() const { return removals_.size(); }

  const DriverReport& report() const { return rep_; }
  // The run's clock: nanoseconds since the driver was made.
  std::uint64_t now_ns() const override { return clock_.now_ns() - origin_; }

  // policy::StepContext
  const std::vector<Step>& steps() const override { return steps_; }
  const trace::Trace& trace() const override { return trace_; }
  const engine::Engine& engine() const override { return eng_; }
  Tier step_tier(std::size_t step) const override {
    return policy_.op_tier(trace_.ops[steps_[step].op]);
  }
  using policy::StepContext::prefetch;
  void prefetch(std::uint32_t tensor, Tier to) override;
  void demote(std::uint32_t tensor, Tier from) override;
  void publish(std::span<const engine::Engine::ScoreUpdate> scores) override;

 private:
  enum class Phase { next, creating, acquiring, barrier, computing, done };

  void record(policy::DriverCall::Kind k, std::uint32_t t, Tier tier = Tier::device,
              bool write = false);
  bool creates_only(std::size_t j) const;
  void begin_step();
  bool create_pass();
  bool acquire_pass();
  void acquired();
  void start_compute();
  void add_stall();
  void step_done();
  void acquire_failed(std::string why, bool out_of_memory);
  void fail(std::string why);
  void finish_step();
  void release_leases(bool wrote);
  std::string cannot_place(const std::string& why) const;
  void ensure(std::uint32_t t);
  bool holds_data(std::uint32_t t) const { return registered_[t] && has_data_[t] && !removing_[t]; }
  static double seconds(std::uint64_t ns) { return static_cast<double>(ns) * 1e-9; }
  std::uint64_t bytes(std::uint32_t t) const {
    return o_.tensor_bytes ? (*o_.tensor_bytes)[t] : trace_.tensors[t].bytes;
  }

  const trace::Trace& trace_;
  const std::vector<Step>& steps_;
  engine::Engine& eng_;
  const engine::Clock& clock_;
  policy::TieringPolicy& policy_;
  const DriverOptions o_;
  const std::uint64_t origin_;
  const std::size_t n_;
  DriverReport rep_;
  std::vector<std::uint8_t> registered_, has_data_, removing_;
  std::vector<std::uint32_t> removals_;

  // The step in progress.
  Phase phase_ = Phase::next;
  std::size_t j_ = 0;
  Tier tier_ = Tier::device;
  std::vector<Held> held_;
  std::vector<std::uint8_t> done_, missed_;  // by touch: granted or given up; asked in vain once
  std::size_t pending_ = 0, create_i_ = 0;
  bool create_asked_ = false, progressed_ = false, stopped_ = false;
  std::uint64_t seen_ = 0, t0_ = 0, end_ = 0, compute_ = 0, compute_from_ = 0, step_stall_ = 0;
  std::uint64_t barrier_since_ = 0, missed_bytes_ = 0;
};

// The real-time waiter: runs `d` to its end on this thread. A change is
// waited for in `eng` (Engine::wait_for_change, the engine's no-progress
// rule); at Wait::compute, `work(d)` runs on the held tensors (real replay
// checks and writes their bytes), then, if `timed`, the thread sleeps until
// the op's end (Note [Compute in replay] in replay.cpp). One card: a
// collective does not wait at a barrier.
struct RealTimeReport {
  std::uint64_t overrun_ops = 0;  // ops whose work outlasted their compute time
  double overrun_s = 0;           // by how much in all
  double oversleep_s = 0;         // summed lateness of the compute sleeps' wake-ups
};
RealTimeReport run_real_time(StepDriver& d, engine::Engine& eng, bool timed,
                             const std::function<void(StepDriver&)>& work = {});

}  // namespace u3m::drive
