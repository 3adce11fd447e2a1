// Verification of what the store holds: corruption at rest (a bit flipped in
// the file after the data was written and checked) is caught by get, by
// verify() and by the scrubber, which retire the entry and call on_corrupt
// once with its key; a transient read fault is not mistaken for it; write
// admission re-validates the stored copy before skipping a rewrite; write
// verification reads back exactly what was written.
#include <chrono>
#include <thread>

#include "test_ssd_util.hpp"

namespace u3m::mem {
namespace {

using testing::blob;
using testing::CorruptKeys;
using testing::open_store;
using testing::ScratchDir;

class SsdVerify : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::string why;
    faults = testing::fault_engine(GetParam(), why);
    if (!faults) GTEST_SKIP() << "io_uring unavailable: " << why;
  }

  SsdStoreOptions options() {
    SsdStoreOptions o;
    o.path = dir.file("store.dat");
    o.capacity = 16 * MiB;
    o.chunk_bytes = 64 * KiB;  // several extents per entry
    o.engine = faults;
    o.on_corrupt = corrupt.callback();
    return o;
  }

  // Puts key (version 1) and returns the writes it issued.
  std::vector<FaultInjectionIoEngine::WrittenRange> put(std::uint64_t key, std::size_t n) {
    auto before = faults->recent_writes().size();
    auto v = blob(key, 1, n);
    EXPECT_EQ(store->put(key, v.data(), n, false), Status::ok);
    auto log = faults->recent_writes();
    return {log.begin() + static_cast<std::ptrdiff_t>(before), log.end()};
  }

  // Three entries; the second extent of key 2 gets a flipped bit on disk.
  void three_entries_one_corrupt() {
    put(1, 150 * KiB);
    auto w = put(2, 200 * KiB);
    put(3, 100 * KiB);
    ASSERT_EQ(w.size(), 4u);
    ASSERT_EQ(faults->corrupt_at_rest(w[1].fd, w[1].offset, w[1].len, 99), Status::ok);
  }

  void expect_intact(std::uint64_t key, std::size_t n) {
    std::vector<unsigned char> out(n);
    ASSERT_EQ(store->get(key, out.data(), n), Status::ok) << key;
    EXPECT_EQ(out, blob(key, 1, n)) << key;
  }

  void expect_retired_once(std::uint64_t key) {
    EXPECT_EQ(corrupt.all(), (std::map<std::uint64_t, std::uint64_t>{{key, 1}}));
    EXPECT_FALSE(store->contains(key));
    auto st = store->stats();
    EXPECT_EQ(st.corrupt_retired, 1u);
    EXPECT_EQ(st.entries, 2u);
    expect_intact(1, 150 * KiB);
    expect_intact(3, 100 * KiB);
  }

  ScratchDir dir;
  CorruptKeys corrupt;
  std::shared_ptr<FaultInjectionIoEngine> faults;
  std::unique_ptr<SsdStore> store;
};

TEST_P(SsdVerify, CorruptionAtRestIsCaughtByGet) {
  store = open_store(options());
  three_entries_one_corrupt();
  std::vector<unsigned char> out(200 * KiB);
  auto before = store->stats();
  EXPECT_EQ(store->get(2, out.data(), out.size()), Status::corrupt);
  auto after = store->stats();
  EXPECT_EQ(after.checksum_failures, before.checksum_failures + 2);  // the read and its re-read
  EXPECT_EQ(after.verify_reads, before.verify_reads + 1);            // the re-read of one extent
  EXPECT_EQ(store->get(2, out.data(), out.size()), Status::not_found);
  expect_retired_once(2);
}

TEST_P(SsdVerify, CorruptionAtRestIsCaughtByVerify) {
  store = open_store(options());
  three_entries_one_corrupt();
  auto before = store->stats();
  EXPECT_EQ(store->verify(1), Status::ok);
  EXPECT_EQ(store->stats().verify_reads, before.verify_reads + 3);  // 150 KiB: three extents
  EXPECT_EQ(store->verify(2), Status::corrupt);
  EXPECT_EQ(store->verify(2), Status::not_found);
  EXPECT_EQ(store->verify(77), Status::not_found);
  expect_retired_once(2);
}

TEST_P(SsdVerify, CorruptionAtRestIsCaughtByScrub) {
  store = open_store(options());
  EXPECT_EQ(store->scrub(MiB), 0u);  // nothing to scrub
  three_entries_one_corrupt();
  EXPECT_EQ(store->scrub(0), 0u);
  EXPECT_EQ(store->scrub(MiB), 450 * KiB);  // every entry once, though the budget is larger
  auto st = store->stats();
  EXPECT_EQ(st.scrub_failures, 1u);
  EXPECT_EQ(st.scrubbed_bytes, 450 * KiB);
  expect_retired_once(2);
  EXPECT_EQ(store->scrub(MiB), 250 * KiB);
  EXPECT_EQ(store->stats().scrub_failures, 1u);
}

