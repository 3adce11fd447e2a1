// Test rigs for the runtime: the real one (device-emu, host, SSD store,
// BackendTransport, wall clock) and a manual one whose transfers complete
// only when the test says so (deterministic ordering and failure tests).
#pragma once

#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "mem/test_ssd_util.hpp"
#include "u3m/engine/engine.hpp"
#include "u3m/engine/real_stack.hpp"
#include "u3m/mem/backend_source.hpp"
#include "u3m/mem/device_emu.hpp"
#include "u3m/mem/host.hpp"
#include "u3m/mem/io_engine.hpp"

namespace u3m::engine::testing {

// Deterministic contents for (tensor, version): a test can check any byte.
inline std::uint8_t pattern_byte(std::uint64_t id, std::uint64_t version, std::uint64_t i) {
  std::uint64_t x = id * 0x9E3779B97F4A7C15ull ^ (version + 1) * 0xC2B2AE3D27D4EB4Full ^ (i >> 3);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<std::uint8_t>(x >> ((i & 7) * 8));
}
inline void fill(void* p, std::uint64_t bytes, std::uint64_t id, std::uint64_t version) {
  auto* b = static_cast<std::uint8_t*>(p);
  for (std::uint64_t i = 0; i < bytes; ++i) b[i] = pattern_byte(id, version, i);
}
// Index of the first wrong byte, or -1.
inline std::int64_t first_mismatch(const void* p, std::uint64_t bytes, std::uint64_t id,
                                   std::uint64_t version) {
  auto* b = static_cast<const std::uint8_t*>(p);
  for (std::uint64_t i = 0; i < bytes; ++i) {
    if (b[i] != pattern_byte(id, version, i)) return static_cast<std::int64_t>(i);
  }
  return -1;
}

// Writes version `v` of tensor `id` in `tier` through a write lease.
inline Status write_version(Engine& e, TensorId id, std::uint64_t v, Tier tier) {
  Lease l;
  Status s = e.acquire(id, tier, Access::write, &l);
  if (!mem::ok(s)) return s;
  fill(l.ptr, l.bytes, id, v);
  return e.release(l);
}

struct RigOptions {
  std::uint64_t device = 1 * mem::MiB, host = 4 * mem::MiB, ssd = 0;  // ssd 0 = two tiers
  std::shared_ptr<mem::IoEngine> io;                                  // null: default engine
  EngineConfig config{};
  double scrub_bytes_per_s = 0;  // the SSD store's scrubber; 0 = off (deterministic tests)
};

// The real stack on this machine (engine::RealStack), quiet copy engines.
struct Rig {
  RealStack stack;
  Engine* engine;

  static StackSpec options(const RigOptions& o) {
    StackSpec r;
    r.device_bytes = o.device;
    r.host_bytes = o.host;
    r.ssd_bytes = o.ssd;  // in a scratch directory removed with the stack
    r.ssd_io = o.io;
    r.copy_spin = false;
    r.engine = o.config;
    r.ssd_scrub_bytes_per_s = o.scrub_bytes_per_s;
    return r;
  }
  explicit Rig(RigOptions o = {}) : stack(options(o)), engine(&stack.engine()) {}

  // Writes version `v` of tensor `id` in `tier`.
  Status write(TensorId id, std::uint64_t v, Tier tier = Tier::device) {
    return write_version(*engine, id, v, tier);
  }
  // Reads the tensor in `tier` and checks it holds version `v`.
  ::testing::AssertionResult holds(TensorId id, std::uint64_t v, Tier tier = Tier::device) {
    Lease l;
    Status s = engine->acquire(id, tier, Access::read, &l);
    if (!mem::ok(s)) return ::testing::AssertionFailure() << "acquire: " << mem::to_string(s);
    std::int64_t bad = first_mismatch(l.ptr, l.bytes, id, v);
    engine->release(l);
    if (bad >= 0) return ::testing::AssertionFailure() << "tensor " << id << " byte " << bad;
    return ::testing::AssertionSuccess();
  }
};

// A transport whose transfers wait until the test completes them; memory
// transfers really copy (host memory only), SSD ones keep bytes in a map.
class ManualTransport final : public Transport {
 public:
  void set_completion(TransferDone done) override { done_ = std::move(done); }
  void start(const Transfer& t) override {
    std::lock_guard lk(mu_);
    started.push_back(t);
  }
  Status erase_ssd(std::uint64_t key) override {
    std::lock_guard lk(mu_);
    ssd_.erase(key);
    ++erases;
    return Status::ok;
  }
  bool has_ssd() const override { return with_ssd; }
  bool ssd_holds(std::uint64_t key) const override {
    std::lock_guard lk(mu_);
    return ssd_.contains(key);
  }

  // Completes the oldest started transfer (or the one with `ticket`).
  Transfer complete(Status s = Status::ok, std::optional<std::uint64_t> ticket = {}) {
    Transfer t;
    {
      std::lock_guard lk(mu_);
      auto it = started.begin();
      if (ticket) {
        while (it != started.end() && it->ticket != *ticket) ++it;
      }
      if (it == started.end()) throw std::runtime_error("no such transfer");
      t = *it;
      started.erase(it);
      if (mem::ok(s)) {
        if (t.link == Link::h2s) {
          auto& v = ssd_[t.tensor];
          v.assign(static_cast<const char*>(t.src), static_cast<const char*>(t.src) + t.bytes);
        } else if (t.link == Link::s2h) {
          const auto& v = ssd_.at(t.tensor);
          if (t.dst) std::memcpy(t.dst, v.data(), t.bytes);  // null: a verify read
        } else {
          std::memcpy(t.dst, t.src, t.bytes);
        }
      }
    }
    done_(t, s);
    return t;
  }
  std::size_t pending() {
    std::lock_guard lk(mu_);
    return started.size();
  }

  bool with_ssd = true;
  std::deque<Transfer> started;
  std::uint64_t erases = 0;

 private:
  mutable std::mutex mu_;
  TransferDone done_;
  std::map<std::uint64_t, std::vector<char>> ssd_;
};

// The engine over host memory only: "device" copies come from a pool over
// real host memory, and a ManualTransport moves the bytes.
struct ManualRig {
  mem::CpuSegmentSource source;
  mem::DevicePool pool;
  mem::HostBackend host;
  ManualTransport transport;
  ManualClock clock;
  std::unique_ptr<Engine> engine;
  explicit ManualRig(EngineConfig c)
      : source(2 * mem::MiB), pool(source, mem::PoolConfig{}), host(mem::HostOptions{}) {
    engine = std::make_unique<Engine>(c, pool, host, transport, clock);
  }
  ~ManualRig() {
    while (transport.pending()) transport.complete();
    engine.reset();
  }
};

}  // namespace u3m::engine::testing
