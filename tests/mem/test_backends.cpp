// device-emu memory, copies, streams, events, throttle and failure; host tier.
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_backends_util.hpp"
#include "u3m/mem/device_emu.hpp"
#include "u3m/mem/host.hpp"

namespace u3m::mem {
namespace {

using testing::Gate;
using testing::pattern;

constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB;

std::vector<std::uint8_t> read_back(DeviceBackend& dev, const void* src, std::size_t n) {
  std::vector<std::uint8_t> out(n, 0);
  EXPECT_EQ(dev.memcpy_async(out.data(), n, src, n, CopyKind::d2h, kDefaultStream), Status::ok);
  EXPECT_EQ(dev.synchronize_stream(kDefaultStream), Status::ok);
  return out;
}

// ---- allocation ----------------------------------------------------------

TEST(DeviceEmu, AllocatesUpToCapacityThenOutOfMemory) {
  DeviceEmuBackend dev({.capacity = 1 * MiB});
  void* a = nullptr;
  void* b = nullptr;
  U3M_ASSERT_OK(dev.allocate(512 * KiB, &a));
  U3M_ASSERT_OK(dev.allocate(512 * KiB, &b));
  void* c = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(dev.allocate(1, &c), Status::out_of_memory);
  EXPECT_EQ(c, reinterpret_cast<void*>(0x1)) << "*ptr must be untouched on error";
  std::uint64_t free_b = 1, total = 0;
  U3M_ASSERT_OK(dev.mem_info(&free_b, &total));
  EXPECT_EQ(free_b, 0u);
  EXPECT_EQ(total, 1 * MiB);
  U3M_ASSERT_OK(dev.free(a));
  U3M_ASSERT_OK(dev.mem_info(&free_b, &total));
  EXPECT_EQ(free_b, 512 * KiB);
  U3M_ASSERT_OK(dev.allocate(100, &c));
  EXPECT_EQ(dev.allocate(2 * MiB, &a), Status::out_of_memory);
  U3M_ASSERT_OK(dev.free(b));
  U3M_ASSERT_OK(dev.free(c));
}

TEST(DeviceEmu, RejectsBadAllocateAndFree) {
  DeviceEmuBackend dev({.capacity = 1 * MiB});
  void* p = nullptr;
  EXPECT_EQ(dev.allocate(0, &p), Status::invalid_argument);
  EXPECT_EQ(dev.allocate(16, nullptr), Status::invalid_argument);
  U3M_ASSERT_OK(dev.allocate(1000, &p));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % DeviceEmuBackend::kAllocAlignment, 0u);
  EXPECT_EQ(dev.free(static_cast<char*>(p) + 8), Status::invalid_argument) << "interior pointer";
  int local = 0;
  EXPECT_EQ(dev.free(&local), Status::invalid_argument) << "host pointer";
  U3M_ASSERT_OK(dev.free(p));
  EXPECT_EQ(dev.free(p), Status::invalid_argument) << "double free";
}

TEST(DeviceEmu, FreedNeighboursCoalesce) {
  DeviceEmuBackend dev({.capacity = 1 * MiB});
  void* q[4];
  for (auto& p : q) U3M_ASSERT_OK(dev.allocate(256 * KiB, &p));
  U3M_ASSERT_OK(dev.free(q[1]));
  U3M_ASSERT_OK(dev.free(q[2]));
  void* big = nullptr;
  U3M_ASSERT_OK(dev.allocate(512 * KiB, &big));  // needs q[1] and q[2] merged
  EXPECT_EQ(big, q[1]);
  U3M_ASSERT_OK(dev.free(q[0]));
  U3M_ASSERT_OK(dev.free(q[3]));
  U3M_ASSERT_OK(dev.free(big));
}

TEST(DeviceEmu, ReportsCapabilities) {
  DeviceEmuOptions o{.capacity = 8 * MiB};
  o.throttle_bytes_per_s[static_cast<int>(CopyKind::h2d)] = 25e9;
  DeviceEmuBackend dev(o);
  Capabilities c = dev.capabilities();
  EXPECT_EQ(c.name, "device-emu");
  EXPECT_EQ(c.tier, Tier::device);
  EXPECT_TRUE(c.vmm);
  EXPECT_EQ(c.granularity, 2 * MiB);
  EXPECT_EQ(c.capacity, 8 * MiB);
  EXPECT_DOUBLE_EQ(c.write_gbps, 25.0);
  EXPECT_DOUBLE_EQ(c.read_gbps, 0.0);
}

// ---- copies -------------------------------------------------------------

TEST(DeviceEmu, CopiesPatternsAtOffsetsInEveryDirection) {
  // Small chunks, so multi-chunk copies and odd tails are exercised.
  DeviceEmuBackend dev({.capacity = 4 * MiB, .chunk_bytes = 64 * KiB});
  void* d1 = nullptr;
  void* d2 = nullptr;
  U3M_ASSERT_OK(dev.allocate(1 * MiB, &d1));
  U3M_ASSERT_OK(dev.allocate(1 * MiB, &d2));
  auto* dev1 = static_cast<std::uint8_t*>(d1);
  auto* dev2 = static_cast<std::uint8_t*>(d2);
  for (std::uint64_t size : {1ull, 7ull, 4096ull, 65537ull, 300001ull}) {
    for (std::uint64_t off : {0ull, 3ull, 4096ull + 1}) {
      auto src = pattern(size * 31 + off, size);
      U3M_ASSERT_OK(dev.memcpy_async(dev1 + off, 1 * MiB - off, src.data(), size, CopyKind::h2d,
                                     kDefaultStream));
      U3M_ASSERT_OK(dev.memcpy_async(dev2 + 2 * off, 1 * MiB - 2 * off, dev1 + off, size,
                                     CopyKind::d2d, kDefaultStream));
      std::vector<std::uint8_t> h2(size + 2, 0xEE);
      U3M_ASSERT_OK(dev.memcpy_async(h2.data() + 1, size, dev2 + 2 * off, size, CopyKind::d2h,
                                     kDefaultStream));
      U3M_ASSERT_OK(dev.synchronize_stream(kDefaultStream));
      ASSERT_EQ(0, std::memcmp(h2.data() + 1, src.data(), size)) << size << " @" << off;
      EXPECT_EQ(h2.front(), 0xEE) << "wrote before dst";
      EXPECT_EQ(h2.back(), 0xEE) << "wrote past count";
    }
  }
  // Host to host goes through a copy engine too.
  auto a = pattern(5, 1000);
  std::vector<std::uint8_t> b(1000, 0);
  U3M_ASSERT_OK(
      dev.memcpy_async(b.data(), b.size(), a.data(), a.size(), CopyKind::h2h, kDefaultStream));
  U3M_ASSERT_OK(dev.synchronize_stream(kDefaultStream));
  EXPECT_EQ(a, b);
  U3M_ASSERT_OK(dev.free(d1));
  U3M_ASSERT_OK(dev.free(d2));
}

TEST(DeviceEmu, RejectsCountBeyondDstMaxAndCopiesNothing) {
  DeviceEmuBackend dev({.capacity = 1 * MiB});
  void* d = nullptr;
  U3M_ASSERT_OK(dev.allocate(4096, &d));
  std::vector<std::uint8_t> zero(4096, 0);
  U3M_ASSERT_OK(dev.memcpy_async(d, 4096, zero.data(), 4096, CopyKind::h2d, kDefaultStream));
  auto src = pattern(1, 4096);
  EXPECT_EQ(dev.memcpy_async(d, 100, src.data(), 101, CopyKind::h2d, kDefaultStream),
            Status::invalid_argument);
  EXPECT_EQ(read_back(dev, d, 4096), zero);
  U3M_ASSERT_OK(dev.memcpy_async(d, 101, src.data(), 101, CopyKind::h2d, kDefaultStream));
  auto got = read_back(dev, d, 101);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), src.begin()));
  U3M_ASSERT_OK(dev.free(d));
}

