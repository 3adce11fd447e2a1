// No hang, ever (issue 14): an acquire or a wait that can never be satisfied
// returns out_of_memory at once, read off the leases, queues and tiers
// (Note [No progress] in src/engine/engine.cpp), and one that can still be
// satisfied waits. The property tests run random traces and random
// threads under random budgets down to 1 byte: each run ends, either with
// every byte right or with out_of_memory. Under TSan (make test-tsan) they
// also check the no-progress rule's own locking.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/rig.hpp"
#include "u3m/drive/replay.hpp"
#include "u3m/engine/steps.hpp"

namespace u3m::engine {
namespace {

using mem::KiB;
using mem::MiB;
using testing::ManualRig;
using testing::Rig;
using testing::RigOptions;
using drive::ReplayOptions;
using drive::ReplayReport;
using drive::replay_trace;

EngineConfig small(std::uint64_t device, std::uint64_t host) {
  EngineConfig c;
  c.device.capacity = device;
  c.host.capacity = host;
  return c;
}

// The reproducer in miniature: the caller holds one tensor on the
// device, the other needs the room it takes, and the host tier is too small
// to take the held one's write-back even if it were released.
TEST(NoProgress, OwnLeasesInTheWayGiveOutOfMemoryAtOnce) {
  ManualRig rig(small(96 * KiB, 16 * KiB));
  Engine& e = *rig.engine;
  ASSERT_EQ(e.add(1, 64 * KiB), Status::ok);
  ASSERT_EQ(e.add(2, 64 * KiB), Status::ok);
  Lease a;
  ASSERT_EQ(e.acquire(1, Tier::device, Access::write, &a), Status::ok);
  Lease b;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(e.acquire(2, Tier::device, Access::write, &b), Status::out_of_memory);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  const std::string why = Engine::last_failure();
  EXPECT_NE(why.find("tensor 2"), std::string::npos) << why;
  EXPECT_NE(why.find("0.06 MiB held by the waiting caller's own leases"), std::string::npos) << why;
  EXPECT_NE(why.find("device 0.06 MiB of 0.09 MiB used"), std::string::npos) << why;
  EXPECT_EQ(e.stats().oom, 1u);
  // The refusal changed nothing: the held tensor is where it was, whole.
  const auto r = e.residency(1);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->valid[0]);
  EXPECT_FALSE(r->lost);
  ASSERT_EQ(e.release(a), Status::ok);
  // Without the lease, tensor 1 could leave the device only for a host tier
  // too small for it: still no progress, now with no lease in the way.
  EXPECT_EQ(e.acquire(2, Tier::device, Access::write, &b), Status::out_of_memory);
  EXPECT_NE(Engine::last_failure().find("0.00 MiB held by the waiting caller's own leases"),
            std::string::npos)
      << Engine::last_failure();
}

// The same shape, but another thread holds the lease in the way and lets go
// later: the waiter must wait for it, not be refused.
TEST(NoProgress, AnotherThreadsLeaseIsWaitedFor) {
  RigOptions o;
  o.device = 128 * KiB;
  o.host = 1 * MiB;
  Rig rig(o);
  Engine& e = *rig.engine;
  ASSERT_EQ(e.add(1, 96 * KiB), Status::ok);
  ASSERT_EQ(e.add(2, 96 * KiB), Status::ok);
  std::atomic<bool> held{false}, go{false};
  std::thread other([&] {
    Lease l;
    ASSERT_EQ(e.acquire(1, Tier::device, Access::write, &l), Status::ok);
    held = true;
    while (!go) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    e.release(l);
  });
  while (!held) std::this_thread::yield();
  go = true;
  Lease b;
  EXPECT_EQ(e.acquire(2, Tier::device, Access::write, &b), Status::ok) << Engine::last_failure();
  other.join();
  if (b) e.release(b);
  EXPECT_EQ(e.stats().oom, 0u);
}

// A read lease of the caller's own blocks its write lease on the same
// tensor for ever: busy, not a hang.
TEST(NoProgress, OwnConflictingLeaseIsBusy) {
  ManualRig rig(small(1 * MiB, 1 * MiB));
  Engine& e = *rig.engine;
  ASSERT_EQ(e.add(7, 4 * KiB), Status::ok);
  Lease r, w;
  ASSERT_EQ(e.acquire(7, Tier::device, Access::read, &r), Status::ok);
  EXPECT_EQ(e.acquire(7, Tier::device, Access::write, &w), Status::busy);
  EXPECT_NE(Engine::last_failure().find("conflicting lease"), std::string::npos);
  ASSERT_EQ(e.release(r), Status::ok);
  EXPECT_EQ(e.acquire(7, Tier::device, Access::write, &w), Status::ok);
  e.release(w);
}

// The polling form: try_acquire schedules, wait_for_change waits. With only
// the caller's own lease in the way nothing can change; with another
// thread's, the wait ends when that thread lets go.
TEST(NoProgress, WaitForChangeRefusesOnlyWhenNothingCanChange) {
  RigOptions o;
  o.device = 96 * KiB;
  o.host = 1 * MiB;
  Rig rig(o);
  Engine& e = *rig.engine;
  ASSERT_EQ(e.add(1, 64 * KiB), Status::ok);
  ASSERT_EQ(e.add(2, 64 * KiB), Status::ok);
  Lease a, b;
  ASSERT_EQ(e.acquire(1, Tier::device, Access::write, &a), Status::ok);
  std::uint64_t seen = e.epoch();
  EXPECT_EQ(e.try_acquire(2, Tier::device, Access::write, &b), Status::busy);
  EXPECT_EQ(e.wait_for_change(seen), Status::out_of_memory);
  EXPECT_NE(Engine::last_failure().find("no progress is possible"), std::string::npos);
  ASSERT_EQ(e.release(a), Status::ok);

  std::atomic<bool> held{false};
  std::thread other([&] {
    Lease l;
    ASSERT_EQ(e.acquire(1, Tier::device, Access::read, &l), Status::ok);
    held = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    e.release(l);
  });
  while (!held) std::this_thread::yield();
  for (;;) {
    seen = e.epoch();
    const Status s = e.try_acquire(2, Tier::device, Access::write, &b);
    if (mem::ok(s)) break;
    ASSERT_EQ(s, Status::busy);
    ASSERT_EQ(e.wait_for_change(seen), Status::ok) << Engine::last_failure();
  }
  other.join();
  e.release(b);
  EXPECT_EQ(e.stats().oom, 1u);  // the first wait only
}

// Random traces under random budgets (log-uniform from 1 byte to twice the
// footprint, with and without an SSD tier), through the real replay: every
// run ends, with every byte read back right, or stopped with out_of_memory
// naming the tensor.
trace::Trace random_trace(std::mt19937_64& rng) {
  trace::Trace t;
  t.job("random");
  const int tensors = 4 + static_cast<int>(rng() % 40);
  for (int i = 0; i < tensors; ++i) {
    const std::uint64_t bytes = 1 + rng() % (rng() % 4 ? 16 * KiB : 256 * KiB);
    t.tensor(trace::make_tensor("t" + std::to_string(i), bytes, trace::DType::u8,
                                trace::Role::activation));
  }
  const int ops = 5 + static_cast<int>(rng() % 120);
  std::vector<std::uint8_t> live(tensors, 0);
  std::uint64_t time = 0;
  for (int j = 0; j < ops; ++j) {
    trace::Op op;
    op.name = "op" + std::to_string(j);
    op.iteration = static_cast<std::uint32_t>(j / 20);
    t.op(op);
    const int touches = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < touches; ++k) {
      const auto x = static_cast<std::uint32_t>(rng() % tensors);
      trace::EventKind kind = !live[x]    ? trace::EventKind::write
                              : rng() % 3 ? trace::EventKind::read
                                          : trace::EventKind::write;
      if (live[x] && rng() % 9 == 0) kind = trace::EventKind::free;
      live[x] = kind != trace::EventKind::free;
      t.event(trace::Event{time++, static_cast<std::uint32_t>(j), x, kind});
    }
  }
  return t;
}

