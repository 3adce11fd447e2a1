// Fault injection below the SSD store: EIO and ENOSPC on write, short writes,
// bit flips and EIO on read. Each must come back with the right Status, be
// counted, and lose nothing: a failed overwrite leaves the previous version
// readable, and a corrupt read never returns ok.
#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <random>

#include "test_ssd_util.hpp"

namespace u3m::mem {
namespace {

using testing::blob;
using testing::open_store;
using testing::rounded;
using testing::ScratchDir;

constexpr std::size_t MiB = 1 << 20;

// The fault layer over both real engines.
class SsdFaults : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::shared_ptr<IoEngine> inner;
    if (std::string(GetParam()) == "io_uring") {
      std::unique_ptr<IoEngine> e;
      std::string why;
      if (!ok(make_uring_engine(64, e, &why))) GTEST_SKIP() << "io_uring unavailable: " << why;
      inner = std::move(e);
    } else {
      inner = make_sync_engine();
    }
    faults = std::make_shared<FaultInjectionIoEngine>(inner);
    SsdStoreOptions o;
    o.path = dir.file("store.dat");
    o.capacity = 32 * MiB;
    o.engine = faults;
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

  ScratchDir dir;
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
      EXPECT_EQ(store->stats().checksum_failures, before + 1);
      expect_holds(n, v);  // the data on disk was fine: the next read is clean
    }
  }
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

// Random faults of every kind over random puts, gets and overwrites, checked
// against a model: a get that answers ok returns exactly the last version
// whose put answered ok, and every injected fault shows up in the counters.
TEST_P(SsdFaults, RandomFaultsLoseNothingAndAreAllCounted) {
  const IoFault kinds[] = {IoFault::eio_on_write, IoFault::enospc_on_write, IoFault::short_write,
                           IoFault::bit_flip_on_read, IoFault::eio_on_read};
  std::uint64_t seed = 42;
  for (IoFault f : kinds) faults->fail_randomly(f, 0.04, seed++);
  std::mt19937_64 rng(7);
  std::map<std::uint64_t, std::vector<unsigned char>> model;
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
  for (auto& [key, want] : model) expect_holds(key, want);  // nothing was lost
  auto st = store->stats();
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

}  // namespace
}  // namespace u3m::mem
