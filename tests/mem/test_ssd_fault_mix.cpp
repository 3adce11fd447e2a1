// Every fault kind at once, under concurrent puts, gets, erases, verifies and
// scrubs from several threads, with the background scrubber running and bits
// flipped at rest in what was recently written. The property: a get that
// answers ok returns exactly the bytes last put; a key vanishes only if the
// store said so (on_corrupt) or its owner's own put or erase allowed it; and
// every silent write fault that was read back was caught.
#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "test_ssd_util.hpp"

namespace u3m::mem {
namespace {

using testing::blob;
using testing::CorruptKeys;
using testing::open_store;
using testing::ScratchDir;

constexpr int kWorkers = 4, kKeysPerWorker = 10, kOps = 220;
constexpr std::size_t kMaxBlob = 200 * KiB;

// A blob that names its key and version in its first 16 bytes, so any reader
// can tell whether what it got is some whole version of the key.
std::vector<unsigned char> payload(std::uint64_t key, std::uint64_t version, std::size_t n) {
  auto v = blob(key, version, n);
  std::memcpy(v.data(), &key, 8);
  std::memcpy(v.data() + 8, &version, 8);
  return v;
}

// The version `got` holds if it is exactly one, else 0.
std::uint64_t whole_version(std::uint64_t key, const unsigned char* got, std::size_t n) {
  if (n < 16) return 0;
  std::uint64_t k, v;
  std::memcpy(&k, got, 8);
  std::memcpy(&v, got + 8, 8);
  if (k != key || v == 0) return 0;
  auto want = payload(key, v, n);
  return std::memcmp(want.data(), got, n) == 0 ? v : 0;
}

struct Tally {
  std::atomic<std::uint64_t> gets{0}, ok_gets{0}, failed_gets{0}, puts{0}, failed_puts{0};
  std::atomic<std::uint64_t> verifies{0}, vanished{0}, violations{0};
};

class SsdFaultMix : public ::testing::TestWithParam<const char*> {};

TEST_P(SsdFaultMix, EveryOkGetReturnsTheLastPutBytes) {
  std::string why;
  auto faults = testing::fault_engine(GetParam(), why);
  if (!faults) GTEST_SKIP() << "io_uring unavailable: " << why;
  ScratchDir dir;
  CorruptKeys corrupt;
  SsdStoreOptions o;
  o.path = dir.file("store.dat");
  o.capacity = 24 * MiB;  // 40 keys of at most 200 KiB, two versions each, fit: nothing is evicted
  o.chunk_bytes = 64 * KiB;
  o.engine = faults;
  o.on_corrupt = corrupt.callback();
  o.scrub_bytes_per_s = 32 * MiB;
  auto store = open_store(o);
  ASSERT_TRUE(store);

  std::uint64_t seed = 1000;
  for (std::size_t k = 0; k < kIoFaultKinds; ++k)
    faults->fail_randomly(static_cast<IoFault>(k), 0.02, seed++);

  std::atomic<std::uint64_t> next_version{1};  // every put attempt writes distinct bytes
  std::atomic<int> working{kWorkers};
  Tally t;
  auto violation = [&](const char* what, std::uint64_t key, Status s) {
    if (t.violations++ < 10) ADD_FAILURE() << what << ": key " << key << " " << to_string(s);
  };

  // Each worker owns its keys and knows what each must hold.
  struct Want {
    std::uint64_t version = 0;     // 0: nothing stored
    std::size_t size = 0;
    bool may_vanish = false;       // a failed unchanged put may have retired a stale copy
    std::uint64_t reported = 0;    // on_corrupt calls for the key when it was last put
  };
  auto worker = [&](int w) {
    std::mt19937_64 rng(77 + w);
    std::vector<Want> mine(kKeysPerWorker);
    std::vector<unsigned char> out(kMaxBlob);
    auto key_of = [&](int i) { return std::uint64_t(w * kKeysPerWorker + i); };
    // not_found for an owned key is fine only if the store said it was corrupt
    // since the last put, or a failed put may have retired it.
    auto vanish_ok = [&](int i) {
      const Want& e = mine[i];
      return e.version == 0 || e.may_vanish || corrupt.count(key_of(i)) > e.reported;
    };
    auto check_get = [&](int i, Status s, std::size_t n) {
      Want& e = mine[i];
      std::uint64_t key = key_of(i);
      t.gets++;
      if (ok(s)) {
        t.ok_gets++;
        if (e.version == 0 || n != e.size || whole_version(key, out.data(), n) != e.version)
          violation("an ok get returned other bytes than the last put", key, s);
      } else if (s == Status::not_found) {
        if (!vanish_ok(i)) violation("a key vanished without a word", key, s);
        if (e.version) t.vanished++;
        e = Want{};
      } else if (s == Status::corrupt || s == Status::io_error || s == Status::short_io) {
        t.failed_gets++;
        if (e.version == 0) violation("a get of an absent key did not answer not_found", key, s);
      } else {
        violation("unexpected get status", key, s);
      }
    };
    for (int op = 0; op < kOps; ++op) {
      int i = static_cast<int>(rng() % kKeysPerWorker);
      std::uint64_t key = key_of(i);
      Want& e = mine[i];
      int what = static_cast<int>(rng() % 20);
      if (what < 7) {  // a put: new bytes, or now and then the stored ones again
        bool same = e.version && what == 0;
        std::uint64_t version = same ? e.version : next_version++;
        std::size_t n = same ? e.size : 16 + rng() % (kMaxBlob - 16);
        auto v = payload(key, version, n);
        std::uint64_t reported = corrupt.count(key);
        Status s = store->put(key, v.data(), n, false);
        t.puts++;
        if (ok(s)) {
          e = Want{version, n, false, reported};
        } else {
          t.failed_puts++;
          if (same) e.may_vanish = true;
          if (!(s == Status::corrupt || s == Status::io_error || s == Status::no_space ||
                s == Status::short_io))
            violation("unexpected put status", key, s);
        }
      } else if (what < 14) {
        std::size_t n = 0;
        Status s = store->get(key, out.data(), out.size(), &n);
        check_get(i, s, n);
      } else if (what < 15) {
        Status s = store->erase(key);
        if (s != Status::ok && s != Status::not_found) violation("erase", key, s);
        e = Want{};
      } else if (what < 17) {
        Status s = store->verify(key);
        t.verifies++;
        if (s == Status::not_found) {
          if (!vanish_ok(i)) violation("verify: a key vanished without a word", key, s);
          e = Want{};
        } else if (!(ok(s) || s == Status::corrupt || s == Status::io_error ||
                     s == Status::short_io)) {
          violation("unexpected verify status", key, s);
        }
      } else {  // another worker's key: any whole version of it, or a failure
        std::uint64_t other = rng() % (kWorkers * kKeysPerWorker);
        std::size_t n = 0;
        Status s = store->get(other, out.data(), out.size(), &n);
        if (ok(s) && whole_version(other, out.data(), n) == 0)
          violation("an ok get of another thread's key returned no whole version", other, s);
      }
    }
    // The last word, with the faults still on: what each key holds now.
    for (int i = 0; i < kKeysPerWorker; ++i) {
      std::size_t n = 0;
      Status s = store->get(key_of(i), out.data(), out.size(), &n);
      check_get(i, s, n);
    }
    working--;
  };
  // Meanwhile bits flip at rest in recent writes, and a thread scrubs too.
  auto chaos = [&] {
    std::uint64_t s = 5;
    while (working.load() > 0) {
      faults->corrupt_random_written(s++);
      store->scrub(128 * KiB);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) threads.emplace_back(worker, w);
  threads.emplace_back(chaos);
  for (auto& th : threads) th.join();

  // With the faults off, every key still stored holds exactly its last version
  // or is reported corrupt now (a flip at rest the workers did not read).
  faults->clear();
  std::vector<unsigned char> out(kMaxBlob);
  for (std::uint64_t key = 0; key < kWorkers * kKeysPerWorker; ++key) {
    std::size_t n = 0;
    std::uint64_t told = corrupt.count(key);
    Status s = store->get(key, out.data(), out.size(), &n);
    if (ok(s)) {
      EXPECT_NE(whole_version(key, out.data(), n), 0u) << key;
    } else if (s == Status::corrupt) {
      EXPECT_EQ(corrupt.count(key), told + 1) << "corrupt at rest, so retired and reported: " << key;
    } else {
      EXPECT_EQ(s, Status::not_found) << key;
    }
  }

  auto st = store->stats();
  std::uint64_t silent = faults->injected(IoFault::lost_write) +
                         faults->injected(IoFault::torn_write) +
                         faults->injected(IoFault::misdirected_write);
  // Every flipped read and every silent fault that was read back failed a check.
  EXPECT_GE(st.checksum_failures,
            faults->injected(IoFault::bit_flip_on_read) + faults->silent_faults_read_back());
  EXPECT_EQ(st.corrupt_retired, corrupt.total());
  EXPECT_EQ(t.violations.load(), 0u);
  // The run really did what it claims.
  for (std::size_t k = 0; k < kIoFaultKinds; ++k)
    EXPECT_GT(faults->injected(static_cast<IoFault>(k)), 0u) << to_string(static_cast<IoFault>(k));
  EXPECT_GT(faults->silent_faults_read_back(), 0u);
  EXPECT_GT(st.write_verify_failures, 0u);
  EXPECT_GT(faults->injected_at_rest(), 0u);
  EXPECT_GT(t.ok_gets.load(), 100u);
  EXPECT_GT(st.scrubbed_bytes, 0u);
  EXPECT_EQ(st.evictions, 0u);
  RecordProperty("gets", std::to_string(t.gets.load()));
  RecordProperty("ok_gets", std::to_string(t.ok_gets.load()));
  RecordProperty("failed_gets", std::to_string(t.failed_gets.load()));
  RecordProperty("puts", std::to_string(t.puts.load()));
  RecordProperty("failed_puts", std::to_string(t.failed_puts.load()));
  RecordProperty("faults_on_ops", std::to_string(faults->injected_total()));
  RecordProperty("silent_write_faults", std::to_string(silent));
  RecordProperty("silent_read_back", std::to_string(faults->silent_faults_read_back()));
  RecordProperty("at_rest", std::to_string(faults->injected_at_rest()));
  RecordProperty("checksum_failures", std::to_string(st.checksum_failures));
  RecordProperty("write_verify_failures", std::to_string(st.write_verify_failures));
  RecordProperty("corrupt_retired", std::to_string(st.corrupt_retired));
  RecordProperty("keys_vanished_reported", std::to_string(t.vanished.load()));
}

INSTANTIATE_TEST_SUITE_P(Engines, SsdFaultMix, ::testing::Values("io_uring", "pread_pwrite"));

}  // namespace
}  // namespace u3m::mem