std::uint64_t log_uniform(std::mt19937_64& rng, std::uint64_t hi) {
  const double x =
      std::uniform_real_distribution<double>(0, std::log2(static_cast<double>(hi)))(rng);
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::exp2(x)));
}

TEST(NoProgressProperty, RandomTracesAndBudgetsEndCorrectOrOutOfMemory) {
  mem::testing::ScratchDir dir;
  int oom = 0, whole = 0, must_fit = 0;
  const char* only = std::getenv("U3M_ONLY_RUN");  // to debug one run
  for (int run = 0; run < 60; ++run) {
    if (only && run != std::atoi(only)) continue;
    std::mt19937_64 rng(9000 + run);
    const trace::Trace t = random_trace(rng);
    ReplayOptions o;
    const std::uint64_t fp = std::max<std::uint64_t>(trace_footprint(t), 1);
    // Half the runs anywhere from 1 byte up, half near the footprint, where
    // most fit.
    const bool near = run % 2;
    o.device_budget = near ? fp / 4 + rng() % (2 * fp) : log_uniform(rng, 2 * fp);
    o.host_budget = near ? fp / 2 + rng() % (3 * fp) : log_uniform(rng, 2 * fp);
    if (rng() % 2) o.ssd_dir = dir.path();
    o.lookahead = static_cast<unsigned>(rng() % 5);
    SCOPED_TRACE(::testing::Message()
                 << "run " << run << ": device " << o.device_budget << " B, host " << o.host_budget
                 << " B, footprint " << fp << " B, ssd " << !o.ssd_dir.empty());
    const ReplayReport r = replay_trace(t, o);
    if (std::getenv("U3M_VERBOSE"))
      std::printf("run %d: device %llu host %llu fp %llu ssd %d -> %s\n", run,
                  (unsigned long long)o.device_budget, (unsigned long long)o.host_budget,
                  (unsigned long long)fp, !o.ssd_dir.empty(),
                  r.out_of_memory ? r.first_error.c_str() : "whole");
    std::fflush(stdout);
    EXPECT_EQ(r.mismatches, 0u);
    // A refusal must be real: with every op's tensors within 80% of the
    // device (the low watermark) and a host tier that holds the whole
    // footprint, room can always be made, so the run must finish.
    std::uint64_t most = 0;
    for (const Step& st : build_steps(t, 0)) {
      std::uint64_t need = 0;
      for (const Touch& x : st.touches) need += t.tensors[x.tensor].bytes;
      most = std::max(most, need);
    }
    if (10 * most <= 8 * o.device_budget && o.host_budget >= 2 * fp && ++must_fit)
      EXPECT_FALSE(r.out_of_memory) << "a false refusal: " << r.first_error;
    if (r.out_of_memory) {
      ++oom;
      EXPECT_EQ(r.errors, 1u) << r.first_error;
      EXPECT_NE(r.first_error.find("no progress is possible"), std::string::npos) << r.first_error;
    } else {
      ++whole;
      EXPECT_TRUE(r.ok()) << r.first_error;
      EXPECT_EQ(r.events, t.events.size());
    }
  }
  // The budgets span both outcomes; a rule that refused everything (or
  // nothing) would not give both.
  EXPECT_GT(oom, 5);
  EXPECT_GT(whole, 5);
  EXPECT_GT(must_fit, 3);  // the false-refusal check above was really made
}