// The cursor moves round robin over entries and survives their removal.
TEST_P(SsdVerify, ScrubWalksEntriesRoundRobin) {
  store = open_store(options());
  put(1, 10 * KiB);
  put(2, 20 * KiB);
  put(3, 30 * KiB);
  std::vector<std::uint64_t> seen;
  for (int i = 0; i < 4; ++i) seen.push_back(store->scrub(1));  // one entry per call
  EXPECT_EQ(seen, (std::vector<std::uint64_t>{10 * KiB, 20 * KiB, 30 * KiB, 10 * KiB}));
  ASSERT_EQ(store->erase(2), Status::ok);  // the cursor's entry
  put(4, 40 * KiB);
  seen.clear();
  for (int i = 0; i < 3; ++i) seen.push_back(store->scrub(1));
  EXPECT_EQ(seen, (std::vector<std::uint64_t>{30 * KiB, 40 * KiB, 10 * KiB}));
}

// A bit flipped on the way (not on disk) fails the first read but not the
// confirming one: verify answers ok and the entry stays.
TEST_P(SsdVerify, TransientReadFaultIsNotCorruptionAtRest) {
  store = open_store(options());
  put(1, 150 * KiB);
  faults->fail_nth(IoFault::bit_flip_on_read, 2);
  EXPECT_EQ(store->verify(1), Status::ok);
  auto st = store->stats();
  EXPECT_EQ(st.checksum_failures, 1u);
  EXPECT_EQ(st.corrupt_retired, 0u);
  EXPECT_EQ(corrupt.total(), 0u);
  expect_intact(1, 150 * KiB);
  // A read error is reported as such, and is not corruption either.
  faults->fail_nth(IoFault::eio_on_read, 1);
  EXPECT_EQ(store->verify(1), Status::io_error);
  EXPECT_TRUE(store->contains(1));
}

// Note [Corrupt at rest]: only the same wrong bytes twice retire an entry.
TEST_P(SsdVerify, OnlyAReproducibleBadReadRetiresAnEntry) {
  store = open_store(options());
  auto w = put(1, 60 * KiB);  // one extent: the n-th read from now is its n-th read
  ASSERT_EQ(w.size(), 1u);
  // Two reads flipped in different bits, then a clean one: transient, kept.
  faults->fail_nth(IoFault::bit_flip_on_read, 1);
  faults->fail_nth(IoFault::bit_flip_on_read, 2);
  EXPECT_EQ(store->verify(1), Status::ok);
  EXPECT_EQ(store->stats().checksum_failures, 2u);
  // Every read flipped differently: no verdict on the data, so io_error, kept.
  faults->fail_randomly(IoFault::bit_flip_on_read, 1.0, 3);
  EXPECT_EQ(store->verify(1), Status::io_error);
  faults->clear();
  EXPECT_EQ(store->stats().checksum_failures, 2u + 4u);  // the read and its three re-reads
  EXPECT_TRUE(store->contains(1));
  EXPECT_EQ(corrupt.total(), 0u);
  expect_intact(1, 60 * KiB);
  // Corrupt at rest, and the first re-read flipped on the way as well: the
  // second re-read matches the first read, which settles it.
  ASSERT_EQ(faults->corrupt_at_rest(w[0].fd, w[0].offset, w[0].len, 11), Status::ok);
  faults->fail_nth(IoFault::bit_flip_on_read, 2);
  EXPECT_EQ(store->verify(1), Status::corrupt);
  EXPECT_EQ(corrupt.count(1), 1u);
  EXPECT_FALSE(store->contains(1));
  EXPECT_EQ(store->stats().corrupt_retired, 1u);
}

