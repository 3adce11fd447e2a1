#include "u3m/drive/step_driver.hpp"

#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::drive {

using engine::Access;
using engine::Lease;
using engine::Status;

StepDriver::StepDriver(const trace::Trace& trace, const std::vector<Step>& steps,
                       engine::Engine& eng, const engine::Clock& clock,
                       policy::TieringPolicy& policy, DriverOptions options)
    : trace_(trace),
      steps_(steps),
      eng_(eng),
      clock_(clock),
      policy_(policy),
      o_(std::move(options)),
      origin_(clock.now_ns()),
      n_(o_.max_steps ? std::min<std::size_t>(o_.max_steps, steps.size()) : steps.size()),
      registered_(trace.tensors.size(), 0),
      has_data_(trace.tensors.size(), 0),
      removing_(trace.tensors.size(), 0) {
  // The engine reports its transfers and occupancy to the run's observer on
  // the driver's timebase (engine::RunObserver).
  if (o_.observer) eng_.set_observer(o_.observer, o_.card, origin_);
}

StepDriver::~StepDriver() {
  if (o_.observer) eng_.set_observer(nullptr);
}

void StepDriver::prefetch(std::uint32_t t, Tier to) {
  if (!holds_data(t)) return;
  record(policy::DriverCall::Kind::prefetch, t, to);
  eng_.prefetch(engine_id(t), to);
}

void StepDriver::demote(std::uint32_t t, Tier from) {
  if (!holds_data(t)) return;
  record(policy::DriverCall::Kind::demote, t, from);
  eng_.evict(engine_id(t), from);
}

void StepDriver::publish(std::span<const engine::Engine::ScoreUpdate> scores) {
  if (o_.log)
    for (const auto& u : scores) {
      record(policy::DriverCall::Kind::publish, tensor_of(u.id));
      o_.log->back().score = u.scores.device;
    }
  eng_.publish_scores(scores);
}

void StepDriver::record(policy::DriverCall::Kind k, std::uint32_t t, Tier tier, bool write) {
  if (o_.log) o_.log->push_back({k, static_cast<std::uint32_t>(j_), t, tier, write});
}

StepDriver::Wait StepDriver::advance() {
  for (;;) {
    switch (phase_) {
      case Phase::done:
        return Wait::done;
      case Phase::barrier:
        return Wait::barrier;
      case Phase::computing:
        return Wait::compute;
      case Phase::next:
        if (j_ == n_ || stopped_) {
          phase_ = Phase::done;
          rep_.total_ns = now_ns();
          return Wait::done;
        }
        begin_step();
        continue;
      case Phase::creating:
        if (!create_pass()) return Wait::change;
        continue;
      case Phase::acquiring:
        if (!acquire_pass()) return Wait::change;
        continue;
    }
  }
}

bool StepDriver::creates_only(std::size_t j) const {
  return engine::creates_only(steps_[j], [&](std::uint32_t t) {
    // A tensor freed and not yet removed holds no data (ensure() will say
    // so); one without a home is created as any step runs (it counts as held).
    return (has_data_[t] && !removing_[t]) || !policy_.home_tier(trace_.tensors[t]);
  });
}

void StepDriver::begin_step() {
  if (creates_only(j_)) {
    phase_ = Phase::creating;
    create_i_ = 0;
    create_asked_ = false;
    return;
  }
  const Step& s = steps_[j_];
  tier_ = policy_.op_tier(trace_.ops[s.op]);
  held_.assign(s.touches.size(), Held{});
  done_.assign(s.touches.size(), 0);
  missed_.assign(s.touches.size(), 0);
  pending_ = s.touches.size();
  missed_bytes_ = compute_ = step_stall_ = 0;
  for (std::size_t i = 0; i < s.touches.size(); ++i) {
    const Touch& t = s.touches[i];
    ensure(t.tensor);
    held_[i].tensor = t.tensor;
    held_[i].had_data = has_data_[t.tensor] != 0;
    held_[i].fresh = t.writes || !held_[i].had_data;
    record(policy::DriverCall::Kind::acquire, t.tensor, tier_, held_[i].fresh);
  }
  t0_ = now_ns();
  phase_ = Phase::acquiring;
  if (o_.step_limit_bytes && tier_ == Tier::device) {
    std::uint64_t need = 0;
    if (o_.step_bytes)
      need = (*o_.step_bytes)[j_];
    else
      for (const Touch& t : s.touches) need += bytes(t.tensor);
    if (need > o_.step_limit_bytes)
      acquire_failed(cannot_place("together they exceed the budget"), true);
  }
}

