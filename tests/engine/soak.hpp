// The runtime's soak (issue 14): threads acquire, release, prefetch and
// evict tensors on the real stack for a while, with random faults of every
// class injected under the SSD store (transient I/O errors, silent lost,
// misdirected and torn writes, bit flips on read, corruption at rest) and
// its scrubber running. Every read is checked against the last version
// written. It reports what was done, injected, detected and lost; a byte
// read back wrong without an error ("silent") is the one thing that must
// never happen. scripts/soak.sh runs it for minutes under TSan; a short run
// is a test (test_soak).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "engine/rig.hpp"

namespace u3m::engine::testing {

struct SoakOptions {
  double seconds = 3;
  int threads = 4;
  int tensors = 400;
  std::uint64_t seed = 1;
  double fault_rate = 0.002;          // per I/O op and fault class
  double rot_per_s = 20;              // corruptions at rest per second
  std::vector<mem::IoFault> without;  // fault classes not injected
};

struct SoakReport {
  std::uint64_t ops = 0, reads = 0, writes = 0, prefetches = 0, evicts = 0;
  std::uint64_t injected = 0, injected_at_rest = 0;
  std::uint64_t injected_by_fault[16] = {};
  // Detected: the store's checks (write read-back, read checksums, scrub)
  // and I/O errors, and what the engine saw of them.
  std::uint64_t detected_store = 0, detected_engine = 0;
  std::uint64_t lost_tensors = 0, lost_bytes = 0;  // reported lost (no good copy left)
  std::uint64_t silent_bad_reads = 0;              // ok status, wrong bytes: never
  std::uint64_t refused = 0;                       // out_of_memory or busy
  mem::SsdStoreStats store;
  EngineStats engine;
  std::string first_unexpected;  // a status the soak does not expect
};

inline SoakReport run_soak(const SoakOptions& so) {
  using mem::IoFault;
  using mem::KiB;
  using mem::MiB;
  SoakReport rep;
  auto faults = std::make_shared<mem::FaultInjectionIoEngine>(
      std::shared_ptr<mem::IoEngine>(mem::make_default_io_engine(64)));
  constexpr IoFault kFaults[] = {IoFault::eio_on_write,      IoFault::enospc_on_write,
                                 IoFault::short_write,       IoFault::bit_flip_on_read,
                                 IoFault::eio_on_read,       IoFault::lost_write,
                                 IoFault::misdirected_write, IoFault::torn_write};
  for (std::size_t i = 0; i < std::size(kFaults); ++i)
    if (std::find(so.without.begin(), so.without.end(), kFaults[i]) == so.without.end())
      faults->fail_randomly(kFaults[i], so.fault_rate, so.seed * 131 + i);
  RigOptions o;
  o.device = 2 * MiB;
  o.host = 4 * MiB;
  o.ssd = 96 * MiB;
  o.io = faults;
  o.config.ssd_verify_max_age_ns = 50'000'000;  // verify often: exercise the path
  o.scrub_bytes_per_s = 64.0 * MiB;
  Rig rig(o);
  Engine& e = *rig.engine;

  std::mt19937_64 init(so.seed);
  std::vector<std::uint64_t> size(so.tensors);
  for (int i = 0; i < so.tensors; ++i) {
    size[i] = 256 + init() % (48 * KiB);
    e.add(i, size[i]);
  }
  std::vector<std::atomic<std::uint64_t>> version(so.tensors);  // 0 = no data yet
  // The soak's own guard: a lost tensor's reset (remove, add) excludes its
  // readers and writers, so none of them sees it half done.
  std::vector<std::shared_mutex> slot(so.tensors);
  std::atomic<std::uint64_t> ops{0}, reads{0}, writes{0}, prefetches{0}, evicts{0};
  std::atomic<std::uint64_t> silent{0}, refused{0}, lost_seen{0};
  std::mutex first_mu;
  std::string first;
  auto unexpected = [&](std::string what) {
    std::lock_guard g(first_mu);
    if (first.empty()) first = std::move(what);
  };
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::microseconds(static_cast<std::int64_t>(so.seconds * 1e6));
  std::atomic<bool> stop{false};

  // A lost tensor (no good copy left, reported as corrupt) starts afresh: it
  // is removed and registered again, so the soak goes on with it.
  auto reset_lost = [&](TensorId id) {
    std::unique_lock g(slot[id]);
    if (e.remove(id) == Status::ok) {
      e.add(id, size[id]);
      version[id] = 0;
      ++lost_seen;
    }
  };
  auto worker = [&](int t) {
    std::mt19937_64 rng(so.seed * 7919 + t);
    while (std::chrono::steady_clock::now() < end) {
      ++ops;
      const TensorId id = rng() % 2 ? rng() % (so.tensors / 8) : rng() % so.tensors;
      const Tier tier = rng() % 3 ? Tier::device : Tier::host;
      const unsigned what = rng() % 10;
      if (what < 3) {  // write a new version
        std::unique_lock g(slot[id]);
        Lease l;
        const Status s = e.acquire(id, tier, Access::write, &l);
        if (mem::ok(s)) {
          const std::uint64_t v = version[id].load() + 1;
          fill(l.ptr, l.bytes, id, v);
          version[id] = v;
          e.release(l);
          ++writes;
        } else if (s == Status::corrupt) {
          g.unlock();
          reset_lost(id);
        } else if (s == Status::out_of_memory || s == Status::busy) {
          ++refused;
        } else {
          unexpected(fmt::format("write {}: {}", id, mem::to_string(s)));
        }
      } else if (what == 3) {
        e.prefetch(id, tier);
        ++prefetches;
      } else if (what == 4) {
        e.evict(id, tier);
        ++evicts;
      } else {  // read and check
        std::shared_lock g(slot[id]);
        Lease l;
        const Status s = e.acquire(id, tier, Access::read, &l);
        if (mem::ok(s)) {
          const std::uint64_t v = version[id].load();  // no writer while we hold a read lease
          if (v != 0 && first_mismatch(l.ptr, l.bytes, id, v) >= 0) ++silent;
          e.release(l);
          ++reads;
        } else if (s == Status::corrupt) {
          g.unlock();
          reset_lost(id);
        } else if (s == Status::out_of_memory || s == Status::busy) {
          ++refused;
        } else if (s != Status::io_error && s != Status::short_io) {
          // A fetch that failed on I/O with copies left is retried by the
          // next acquire; anything else is a surprise.
          unexpected(fmt::format("read {}: {}", id, mem::to_string(s)));
        }
      }
    }
  };
  // Corruption at rest, at random moments, in what was written lately.
  std::thread rot([&] {
    if (!(so.rot_per_s > 0)) return;
    std::mt19937_64 rng(so.seed ^ 0xA5A5);
    const auto gap = std::chrono::microseconds(static_cast<std::int64_t>(1e6 / so.rot_per_s));
    while (!stop) {
      std::this_thread::sleep_for(gap);
      faults->corrupt_random_written(rng());
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < so.threads; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  stop = true;
  rot.join();
  e.drain();

  rep.ops = ops;
  rep.reads = reads;
  rep.writes = writes;
  rep.prefetches = prefetches;
  rep.evicts = evicts;
  rep.silent_bad_reads = silent;
  rep.refused = refused;
  rep.first_unexpected = first;
  for (std::size_t i = 0; i < std::size(kFaults); ++i) {
    rep.injected_by_fault[i] = faults->injected(kFaults[i]);
    rep.injected += rep.injected_by_fault[i];
  }
  rep.injected_at_rest = faults->injected_at_rest();
  rep.store = rig.stack.ssd()->stats();
  rep.engine = e.stats();
  rep.detected_store = rep.store.write_verify_failures + rep.store.checksum_failures +
                       rep.store.io_errors + rep.store.short_writes + rep.store.short_reads;
  rep.detected_engine = rep.engine.io_errors + rep.engine.no_space + rep.engine.short_io +
                        rep.engine.corrupt_reads + rep.engine.ssd_copies_failed;
  rep.lost_tensors = rep.engine.lost_tensors;
  rep.lost_bytes = rep.engine.lost_bytes;
  return rep;
}

}  // namespace u3m::engine::testing