TEST(DeviceEmu, ValidatesPointersAgainstKindAndLiveMemory) {
  DeviceEmuBackend dev({.capacity = 1 * MiB});
  void* d = nullptr;
  U3M_ASSERT_OK(dev.allocate(4096, &d));
  auto* dp = static_cast<std::uint8_t*>(d);
  std::vector<std::uint8_t> h(8192, 1);
  const auto bad = Status::invalid_argument;
  // A device-side range must lie inside a live allocation.
  EXPECT_EQ(dev.memcpy_async(dp + 4000, 8192, h.data(), 97, CopyKind::h2d, kDefaultStream), bad);
  EXPECT_EQ(dev.memcpy_async(h.data(), 8192, dp, 4097, CopyKind::d2h, kDefaultStream), bad);
  // Kind must match where the pointers are.
  EXPECT_EQ(dev.memcpy_async(h.data(), 8192, h.data() + 4096, 16, CopyKind::h2d, kDefaultStream),
            bad);
  EXPECT_EQ(dev.memcpy_async(h.data(), 8192, dp, 16, CopyKind::h2h, kDefaultStream), bad);
  EXPECT_EQ(dev.memcpy_async(dp, 4096, h.data(), 16, CopyKind::d2h, kDefaultStream), bad);
  // Overlapping ranges and null pointers.
  EXPECT_EQ(dev.memcpy_async(dp + 8, 4088, dp, 16, CopyKind::d2d, kDefaultStream), bad);
  EXPECT_EQ(dev.memcpy_async(nullptr, 16, h.data(), 16, CopyKind::h2h, kDefaultStream), bad);
  // Unknown stream; and count 0 is a no-op.
  EXPECT_EQ(dev.memcpy_async(dp, 16, h.data(), 16, CopyKind::h2d, Stream{999}), Status::not_found);
  EXPECT_EQ(dev.memcpy_async(dp, 16, h.data(), 0, CopyKind::h2d, kDefaultStream), Status::ok);
  U3M_ASSERT_OK(dev.free(d));
  EXPECT_EQ(dev.memcpy_async(dp, 16, h.data(), 16, CopyKind::h2d, kDefaultStream), bad)
      << "freed memory is not device memory any more";
}

