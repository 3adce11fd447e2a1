// Fault injection below the SSD store. Loud faults (EIO and ENOSPC on write,
// short writes, bit flips and EIO on read) must come back with the right
// Status, be counted, and lose nothing: a failed overwrite leaves the previous
// version readable, and a corrupt read never returns ok. Silent write faults
// (lost, torn, misdirected: the write reports success) must be caught by the
// put's read-back, or, with verification off, by the next read. The wrapper's
// own behaviour is tested at the end.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "test_ssd_util.hpp"

namespace u3m::mem {
namespace {

using testing::blob;
using testing::CorruptKeys;
using testing::open_store;
using testing::rounded;
using testing::ScratchDir;

constexpr std::size_t MiB = 1 << 20;

// The fault layer over both real engines.
class SsdFaults : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::string why;
    faults = testing::fault_engine(GetParam(), why);
    if (!faults) GTEST_SKIP() << "io_uring unavailable: " << why;
    reopen(true);
  }

  void reopen(bool verify_writes) {
    store.reset();
    SsdStoreOptions o;
    o.path = dir.file("store.dat");
    o.capacity = 32 * MiB;
    o.engine = faults;
    o.verify_writes = verify_writes;
    o.on_corrupt = corrupt.callback();
    store = open_store(o);
  }

  // The stored bytes of key, or the failure status.
  Status read(std::uint64_t key, std::vector<unsigned char>& out) {
    std::size_t n = 0;
    store->contains(key, &n);  // size the buffer to fit (single-threaded test)
    out.assign(n + 1, 0);
    Status s = store->get(key, out.data(), out.size(), &n);
    out.resize(ok(s) ? n : 0);
    return s;
  }

  void expect_holds(std::uint64_t key, const std::vector<unsigned char>& want) {
    std::vector<unsigned char> got;
    ASSERT_EQ(read(key, got), Status::ok);
    EXPECT_EQ(got, want);
  }

  // Reads key: either exactly `want`, or corrupt and retired with on_corrupt
  // told (never wrong bytes as ok).
  void expect_holds_or_reported(std::uint64_t key, const std::vector<unsigned char>& want) {
    std::vector<unsigned char> got;
    std::uint64_t told = corrupt.count(key);
    Status s = read(key, got);
    if (ok(s)) {
      EXPECT_EQ(got, want) << "key " << key;
    } else {
      EXPECT_EQ(s, Status::corrupt) << "key " << key;
      EXPECT_EQ(corrupt.count(key), told + 1) << "key " << key;
      EXPECT_FALSE(store->contains(key));
    }
  }

  ScratchDir dir;
  CorruptKeys corrupt;
  std::shared_ptr<FaultInjectionIoEngine> faults;
  std::unique_ptr<SsdStore> store;
};

// A failed overwrite: the fault hits the n-th extent of a 3-extent write.
struct WriteFaultCase {
  IoFault fault;
  Status expect;
};

TEST_P(SsdFaults, FailedOverwriteKeepsPreviousVersion) {
  const WriteFaultCase cases[] = {{IoFault::eio_on_write, Status::io_error},
                                  {IoFault::enospc_on_write, Status::no_space},
                                  {IoFault::short_write, Status::short_io}};
  std::uint64_t key = 0;
  for (const auto& c : cases) {
    for (std::uint64_t nth : {1, 2, 3}) {
      ++key;
      SCOPED_TRACE(::testing::Message() << to_string(c.fault) << " on extent " << nth);
      auto v1 = blob(key, 1, 2 * MiB + 100), v2 = blob(key, 2, 2 * MiB + 900);
      ASSERT_EQ(store->put(key, v1.data(), v1.size(), false), Status::ok);
      auto before = store->stats();
      faults->fail_nth(c.fault, nth);
      EXPECT_EQ(store->put(key, v2.data(), v2.size(), false), c.expect);
      auto after = store->stats();
      EXPECT_EQ(after.io_errors - before.io_errors, c.fault == IoFault::short_write ? 0u : 1u);
      EXPECT_EQ(after.enospc - before.enospc, c.fault == IoFault::enospc_on_write ? 1u : 0u);
      EXPECT_EQ(after.short_writes - before.short_writes,
                c.fault == IoFault::short_write ? 1u : 0u);
      EXPECT_EQ(after.bytes_used, before.bytes_used);  // the half-written extents were freed
      expect_holds(key, v1);
      // The fault was one-shot: retrying the put succeeds.
      ASSERT_EQ(store->put(key, v2.data(), v2.size(), false), Status::ok);
      expect_holds(key, v2);
    }
  }
  EXPECT_EQ(faults->injected_total(), 9u);
}