// A step that only creates tensors, with a home for each: created one at a
// time where they rest (TieringPolicy::home_tier). False: waits for a change.
bool StepDriver::create_pass() {
  const Step& s = steps_[j_];
  for (; create_i_ < s.touches.size(); ++create_i_, create_asked_ = false) {
    const std::uint32_t t = s.touches[create_i_].tensor;
    const Tier home = *policy_.home_tier(trace_.tensors[t]);
    if (!create_asked_) {
      ensure(t);
      record(policy::DriverCall::Kind::acquire, t, home, true);
    }
    create_asked_ = true;
    Lease l;
    seen_ = eng_.epoch();
    const std::uint64_t evictions = eng_.evictions();
    const Status st = eng_.try_acquire(engine_id(t), home, Access::write, &l);
    if (st == Status::busy) {
      progressed_ = eng_.evictions() != evictions;
      return false;
    }
    if (!mem::ok(st)) {
      fail(fmt::format("step {}: cannot create '{}' in its home tier: {}", j_,
                       trace_.tensors[t].name, mem::to_string(st)));
      return true;
    }
    if (o_.created) o_.created(t, l);
    eng_.release(l);
    has_data_[t] = 1;
  }
  finish_step();
  return true;
}

// One pass over the step's tensors not granted yet. False: waits for a change.
bool StepDriver::acquire_pass() {
  const Step& s = steps_[j_];
  seen_ = eng_.epoch();
  const std::uint64_t evictions = eng_.evictions();
  bool granted = false;
  for (std::size_t i = 0; i < s.touches.size(); ++i) {
    if (done_[i]) continue;
    Held& h = held_[i];
    const Status st = eng_.try_acquire(engine_id(h.tensor), tier_,
                                       h.fresh ? Access::write : Access::read, &h.lease);
    if (mem::ok(st)) {
      done_[i] = 1;
      --pending_;
      granted = true;
    } else if (st == Status::busy) {
      if (!missed_[i]) missed_bytes_ += bytes(h.tensor);
      missed_[i] = 1;
    } else {
      std::string why = fmt::format("step {} op '{}' tensor '{}': {}", j_, trace_.ops[s.op].name,
                                    trace_.tensors[h.tensor].name, mem::to_string(st));
      if (!o_.go_on_after_fault) {
        acquire_failed(std::move(why), false);
        return true;
      }
      ++rep_.errors;  // counted; the op runs without this tensor
      if (rep_.first_error.empty()) rep_.first_error = std::move(why);
      h.lease = Lease{};
      done_[i] = 1;
      --pending_;
    }
  }
  if (pending_ == 0) {
    acquired();
    return true;
  }
  progressed_ = granted || eng_.evictions() != evictions;
  return false;
}

void StepDriver::no_progress(const std::string& why) {
  if (phase_ == Phase::creating) {
    rep_.out_of_memory = true;
    fail(fmt::format("step {}: cannot create '{}' in its home tier: {}", j_,
                     trace_.tensors[steps_[j_].touches[create_i_].tensor].name, why));
    return;
  }
  if (phase_ != Phase::acquiring) throw std::logic_error("StepDriver::no_progress: not waiting");
  acquire_failed(cannot_place(why), true);
}

// Holds its tensors: the stall ends, the policy decides with them pinned
// (Note [Step driver]), then a collective waits for the other cards.
void StepDriver::acquired() {
  add_stall();
  policy_.on_step(j_, *this);
  if (trace_.ops[steps_[j_].op].cls == trace::OpClass::collective) {
    ++rep_.collectives;
    if (o_.barriers) {
      barrier_since_ = now_ns();
      phase_ = Phase::barrier;
      return;
    }
  }
  start_compute();
}

void StepDriver::leave_barrier() {
  rep_.barrier_ns += now_ns() - barrier_since_;
  start_compute();
}

void StepDriver::start_compute() {
  const trace::Op& op = trace_.ops[steps_[j_].op];
  std::uint64_t dt = 0;
  if (o_.op_time) {
    const double s = o_.op_time(op);
    if (!std::isfinite(s) || s < 0)
      input_error("op_time", "op '{}': compute time {} s is not a finite number >= 0", op.name, s);
    dt = static_cast<std::uint64_t>(std::llround(s * 1e9));
  }
  rep_.compute_ns += dt;
  compute_ = dt;
  compute_from_ = now_ns();
  end_ = compute_from_ + dt;
  phase_ = Phase::computing;
}

void StepDriver::add_stall() {
  const std::uint64_t now = now_ns();
  step_stall_ = now - t0_;
  rep_.stall_ns += step_stall_;
  if (o_.observer && now > t0_) {
    const trace::Op& op = trace_.ops[steps_[j_].op];
    o_.observer->stall(o_.card, op.iteration, steps_[j_].op, seconds(t0_), seconds(now));
  }
}

void StepDriver::step_done() {
  if (o_.step_done)
    o_.step_done(StepRecord{j_, steps_[j_].op, step_stall_, compute_, missed_bytes_});
}

