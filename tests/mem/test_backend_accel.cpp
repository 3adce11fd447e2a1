// The accelerator backends' conformance suite (test_backend_accel.hpp): what
// backend.hpp promises, checked through AccelBackend on each runtime, plus the
// loading, binding, error mapping and ordering the doubles make observable.
#include "test_backend_accel.hpp"

#include <cstring>
#include <thread>
#include <vector>

#include "test_backends_util.hpp"
#include "u3m/mem/backend_source.hpp"

namespace u3m::mem::testing {
namespace {

TEST_P(AccelTest, ReportsWhatItFound) {
  const AccelInfo& i = dev_->info();
  EXPECT_EQ(i.name, GetParam().name);
  EXPECT_EQ(i.test_double, !GetParam().real);
  EXPECT_FALSE(i.library.empty());
  EXPECT_FALSE(i.device_name.empty());
  EXPECT_TRUE(i.vmm) << i.vmm_note;
  const Capabilities c = dev_->capabilities();
  EXPECT_EQ(c.name, GetParam().name);
  EXPECT_EQ(c.tier, Tier::device);
  EXPECT_EQ(c.vmm, i.vmm);
  EXPECT_GT(c.granularity, 0u);
  std::uint64_t free_bytes = 0, total = 0;
  ASSERT_EQ(dev_->mem_info(&free_bytes, &total), Status::ok);
  EXPECT_EQ(total, c.capacity);
  EXPECT_LE(free_bytes, total);
  if (ctl_) {
    EXPECT_EQ(c.granularity, 2 * MiB);
  }  // the double's default
}

TEST_P(AccelTest, AllocatesFreesAndAccountsDeviceMemory) {
  std::uint64_t free0 = 0, total = 0, free1 = 0;
  ASSERT_EQ(dev_->mem_info(&free0, &total), Status::ok);
  void* p = dev_alloc(64 * MiB);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(dev_->mem_info(&free1, &total), Status::ok);
  EXPECT_LE(free1 + 64 * MiB, free0 + (ctl_ ? 0 : 8 * MiB));  // the real runtime rounds
  int local = 0;
  EXPECT_EQ(dev_->free(&local), Status::invalid_argument);  // not from allocate()
  EXPECT_EQ(dev_->allocate(0, &p), Status::invalid_argument);
  EXPECT_EQ(dev_->free(p), Status::ok);
  EXPECT_EQ(dev_->free(p), Status::invalid_argument);  // twice
}

TEST_P(AccelTest, OutOfMemoryIsRecoverable) {
  std::uint64_t free_bytes = 0, total = 0;
  ASSERT_EQ(dev_->mem_info(&free_bytes, &total), Status::ok);
  void* p = nullptr;
  EXPECT_EQ(dev_->allocate(total * 4, &p), Status::out_of_memory) << dev_->last_error();
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(dev_->last_error().find("malloc"), std::string::npos) << dev_->last_error();
  p = dev_alloc(1 * MiB);  // the device is still usable
  EXPECT_EQ(dev_->free(p), Status::ok);
}

// Pinned host -> device -> device -> host on a stream, and the same with the
// synchronous copy, at offsets that keep ACL's 64-byte rule.
TEST_P(AccelTest, CopiesRoundTripOnStreamsAndSynchronously) {
  const std::uint64_t n = 3 * MiB + 192;
  auto* src = static_cast<std::uint8_t*>(host_alloc(n + 64));
  auto* back = static_cast<std::uint8_t*>(host_alloc(n + 64));
  auto* d1 = static_cast<std::uint8_t*>(dev_alloc(n + 4096));
  auto* d2 = static_cast<std::uint8_t*>(dev_alloc(n + 4096));
  const auto want = pattern(7, n);
  std::memcpy(src + 64, want.data(), n);
  Stream s;
  ASSERT_EQ(dev_->create_stream(&s), Status::ok);
  ASSERT_EQ(dev_->memcpy_async(d1 + 128, n + 4096 - 128, src + 64, n, CopyKind::h2d, s), Status::ok)
      << dev_->last_error();
  ASSERT_EQ(dev_->memcpy_async(d2, n + 4096, d1 + 128, n, CopyKind::d2d, s), Status::ok);
  ASSERT_EQ(dev_->memcpy_async(back + 64, n, d2, n, CopyKind::d2h, s), Status::ok);
  ASSERT_EQ(dev_->synchronize_stream(s), Status::ok) << dev_->last_error();
  EXPECT_EQ(std::memcmp(back + 64, want.data(), n), 0);

  std::memset(back, 0, n + 64);
  ASSERT_EQ(dev_->memcpy_sync(d1 + 1, n + 4095, src + 64, n, CopyKind::h2d), Status::ok);
  ASSERT_EQ(dev_->memcpy_sync(d2 + 3, n, d1 + 1, n, CopyKind::d2d), Status::ok);
  ASSERT_EQ(dev_->memcpy_sync(back + 5, n, d2 + 3, n, CopyKind::d2h), Status::ok);
  EXPECT_EQ(std::memcmp(back + 5, want.data(), n), 0);
  // The reference path the bench uses lands the same bytes.
  ASSERT_EQ(dev_->raw_memcpy(d1, n, src + 64, n, CopyKind::h2d), Status::ok);
  ASSERT_EQ(dev_->raw_memcpy(back, n, d1, n, CopyKind::d2h), Status::ok);
  EXPECT_EQ(std::memcmp(back, want.data(), n), 0);
  EXPECT_EQ(dev_->destroy_stream(s), Status::ok);
  EXPECT_EQ(dev_->free(d1), Status::ok);
  EXPECT_EQ(dev_->free(d2), Status::ok);
}

// backend.hpp's checks run before the runtime sees the call.
TEST_P(AccelTest, RejectsBadCopiesBeforeTheRuntime) {
  auto* h = static_cast<std::uint8_t*>(host_alloc(1 * MiB));
  auto* d = static_cast<std::uint8_t*>(dev_alloc(1 * MiB));
  const std::uint64_t before = ctl_ ? ctl_->calls(GetParam().api_copy_async) : 0;
  auto async = [&](void* dst, std::uint64_t max, const void* src, std::uint64_t n, CopyKind k) {
    return dev_->memcpy_async(dst, max, src, n, k, kDefaultStream);
  };
  EXPECT_EQ(async(d, 4096, h, 8192, CopyKind::h2d), Status::invalid_argument);  // > dst_max
  EXPECT_NE(dev_->last_error().find("destMax"), std::string::npos) << dev_->last_error();
  EXPECT_EQ(async(nullptr, 4096, h, 4096, CopyKind::h2d), Status::invalid_argument);
  EXPECT_EQ(async(d + 1 * MiB - 64, 4096, h, 4096, CopyKind::h2d), Status::invalid_argument);
  EXPECT_NE(dev_->last_error().find("not inside live device memory"), std::string::npos);
  EXPECT_EQ(async(h, 4096, d, 4096, CopyKind::h2d), Status::invalid_argument);  // sides swapped
  EXPECT_EQ(async(d + 64, 4096, d, 4096, CopyKind::d2d), Status::invalid_argument);  // overlap
  EXPECT_EQ(dev_->memcpy_async(d, 4096, h, 4096, CopyKind::h2d, Stream{999}), Status::not_found);
  EXPECT_EQ(async(d, 4096, h, 0, CopyKind::h2d), Status::ok);  // nothing to copy
  EXPECT_EQ(dev_->memcpy_sync(h, 4096, d + 1 * MiB - 64, 4096, CopyKind::d2h),
            Status::invalid_argument);
  if (ctl_) {
    EXPECT_EQ(ctl_->calls(GetParam().api_copy_async), before);
  }
  EXPECT_EQ(dev_->free(d), Status::ok);
}

// Streams are asynchronous and ordered; events mark their progress; a
// stream waiting on another's event runs after it.
TEST_P(AccelTest, EventsOrderWorkAcrossStreams) {
  U3M_NEEDS_DOUBLE();
  const std::uint64_t n = 1 * MiB;
  auto* h1 = static_cast<std::uint8_t*>(host_alloc(n));
  auto* h2 = static_cast<std::uint8_t*>(host_alloc(n));
  auto* d = static_cast<std::uint8_t*>(dev_alloc(n));
  const auto want = pattern(3, n);
  std::memcpy(h1, want.data(), n);
  Stream a, b;
  Event e;
  ASSERT_EQ(dev_->create_stream(&a), Status::ok);
  ASSERT_EQ(dev_->create_stream(&b), Status::ok);
  ASSERT_EQ(dev_->create_event(&e), Status::ok);
  ctl_->hold(true);
  ASSERT_EQ(dev_->memcpy_async(d, n, h1, n, CopyKind::h2d, a), Status::ok);
  ASSERT_EQ(dev_->record_event(e, a), Status::ok);
  ASSERT_EQ(dev_->stream_wait_event(b, e), Status::ok);
  ASSERT_EQ(dev_->memcpy_async(h2, n, d, n, CopyKind::d2h, b), Status::ok);
  EXPECT_EQ(dev_->query_event(e), Status::busy);  // held: nothing ran
  EXPECT_NE(std::memcmp(h2, want.data(), n), 0);
  ctl_->hold(false);
  ASSERT_EQ(dev_->synchronize_stream(b), Status::ok);
  EXPECT_EQ(dev_->query_event(e), Status::ok);
  EXPECT_EQ(std::memcmp(h2, want.data(), n), 0);  // b's copy ran after a's
  EXPECT_EQ(dev_->synchronize_event(e), Status::ok);
  EXPECT_EQ(dev_->destroy_event(e), Status::ok);
  EXPECT_EQ(dev_->destroy_stream(a), Status::ok);
  EXPECT_EQ(dev_->destroy_stream(b), Status::ok);
  EXPECT_EQ(dev_->free(d), Status::ok);
}

TEST_P(AccelTest, EventNeverRecordedIsCompleteWithoutAskingTheRuntime) {
  Event e;
  ASSERT_EQ(dev_->create_event(&e), Status::ok);
  const std::uint64_t before = ctl_ ? ctl_->calls(GetParam().api_event_query) : 0;
  EXPECT_EQ(dev_->query_event(e), Status::ok);
  EXPECT_EQ(dev_->synchronize_event(e), Status::ok);
  EXPECT_EQ(dev_->stream_wait_event(kDefaultStream, e), Status::ok);
  if (ctl_) {
    EXPECT_EQ(ctl_->calls(GetParam().api_event_query), before);
  }
  EXPECT_EQ(dev_->record_event(e, kDefaultStream), Status::ok);
  EXPECT_EQ(dev_->synchronize_event(e), Status::ok);
  EXPECT_EQ(dev_->query_event(e), Status::ok);
  EXPECT_EQ(dev_->destroy_event(e), Status::ok);
}

TEST_P(AccelTest, UnknownHandlesAreNotFound) {
  Stream s;
  Event e;
  ASSERT_EQ(dev_->create_stream(&s), Status::ok);
  ASSERT_EQ(dev_->create_event(&e), Status::ok);
  EXPECT_EQ(dev_->destroy_stream(kDefaultStream), Status::invalid_argument);
  EXPECT_EQ(dev_->destroy_stream(s), Status::ok);
  EXPECT_EQ(dev_->synchronize_stream(s), Status::not_found);
  EXPECT_EQ(dev_->record_event(e, s), Status::not_found);
  EXPECT_EQ(dev_->destroy_event(e), Status::ok);
  EXPECT_EQ(dev_->query_event(e), Status::not_found);
  EXPECT_EQ(dev_->stream_wait_event(kDefaultStream, e), Status::not_found);
}

// A failure on a stream surfaces at synchronize; a lost device stays lost.
TEST_P(AccelTest, AsyncFailureSurfacesAtSynchronizeAndIsSticky) {
  U3M_NEEDS_DOUBLE();
  auto* h = host_alloc(1 * MiB);
  void* d = dev_alloc(1 * MiB);
  ctl_->fail_next_copy(GetParam().code_lost, true);
  ASSERT_EQ(dev_->memcpy_async(d, 1 * MiB, h, 1 * MiB, CopyKind::h2d, kDefaultStream), Status::ok);
  EXPECT_EQ(dev_->synchronize_stream(kDefaultStream), Status::device_failed);
  EXPECT_NE(dev_->last_error().find(std::to_string(GetParam().code_lost)), std::string::npos)
      << dev_->last_error();
  void* p = nullptr;
  EXPECT_EQ(dev_->allocate(4096, &p), Status::device_failed);
  Stream s;
  EXPECT_EQ(dev_->create_stream(&s), Status::device_failed);
  EXPECT_EQ(dev_->memcpy_sync(d, 4096, h, 4096, CopyKind::h2d), Status::device_failed);
  // A lost device keeps what it held (CUDA's does until the process exits),
  // so the cleanup cannot give it back; start the double afresh instead.
  host_.reset();
  dev_.reset();
  ctl_->reset();
}

TEST_P(AccelTest, NativeErrorsMapOntoStatus) {
  U3M_NEEDS_DOUBLE();
  const AccelTarget& t = GetParam();
  void* p = nullptr;
  ctl_->fail_next(t.api_malloc.c_str(), t.code_oom);
  EXPECT_EQ(dev_->allocate(4096, &p), Status::out_of_memory);
  EXPECT_NE(dev_->last_error().find(std::to_string(t.code_oom)), std::string::npos);
  Stream s;
  ctl_->fail_next(t.api_event_create.c_str(), t.code_bad_handle);
  Event e;
  EXPECT_EQ(dev_->create_event(&e), Status::not_found);
  ctl_->fail_next(t.api_stream_sync.c_str(), t.code_bad_handle);
  EXPECT_EQ(dev_->synchronize_stream(kDefaultStream), Status::not_found);
  // Not sticky: the device still works.
  p = dev_alloc(4096);
  EXPECT_EQ(dev_->free(p), Status::ok);
  ctl_->fail_next(t.api_malloc.c_str(), t.code_lost);
  EXPECT_EQ(dev_->allocate(4096, &p), Status::device_failed);
  EXPECT_EQ(dev_->create_stream(&s), Status::device_failed);  // sticky
}

TEST_P(AccelTest, ExpandableSegmentsMapChunksThatTakeCopies) {
  const std::uint64_t g = dev_->capabilities().granularity;
  void* va = nullptr;
  ASSERT_EQ(dev_->reserve(4 * g, &va), Status::ok) << dev_->last_error();
  auto* base = static_cast<std::uint8_t*>(va);
  PhysicalHandle c1, c2;
  ASSERT_EQ(dev_->create_physical(g, &c1), Status::ok) << dev_->last_error();
  ASSERT_EQ(dev_->create_physical(g, &c2), Status::ok);
  EXPECT_EQ(dev_->create_physical(g + 1, &c2), Status::invalid_argument);
  ASSERT_EQ(dev_->map(base, c1), Status::ok) << dev_->last_error();
  ASSERT_EQ(dev_->map(base + g, c2), Status::ok) << dev_->last_error();
  EXPECT_EQ(dev_->map(base + g, c1), Status::invalid_argument);      // overlaps c2
  EXPECT_EQ(dev_->map(base + 4 * g, c1), Status::invalid_argument);  // outside
  // A copy across both chunks (contiguous), and back.
  const std::uint64_t n = g + g / 2, off = g / 2;
  auto* h = static_cast<std::uint8_t*>(host_alloc(n));
  auto* back = static_cast<std::uint8_t*>(host_alloc(n));
  const auto want = pattern(11, n);
  std::memcpy(h, want.data(), n);
  ASSERT_EQ(dev_->memcpy_async(base + off, n, h, n, CopyKind::h2d, kDefaultStream), Status::ok)
      << dev_->last_error();
  ASSERT_EQ(dev_->memcpy_async(back, n, base + off, n, CopyKind::d2h, kDefaultStream), Status::ok);
  ASSERT_EQ(dev_->synchronize_stream(kDefaultStream), Status::ok) << dev_->last_error();
  EXPECT_EQ(std::memcmp(back, want.data(), n), 0);
  // The unmapped third granule is not device memory.
  EXPECT_EQ(dev_->memcpy_async(base + 2 * g, 64, h, 64, CopyKind::h2d, kDefaultStream),
            Status::invalid_argument);
  EXPECT_EQ(dev_->release(va), Status::busy);
  EXPECT_EQ(dev_->free_physical(c1), Status::busy);
  EXPECT_EQ(dev_->unmap(base + 1), Status::invalid_argument);
  EXPECT_EQ(dev_->unmap(base), Status::ok);
  EXPECT_EQ(dev_->unmap(base + g), Status::ok);
  EXPECT_EQ(dev_->free_physical(c1), Status::ok);
  EXPECT_EQ(dev_->free_physical(c2), Status::ok);
  EXPECT_EQ(dev_->release(va), Status::ok);
}

// The pool allocator runs on the backend unchanged, with and without
// expandable segments.
TEST_P(AccelTest, DevicePoolRunsOnTheBackend) {
  for (bool expandable : {false, true}) {
    BackendSegmentSource src(*dev_);
    PoolConfig cfg;
    cfg.expandable_segments = expandable;
    cfg.expandable_reserve = 64 * MiB;
    DevicePool pool(src, cfg);
    std::vector<PoolAllocation> blocks;
    for (std::uint64_t bytes : {4 * KiB, 300 * KiB, 3 * MiB, 5 * MiB}) {
      PoolAllocation a;
      ASSERT_EQ(pool.allocate(bytes, &a), Status::ok) << dev_->last_error();
      blocks.push_back(a);
    }
    const std::uint64_t n = blocks[2].requested;
    auto* h = static_cast<std::uint8_t*>(host_alloc(n));
    auto* back = static_cast<std::uint8_t*>(host_alloc(n));
    const auto want = pattern(expandable ? 5 : 6, n);
    std::memcpy(h, want.data(), n);
    ASSERT_EQ(dev_->memcpy_async(blocks[2].ptr, n, h, n, CopyKind::h2d, kDefaultStream), Status::ok)
        << dev_->last_error();
    ASSERT_EQ(dev_->memcpy_async(blocks[3].ptr, blocks[3].size, blocks[2].ptr, n, CopyKind::d2d,
                                 kDefaultStream),
              Status::ok);
    ASSERT_EQ(dev_->memcpy_async(back, n, blocks[3].ptr, n, CopyKind::d2h, kDefaultStream),
              Status::ok);
    ASSERT_EQ(dev_->synchronize_stream(kDefaultStream), Status::ok);
    EXPECT_EQ(std::memcmp(back, want.data(), n), 0) << "expandable " << expandable;
    for (auto& a : blocks) EXPECT_EQ(pool.free(a), Status::ok);
    pool.empty_cache();
    EXPECT_EQ(src.counters().physical_bytes.load(), 0u);
    EXPECT_EQ(host().free(h), Status::ok);
    EXPECT_EQ(host().free(back), Status::ok);
  }
}

// Both runtimes keep the current device per thread; the backend binds it on
// every calling thread (the ACL double refuses calls without a context, the
// CUDA double driver calls without one).
TEST_P(AccelTest, WorksFromAnyThread) {
  auto* h = static_cast<std::uint8_t*>(host_alloc(1 * MiB));
  const auto want = pattern(9, 1 * MiB);
  std::memcpy(h, want.data(), 1 * MiB);
  Status s1 = Status::busy, s2 = Status::busy, s3 = Status::busy;
  std::vector<std::uint8_t> back(1 * MiB);
  std::thread t([&] {
    void* d = nullptr;
    s1 = dev_->allocate(1 * MiB, &d);
    if (!ok(s1)) return;
    s2 = dev_->memcpy_sync(d, 1 * MiB, h, 1 * MiB, CopyKind::h2d);
    dev_->memcpy_sync(back.data(), 1 * MiB, d, 1 * MiB, CopyKind::d2h);
    dev_->free(d);
    void* va = nullptr;
    s3 = dev_->reserve(dev_->capabilities().granularity, &va);
    if (ok(s3)) dev_->release(va);
  });
  t.join();
  EXPECT_EQ(s1, Status::ok) << dev_->last_error();
  EXPECT_EQ(s2, Status::ok) << dev_->last_error();
  EXPECT_EQ(s3, Status::ok) << dev_->last_error();
  EXPECT_EQ(back, want);
}

TEST_P(AccelTest, PinnedHostTierComesFromTheRuntime) {
  auto tier = dev_->make_host_backend(4 * MiB);
  const Capabilities c = tier->capabilities();
  EXPECT_EQ(c.name, GetParam().name + "-host");
  EXPECT_EQ(c.tier, Tier::host);
  EXPECT_TRUE(c.pinned);
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(tier->allocate(3 * MiB, &a), Status::ok);
  EXPECT_EQ(tier->allocate(2 * MiB, &b), Status::out_of_memory);  // over its capacity
  std::uint64_t f = 0, t = 0;
  ASSERT_EQ(tier->mem_info(&f, &t), Status::ok);
  EXPECT_EQ(t, 4 * MiB);
  EXPECT_EQ(f, 1 * MiB);
  int local = 0;
  EXPECT_EQ(tier->free(&local), Status::invalid_argument);
  EXPECT_EQ(tier->free(a), Status::ok);
}

// Whatever is left (memory, mappings, chunks, reservations, streams,
// events) is given back when the backend goes: TearDown checks the double.
TEST_P(AccelTest, DestructionGivesEverythingBack) {
  U3M_NEEDS_DOUBLE();
  dev_alloc(1 * MiB);
  Stream s;
  Event e;
  ASSERT_EQ(dev_->create_stream(&s), Status::ok);
  ASSERT_EQ(dev_->create_event(&e), Status::ok);
  ASSERT_EQ(dev_->record_event(e, s), Status::ok);
  const std::uint64_t g = dev_->capabilities().granularity;
  void* va = nullptr;
  PhysicalHandle c;
  ASSERT_EQ(dev_->reserve(2 * g, &va), Status::ok);
  ASSERT_EQ(dev_->create_physical(g, &c), Status::ok);
  ASSERT_EQ(dev_->map(va, c), Status::ok);
  host_alloc(4096);
  EXPECT_GT(ctl_->live_objects(), 0u);
}

TEST_P(AccelTest, NoDeviceIsAOneLineReason) {
  U3M_NEEDS_DOUBLE();
  dev_.reset();
  ctl_->configure(0, 1 * GiB, 2 * MiB);
  std::unique_ptr<AccelBackend> b;
  std::string why;
  EXPECT_NE(open(&b, &why), Status::ok);
  EXPECT_EQ(b, nullptr);
  EXPECT_NE(why.find(GetParam().api_device_count), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
  EXPECT_EQ(why.rfind(GetParam().name + ": ", 0), 0u) << why;
}

TEST_P(AccelTest, AMissingLibraryOrFunctionIsAOneLineReason) {
  std::unique_ptr<AccelBackend> b;
  std::string why;
  EXPECT_EQ(GetParam().open("/nonexistent/u3m-no-such-runtime.so", &b, &why), Status::unsupported);
  EXPECT_NE(why.find("/nonexistent/u3m-no-such-runtime.so"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
  // A library that is not this runtime: the first function it lacks is named.
  why.clear();
  EXPECT_EQ(GetParam().open(U3M_OTHER_DOUBLE, &b, &why), Status::unsupported);
  EXPECT_NE(why.find(" has no "), std::string::npos) << why;
}

}  // namespace
}  // namespace u3m::mem::testing