// memcpy_sync (Note [Synchronous copies]): the same validation as
// memcpy_async, the copy done on return by the calling thread (the hook sees
// kSyncStream, no engine runs it), the link throttle shared with the engines,
// and a failed device refused.
TEST(DeviceEmu, SynchronousCopyValidatesCopiesOnTheCallerAndSharesTheThrottle) {
  constexpr double kRate = 100e6;
  std::mutex mu;
  std::set<std::uint64_t> hook_streams;
  std::set<std::thread::id> hook_threads;
  DeviceEmuOptions o{.capacity = 4 * MiB,
                     .chunk_bytes = 256 * KiB,
                     .before_chunk = [&](CopyKind, std::uint64_t stream, std::uint64_t) {
                       std::lock_guard g(mu);
                       hook_streams.insert(stream);
                       hook_threads.insert(std::this_thread::get_id());
                     }};
  o.throttle_bytes_per_s[static_cast<int>(CopyKind::h2d)] = kRate;
  DeviceEmuBackend dev(o);
  void* d = nullptr;
  U3M_ASSERT_OK(dev.allocate(2 * MiB, &d));
  auto* dp = static_cast<std::uint8_t*>(d);
  std::vector<std::uint8_t> h(8192, 1);
  const auto bad = Status::invalid_argument;
  EXPECT_EQ(dev.memcpy_sync(dp, 100, h.data(), 101, CopyKind::h2d), bad);  // count > dst_max
  EXPECT_EQ(dev.memcpy_sync(dp + 2 * MiB - 8, 8192, h.data(), 97, CopyKind::h2d), bad);
  EXPECT_EQ(dev.memcpy_sync(h.data(), 8192, h.data() + 4096, 16, CopyKind::h2d), bad);
  EXPECT_EQ(dev.memcpy_sync(nullptr, 16, h.data(), 16, CopyKind::h2h), bad);
  EXPECT_EQ(dev.memcpy_sync(dp, 16, h.data(), 0, CopyKind::h2d), Status::ok);
  EXPECT_TRUE(hook_streams.empty()) << "nothing valid was copied yet";

  auto src = pattern(31, 1 * MiB);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  U3M_ASSERT_OK(dev.memcpy_sync(dp, 2 * MiB, src.data(), 1 * MiB, CopyKind::h2d));
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(took, 0.8 * (1 * MiB) / kRate) << "the link throttle applies";
  std::vector<std::uint8_t> back(1 * MiB, 0);
  U3M_ASSERT_OK(dev.memcpy_sync(back.data(), back.size(), dp, 1 * MiB, CopyKind::d2h));
  EXPECT_EQ(back, src);
  EXPECT_EQ(hook_streams, std::set<std::uint64_t>{kSyncStream});
  EXPECT_EQ(hook_threads, std::set<std::thread::id>{std::this_thread::get_id()});
  EXPECT_EQ(dev.run_stats().by_engine, 0u);
  EXPECT_EQ(dev.run_stats().by_caller, 2u);

  dev.inject_failure();
  EXPECT_EQ(dev.memcpy_sync(back.data(), back.size(), dp, 1 * MiB, CopyKind::d2h),
            Status::device_failed);
}

// ---- streams and events ---------------------------------------------------

