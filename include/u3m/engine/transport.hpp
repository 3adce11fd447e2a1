// How the runtime's bytes move between tiers. The engine decides what moves,
// when and in which order (decision code); a Transport only carries out one
// transfer and reports its status. Real runs use BackendTransport (device
// backend copies on streams, the SSD store's async I/O); the simulator plugs
// in a transport that books time on modelled links instead.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "u3m/mem/backend.hpp"
#include "u3m/mem/ssd_store.hpp"

namespace u3m::engine {

using mem::Status;
using mem::Tier;

// The four links between adjacent tiers. A device<->SSD move goes through host.
enum class Link : std::uint8_t { d2h, h2d, h2s, s2h };
inline constexpr int kNumLinks = 4;
std::string_view to_string(Link l);

// An s2h transfer with a null dst only reads the SSD copy back and checks it
// (Note [Verified before dropped] in engine.cpp).
struct Transfer {
  std::uint64_t ticket = 0;  // the engine's id for this transfer
  std::uint64_t tensor = 0;  // tensor id (also the SSD key)
  Link link = Link::d2h;
  std::uint64_t bytes = 0;
  const void* src = nullptr;  // memory side; null on the SSD side
  void* dst = nullptr;
  double rate_limit = 0;  // bytes/s this link may use now; 0 = no cap
};

// Called exactly once per started transfer, from any thread, possibly before
// start() returns. Must not call start() recursively.
using TransferDone = std::function<void(const Transfer&, Status)>;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual void set_completion(TransferDone done) = 0;
  virtual void start(const Transfer& t) = 0;
  // Drops the SSD copy of a tensor (it became stale). Synchronous, and called
  // under the engine's lock: it must not call back into the engine.
  virtual Status erase_ssd(std::uint64_t key) = 0;
  virtual bool has_ssd() const = 0;
  // Whether the SSD tier holds a copy of key now (Engine::ssd_copy_failed).
  // Under the engine's lock, like erase_ssd.
  virtual bool ssd_holds(std::uint64_t key) const = 0;
};

// Note [Link throttle]
// A throttled link books each transfer into the next free slot of its rate
// on a mem::LinkSchedule (Note [Link model] in mem/link.hpp, the schedule the
// simulated links book on too), and waits for the slot's start before
// issuing it. Transfers on one link therefore never exceed the rate
// together, and an emergency spill at 1 GB/s leaves the rest of the SSD's
// bandwidth to demand reads, whatever the transfer sizes.

// Real transport: one worker thread per link. Memory links copy with the
// device backend's memcpy_sync (device-emu: Note [Synchronous copies]), or,
// with stream_copies, with memcpy_async on the link's own stream and a
// synchronize of that stream (Note [Copies on u3m's streams]); SSD links use
// the store's async put/get (checksums verified on every get).
class BackendTransport final : public Transport {
 public:
  // `device` must outlive the transport; `ssd` may be null (two tiers).
  // stream_copies: the memory links create a stream each and copy on it.
  BackendTransport(mem::DeviceBackend& device, mem::SsdStore* ssd, bool stream_copies = false);
  ~BackendTransport() override;  // waits for transfers in flight
  void set_completion(TransferDone done) override;
  void start(const Transfer& t) override;
  Status erase_ssd(std::uint64_t key) override;
  bool has_ssd() const override { return ssd_ != nullptr; }
  bool ssd_holds(std::uint64_t key) const override { return ssd_ && ssd_->contains(key); }

 private:
  struct Worker;
  mem::DeviceBackend& device_;
  mem::SsdStore* ssd_;
  TransferDone done_;
  std::array<std::unique_ptr<Worker>, kNumLinks> workers_;
};

}  // namespace u3m::engine
