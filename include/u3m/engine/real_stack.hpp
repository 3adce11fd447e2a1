// The real runtime on this machine, assembled once: emulated HBM (a
// device-emu arena behind a DevicePool), pinned host DRAM, an optional SSD
// store, BackendTransport and the wall clock, under one Engine. `u3m run
// replay`, the tiered KV store and the Python Runtime all run on it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "u3m/engine/clock.hpp"
#include "u3m/engine/engine.hpp"
#include "u3m/engine/stack_spec.hpp"
#include "u3m/engine/transport.hpp"
#include "u3m/mem/backend_registry.hpp"
#include "u3m/mem/backend_source.hpp"
#include "u3m/mem/device_emu.hpp"
#include "u3m/mem/fault_spec.hpp"
#include "u3m/mem/host.hpp"
#include "u3m/mem/host_cache.hpp"
#include "u3m/mem/io_engine.hpp"
#include "u3m/mem/pool.hpp"
#include "u3m/mem/ssd_store.hpp"

namespace u3m::engine {


// Note [Real stack]
// Built from a StackSpec (the device arena: Note [Device arena] in
// stack_spec.hpp). The device and host tiers come from mem::open_backend on
// StackSpec::backend, so device-emu and a real cuda or acl device are chosen
// in one place. Members are built in declaration order and torn down in
// reverse, the engine first: it waits for its transfers, which use the
// backends.
class RealStack {
 public:
  // InputError for capacities of 0, an SSD tier that cannot be opened, or a
  // backend that cannot open (the registry's one-line reason).
  explicit RealStack(const StackSpec& o);
  ~RealStack();
  RealStack(const RealStack&) = delete;
  RealStack& operator=(const RealStack&) = delete;

  Engine& engine() { return *engine_; }
  const Engine& engine() const { return *engine_; }
  const mem::DevicePool& pool() const { return pool_; }
  bool has_ssd() const { return ssd_ != nullptr; }
  const mem::SsdStore* ssd() const { return ssd_.get(); }
  // The fault-injection engine under the store (StackSpec::ssd_faults), or null.
  mem::FaultInjectionIoEngine* faults() const { return faults_.get(); }
  // What the SSD store said when it opened (a file left by a crashed process
  // that it discarded), or "".
  std::string ssd_notice() const;
  std::uint64_t arena_bytes() const;
  // The backend the device tier is on ("auto" resolved), and what the
  // registry knows of it: the AccelBackend for cuda and acl, else null.
  const std::string& backend_name() const { return backend_.name; }
  const mem::AccelBackend* accel() const { return backend_.accel; }
  // The device tier's backend, for a copy between a device lease and host
  // memory the CPU cannot do itself (cuda, acl: device memory is not mapped).
  mem::DeviceBackend& device() { return *backend_.device; }
  // auto: why each backend tried before the one opened was passed over.
  const std::vector<std::string>& passed_over() const { return backend_.passed_over; }
  // The cache in front of the runtime's pinned host allocator (cuda, acl:
  // Note [Pinned host cache]), or null (device-emu).
  const mem::HostBlockCache* host_cache() const { return host_cache_.get(); }
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
  mem::OpenedBackend backend_;  // device and host tiers
  std::unique_ptr<mem::HostBlockCache> host_cache_;  // over backend_.host on cuda and acl
  mem::BackendSegmentSource source_;
  mem::DevicePool pool_;
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