TEST_P(SsdFaults, FailedFirstPutLeavesNoEntry) {
  auto v = blob(1, 1, 5000);  // one block-rounded extent: the short write writes nothing
  for (IoFault f : {IoFault::eio_on_write, IoFault::enospc_on_write, IoFault::short_write}) {
    faults->fail_nth(f, 1);
    EXPECT_NE(store->put(1, v.data(), v.size(), true), Status::ok) << to_string(f);
    EXPECT_FALSE(store->contains(1));
    EXPECT_EQ(store->stats().bytes_used, 0u);
  }
}

TEST_P(SsdFaults, BitFlipOnReadIsCorruptNeverWrongData) {
  // Aligned sizes read straight into the caller's buffer, odd sizes bounce:
  // the check must catch the flip on both paths, in any extent.
  for (std::size_t n : {std::size_t{4096}, std::size_t{333}, 3 * MiB, 3 * MiB + 1}) {
    auto v = blob(n, 1, n);
    ASSERT_EQ(store->put(n, v.data(), n, false), Status::ok);
    std::uint64_t extents = (n + MiB - 1) / MiB;
    for (std::uint64_t nth = 1; nth <= extents; ++nth) {
      auto before = store->stats().checksum_failures;
      faults->fail_nth(IoFault::bit_flip_on_read, nth);
      std::vector<unsigned char> out;
      EXPECT_EQ(read(n, out), Status::corrupt) << n << " extent " << nth;
      // One failure: the confirming re-read of the extent was clean.
      EXPECT_EQ(store->stats().checksum_failures, before + 1);
      expect_holds(n, v);  // the data on disk was fine: the entry stays, the next read is clean
    }
  }
  EXPECT_EQ(corrupt.total(), 0u);  // a fault on the way is not corruption at rest
  EXPECT_EQ(store->stats().corrupt_retired, 0u);
}

TEST_P(SsdFaults, EioOnReadIsReportedAndCounted) {
  auto v = blob(5, 1, 2 * MiB);
  ASSERT_EQ(store->put(5, v.data(), v.size(), false), Status::ok);
  faults->fail_nth(IoFault::eio_on_read, 2);
  std::vector<unsigned char> out;
  EXPECT_EQ(read(5, out), Status::io_error);
  EXPECT_EQ(store->stats().io_errors, 1u);
  expect_holds(5, v);
}