TEST(DeviceEmu, StreamRunsItsWorkInOrder) {
  DeviceEmuBackend dev({.capacity = 8 * MiB, .chunk_bytes = 64 * KiB});
  Stream s;
  U3M_ASSERT_OK(dev.create_stream(&s));
  void* d1 = nullptr;
  void* d2 = nullptr;
  U3M_ASSERT_OK(dev.allocate(1 * MiB, &d1));
  U3M_ASSERT_OK(dev.allocate(1 * MiB, &d2));
  // A chain with no synchronization in between: each step reads what the
  // previous one wrote, and later writes to d1 must not overtake the d2d.
  auto a = pattern(1, 1 * MiB), b = pattern(2, 1 * MiB);
  std::vector<std::uint8_t> out(1 * MiB, 0), out2(1 * MiB, 0);
  U3M_ASSERT_OK(dev.memcpy_async(d1, 1 * MiB, a.data(), 1 * MiB, CopyKind::h2d, s));
  U3M_ASSERT_OK(dev.memcpy_async(d2, 1 * MiB, d1, 1 * MiB, CopyKind::d2d, s));
  U3M_ASSERT_OK(dev.memcpy_async(d1, 1 * MiB, b.data(), 1 * MiB, CopyKind::h2d, s));
  U3M_ASSERT_OK(dev.memcpy_async(out.data(), 1 * MiB, d2, 1 * MiB, CopyKind::d2h, s));
  U3M_ASSERT_OK(dev.memcpy_async(out2.data(), 1 * MiB, d1, 1 * MiB, CopyKind::d2h, s));
  U3M_ASSERT_OK(dev.synchronize_stream(s));
  EXPECT_EQ(out, a);
  EXPECT_EQ(out2, b);
  U3M_ASSERT_OK(dev.destroy_stream(s));
  EXPECT_EQ(dev.synchronize_stream(s), Status::not_found);
  EXPECT_EQ(dev.destroy_stream(kDefaultStream), Status::invalid_argument);
  U3M_ASSERT_OK(dev.free(d1));
  U3M_ASSERT_OK(dev.free(d2));
}

// A device with one stream whose copies are held at a gate.
struct GatedDevice {
  Gate gate;
  std::atomic<std::uint64_t> gated_stream{~0ull};
  DeviceEmuBackend dev{
      {.capacity = 8 * MiB, .before_chunk = [this](CopyKind, std::uint64_t stream, std::uint64_t) {
         if (stream == gated_stream) gate.pass();
       }}};
};

TEST(DeviceEmu, EventsTrackRecordedPositions) {
  GatedDevice g;
  DeviceEmuBackend& dev = g.dev;
  Stream s;
  Event e;
  U3M_ASSERT_OK(dev.create_stream(&s));
  U3M_ASSERT_OK(dev.create_event(&e));
  EXPECT_EQ(dev.query_event(e), Status::ok) << "a never-recorded event is complete";
  void* d = nullptr;
  U3M_ASSERT_OK(dev.allocate(4096, &d));
  auto src = pattern(3, 4096);
  g.gated_stream = s.id;
  g.gate.close();
  U3M_ASSERT_OK(dev.memcpy_async(d, 4096, src.data(), 4096, CopyKind::h2d, s));
  U3M_ASSERT_OK(dev.record_event(e, s));
  g.gate.wait_for_waiters(1);
  EXPECT_EQ(dev.query_event(e), Status::busy) << "the copy before the record is held";
  g.gate.open();
  U3M_ASSERT_OK(dev.synchronize_event(e));
  EXPECT_EQ(dev.query_event(e), Status::ok);
  EXPECT_EQ(read_back(dev, d, 4096), src);
  U3M_ASSERT_OK(dev.destroy_event(e));
  EXPECT_EQ(dev.query_event(e), Status::not_found);
  EXPECT_EQ(dev.record_event(Event{12345}, s), Status::not_found);
  U3M_ASSERT_OK(dev.destroy_stream(s));
  U3M_ASSERT_OK(dev.free(d));
}

