// Faults under the runtime (issue 4): EIO on write, ENOSPC, a short write and
// a flipped bit on read, injected under the SSD store. None loses or
// silently corrupts a tensor; each is reported and counted.
#include <gtest/gtest.h>

#include "engine/rig.hpp"

namespace u3m::engine {
namespace {

using mem::IoFault;
using mem::KiB;
using mem::MiB;
using testing::Rig;
using testing::RigOptions;

struct FaultRig {
  std::shared_ptr<mem::FaultInjectionIoEngine> io = std::make_shared<mem::FaultInjectionIoEngine>(
      std::shared_ptr<mem::IoEngine>(mem::make_default_io_engine(64)));
  std::unique_ptr<Rig> rig;
  explicit FaultRig(std::uint64_t host = 1 * MiB, unsigned retries = 2) {
    RigOptions o;
    o.device = 512 * KiB;
    o.host = host;
    o.ssd = 32 * MiB;
    o.io = io;
    o.config.read_retries = retries;
    rig = std::make_unique<Rig>(o);
  }
};

// Writes a tensor on host, asks it to move to SSD with `fault` on that write,
// and checks the host copy survived, the error was counted, and a retry works.
void write_fault_keeps_the_host_copy(IoFault fault, std::uint64_t EngineStats::*counter) {
  FaultRig f;
  Engine& e = *f.rig->engine;
  ASSERT_EQ(e.add(1, 64 * KiB), Status::ok);
  ASSERT_EQ(f.rig->write(1, 5, Tier::host), Status::ok);
  f.io->fail_nth(fault, 1);
  ASSERT_EQ(e.evict(1, Tier::host), Status::ok);
  e.drain();
  EXPECT_EQ(f.io->injected(fault), 1u);
  auto r = e.residency(1);
  EXPECT_TRUE(r->valid[1]) << "the host copy must stay when the SSD write fails";
  EXPECT_FALSE(r->valid[2]);
  EXPECT_FALSE(r->lost);
  EngineStats st = e.stats();
  EXPECT_EQ(st.*counter, 1u);
  EXPECT_EQ(st.links[static_cast<int>(Link::h2s)].failures, 1u);
  EXPECT_TRUE(f.rig->holds(1, 5, Tier::host));
  // The next write-back succeeds, and the SSD copy reads back intact.
  ASSERT_EQ(e.evict(1, Tier::host), Status::ok);
  e.drain();
  r = e.residency(1);
  EXPECT_FALSE(r->valid[1]);
  EXPECT_TRUE(r->valid[2]);
  EXPECT_TRUE(f.rig->holds(1, 5, Tier::device));
}

TEST(EngineFaults, EioOnWriteKeepsTheUpperCopy) {
  write_fault_keeps_the_host_copy(IoFault::eio_on_write, &EngineStats::io_errors);
}
TEST(EngineFaults, EnospcKeepsTheUpperCopy) {
  write_fault_keeps_the_host_copy(IoFault::enospc_on_write, &EngineStats::no_space);
}
TEST(EngineFaults, ShortWriteKeepsTheUpperCopy) {
  write_fault_keeps_the_host_copy(IoFault::short_write, &EngineStats::short_io);
}

TEST(EngineFaults, FlippedBitOnReadIsCaughtAndReread) {
  FaultRig f;
  Engine& e = *f.rig->engine;
  ASSERT_EQ(e.add(1, 64 * KiB), Status::ok);
  ASSERT_EQ(f.rig->write(1, 8, Tier::host), Status::ok);
  ASSERT_EQ(e.evict(1, Tier::host), Status::ok);
  e.drain();
  ASSERT_TRUE(e.residency(1)->valid[2]);
  f.io->fail_nth(IoFault::bit_flip_on_read, 1);
  EXPECT_TRUE(f.rig->holds(1, 8, Tier::device));
  EngineStats st = e.stats();
  EXPECT_EQ(f.io->injected(IoFault::bit_flip_on_read), 1u);
  EXPECT_EQ(st.corrupt_reads, 1u);
  EXPECT_EQ(st.links[static_cast<int>(Link::s2h)].retries, 1u);
  EXPECT_EQ(st.lost_tensors, 0u);
}

TEST(EngineFaults, RandomFaultSoakLosesNothingAndCountsEveryFault) {
  FaultRig f(/*host=*/512 * KiB, /*retries=*/6);
  Engine& e = *f.rig->engine;
  constexpr int kN = 160;  // 160 x 16 KiB = 2.5 MiB through 0.5 + 0.5 MiB of memory tiers
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(e.add(i, 16 * KiB), Status::ok);
    ASSERT_EQ(f.rig->write(i, 1), Status::ok);
  }
  for (IoFault x : {IoFault::eio_on_write, IoFault::enospc_on_write, IoFault::short_write,
                    IoFault::bit_flip_on_read}) {
    f.io->fail_randomly(x, 0.03, 7 + static_cast<int>(x));
  }
  std::vector<std::uint64_t> version(kN, 1);
  std::mt19937_64 rng(3);
  for (int k = 0; k < 1500; ++k) {
    int i = static_cast<int>(rng() % kN);
    Tier t = rng() % 2 ? Tier::device : Tier::host;
    if (rng() % 4 == 0) {
      ASSERT_EQ(f.rig->write(i, ++version[i], t), Status::ok);
    } else {
      ASSERT_TRUE(f.rig->holds(i, version[i], t)) << "op " << k;
    }
  }
  e.drain();
  f.io->clear();
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(f.rig->holds(i, version[i], Tier::host)) << i;
  EngineStats st = e.stats();
  EXPECT_EQ(st.lost_tensors, 0u);
  // Every blob is one extent, so each injected fault is exactly one failed transfer.
  EXPECT_EQ(st.io_errors, f.io->injected(IoFault::eio_on_write));
  EXPECT_EQ(st.no_space, f.io->injected(IoFault::enospc_on_write));
  EXPECT_EQ(st.short_io, f.io->injected(IoFault::short_write));
  // A flip may also hit a read the SSD store makes for itself (a write's
  // read-back, a re-validation, a confirming re-read), which the store absorbs
  // or reports as the put's failure: at most one failed transfer per flip.
  EXPECT_LE(st.corrupt_reads, f.io->injected(IoFault::bit_flip_on_read));
  EXPECT_GT(st.corrupt_reads, 0u);
  EXPECT_GT(f.io->injected_total(), 10u);  // the soak really injected faults
}

// Note [Verified before dropped], on a transport the test completes by hand:
// a clean host copy over an SSD copy that has not checked out lately is
// dropped only after a verify read, and kept if that read fails.
struct VerifyRig {
  testing::ManualRig rig;
  Engine& e;
  explicit VerifyRig(std::uint64_t max_age_ns)
      : rig([&] {
          EngineConfig c;
          c.device.capacity = 1 * MiB;
          c.host.capacity = 1 * MiB;
          c.ssd_verify_max_age_ns = max_age_ns;
          return c;
        }()),
        e(*rig.engine) {}
  // Tensor 1 with version 3 on host and SSD, both valid (written, written
  // back, read back).
  void host_and_ssd() {
    ASSERT_EQ(e.add(1, 64 * KiB), Status::ok);
    ASSERT_EQ(testing::write_version(e, 1, 3, Tier::host), Status::ok);
    ASSERT_EQ(e.evict(1, Tier::host), Status::ok);
    ASSERT_EQ(rig.transport.pending(), 1u);
    ASSERT_EQ(rig.transport.complete().link, Link::h2s);
    ASSERT_FALSE(e.residency(1)->valid[1]);
    Lease l;
    ASSERT_EQ(e.try_acquire(1, Tier::host, Access::read, &l), Status::busy);
    ASSERT_EQ(rig.transport.complete().link, Link::s2h);
    ASSERT_EQ(e.try_acquire(1, Tier::host, Access::read, &l), Status::ok);
    EXPECT_EQ(testing::first_mismatch(l.ptr, l.bytes, 1, 3), -1);
    ASSERT_EQ(e.release(l), Status::ok);
    ASSERT_TRUE(e.residency(1)->valid[1]);
    ASSERT_TRUE(e.residency(1)->valid[2]);
  }
};

TEST(EngineVerify, AFreshSsdCopyLetsTheUpperCopyGoAtOnce) {
  VerifyRig v(~0ull);  // every copy counts as fresh
  v.host_and_ssd();
  ASSERT_EQ(v.e.evict(1, Tier::host), Status::ok);
  EXPECT_EQ(v.rig.transport.pending(), 0u);
  EXPECT_FALSE(v.e.residency(1)->valid[1]);
  EXPECT_EQ(v.e.stats().ssd_verifies, 0u);
}

TEST(EngineVerify, AnOldSsdCopyIsReadBackBeforeTheUpperCopyGoes) {
  VerifyRig v(0);
  v.host_and_ssd();
  ASSERT_EQ(v.e.evict(1, Tier::host), Status::ok);
  ASSERT_EQ(v.rig.transport.pending(), 1u);
  const Transfer t = v.rig.transport.started.front();
  EXPECT_EQ(t.link, Link::s2h);
  EXPECT_EQ(t.dst, nullptr);  // a read that only checks
  EXPECT_TRUE(v.e.residency(1)->valid[1]) << "dropped before the check came back";
  v.rig.transport.complete();
  EXPECT_FALSE(v.e.residency(1)->valid[1]);
  EXPECT_TRUE(v.e.residency(1)->valid[2]);
  const EngineStats st = v.e.stats();
  EXPECT_EQ(st.ssd_verifies, 1u);
  EXPECT_EQ(st.ssd_verify_failures, 0u);
  EXPECT_EQ(st.clean_drops, 1u);
}

TEST(EngineVerify, AFailedCheckKeepsTheUpperCopyAndRewritesIt) {
  VerifyRig v(0);
  v.host_and_ssd();
  ASSERT_EQ(v.e.evict(1, Tier::host), Status::ok);
  v.rig.transport.complete(Status::corrupt);
  auto r = v.e.residency(1);
  EXPECT_TRUE(r->valid[1]) << "the only good copy must stay";
  EXPECT_FALSE(r->valid[2]);
  EXPECT_FALSE(r->lost);
  EXPECT_EQ(v.e.stats().ssd_verify_failures, 1u);
  // The next eviction writes it back (a repair), and the data is intact.
  ASSERT_EQ(v.e.evict(1, Tier::host), Status::ok);
  ASSERT_EQ(v.rig.transport.complete().link, Link::h2s);
  r = v.e.residency(1);
  EXPECT_FALSE(r->valid[1]);
  EXPECT_TRUE(r->valid[2]);
  Lease l;
  ASSERT_EQ(v.e.try_acquire(1, Tier::host, Access::read, &l), Status::busy);
  v.rig.transport.complete();
  ASSERT_EQ(v.e.try_acquire(1, Tier::host, Access::read, &l), Status::ok);
  EXPECT_EQ(testing::first_mismatch(l.ptr, l.bytes, 1, 3), -1);
  v.e.release(l);
}

// The store found the only copy corrupt (a scrub): the tensor is reported
// lost, never served. A copy the store still holds is left alone.
TEST(EngineVerify, AnSsdCopyTheStoreDroppedIsForgottenAndTheLossReported) {
  VerifyRig v(~0ull);
  v.host_and_ssd();
  ASSERT_EQ(v.e.evict(1, Tier::host), Status::ok);  // fresh: dropped at once
  ASSERT_FALSE(v.e.residency(1)->valid[1]);
  v.e.ssd_copy_failed(1);  // the store still holds it: not this copy
  EXPECT_TRUE(v.e.residency(1)->valid[2]);
  EXPECT_EQ(v.e.stats().ssd_copies_failed, 0u);
  v.rig.transport.erase_ssd(1);  // as the store does before it calls back
  v.e.ssd_copy_failed(1);
  v.e.ssd_copy_failed(1);  // idempotent
  const auto r = v.e.residency(1);
  EXPECT_TRUE(r->lost);
  const EngineStats st = v.e.stats();
  EXPECT_EQ(st.ssd_copies_failed, 1u);
  EXPECT_EQ(st.lost_tensors, 1u);
  EXPECT_EQ(st.lost_bytes, 64 * KiB);
  Lease l;
  EXPECT_EQ(v.e.acquire(1, Tier::device, Access::read, &l), Status::corrupt);
}

}  // namespace
}  // namespace u3m::engine
