// SsdStore behaviour: round trips, overwrite, erase, the capacity bound with
// LRU eviction, write admission, buffered fallback, async use and concurrency.
#include <atomic>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "test_ssd_util.hpp"

namespace u3m::mem {
namespace {

using testing::blob;
using testing::Buffer;
using testing::open_store;
using testing::rounded;
using testing::ScratchDir;

constexpr std::size_t MiB = 1 << 20;

// ------------------------------------------------------------------ allocator

TEST(ExtentAllocator, BestFitSplitAndCoalesce) {
  ExtentAllocator a(16 * 4096, 4096);
  std::vector<std::uint64_t> offs;
  for (int i = 0; i < 16; ++i) offs.push_back(a.allocate(4096).value());
  EXPECT_FALSE(a.allocate(4096).has_value());
  EXPECT_EQ(a.free_bytes(), 0u);
  // Free blocks 1, 3, 4 and 8..10: runs of 1, 2 and 3 blocks.
  for (int i : {1, 3, 4, 8, 9, 10}) ASSERT_TRUE(a.free(offs[i], 4096));
  EXPECT_EQ(a.free_runs(), 3u);
  EXPECT_EQ(a.largest_free(), 3 * 4096u);
  EXPECT_EQ(a.allocate(2 * 4096).value(), offs[3]);  // best fit: the 2-block hole, not the 3
  EXPECT_FALSE(a.free(offs[9], 4096));               // already free: refused
  EXPECT_FALSE(a.free(offs[0], 100));                // unaligned: refused
  for (int i : {0, 2, 3, 4, 5, 6, 7, 11, 12, 13, 14, 15}) ASSERT_TRUE(a.free(offs[i], 4096));
  EXPECT_EQ(a.free_runs(), 1u);  // everything coalesced back into one run
  EXPECT_EQ(a.largest_free(), 16 * 4096u);
  EXPECT_EQ(a.allocate(16 * 4096).value(), 0u);
}

// ----------------------------------------------------------------- round trip

class SsdStoreTest : public ::testing::Test {
 protected:
  SsdStoreOptions options(std::uint64_t capacity) {
    SsdStoreOptions o;
    o.path = dir.file("store.dat");
    o.capacity = capacity;
    return o;
  }
  ScratchDir dir;
};

TEST_F(SsdStoreTest, RoundTripManySizesAlignedAndNot) {
  auto s = open_store(options(64 * MiB));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->capabilities().direct_io, testing::dir_supports_direct_io(dir));
  const std::size_t sizes[] = {0,         1,       100, 4095,    4096,          4097,
                               65536 + 7, MiB - 1, MiB, MiB + 1, 3 * MiB + 123, 8 * MiB};
  std::uint64_t key = 0, stored = 0;
  for (bool misaligned : {false, true}) {
    for (std::size_t n : sizes) {
      ++key;
      auto want = blob(key, 1, n);
      Buffer src(n, misaligned), dst(n, misaligned);
      std::copy(want.begin(), want.end(), src.data());
      ASSERT_EQ(s->put(key, src.data(), n, false), Status::ok) << n;
      std::size_t got_size = 12345;
      ASSERT_EQ(s->get(key, dst.data(), n, &got_size), Status::ok) << n;
      EXPECT_EQ(got_size, n);
      EXPECT_EQ(dst.bytes(n), want) << "size " << n << " misaligned " << misaligned;
      stored += n;
    }
  }
  auto st = s->stats();
  EXPECT_EQ(st.entries, key);
  EXPECT_EQ(st.bytes_stored, stored);
  EXPECT_EQ(st.bytes_written, stored);
  EXPECT_EQ(st.bytes_read, stored);
  EXPECT_EQ(st.checksum_failures, 0u);
  EXPECT_LE(st.bytes_used, st.capacity);
}

TEST_F(SsdStoreTest, GetIntoTooSmallBufferIsInvalidAndUnknownKeyNotFound) {
  auto s = open_store(options(MiB));
  auto v = blob(1, 1, 5000);
  ASSERT_EQ(s->put(1, v.data(), v.size(), false), Status::ok);
  std::vector<unsigned char> out(4999);
  std::size_t size = 0;
  EXPECT_EQ(s->get(1, out.data(), out.size(), &size), Status::invalid_argument);
  EXPECT_EQ(size, 5000u);  // tells the caller how much to provide
  EXPECT_EQ(s->get(2, out.data(), out.size()), Status::not_found);
}

TEST_F(SsdStoreTest, OverwriteReplacesAndFreesTheOldExtents) {
  auto s = open_store(options(8 * MiB));
  auto v1 = blob(7, 1, 3 * MiB + 5), v2 = blob(7, 2, 10000);
  ASSERT_EQ(s->put(7, v1.data(), v1.size(), false), Status::ok);
  ASSERT_EQ(s->put(7, v2.data(), v2.size(), false), Status::ok);
  std::vector<unsigned char> out(v1.size());
  std::size_t n = 0;
  ASSERT_EQ(s->get(7, out.data(), out.size(), &n), Status::ok);
  ASSERT_EQ(n, v2.size());
  out.resize(n);
  EXPECT_EQ(out, v2);
  auto st = s->stats();
  EXPECT_EQ(st.entries, 1u);
  EXPECT_EQ(st.bytes_used, rounded(v2.size()));
  EXPECT_EQ(st.free_runs, 2u);  // v1's extents coalesced into one run before v2's
  ASSERT_EQ(s->erase(7), Status::ok);
  EXPECT_EQ(s->stats().free_runs, 1u);  // and everything into one run
  EXPECT_EQ(s->stats().largest_free, s->stats().capacity);
}

TEST_F(SsdStoreTest, EraseRemovesAndFrees) {
  auto s = open_store(options(MiB));
  auto v = blob(3, 1, 70000);
  ASSERT_EQ(s->put(3, v.data(), v.size(), true), Status::ok);
  EXPECT_TRUE(s->contains(3));
  ASSERT_EQ(s->erase(3), Status::ok);
  EXPECT_FALSE(s->contains(3));
  std::vector<unsigned char> out(v.size());
  EXPECT_EQ(s->get(3, out.data(), out.size()), Status::not_found);
  EXPECT_EQ(s->erase(3), Status::not_found);
  EXPECT_EQ(s->stats().bytes_used, 0u);
  EXPECT_EQ(s->stats().entries, 0u);
}

// ------------------------------------------------------------------- capacity

TEST_F(SsdStoreTest, FullStoreEvictsEvictableInLruOrderOnly) {
  std::vector<std::uint64_t> evicted;
  auto o = options(MiB);  // 4 entries of 256 KiB fill it
  o.on_evict = [&](std::uint64_t k) { evicted.push_back(k); };
  auto s = open_store(o);
  const std::size_t n = 256 * 1024;
  for (std::uint64_t k = 0; k < 4; ++k) {
    auto v = blob(k, 1, n);
    ASSERT_EQ(s->put(k, v.data(), n, /*evictable=*/k != 2), Status::ok);
  }
  std::vector<unsigned char> out(n);
  ASSERT_EQ(s->get(0, out.data(), n), Status::ok);  // key 0 is now the most recently used

  auto v4 = blob(4, 1, n);
  ASSERT_EQ(s->put(4, v4.data(), n, false), Status::ok);  // evicts key 1, the LRU evictable
  EXPECT_EQ(evicted, std::vector<std::uint64_t>{1});
  EXPECT_FALSE(s->contains(1));
  auto v5 = blob(5, 1, n);
  ASSERT_EQ(s->put(5, v5.data(), n, false), Status::ok);  // then key 3 (key 2 is pinned data)
  EXPECT_EQ(evicted, (std::vector<std::uint64_t>{1, 3}));
  auto v6 = blob(6, 1, n);
  ASSERT_EQ(s->put(6, v6.data(), n, false), Status::ok);  // then key 0
  EXPECT_EQ(evicted, (std::vector<std::uint64_t>{1, 3, 0}));

  // Only non-evictable data left: a put is refused and nothing is dropped.
  auto v7 = blob(7, 1, n);
  EXPECT_EQ(s->put(7, v7.data(), n, true), Status::no_space);
  EXPECT_EQ(evicted.size(), 3u);
  for (std::uint64_t k : {2, 4, 5, 6}) {
    ASSERT_EQ(s->get(k, out.data(), n), Status::ok);
    EXPECT_EQ(out, blob(k, 1, n));
  }
  auto st = s->stats();
  EXPECT_EQ(st.evictions, 3u);
  EXPECT_EQ(st.no_space, 1u);
  EXPECT_EQ(st.bytes_used, st.capacity);
}

TEST_F(SsdStoreTest, NoEvictionWhenThePutCannotFitAnyway) {
  auto s = open_store(options(MiB));
  auto a = blob(1, 1, 512 * 1024), b = blob(2, 1, 256 * 1024), big = blob(3, 1, 600 * 1024);
  ASSERT_EQ(s->put(1, a.data(), a.size(), false), Status::ok);
  ASSERT_EQ(s->put(2, b.data(), b.size(), true), Status::ok);
  // 256 KiB free + 256 KiB evictable < 600 KiB: refuse without evicting key 2.
  EXPECT_EQ(s->put(3, big.data(), big.size(), true), Status::no_space);
  EXPECT_TRUE(s->contains(2));
  EXPECT_EQ(s->stats().evictions, 0u);
  auto huge = blob(4, 1, 2 * MiB);  // larger than the whole store
  EXPECT_EQ(s->put(4, huge.data(), huge.size(), true), Status::no_space);
}

TEST_F(SsdStoreTest, OverwriteOfAFullStoreKeepsThePreviousVersionOnNoSpace) {
  auto s = open_store(options(MiB));
  auto v1 = blob(1, 1, 768 * 1024), v2 = blob(1, 2, 512 * 1024);
  ASSERT_EQ(s->put(1, v1.data(), v1.size(), true), Status::ok);
  // The new version needs room next to the old one; the key's own old copy is
  // never evicted to make it, so the put fails and the old version stays.
  EXPECT_EQ(s->put(1, v2.data(), v2.size(), true), Status::no_space);
  std::vector<unsigned char> out(v1.size());
  ASSERT_EQ(s->get(1, out.data(), out.size()), Status::ok);
  EXPECT_EQ(out, v1);
}

// ------------------------------------------------------------- write admission

// An identical rewrite reads the stored copy back (test_ssd_verify.cpp) but
// writes nothing.
TEST_F(SsdStoreTest, IdenticalRewriteWritesNothing) {
  auto s = open_store(options(8 * MiB));
  auto v = blob(9, 1, 2 * MiB + 17);
  ASSERT_EQ(s->put(9, v.data(), v.size(), true), Status::ok);
  auto writes = s->engine().stats().writes;
  EXPECT_EQ(writes, 3u);  // three 1 MiB extents
  ASSERT_EQ(s->put(9, v.data(), v.size(), true), Status::ok);
  EXPECT_EQ(s->engine().stats().writes, writes);
  EXPECT_EQ(s->stats().writes_avoided, 1u);
  v[MiB + 5] ^= 1;  // one changed bit: written again
  ASSERT_EQ(s->put(9, v.data(), v.size(), true), Status::ok);
  EXPECT_EQ(s->engine().stats().writes, writes + 3);
  EXPECT_EQ(s->stats().writes_avoided, 1u);
  std::vector<unsigned char> out(v.size());
  ASSERT_EQ(s->get(9, out.data(), out.size()), Status::ok);
  EXPECT_EQ(out, v);
  // An identical put of the same bytes under another key is not "unchanged".
  ASSERT_EQ(s->put(10, v.data(), v.size(), true), Status::ok);
  EXPECT_EQ(s->engine().stats().writes, writes + 6);
}

// Admission hashes a rewrite only while its extents match the stored ones
// (Note [Hashing while writing]): a change in the first extent, found at
// once, and one in the last, found after hashing the rest, are both written.
TEST_F(SsdStoreTest, RewriteChangedInFirstOrLastExtentIsWritten) {
  auto s = open_store(options(16 * MiB));
  auto v = blob(4, 1, 3 * MiB);
  ASSERT_EQ(s->put(4, v.data(), v.size(), false), Status::ok);
  for (std::size_t at : {std::size_t{0}, 3 * MiB - 1}) {
    auto writes = s->engine().stats().writes;
    v[at] ^= 0x80;
    ASSERT_EQ(s->put(4, v.data(), v.size(), false), Status::ok);
    EXPECT_EQ(s->engine().stats().writes, writes + 3) << at;
    std::vector<unsigned char> out(v.size());
    ASSERT_EQ(s->get(4, out.data(), out.size()), Status::ok);
    EXPECT_EQ(out, v) << at;
  }
  EXPECT_EQ(s->stats().writes_avoided, 0u);
  ASSERT_EQ(s->put(4, v.data(), v.size(), false), Status::ok);  // now unchanged
  EXPECT_EQ(s->stats().writes_avoided, 1u);
}

TEST_F(SsdStoreTest, AdmittedRewriteStillUpdatesEvictability) {
  auto s = open_store(options(MiB));
  const std::size_t n = 512 * 1024;
  auto a = blob(1, 1, n), b = blob(2, 1, n), c = blob(3, 1, n);
  ASSERT_EQ(s->put(1, a.data(), n, true), Status::ok);
  ASSERT_EQ(s->put(2, b.data(), n, true), Status::ok);
  ASSERT_EQ(s->put(1, a.data(), n, false), Status::ok);  // no write, but now pinned data
  ASSERT_EQ(s->put(3, c.data(), n, true), Status::ok);   // so key 2 must go, not key 1
  EXPECT_TRUE(s->contains(1));
  EXPECT_FALSE(s->contains(2));
}

// --------------------------------------------------------- buffered / engines

TEST_F(SsdStoreTest, BufferedModeAndSyncEngineRoundTrip) {
  auto o = options(16 * MiB);
  o.direct_io = false;
  o.engine = make_sync_engine();
  auto s = open_store(o);
  EXPECT_FALSE(s->capabilities().direct_io);
  EXPECT_EQ(s->engine().name(), "pread/pwrite");
  for (std::size_t n : {std::size_t{1}, std::size_t{4097}, 2 * MiB + 3}) {
    auto v = blob(n, 1, n);
    ASSERT_EQ(s->put(n, v.data(), n, false), Status::ok);
    std::vector<unsigned char> out(n);
    ASSERT_EQ(s->get(n, out.data(), n), Status::ok);
    EXPECT_EQ(out, v);
  }
}

TEST_F(SsdStoreTest, BadOptionsAreRefusedWithAReason) {
  std::unique_ptr<SsdStore> s;
  std::string why;
  auto o = options(100);  // less than one block
  EXPECT_EQ(SsdStore::open(o, s, &why), Status::invalid_argument);
  EXPECT_NE(why.find("capacity"), std::string::npos) << why;
  o = options(MiB);
  o.path = dir.file("no/such/dir/store.dat");
  EXPECT_EQ(SsdStore::open(o, s, &why), Status::io_error);
  EXPECT_NE(why.find("no/such/dir"), std::string::npos) << why;
  EXPECT_FALSE(s);
}

// ---------------------------------------------------------------- async / MT

TEST_F(SsdStoreTest, ManyAsyncOpsInFlight) {
  auto s = open_store(options(64 * MiB));
  std::vector<std::vector<unsigned char>> blobs;
  for (std::uint64_t k = 0; k < 48; ++k) blobs.push_back(blob(k, 1, (k % 7) * 150000 + k + 1));
  std::vector<std::future<Status>> fs;
  for (std::uint64_t k = 0; k < blobs.size(); ++k)
    fs.push_back(s->put_async(k, blobs[k].data(), blobs[k].size(), false));
  for (auto& f : fs) ASSERT_EQ(f.get(), Status::ok);
  std::vector<std::vector<unsigned char>> outs(blobs.size());
  std::atomic<int> callbacks{0};
  std::vector<std::promise<Status>> done(blobs.size());
  for (std::uint64_t k = 0; k < blobs.size(); ++k) {
    outs[k].resize(blobs[k].size());
    s->get_async(k, outs[k].data(), outs[k].size(), [&, k](Status st) {
      callbacks++;
      done[k].set_value(st);
    });
  }
  for (std::uint64_t k = 0; k < blobs.size(); ++k) {
    ASSERT_EQ(done[k].get_future().get(), Status::ok);
    EXPECT_EQ(outs[k], blobs[k]) << k;
  }
  EXPECT_EQ(callbacks.load(), 48);
}

// Several threads put, get and erase at once under a tight capacity, so
// evictions and no_space happen concurrently. Each thread owns a set of keys
// and knows exactly what each must hold; reads of other threads' keys must be
// a whole version of that key (never torn or mixed).
TEST_F(SsdStoreTest, ConcurrentRandomOpsKeepEveryByte) {
  auto s = open_store(options(4 * MiB));
  constexpr int kThreads = 4, kKeysPerThread = 12, kOps = 150;
  auto size_of = [](std::uint64_t key, std::uint64_t version) {
    return static_cast<std::size_t>((key * 7919 + version * 104729) % (300 * 1024) + 1);
  };
  std::atomic<int> failures{0};
  auto worker = [&](int t) {
    std::mt19937_64 rng(1000 + t);
    struct Expect {
      std::uint64_t version;
      bool evictable;
    };
    std::map<std::uint64_t, std::optional<Expect>> mine;
    std::vector<unsigned char> out(300 * 1024);
    for (int i = 0; i < kOps; ++i) {
      std::uint64_t key = t * kKeysPerThread + rng() % kKeysPerThread;
      int what = static_cast<int>(rng() % 10);
      if (what < 4) {
        std::uint64_t version = i + 1;
        bool evictable = rng() % 2;
        auto v = blob(key, version, size_of(key, version));
        Status st = s->put(key, v.data(), v.size(), evictable);
        if (st == Status::ok)
          mine[key] = Expect{version, evictable};
        else if (st != Status::no_space)
          failures++;
      } else if (what < 8) {
        std::size_t n = 0;
        Status st = s->get(key, out.data(), out.size(), &n);
        auto& e = mine[key];
        if (st == Status::ok) {
          if (!e || n != size_of(key, e->version) ||
              !std::equal(out.begin(), out.begin() + n, blob(key, e->version, n).begin()))
            failures++;
        } else if (!(st == Status::not_found && (!e || e->evictable))) {
          failures++;  // only an evictable entry may vanish
        }
        if (st == Status::not_found) e.reset();
      } else if (what < 9) {
        Status st = s->erase(key);
        if (st != Status::ok && st != Status::not_found) failures++;
        mine[key].reset();
      } else {  // another thread's key: any whole version is fine
        std::uint64_t other = rng() % (kThreads * kKeysPerThread);
        std::size_t n = 0;
        Status st = s->get(other, out.data(), out.size(), &n);
        if (st == Status::ok) {
          bool whole = false;
          for (std::uint64_t v = 1; v <= kOps && !whole; ++v)
            whole = size_of(other, v) == n &&
                    std::equal(out.begin(), out.begin() + n, blob(other, v, n).begin());
          if (!whole) failures++;
        } else if (st != Status::not_found) {
          failures++;
        }
      }
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) ts.emplace_back(worker, t);
  for (auto& th : ts) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto st = s->stats();
  EXPECT_LE(st.bytes_used, st.capacity);
  EXPECT_EQ(st.checksum_failures, 0u);
  EXPECT_EQ(st.io_errors, 0u);
  EXPECT_GT(st.evictions, 0u);  // the capacity was tight enough to exercise eviction
}

}  // namespace
}  // namespace u3m::mem