TEST(DeviceEmu, StreamWaitEventOrdersAcrossStreams) {
  GatedDevice g;
  DeviceEmuBackend& dev = g.dev;
  Stream producer, consumer;
  Event written, consumed;
  U3M_ASSERT_OK(dev.create_stream(&producer));
  U3M_ASSERT_OK(dev.create_stream(&consumer));
  U3M_ASSERT_OK(dev.create_event(&written));
  U3M_ASSERT_OK(dev.create_event(&consumed));
  void* d = nullptr;
  U3M_ASSERT_OK(dev.allocate(64 * KiB, &d));
  auto src = pattern(4, 64 * KiB);
  std::vector<std::uint8_t> out(64 * KiB, 0);
  g.gated_stream = producer.id;
  g.gate.close();
  U3M_ASSERT_OK(dev.memcpy_async(d, 64 * KiB, src.data(), 64 * KiB, CopyKind::h2d, producer));
  U3M_ASSERT_OK(dev.record_event(written, producer));
  U3M_ASSERT_OK(dev.stream_wait_event(consumer, written));  // does not block the caller
  U3M_ASSERT_OK(dev.memcpy_async(out.data(), 64 * KiB, d, 64 * KiB, CopyKind::d2h, consumer));
  U3M_ASSERT_OK(dev.record_event(consumed, consumer));
  g.gate.wait_for_waiters(1);
  EXPECT_EQ(dev.query_event(consumed), Status::busy) << "consumer ran ahead of the producer";
  g.gate.open();
  U3M_ASSERT_OK(dev.synchronize_stream(consumer));
  EXPECT_EQ(out, src);
  EXPECT_EQ(dev.query_event(written), Status::ok);
  U3M_ASSERT_OK(dev.destroy_stream(producer));
  U3M_ASSERT_OK(dev.destroy_stream(consumer));
  U3M_ASSERT_OK(dev.free(d));
}

TEST(DeviceEmu, DestroyingAnEventReleasesStreamsWaitingOnIt) {
  GatedDevice g;
  DeviceEmuBackend& dev = g.dev;
  Stream held, waiter;
  Event e;
  U3M_ASSERT_OK(dev.create_stream(&held));
  U3M_ASSERT_OK(dev.create_stream(&waiter));
  U3M_ASSERT_OK(dev.create_event(&e));
  std::vector<std::uint8_t> a(16, 1), b(16, 0);
  g.gated_stream = held.id;
  g.gate.close();
  U3M_ASSERT_OK(dev.memcpy_async(b.data(), 16, a.data(), 16, CopyKind::h2h, held));
  U3M_ASSERT_OK(dev.record_event(e, held));
  U3M_ASSERT_OK(dev.stream_wait_event(waiter, e));
  g.gate.wait_for_waiters(1);
  U3M_ASSERT_OK(dev.destroy_event(e));
  U3M_ASSERT_OK(dev.synchronize_stream(waiter));  // would hang if the wait outlived its event
  g.gate.open();
  U3M_ASSERT_OK(dev.synchronize_stream(held));
  EXPECT_EQ(a, b);
  U3M_ASSERT_OK(dev.destroy_stream(held));
  U3M_ASSERT_OK(dev.destroy_stream(waiter));
}

