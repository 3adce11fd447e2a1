// The real runtime on this machine, assembled once: emulated HBM (a
// device-emu arena behind a DevicePool), pinned host DRAM, an optional SSD
// store, BackendTransport and the wall clock, under one Engine. `u3m run
// replay`, the tiered KV store and the Python Runtime all run on it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "u3m/engine/clock.hpp"
#include "u3m/engine/engine.hpp"
#include "u3m/engine/transport.hpp"
#include "u3m/mem/backend_source.hpp"
#include "u3m/mem/device_emu.hpp"
#include "u3m/mem/fault_spec.hpp"
#include "u3m/mem/host.hpp"
#include "u3m/mem/io_engine.hpp"
#include "u3m/mem/pool.hpp"
#include "u3m/mem/ssd_store.hpp"

namespace u3m::engine {

struct RealStackOptions {
  std::uint64_t device_bytes = 0;  // the engine's device capacity, > 0
  std::uint64_t host_bytes = 0;    // the engine's host capacity, > 0
  std::uint64_t ssd_bytes = 0;     // SSD store capacity; 0 = no SSD tier
  // Where the SSD store's file goes; empty = a fresh directory under $TMPDIR
  // (or /tmp), removed with the stack.
  std::string ssd_dir;
  std::string ssd_file = "u3m.ssd";  // the store's file name in ssd_dir
  // Emulated link throttle per direction, bytes/s; 0 = memcpy speed.
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0;
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
  bool expandable_segments = true;  // when the arena supports them
  EngineConfig engine{};            // device and host capacities come from the fields above
};

// Note [Real stack]
// The device arena is twice the engine's device capacity plus 64 MiB: the
// pool rounds small tensors up into 2 MiB segments, and the engine, not the
// arena, is the budget (it counts tensor bytes). Members are built in
// declaration order and torn down in reverse, the engine first: it waits for
// its transfers, which use the backends.
class RealStack {
 public:
  // InputError for capacities of 0 or an SSD tier that cannot be opened.
  explicit RealStack(const RealStackOptions& o);
  ~RealStack();
  RealStack(const RealStack&) = delete;
  RealStack& operator=(const RealStack&) = delete;

  Engine& engine() { return *engine_; }
  const Engine& engine() const { return *engine_; }
  const mem::DevicePool& pool() const { return pool_; }
  bool has_ssd() const { return ssd_ != nullptr; }
  const mem::SsdStore* ssd() const { return ssd_.get(); }
  // The fault-injection engine under the store (RealStackOptions::ssd_faults), or null.
  mem::FaultInjectionIoEngine* faults() const { return faults_.get(); }
  // What the SSD store said when it opened (a file left by a crashed process
  // that it discarded), or "".
  std::string ssd_notice() const;
  std::uint64_t arena_bytes() const;
  // The scratch directory this stack created for its SSD file (removed with
  // the stack), or "" when it made none.
  const std::string& scratch_dir() const { return scratch_.path; }

 private:
  // Declared first, so destroyed last: after the store has closed its file,
  // also when a later member's constructor throws.
  struct Scratch {
    std::string path;
    Scratch() = default;
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    ~Scratch();
  };
  Scratch scratch_;
  mem::DeviceEmuBackend device_;
  mem::BackendSegmentSource source_;
  mem::DevicePool pool_;
  mem::HostBackend host_;
  std::shared_ptr<mem::FaultInjectionIoEngine> faults_;
  std::unique_ptr<mem::SsdStore> ssd_;
  std::unique_ptr<BackendTransport> transport_;
  SteadyClock clock_;
  std::unique_ptr<Engine> engine_;
  // The store's on_corrupt callback reaches the engine through this, so the
  // destructor can cut it off before the engine goes.
  std::mutex corrupt_mu_;
  Engine* corrupt_sink_ = nullptr;
};

}  // namespace u3m::engine