// Random loud faults over random puts, gets and overwrites, checked against a
// model: a get that answers ok returns exactly the last version whose put
// answered ok, and every injected fault shows up in the counters. A key may
// vanish only if the store said it was corrupt (two flipped reads in a row of
// one extent look like corruption at rest). Silent faults, threads and
// corruption at rest are mixed in by test_ssd_fault_mix.cpp.
TEST_P(SsdFaults, RandomFaultsLoseNothingAndAreAllCounted) {
  const IoFault kinds[] = {IoFault::eio_on_write, IoFault::enospc_on_write, IoFault::short_write,
                           IoFault::bit_flip_on_read, IoFault::eio_on_read};
  std::uint64_t seed = 42;
  for (IoFault f : kinds) faults->fail_randomly(f, 0.04, seed++);
  std::mt19937_64 rng(7);
  std::map<std::uint64_t, std::vector<unsigned char>> model;
  auto forget_reported = [&] {
    for (auto& [key, n] : corrupt.all()) model.erase(key);
  };
  int ok_gets = 0, failed_ops = 0;
  for (int i = 0; i < 300; ++i) {
    std::uint64_t key = rng() % 24;
    if (rng() % 2) {
      std::size_t n = rng() % 4 == 0 ? rng() % (3 * MiB) + 1 : rng() % 20000 + 1;
      auto v = blob(key, i, n);
      Status s = store->put(key, v.data(), n, false);
      if (ok(s))
        model[key] = std::move(v);
      else
        ++failed_ops;
    } else {
      std::vector<unsigned char> out;
      Status s = read(key, out);
      if (s == Status::not_found && corrupt.count(key) > 0) forget_reported();
      auto it = model.find(key);
      if (it == model.end()) {
        EXPECT_EQ(s, Status::not_found);
      } else if (ok(s)) {
        ++ok_gets;
        EXPECT_EQ(out, it->second) << "key " << key;
      } else {
        ++failed_ops;
        EXPECT_TRUE(s == Status::corrupt || s == Status::io_error) << to_string(s);
      }
    }
  }
  faults->clear();
  forget_reported();
  for (auto& [key, want] : model) expect_holds(key, want);  // nothing else was lost
  auto st = store->stats();
  EXPECT_EQ(st.corrupt_retired, corrupt.total());
  EXPECT_EQ(st.checksum_failures, faults->injected(IoFault::bit_flip_on_read));
  EXPECT_EQ(st.io_errors, faults->injected(IoFault::eio_on_write) +
                              faults->injected(IoFault::enospc_on_write) +
                              faults->injected(IoFault::eio_on_read));
  EXPECT_EQ(st.enospc, faults->injected(IoFault::enospc_on_write));
  EXPECT_EQ(st.short_writes, faults->injected(IoFault::short_write));
  EXPECT_GT(faults->injected_total(), 5u);  // the soak really injected faults
  EXPECT_GT(failed_ops, 0);
  EXPECT_GT(ok_gets, 0);
}

// Each silent fault on each extent of a 3-extent overwrite: the write reports
// success, the read-back does not match, the put fails with corrupt and the
// previous version stands. A misdirected write may land on other data, which
// then reads as corrupt (and is reported), never as wrong bytes.
TEST_P(SsdFaults, SilentWriteFaultFailsThePutAndKeepsThePreviousVersion) {
  std::map<std::uint64_t, std::vector<unsigned char>> latest;
  std::uint64_t key = 0;
  for (IoFault f : {IoFault::lost_write, IoFault::torn_write, IoFault::misdirected_write}) {
    for (std::uint64_t nth : {1, 2, 3}) {
      ++key;
      SCOPED_TRACE(::testing::Message() << to_string(f) << " on extent " << nth);
      auto v1 = blob(key, 1, 2 * MiB + 100), v2 = blob(key, 2, 2 * MiB + 900);
      ASSERT_EQ(store->put(key, v1.data(), v1.size(), false), Status::ok);
      latest[key] = v1;
      auto before = store->stats();
      auto injected = faults->injected(f);
      faults->fail_nth(f, nth);
      EXPECT_EQ(store->put(key, v2.data(), v2.size(), false), Status::corrupt);
      auto after = store->stats();
      EXPECT_EQ(faults->injected(f), injected + 1);
      EXPECT_EQ(after.write_verify_failures, before.write_verify_failures + 1);
      EXPECT_EQ(after.verify_reads, before.verify_reads + 3);  // every extent was read back
      EXPECT_EQ(after.bytes_used, before.bytes_used);  // the unverified extents were freed
      EXPECT_EQ(after.io_errors + after.short_writes, before.io_errors + before.short_writes);
      if (f == IoFault::misdirected_write)
        expect_holds_or_reported(key, v1);
      else
        expect_holds(key, v1);
      // The fault was one-shot: retrying the put succeeds.
      ASSERT_EQ(store->put(key, v2.data(), v2.size(), false), Status::ok);
      expect_holds(key, v2);
      latest[key] = v2;
    }
  }
  // Misdirected data that landed on another entry is caught when it is read.
  for (auto& [k, want] : latest) expect_holds_or_reported(k, want);
  EXPECT_EQ(store->stats().write_verify_failures, 9u);
}