TEST_P(SsdVerify, BackgroundScrubberFindsCorruptionAtItsRate) {
  auto o = options();
  o.scrub_bytes_per_s = 4 * MiB;
  const auto t0 = std::chrono::steady_clock::now();
  store = open_store(o);
  three_entries_one_corrupt();
  for (int i = 0; i < 1000 && corrupt.total() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(corrupt.count(2), 1u) << "the scrubber did not find it within 10 s";
  auto st = store->stats();
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // At most the rate, plus one slice (rate / 20) and one whole entry of slack.
  EXPECT_LE(static_cast<double>(st.scrubbed_bytes), 4.0 * MiB * elapsed + 4.0 * MiB / 20 + 200 * KiB)
      << "elapsed " << elapsed << " s";
  EXPECT_GE(st.scrub_failures, 1u);
  expect_retired_once(2);
}

// The scrubber's wait between slices is cut short by the destructor.
TEST_P(SsdVerify, DestructorStopsASleepingScrubberAtOnce) {
  auto o = options();
  o.scrub_bytes_per_s = 4096;  // a 100 KiB entry buys a 25 s wait
  store = open_store(o);
  put(1, 100 * KiB);
  for (int i = 0; i < 500 && store->stats().scrubbed_bytes == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GT(store->stats().scrubbed_bytes, 0u);
  auto t0 = std::chrono::steady_clock::now();
  store.reset();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

// ------------------------------------------------------------- re-validation

TEST_P(SsdVerify, UnchangedRewriteReadsTheStoredCopyInsteadOfWriting) {
  store = open_store(options());
  auto v = blob(1, 1, 150 * KiB);
  ASSERT_EQ(store->put(1, v.data(), v.size(), false), Status::ok);
  auto io = store->engine().stats();
  ASSERT_EQ(store->put(1, v.data(), v.size(), true), Status::ok);
  auto io2 = store->engine().stats();
  EXPECT_EQ(io2.writes, io.writes);     // no write
  EXPECT_EQ(io2.reads, io.reads + 3);   // each extent read back
  auto st = store->stats();
  EXPECT_EQ(st.revalidations, 1u);
  EXPECT_EQ(st.writes_avoided, 1u);
  EXPECT_EQ(st.verify_reads, 3u + 3u);  // the first put's read-back, then the re-validation
  expect_intact(1, 150 * KiB);
}

// The stored copy went bad after it was written: the unchanged put notices,
// retires it, writes a fresh copy, and does not call on_corrupt (it repaired
// the copy itself).
TEST_P(SsdVerify, RevalidationRewritesAStaleCopy) {
  store = open_store(options());
  auto w = put(1, 150 * KiB);
  ASSERT_EQ(faults->corrupt_at_rest(w[2].fd, w[2].offset, w[2].len, 5), Status::ok);
  auto io = store->engine().stats();
  auto v = blob(1, 1, 150 * KiB);
  ASSERT_EQ(store->put(1, v.data(), v.size(), false), Status::ok);
  EXPECT_EQ(store->engine().stats().writes, io.writes + 3);  // written again
  auto st = store->stats();
  EXPECT_EQ(st.revalidations, 1u);
  EXPECT_EQ(st.writes_avoided, 0u);
  EXPECT_EQ(st.revalidation_failures, 1u);
  EXPECT_EQ(st.corrupt_retired, 0u);  // only what on_corrupt was told counts there
  EXPECT_EQ(st.checksum_failures, 2u);  // the re-validation read and its re-read
  EXPECT_EQ(corrupt.total(), 0u);
  EXPECT_EQ(st.entries, 1u);
  expect_intact(1, 150 * KiB);
  EXPECT_EQ(store->verify(1), Status::ok);
}

// A re-validation hit by a read error cannot vouch for the copy: the put writes.
TEST_P(SsdVerify, RevalidationThatCannotReadWrites) {
  store = open_store(options());
  auto v = blob(1, 1, 150 * KiB);
  ASSERT_EQ(store->put(1, v.data(), v.size(), false), Status::ok);
  auto writes = store->engine().stats().writes;
  faults->fail_nth(IoFault::eio_on_read, 1);
  ASSERT_EQ(store->put(1, v.data(), v.size(), false), Status::ok);
  EXPECT_EQ(store->engine().stats().writes, writes + 3);
  EXPECT_EQ(store->stats().writes_avoided, 0u);
  EXPECT_EQ(store->stats().revalidation_failures, 1u);
  expect_intact(1, 150 * KiB);
}

// ------------------------------------------------------- write verification

TEST_P(SsdVerify, EveryPutIsReadBackUnlessTurnedOff) {
  for (bool verify : {true, false}) {
    SCOPED_TRACE(verify);
    store.reset();
    auto o = options();
    o.verify_writes = verify;
    store = open_store(o);
    auto reads = store->engine().stats().reads;
    for (std::size_t n : {std::size_t{1}, 64 * KiB, 64 * KiB + 1, 300 * KiB}) {
      auto v = blob(n, 1, n);
      ASSERT_EQ(store->put(n, v.data(), n, false), Status::ok);
    }
    const std::uint64_t extents = 1 + 1 + 2 + 5;
    EXPECT_EQ(store->engine().stats().reads - reads, verify ? extents : 0u);
    EXPECT_EQ(store->stats().verify_reads, verify ? extents : 0u);
    EXPECT_EQ(store->stats().write_verify_failures, 0u);
    EXPECT_EQ(store->put(9, nullptr, 0, false), Status::ok);  // nothing to read back
    EXPECT_EQ(store->verify(9), Status::ok);
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, SsdVerify, ::testing::Values("io_uring", "pread_pwrite"));

}  // namespace
}  // namespace u3m::mem