// Note [A waiting caller runs the copy]: with the engine held before it takes
// any op (as a CPU-starved engine thread would be), synchronize_stream must
// still finish, by running the stream's ops in order on the calling thread.
TEST(DeviceEmu, SynchronizeRunsQueuedOpsWhenTheEngineIsStarved) {
  Gate engine_gate;
  std::atomic<std::uint64_t> held_stream{~0ull};
  std::mutex mu;
  std::set<std::thread::id> copying_threads;
  DeviceEmuBackend dev({.capacity = 8 * MiB,
                        .chunk_bytes = 64 * KiB,
                        .before_chunk =
                            [&](CopyKind, std::uint64_t, std::uint64_t) {
                              std::lock_guard g(mu);
                              copying_threads.insert(std::this_thread::get_id());
                            },
                        .before_engine_op =
                            [&](std::uint64_t stream) {
                              if (stream == held_stream) engine_gate.pass();
                            }});
  Stream s;
  Event e;
  U3M_ASSERT_OK(dev.create_stream(&s));
  U3M_ASSERT_OK(dev.create_event(&e));
  void* d = nullptr;
  U3M_ASSERT_OK(dev.allocate(256 * KiB, &d));
  auto src = pattern(21, 256 * KiB);
  std::vector<std::uint8_t> out(256 * KiB, 0);
  held_stream = s.id;
  engine_gate.close();
  const DeviceEmuRunStats before = dev.run_stats();
  // The second copy reads what the first wrote: only in-order running gives src.
  U3M_ASSERT_OK(dev.memcpy_async(d, 256 * KiB, src.data(), 256 * KiB, CopyKind::h2d, s));
  U3M_ASSERT_OK(dev.record_event(e, s));
  U3M_ASSERT_OK(dev.memcpy_async(out.data(), 256 * KiB, d, 256 * KiB, CopyKind::d2h, s));
  engine_gate.wait_for_waiters(1);  // the engine is held, queue untouched
  std::atomic<bool> synced{false};
  Status st = Status::busy;
  const std::thread::id caller = std::this_thread::get_id();
  // Opens the gate after 10 s, so a regression fails the test instead of
  // hanging it.
  std::thread watchdog([&] {
    for (int i = 0; i < 1000 && !synced; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    engine_gate.open();
  });
  st = dev.synchronize_stream(s);
  synced = true;
  watchdog.join();
  engine_gate.open();
  U3M_ASSERT_OK(st);
  EXPECT_EQ(out, src);
  EXPECT_EQ(dev.query_event(e), Status::ok);
  {
    std::lock_guard g(mu);
    EXPECT_EQ(copying_threads, std::set<std::thread::id>{caller}) << "the held engine copied";
  }
  const DeviceEmuRunStats after = dev.run_stats();
  EXPECT_EQ(after.by_caller - before.by_caller, 3u) << "two copies and one record";
  EXPECT_EQ(after.by_engine, before.by_engine);
  U3M_ASSERT_OK(dev.destroy_stream(s));
  U3M_ASSERT_OK(dev.destroy_event(e));
  U3M_ASSERT_OK(dev.free(d));
}

// Many host threads, each with an inbound and an outbound stream, moving
// round trips through device memory and handing each round from one stream
// to the other with an event. Run under TSan, with and without waiting
// callers running queued ops (Note [A waiting caller runs the copy]).
void many_streams_round_trips(bool caller_runs_queued) {
  constexpr int kThreads = 8, kRounds = 40;
  constexpr std::uint64_t kBytes = 96 * KiB;
  DeviceEmuBackend dev(
      {.capacity = 64 * MiB, .chunk_bytes = 32 * KiB, .caller_runs_queued = caller_runs_queued});
  std::atomic<int> failures{0};
  auto check = [&](Status st) {
    if (st != Status::ok) ++failures;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Stream in, out;
      Event staged;
      void* a = nullptr;
      void* b = nullptr;
      check(dev.create_stream(&in));
      check(dev.create_stream(&out));
      check(dev.create_event(&staged));
      check(dev.allocate(kBytes, &a));
      check(dev.allocate(kBytes, &b));
      if (failures > 0) return;
      std::vector<std::uint8_t> back(kBytes);
      for (int r = 0; r < kRounds; ++r) {
        auto src = pattern(t * 1000 + r, kBytes);
        check(dev.memcpy_async(a, kBytes, src.data(), kBytes, CopyKind::h2d, in));
        check(dev.memcpy_async(b, kBytes, a, kBytes, CopyKind::d2d, in));
        check(dev.record_event(staged, in));
        check(dev.stream_wait_event(out, staged));
        check(dev.memcpy_async(back.data(), kBytes, b, kBytes, CopyKind::d2h, out));
        check(dev.synchronize_stream(out));  // not `in`: the event alone orders the streams
        if (back != src) ++failures;
      }
      check(dev.destroy_stream(in));
      check(dev.destroy_stream(out));
      check(dev.destroy_event(staged));
      check(dev.free(a));
      check(dev.free(b));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, 0);
  std::uint64_t free_b = 0, total = 0;
  U3M_ASSERT_OK(dev.mem_info(&free_b, &total));
  EXPECT_EQ(free_b, total);
  // Every op ran exactly once: per round 3 copies, a record and a wait.
  const DeviceEmuRunStats ran = dev.run_stats();
  EXPECT_EQ(ran.by_engine + ran.by_caller, std::uint64_t{kThreads} * kRounds * 5);
  if (!caller_runs_queued) {
    EXPECT_EQ(ran.by_caller, 0u);
  }
}

TEST(DeviceEmu, ManyConcurrentStreamsKeepDataIntact) {
  many_streams_round_trips(true);
}

TEST(DeviceEmu, ManyConcurrentStreamsKeepDataIntactEngineOnly) {
  many_streams_round_trips(false);
}

// ---- throttle and failure --------------------------------------------------

TEST(DeviceEmu, ThrottleLimitsBandwidthSharedByStreamsInOneDirection) {
  // 100 MB/s h2d: 1 MiB must take >= ~10.5 ms; two streams share the link.
  // A behaviour check with a lower bound only, never a speed goal.
  constexpr double kRate = 100e6;
  DeviceEmuOptions o{.capacity = 8 * MiB, .chunk_bytes = 256 * KiB};
  o.throttle_bytes_per_s[static_cast<int>(CopyKind::h2d)] = kRate;
  DeviceEmuBackend dev(o);
  Stream s2;
  U3M_ASSERT_OK(dev.create_stream(&s2));
  void* d = nullptr;
  U3M_ASSERT_OK(dev.allocate(2 * MiB, &d));
  auto src = pattern(9, 1 * MiB);
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  U3M_ASSERT_OK(dev.memcpy_async(d, 1 * MiB, src.data(), 1 * MiB, CopyKind::h2d, kDefaultStream));
  U3M_ASSERT_OK(dev.synchronize_stream(kDefaultStream));
  double one = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(one, 0.8 * (1 * MiB) / kRate);

  auto* dp = static_cast<char*>(d);
  t0 = Clock::now();
  U3M_ASSERT_OK(dev.memcpy_async(dp, 1 * MiB, src.data(), 1 * MiB, CopyKind::h2d, kDefaultStream));
  U3M_ASSERT_OK(dev.memcpy_async(dp + MiB, 1 * MiB, src.data(), 1 * MiB, CopyKind::h2d, s2));
  U3M_ASSERT_OK(dev.synchronize_stream(kDefaultStream));
  U3M_ASSERT_OK(dev.synchronize_stream(s2));
  double two = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(two, 0.8 * (2 * MiB) / kRate) << "two streams must share one direction's link";
  auto got = read_back(dev, dp + MiB, 1 * MiB);
  EXPECT_EQ(got, src);
  U3M_ASSERT_OK(dev.destroy_stream(s2));
  U3M_ASSERT_OK(dev.free(d));
}

TEST(DeviceEmu, InjectedFailureFailsInFlightCopiesAndEveryLaterCall) {
  GatedDevice g;
  DeviceEmuBackend& dev = g.dev;
  Stream s;
  Event e;
  U3M_ASSERT_OK(dev.create_stream(&s));
  U3M_ASSERT_OK(dev.create_event(&e));
  void* d = nullptr;
  U3M_ASSERT_OK(dev.allocate(64 * KiB, &d));
  std::vector<std::uint8_t> zero(64 * KiB, 0);
  U3M_ASSERT_OK(dev.memcpy_async(d, 64 * KiB, zero.data(), 64 * KiB, CopyKind::h2d, s));
  U3M_ASSERT_OK(dev.synchronize_stream(s));
  auto src = pattern(11, 64 * KiB);
  std::vector<std::uint8_t> out(64 * KiB, 0x5A);
  g.gated_stream = s.id;
  g.gate.close();
  U3M_ASSERT_OK(dev.memcpy_async(d, 64 * KiB, src.data(), 64 * KiB, CopyKind::h2d, s));
  U3M_ASSERT_OK(dev.memcpy_async(out.data(), 64 * KiB, d, 64 * KiB, CopyKind::d2h, s));
  U3M_ASSERT_OK(dev.record_event(e, s));
  g.gate.wait_for_waiters(1);
  // A host thread blocked on the event must wake with the failure.
  Status waited = Status::ok;
  std::thread waiter([&] { waited = dev.synchronize_event(e); });
  dev.inject_failure();
  waiter.join();  // returns although the copy is still held at the gate
  EXPECT_EQ(waited, Status::device_failed);
  g.gate.open();
  EXPECT_EQ(dev.synchronize_stream(s), Status::device_failed);
  EXPECT_EQ(out, std::vector<std::uint8_t>(64 * KiB, 0x5A)) << "a dropped copy wrote data";
  void* p = nullptr;
  std::uint64_t f = 0, t = 0;
  Stream s2;
  PhysicalHandle h;
  EXPECT_EQ(dev.allocate(4096, &p), Status::device_failed);
  EXPECT_EQ(dev.free(d), Status::device_failed);
  EXPECT_EQ(dev.mem_info(&f, &t), Status::device_failed);
  EXPECT_EQ(dev.memcpy_async(d, 16, src.data(), 16, CopyKind::h2d, s), Status::device_failed);
  EXPECT_EQ(dev.create_stream(&s2), Status::device_failed);
  EXPECT_EQ(dev.record_event(e, s), Status::device_failed);
  EXPECT_EQ(dev.query_event(e), Status::device_failed);
  EXPECT_EQ(dev.stream_wait_event(s, e), Status::device_failed);
  EXPECT_EQ(dev.reserve(2 * MiB, &p), Status::device_failed);
  EXPECT_EQ(dev.create_physical(2 * MiB, &h), Status::device_failed);
}  // the destructor must not hang on the failed device's engines

// ---- host ---------------------------------------------------------------

TEST(Host, AllocatesWithinCapacityAndHoldsData) {
  HostBackend host({.capacity = 1 * MiB});
  Capabilities c = host.capabilities();
  EXPECT_EQ(c.name, "host");
  EXPECT_EQ(c.tier, Tier::host);
  EXPECT_EQ(c.capacity, 1 * MiB);
  void* a = nullptr;
  void* b = nullptr;
  U3M_ASSERT_OK(host.allocate(600 * KiB, &a));
  EXPECT_EQ(host.allocate(600 * KiB, &b), Status::out_of_memory);
  EXPECT_EQ(b, nullptr);
  auto src = pattern(7, 600 * KiB);
  std::memcpy(a, src.data(), src.size());
  EXPECT_EQ(0, std::memcmp(a, src.data(), src.size()));
  // Whether the real mlock works depends on the machine; the report must agree with it.
  EXPECT_EQ(host.pinned_bytes() > 0, host.capabilities().pinned);
  std::uint64_t f = 0, t = 0;
  U3M_ASSERT_OK(host.mem_info(&f, &t));
  EXPECT_EQ(t, 1 * MiB);
  EXPECT_EQ(f, 1 * MiB - 600 * KiB);
  U3M_ASSERT_OK(host.free(a));
  EXPECT_EQ(host.free(a), Status::invalid_argument);
  EXPECT_EQ(host.allocate(0, &b), Status::invalid_argument);
  U3M_ASSERT_OK(host.mem_info(&f, &t));
  EXPECT_EQ(f, t);
}

int refuse_lock(const void*, std::size_t) {
  errno = ENOMEM;
  return -1;
}

std::atomic<int> g_locks_left{0};
int lock_a_few(const void*, std::size_t) {
  if (g_locks_left.fetch_sub(1) > 0) return 0;
  errno = ENOMEM;
  return -1;
}

TEST(Host, BuffersOfTwoMiBOrMoreAreHugePageAligned) {
  // Note [Huge-page host buffers]: alignment is ours to give; whether the
  // kernel backs them with huge pages is not, so only alignment is checked.
  HostBackend h(HostOptions{.capacity = 64 * MiB, .pin = false});
  for (std::uint64_t bytes : {2 * MiB, 3 * MiB + 5, 16 * MiB}) {
    void* p = nullptr;
    ASSERT_TRUE(ok(h.allocate(bytes, &p))) << bytes;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % (2 * MiB), 0u) << bytes;
    std::memset(p, 0x3c, bytes);  // the whole range is mapped, and only it is ours
    EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 0x3c);
    ASSERT_TRUE(ok(h.free(p)));
  }
  std::uint64_t free_bytes = 0, total = 0;
  ASSERT_TRUE(ok(h.mem_info(&free_bytes, &total)));
  EXPECT_EQ(free_bytes, total);
}