// Threads that each hold up to four leases and ask for more, on both memory
// tiers, with budgets so small that they often block each other: every
// thread finishes (a cycle of waiters is broken by refusing the one that
// closes it), and every byte read equals the last byte written.
TEST(NoProgressProperty, ThreadsHoldingLeasesUnderTinyBudgetsAllFinish) {
  for (int round = 0; round < 6; ++round) {
    std::mt19937_64 cfg(77 + round);
    RigOptions o;
    o.device = 8 * KiB + cfg() % (256 * KiB);
    o.host = 4 * KiB + cfg() % (512 * KiB);
    o.ssd = round % 2 ? 16 * MiB : 0;
    Rig rig(o);
    Engine& e = *rig.engine;
    constexpr int kTensors = 64, kThreads = 4, kOps = 300;
    std::vector<std::atomic<std::uint64_t>> version(kTensors);
    std::vector<std::mutex> owner(kTensors);  // the test's own writer exclusion
    for (int i = 0; i < kTensors; ++i) ASSERT_EQ(e.add(i, 512 + cfg() % (24 * KiB)), Status::ok);
    std::atomic<std::uint64_t> bad{0}, refused{0}, granted{0}, other_errors{0};
    auto worker = [&](int seed) {
      std::mt19937_64 rng(seed);
      for (int k = 0; k < kOps; ++k) {
        std::vector<std::pair<Lease, std::uint64_t>> held;
        const int n = 1 + static_cast<int>(rng() % 4);
        for (int m = 0; m < n; ++m) {
          const TensorId id = rng() % kTensors;
          const bool dup = std::any_of(held.begin(), held.end(),
                                       [&](const auto& h) { return h.first.id == id; });
          if (dup) continue;  // the test's own rule: one lease per tensor and thread
          const Tier tier = rng() % 3 ? Tier::device : Tier::host;
          Lease l;
          const Status s = e.acquire(id, tier, Access::read, &l);
          if (s == Status::out_of_memory || s == Status::busy) {
            ++refused;
            break;
          }
          if (!mem::ok(s)) {
            ++other_errors;
            break;
          }
          ++granted;
          const std::uint64_t v = version[id].load();
          if (v && testing::first_mismatch(l.ptr, l.bytes, id, v) >= 0) ++bad;
          held.emplace_back(l, v);
        }
        for (auto& [l, v] : held) e.release(l);
        // A write, alone (so no cycle can involve it beyond its own room).
        const TensorId id = rng() % kTensors;
        std::unique_lock g(owner[id], std::try_to_lock);
        if (!g) continue;
        Lease w;
        const Status s = e.acquire(id, rng() % 2 ? Tier::device : Tier::host, Access::write, &w);
        if (mem::ok(s)) {
          const std::uint64_t v = version[id].load() + 1;
          testing::fill(w.ptr, w.bytes, id, v);
          version[id] = v;
          e.release(w);
        } else if (s == Status::out_of_memory || s == Status::busy) {
          ++refused;
        } else {
          ++other_errors;
        }
      }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, 100 * round + t);
    for (auto& t : threads) t.join();
    EXPECT_EQ(bad.load(), 0u) << "round " << round;
    EXPECT_EQ(other_errors.load(), 0u) << "round " << round;
    EXPECT_GT(granted.load(), 0u) << "round " << round;
  }
}

}  // namespace
}  // namespace u3m::engine