void StepDriver::end_compute() {
  const Step& s = steps_[j_];
  const trace::Op& op = trace_.ops[s.op];
  const std::uint64_t now = now_ns();
  if (op.job == 0) {
    if (rep_.iteration_end_ns.size() <= op.iteration)
      rep_.iteration_end_ns.resize(op.iteration + 1, 0);
    rep_.iteration_end_ns[op.iteration] = now;
  }
  if (o_.observer) {
    o_.observer->op(o_.card, op.iteration, s.op, op.name,
                    engine::OpWork{op.flops, static_cast<double>(op.bytes)}, seconds(compute_from_),
                    seconds(now));
    const bool last_of_iteration =
        j_ + 1 == n_ || trace_.ops[steps_[j_ + 1].op].iteration != op.iteration;
    if (op.job == 0 && last_of_iteration)
      o_.observer->step_end(o_.card, op.iteration, seconds(now));
  }
  release_leases(true);
  for (std::uint32_t t : s.frees) {
    if (registered_[t] && !removing_[t]) {
      record(policy::DriverCall::Kind::free, t);
      removing_[t] = 1;
      removals_.push_back(t);
    }
  }
  retry_removals();
  step_done();
  finish_step();
}

void StepDriver::acquire_failed(std::string why, bool out_of_memory) {
  add_stall();
  step_done();
  release_leases(false);
  rep_.out_of_memory = rep_.out_of_memory || out_of_memory;
  fail(std::move(why));
}

void StepDriver::fail(std::string why) {
  ++rep_.errors;
  if (rep_.first_error.empty()) rep_.first_error = std::move(why);
  stopped_ = true;
  phase_ = Phase::next;  // advance() ends the run
}

void StepDriver::finish_step() {
  ++rep_.steps;
  ++j_;
  phase_ = Phase::next;
}

void StepDriver::abort() {
  if (phase_ == Phase::done) return;
  if (phase_ == Phase::acquiring || phase_ == Phase::barrier || phase_ == Phase::computing)
    step_done();
  release_leases(false);
  phase_ = Phase::done;
  rep_.total_ns = now_ns();
}

// held_ is empty outside a step (its index is the step's touch).
void StepDriver::release_leases(bool wrote) {
  for (const Held& h : held_) {
    if (!h.lease) continue;
    eng_.release(h.lease);
    if (wrote) has_data_[h.tensor] = 1;
  }
  held_.clear();
}

void StepDriver::retry_removals() {
  std::size_t kept = 0;
  for (std::uint32_t t : removals_) {
    if (!removing_[t]) continue;  // touched again: ensure() took it back
    const Status s = eng_.remove(engine_id(t));
    if (s == Status::busy) {
      removals_[kept++] = t;
      continue;
    }
    if (!mem::ok(s) && s != Status::not_found) {
      ++rep_.errors;
      if (rep_.first_error.empty())
        rep_.first_error = fmt::format("free '{}': {}", trace_.tensors[t].name, mem::to_string(s));
    }
    registered_[t] = has_data_[t] = removing_[t] = 0;
  }
  removals_.resize(kept);
}

std::string StepDriver::cannot_place(const std::string& why) const {
  const Step& s = steps_[j_];
  std::uint64_t need = 0;
  for (const Touch& t : s.touches) need += bytes(t.tensor);
  const engine::EngineConfig& c = eng_.config();
  return fmt::format(
      "step {} op '{}': its {} tensors ({} bytes) cannot all be placed in {}: {} "
      "(device {} bytes, host {} bytes)",
      j_, trace_.ops[s.op].name, s.touches.size(), need, mem::to_string(tier_), why,
      c.device.capacity, c.host.capacity);
}

void StepDriver::ensure(std::uint32_t t) {
  if (removing_[t]) {
    // Freed, then allocated again before its removal went through: the
    // same registration serves the new tensor, whose data is undefined, so
    // its first touch is a write (which drops the stale copies).
    removing_[t] = 0;
    has_data_[t] = 0;
    return;
  }
  if (!registered_[t]) {
    eng_.add(engine_id(t), bytes(t), policy_.initial_scores(t, j_));
    registered_[t] = 1;
    has_data_[t] = 0;
  }
}

RealTimeReport run_real_time(StepDriver& d, engine::Engine& eng, bool timed,
                             const std::function<void(StepDriver&)>& work) {
  RealTimeReport r;
  for (;;) {
    switch (d.advance()) {
      case StepDriver::Wait::done:
        return r;
      case StepDriver::Wait::barrier:  // one card: nobody to wait for
        d.leave_barrier();
        break;
      case StepDriver::Wait::change:
        if (d.progressed()) break;  // ask again at once
        if (eng.wait_for_change(d.seen_epoch()) == Status::out_of_memory)
          d.no_progress(engine::Engine::last_failure());
        break;
      case StepDriver::Wait::compute: {
        if (work) work(d);
        const std::uint64_t end = d.compute_end(), now = d.now_ns();
        if (timed) {
          if (now > end) {
            ++r.overrun_ops;
            r.overrun_s += static_cast<double>(now - end) * 1e-9;
          } else {
            std::this_thread::sleep_for(std::chrono::nanoseconds(end - now));
            r.oversleep_s += static_cast<double>(d.now_ns() - end) * 1e-9;
          }
        }
        d.end_compute();
        break;
      }
    }
  }
}

}  // namespace u3m::drive