TEST(Host, FallsBackToPageableWhenLockingIsRefused) {
  HostBackend host({.capacity = 1 * MiB, .lock = refuse_lock});
  EXPECT_FALSE(host.capabilities().pinned) << "the probe at start must see the refusal";
  void* a = nullptr;
  U3M_ASSERT_OK(host.allocate(64 * KiB, &a));
  std::memset(a, 0xAB, 64 * KiB);
  EXPECT_EQ(host.pinned_bytes(), 0u);
  U3M_ASSERT_OK(host.free(a));
}

TEST(Host, DegradesWhenLockingStopsPartWay) {
  g_locks_left = 2;  // the probe and the first allocation are locked
  HostBackend host({.capacity = 1 * MiB, .lock = lock_a_few});
  EXPECT_TRUE(host.capabilities().pinned);
  void* a = nullptr;
  void* b = nullptr;
  U3M_ASSERT_OK(host.allocate(64 * KiB, &a));
  EXPECT_EQ(host.pinned_bytes(), 64 * KiB);
  EXPECT_TRUE(host.capabilities().pinned);
  U3M_ASSERT_OK(host.allocate(64 * KiB, &b)) << "a refused lock must not fail the allocation";
  EXPECT_FALSE(host.capabilities().pinned);
  EXPECT_EQ(host.pinned_bytes(), 64 * KiB);
  U3M_ASSERT_OK(host.free(a));
  EXPECT_EQ(host.pinned_bytes(), 0u);
  U3M_ASSERT_OK(host.free(b));
}

TEST(Host, PinFalseNeverLocks) {
  HostBackend host({.capacity = 1 * MiB, .pin = false, .lock = lock_a_few});
  g_locks_left = 100;
  void* a = nullptr;
  U3M_ASSERT_OK(host.allocate(4096, &a));
  EXPECT_FALSE(host.capabilities().pinned);
  EXPECT_EQ(g_locks_left, 100);
  U3M_ASSERT_OK(host.free(a));
}

}  // namespace
}  // namespace u3m::mem
