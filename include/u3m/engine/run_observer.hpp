// What a run tells whoever watches it: timelines, metrics and bandwidth
// diagnosis (docs/operators.md once it exists). The step driver reports ops
// and stalls; the engine reports transfers and tier occupancy. Times are the
// run's own clock in seconds (virtual in the simulator, wall time in a real
// run), so one observer serves both.
//
// Calls may come from the driver's thread and from the engine's completion
// threads at once: an implementation must be thread-safe, and cheap (it runs
// inside the step loop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "u3m/engine/transport.hpp"
#include "u3m/mem/status.hpp"

namespace u3m::engine {

class Engine;

struct TransferRecord {
  int card = 0;
  Link link = Link::d2h;
  std::uint8_t priority = 0;  // engine::Priority as its value
  std::uint64_t bytes = 0;
  double start_s = 0, end_s = 0;
  bool ok = true;
};

// What an op computes, as the trace records it (0 = unknown), so an observer
// can place it on a roofline (observe::Diagnosis's HBM-bound share).
struct OpWork {
  double flops = 0;
  double bytes = 0;  // bytes it reads and writes in device memory
};

class RunObserver {
 public:
  virtual ~RunObserver() = default;
  // Op `index` (its index in the trace's ops; a serving run numbers its
  // iterations) of `step` ran on the compute track of `card` from t0 to t1,
  // after its operands were in place.
  virtual void op(int /*card*/, std::int64_t /*step*/, std::size_t /*index*/,
                  std::string_view /*name*/, OpWork /*work*/, double /*t0_s*/, double /*t1_s*/) {}
  // Op `index` waited for its operands from t0 to t1.
  virtual void stall(int /*card*/, std::int64_t /*step*/, std::size_t /*index*/,
                     double /*t0_s*/, double /*t1_s*/) {}
  // Step `step` ended at t on `card`.
  virtual void step_end(int /*card*/, std::int64_t /*step*/, double /*t_s*/) {}
  // A transfer finished (or failed).
  virtual void transfer(const TransferRecord& /*t*/) {}
  // Bytes held in `tier` on `card` changed to `used` at t.
  virtual void occupancy(int /*card*/, mem::Tier /*tier*/, std::uint64_t /*used*/,
                         double /*t_s*/) {}
  // Engine::set_observer: `e` reports to this observer as `card` from
  // attached() until detached() (another observer set, or the engine's
  // destructor). In between, and outside the two reporting calls above, the
  // observer may read e's locking accessors (stats(), monitor()).
  virtual void attached(int /*card*/, const Engine& /*e*/) {}
  virtual void detached(int /*card*/, const Engine& /*e*/) {}
};

}  // namespace u3m::engine
