// One description of a memory stack (issue 15 item 3): budgets, the device
// pool's configuration, the engine's watermarks and link slots, the links,
// and the SSD tier. The real stack (real_stack.hpp) and the simulator's
// (sim/sim_stack.hpp) are both built from it, so a rule such as the device
// arena's size is written once.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "u3m/engine/engine.hpp"
#include "u3m/mem/fault_spec.hpp"
#include "u3m/mem/io_engine.hpp"
#include "u3m/mem/link.hpp"
#include "u3m/mem/pool.hpp"

namespace u3m::engine {

// Note [Device arena]
// The device pool's capacity is twice the engine's device capacity plus
// 64 MiB, unless the pool configuration gives one: the pool rounds small
// tensors up into 2 MiB segments, and the engine, not the arena, is the
// budget (it counts tensor bytes).
struct StackSpec {
  std::uint64_t device_bytes = 0;  // the engine's device capacity, > 0
  std::uint64_t host_bytes = 0;    // the engine's host capacity, > 0
  std::uint64_t ssd_bytes = 0;     // SSD tier capacity; 0 = no SSD tier
  // The device pool (`u3m run replay --pool-config`); capacity 0 = Note
  // [Device arena]. Expandable segments where the arena supports them.
  mem::PoolConfig pool = default_pool();
  EngineConfig engine{};  // device and host capacities come from the fields above
  // Links by engine::Link. Real stack: h2d/d2h bandwidth is device-emu's
  // emulated throttle (0 = memcpy speed), latencies and the SSD links are the
  // hardware's own. Simulated stack: every link as modelled.
  std::array<mem::LinkModel, kNumLinks> links{};

  // Real stack only.
  // The device tier's backend, opened through mem::open_backend (the one
  // registry): "device-emu" (the arena in host memory), "cuda", "acl" or
  // "auto". On cuda and acl the host tier is the runtime's pinned memory and
  // the h2d/d2h links are the hardware's (no emulated throttle).
  std::string backend = "device-emu";
  int device_ordinal = 0;  // cuda and acl: which device
  // Where the SSD store's file goes; empty = a fresh directory under $TMPDIR
  // (or /tmp), removed with the stack.
  std::string ssd_dir;
  std::string ssd_file = "u3m.ssd";  // the store's file name in ssd_dir
  // false: idle copy engines and synchronize never spin before sleeping
  // (tests on shared cores, sanitizers); true: device-emu's defaults.
  bool copy_spin = true;
  std::shared_ptr<mem::IoEngine> ssd_io;  // the SSD store's I/O engine; null = its default
  // Faults injected under the SSD store (tests, soaks, `run replay
  // --ssd-faults`): a fault-injection engine over the default one. Only
  // without ssd_io.
  mem::FaultSpec ssd_faults;
  // The SSD store's background scrubber: bytes/s it re-reads and checks, at
  // most (0 = none). A copy it finds corrupt is dropped from the engine, which
  // reports the tensor lost if that was its only copy.
  double ssd_scrub_bytes_per_s = 32.0 * 1024 * 1024;

  // InputError ("where: ...") for capacities of 0 or a bad pool or link.
  void validate(std::string_view where) const;
  std::uint64_t arena_bytes() const;  // Note [Device arena]
  // The pool's configuration with its capacity; expandable segments only if
  // the segment source supports them.
  mem::PoolConfig pool_config(bool source_supports_vmm) const;
  EngineConfig engine_config() const;  // `engine` with the capacities

  static mem::PoolConfig default_pool() {
    mem::PoolConfig p;
    p.expandable_segments = true;
    return p;
  }
};

}  // namespace u3m::engine