// Without verification a silent fault goes unseen by the put, which answers
// ok; the next get catches it (corrupt, confirmed by a re-read), retires the
// entry and tells the owner. This is the case verify_writes exists for: by
// then the caller may have dropped its copy.
TEST_P(SsdFaults, WithoutVerificationTheNextGetCatchesASilentFault) {
  reopen(/*verify_writes=*/false);
  std::uint64_t key = 100;
  for (IoFault f : {IoFault::lost_write, IoFault::torn_write, IoFault::misdirected_write}) {
    ++key;
    SCOPED_TRACE(to_string(f));
    auto v1 = blob(key, 1, 64 * 1024), v2 = blob(key, 2, 64 * 1024);
    ASSERT_EQ(store->put(key, v1.data(), v1.size(), false), Status::ok);
    auto reads = store->engine().stats().reads;
    faults->fail_nth(f, 1);
    EXPECT_EQ(store->put(key, v2.data(), v2.size(), false), Status::ok);  // it cannot tell
    EXPECT_EQ(store->engine().stats().reads, reads);                      // no read-back
    auto before = store->stats();
    std::vector<unsigned char> got;
    EXPECT_EQ(read(key, got), Status::corrupt);
    auto after = store->stats();
    EXPECT_EQ(after.checksum_failures, before.checksum_failures + 2);  // the get and its re-read
    EXPECT_EQ(after.corrupt_retired, before.corrupt_retired + 1);
    EXPECT_EQ(corrupt.count(key), 1u);
    EXPECT_FALSE(store->contains(key));
    EXPECT_EQ(read(key, got), Status::not_found);
  }
  EXPECT_EQ(store->stats().write_verify_failures, 0u);
  EXPECT_EQ(corrupt.total(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Engines, SsdFaults, ::testing::Values("io_uring", "pread_pwrite"));

// The wrapper itself: the n-th write is short by exactly half, aligned, and
// reads are not counted towards write faults.
TEST(FaultInjectionIoEngine, NthWriteIsShortAndCountsOnlyWrites) {
  ScratchDir dir;
  std::string path = dir.file("f");
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  FaultInjectionIoEngine e(make_sync_engine());
  e.fail_nth(IoFault::short_write, 2);
  std::vector<unsigned char> buf(8192, 0xAB);
  std::vector<std::int64_t> results;
  auto op = [&](IoKind k) {
    IoOp o{k, fd, buf.data(), 8192, 0, [&](std::int64_t r) { results.push_back(r); }};
    e.submit({&o, 1});
  };
  op(IoKind::write);
  op(IoKind::read);
  op(IoKind::write);
  op(IoKind::write);
  ::close(fd);
  EXPECT_EQ(results, (std::vector<std::int64_t>{8192, 8192, 4096, 8192}));
  EXPECT_EQ(e.injected(IoFault::short_write), 1u);
  auto st = e.stats();
  EXPECT_EQ(st.writes, 3u);
  EXPECT_EQ(st.reads, 1u);
  EXPECT_EQ(st.bytes_written, 8192u + 4096u + 8192u);
}

// ------------------------------------------------------------- the wrapper

// A file of `blocks` 4 KiB blocks, block i filled with the byte i + 1.
class BlockFile {
 public:
  BlockFile(const ScratchDir& dir, int blocks) : blocks_(blocks) {
    fd_ = ::open(dir.file("blocks").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    EXPECT_GE(fd_, 0);
    for (int i = 0; i < blocks; ++i) {
      std::vector<unsigned char> b(4096, static_cast<unsigned char>(i + 1));
      EXPECT_EQ(::pwrite(fd_, b.data(), 4096, off_t{i} * 4096), 4096);
    }
  }
  ~BlockFile() { ::close(fd_); }
  int fd() const { return fd_; }
  std::vector<unsigned char> contents() const {
    std::vector<unsigned char> v(std::size_t(blocks_) * 4096);
    EXPECT_EQ(::pread(fd_, v.data(), v.size(), 0), static_cast<ssize_t>(v.size()));
    return v;
  }
  static std::vector<unsigned char> original(int blocks) {
    std::vector<unsigned char> v;
    for (int i = 0; i < blocks; ++i) v.insert(v.end(), 4096, static_cast<unsigned char>(i + 1));
    return v;
  }

 private:
  int fd_ = -1;
  int blocks_;
};

std::int64_t submit_one(IoEngine& e, IoKind kind, int fd, void* buf, std::uint32_t len,
                        std::uint64_t off) {
  std::int64_t result = -1;
  IoOp o{kind, fd, buf, len, off, [&](std::int64_t r) { result = r; }};
  e.submit({&o, 1});  // the sync engine completes inline
  return result;
}

// Silent faults report the whole length and then: write nothing (lost), a
// block-aligned prefix (torn), or the whole op at another block-aligned
// offset inside the file (misdirected).
TEST(FaultInjectionIoEngine, SilentWriteFaultsReportSuccess) {
  constexpr int kBlocks = 16;
  const auto orig = BlockFile::original(kBlocks);
  std::vector<unsigned char> data(4 * 4096, 0xAB);
  for (IoFault f : {IoFault::lost_write, IoFault::torn_write, IoFault::misdirected_write}) {
    SCOPED_TRACE(to_string(f));
    ScratchDir dir;
    BlockFile file(dir, kBlocks);
    FaultInjectionIoEngine e(make_sync_engine());
    e.fail_nth(f, 1);
    EXPECT_EQ(submit_one(e, IoKind::write, file.fd(), data.data(), 4 * 4096, 4 * 4096), 4 * 4096);
    EXPECT_EQ(e.injected(f), 1u);
    EXPECT_EQ(e.injected_total(), 1u);
    auto now = file.contents();
    auto block_is = [&](int b, unsigned char v) {
      return std::all_of(now.begin() + b * 4096, now.begin() + (b + 1) * 4096,
                         [&](unsigned char c) { return c == v; });
    };
    if (f == IoFault::lost_write) {
      EXPECT_EQ(now, orig);
    } else if (f == IoFault::torn_write) {
      int kept = 0;
      while (kept < 4 && block_is(4 + kept, 0xAB)) ++kept;
      EXPECT_LT(kept, 4);
      for (int b = 0; b < kBlocks; ++b) {
        if (b < 4 || b >= 4 + kept) {
          EXPECT_TRUE(block_is(b, static_cast<unsigned char>(b + 1))) << b;
        }
      }
    } else {
      int at = -1;
      for (int b = 0; b + 4 <= kBlocks && at < 0; ++b)
        if (b != 4 && block_is(b, 0xAB) && block_is(b + 1, 0xAB) && block_is(b + 2, 0xAB) &&
            block_is(b + 3, 0xAB))
          at = b;
      ASSERT_GE(at, 0) << "the data landed nowhere";
      for (int b = 0; b < kBlocks; ++b) {
        if (b < at || b >= at + 4) {
          EXPECT_TRUE(block_is(b, static_cast<unsigned char>(b + 1))) << b;
        }
      }
    }
    // The target range was left wrong, so reading it back whole counts once.
    std::vector<unsigned char> back(4 * 4096);
    EXPECT_EQ(submit_one(e, IoKind::read, file.fd(), back.data(), 4 * 4096, 4 * 4096), 4 * 4096);
    EXPECT_EQ(e.silent_faults_read_back(), 1u);
    EXPECT_EQ(submit_one(e, IoKind::read, file.fd(), back.data(), 4 * 4096, 4 * 4096), 4 * 4096);
    EXPECT_EQ(e.silent_faults_read_back(), 1u);  // once
  }
}

// A silent fault is no longer pending once another write touches its range,
// and one that left the right bytes anyway (a retry into the same place) is
// never pending.
TEST(FaultInjectionIoEngine, ReadBackCountsOnlyFaultsThatLeftWrongBytes) {
  ScratchDir dir;
  BlockFile file(dir, 8);
  FaultInjectionIoEngine e(make_sync_engine());
  std::vector<unsigned char> data(8192, 0x5A), back(8192);
  e.fail_nth(IoFault::lost_write, 1);
  submit_one(e, IoKind::write, file.fd(), data.data(), 8192, 0);
  submit_one(e, IoKind::write, file.fd(), data.data(), 4096, 4096);  // overlaps: no longer pending
  submit_one(e, IoKind::read, file.fd(), back.data(), 8192, 0);
  EXPECT_EQ(e.silent_faults_read_back(), 0u);
  submit_one(e, IoKind::write, file.fd(), data.data(), 8192, 0);  // really written now
  e.fail_nth(IoFault::lost_write, 1);
  submit_one(e, IoKind::write, file.fd(), data.data(), 8192, 0);  // lost, but the bytes are there
  submit_one(e, IoKind::read, file.fd(), back.data(), 8192, 0);
  EXPECT_EQ(e.silent_faults_read_back(), 0u);
  EXPECT_EQ(e.injected(IoFault::lost_write), 2u);
}

TEST(FaultInjectionIoEngine, CorruptAtRestFlipsOneBitInTheRange) {
  ScratchDir dir;
  const int kBlocks = 8;
  for (std::uint64_t seed : {1, 2, 3, 4, 5}) {
    BlockFile file(dir, kBlocks);
    FaultInjectionIoEngine e(make_sync_engine());
    ASSERT_EQ(e.corrupt_at_rest(file.fd(), 5000, 3000, seed), Status::ok);
    auto now = file.contents(), orig = BlockFile::original(kBlocks);
    int bits = 0;
    for (std::size_t i = 0; i < now.size(); ++i) {
      if (now[i] == orig[i]) continue;
      EXPECT_GE(i, 5000u);
      EXPECT_LT(i, 8000u);
      bits += __builtin_popcount(now[i] ^ orig[i]);
    }
    EXPECT_EQ(bits, 1);
    EXPECT_EQ(e.injected_at_rest(), 1u);
    EXPECT_EQ(e.injected_total(), 0u);  // at rest is counted apart from faults on ops
    EXPECT_EQ(e.corrupt_at_rest(file.fd(), kBlocks * 4096, 10, seed), Status::invalid_argument);
    EXPECT_EQ(e.corrupt_at_rest(file.fd(), 0, 0, seed), Status::invalid_argument);
    EXPECT_EQ(e.injected_at_rest(), 1u);
  }
}

TEST(FaultInjectionIoEngine, CorruptRandomWrittenHitsARecentWrite) {
  ScratchDir dir;
  BlockFile file(dir, 32);
  FaultInjectionIoEngine e(make_sync_engine());
  EXPECT_FALSE(e.corrupt_random_written(1));  // nothing written yet
  std::vector<unsigned char> data(8192, 0);
  for (std::uint64_t b : {2, 10, 20}) submit_one(e, IoKind::write, file.fd(), data.data(), 8192, b * 4096);
  auto log = e.recent_writes();
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[1].offset, 10 * 4096u);
  EXPECT_EQ(log[1].len, 8192u);
  auto before = file.contents();
  ASSERT_TRUE(e.corrupt_random_written(7));
  auto now = file.contents();
  std::size_t changed = 0, where = 0;
  for (std::size_t i = 0; i < now.size(); ++i)
    if (now[i] != before[i]) ++changed, where = i;
  ASSERT_EQ(changed, 1u);
  bool inside = false;
  for (auto& w : log) inside |= where >= w.offset && where < w.offset + w.len;
  EXPECT_TRUE(inside) << where;
  EXPECT_EQ(e.injected_at_rest(), 1u);
}

TEST(FaultInjectionIoEngine, WriteLogKeepsTheLatestWritesInOrder) {
  ScratchDir dir;
  BlockFile file(dir, 64);
  FaultInjectionIoEngine e(make_sync_engine());
  std::vector<unsigned char> data(4096, 0);
  const std::size_t n = FaultInjectionIoEngine::kWriteLog + 10;
  for (std::size_t i = 0; i < n; ++i)  // write i goes to block i % 64
    submit_one(e, IoKind::write, file.fd(), data.data(), 4096, (i % 64) * 4096);
  auto log = e.recent_writes();
  ASSERT_EQ(log.size(), FaultInjectionIoEngine::kWriteLog);
  for (std::size_t k = 0; k < log.size(); ++k) EXPECT_EQ(log[k].offset, ((k + 10) % 64) * 4096) << k;
}

TEST(FaultInjectionIoEngine, EveryKindHasANameAndSilenceIsKnown) {
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < kIoFaultKinds; ++i) {
    auto f = static_cast<IoFault>(i);
    EXPECT_NE(to_string(f), "?");
    names.insert(to_string(f));
    EXPECT_EQ(is_silent(f), f == IoFault::lost_write || f == IoFault::torn_write ||
                                f == IoFault::misdirected_write);
  }
  EXPECT_EQ(names.size(), kIoFaultKinds);
}

}  // namespace
}  // namespace u3m::mem