namespace u3m::engine {
namespace {

// Note [Claimed copies]: a copy fetched after a polling caller's try_acquire
// is kept from eviction until that tensor is asked for again. A blocking
// acquire that waits for that very fetch asks again: once it is granted the
// copy must be evictable again, or the tier fills with claimed copies
// nobody will ask for (seen as out of memory in u3m.torch.offload).
TEST(NoProgress, AGrantEndsTheClaimOfTheFetchItWaitedFor) {
  ManualRig rig(small(128 * KiB, 1 * MiB));
  Engine& e = *rig.engine;
  ASSERT_EQ(e.add(1, 64 * KiB), Status::ok);
  ASSERT_EQ(e.add(2, 96 * KiB), Status::ok);
  Lease l;
  ASSERT_EQ(e.acquire(1, Tier::device, Access::write, &l), Status::ok);
  ASSERT_EQ(e.release(l), Status::ok);
  ASSERT_EQ(e.evict(1, Tier::device), Status::ok);
  while (rig.transport.pending()) rig.transport.complete();
  ASSERT_FALSE(e.residency(1)->valid[0]);

  // The polling ask starts the fetch; a blocking ask then waits for it.
  ASSERT_EQ(e.try_acquire(1, Tier::device, Access::read, &l), Status::busy);
  std::atomic<bool> granted{false};
  std::thread waiter([&] {
    Lease w;
    ASSERT_EQ(e.acquire(1, Tier::device, Access::read, &w), Status::ok);
    granted = true;
    e.release(w);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let it block
  while (!granted) {
    if (rig.transport.pending()) rig.transport.complete();
    std::this_thread::yield();
  }
  waiter.join();

  // Tensor 2 needs the room tensor 1's clean device copy takes.
  Lease b;
  EXPECT_EQ(e.acquire(2, Tier::device, Access::write, &b), Status::ok) << Engine::last_failure();
  if (b) e.release(b);
  EXPECT_EQ(e.stats().oom, 0u);
}

}  // namespace
}  // namespace u3m::engine
