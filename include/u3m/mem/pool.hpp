// The device memory pool: a caching allocator with size buckets, best-fit,
// split/coalesce and expandable segments, after MISSION.md item 6 and
// PyTorch's CUDACachingAllocator (design only, no code).
// docs/memory.md ("Pool allocator") describes the design and its figures.
//
// The pool never calls the OS or a device: it asks a SegmentSource for memory.
// Real runs plug in a device backend (or CpuSegmentSource here), the simulator
// and the static-plan comparison plug in VirtualSegmentSource, which hands out
// fake addresses and never touches memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "u3m/mem/status.hpp"

namespace u3m::mem {

inline constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

// What the pool needs from a backend. Two modes:
//  * segments: allocate_segment / free_segment hand out whole contiguous
//    segments (cudaMalloc / aclrtMalloc);
//  * VMM (supports_vmm()): reserve a virtual range, then map and unmap
//    physical chunks of granularity() bytes inside it (cuMemAddressReserve +
//    cuMemCreate/cuMemMap, aclrtReserveMemAddress + aclrtMallocPhysical/aclrtMapMem).
// Sizes and map/unmap addresses are multiples of granularity(); reserve()
// returns a base aligned to granularity(). Every call returns a Status and
// takes nothing on failure.
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  virtual std::uint64_t granularity() const = 0;
  virtual bool supports_vmm() const = 0;

  virtual Status allocate_segment(std::uint64_t bytes, void** base) = 0;
  virtual Status free_segment(void* base, std::uint64_t bytes) = 0;

  virtual Status reserve(std::uint64_t bytes, void** base) = 0;
  virtual Status map(void* addr, std::uint64_t bytes) = 0;
  virtual Status unmap(void* addr, std::uint64_t bytes) = 0;
  virtual Status release(void* base, std::uint64_t bytes) = 0;
};

// How many calls a source has served and how many bytes it holds; kept by the
// sources below (atomics, so tests may read them while a pool runs).
struct SourceCounters {
  std::atomic<std::uint64_t> allocate_segment{0}, free_segment{0}, reserve{0}, map{0}, unmap{0},
      release{0}, failures{0};
  std::atomic<std::uint64_t> physical_bytes{0};  // segments + mapped chunks held now
  std::uint64_t calls() const {
    return allocate_segment + free_segment + reserve + map + unmap + release;
  }
};

// Hands out fake, never-dereferenced addresses: a model of a device address
// space for the simulator, the static-plan comparison and tests. Physical
// capacity (0 = unbounded) makes it report out_of_memory like a full device;
// fail_after(n) makes the call after the next n fail (fault injection).
class VirtualSegmentSource final : public SegmentSource {
 public:
  explicit VirtualSegmentSource(std::uint64_t granularity = 2 * MiB,
                                std::uint64_t physical_capacity = 0, bool vmm = true);
  std::uint64_t granularity() const override { return granularity_; }
  bool supports_vmm() const override { return vmm_; }
  Status allocate_segment(std::uint64_t bytes, void** base) override;
  Status free_segment(void* base, std::uint64_t bytes) override;
  Status reserve(std::uint64_t bytes, void** base) override;
  Status map(void* addr, std::uint64_t bytes) override;
  Status unmap(void* addr, std::uint64_t bytes) override;
  Status release(void* base, std::uint64_t bytes) override;

  void fail_after(std::uint64_t calls);  // the (calls+1)-th call from now fails
  const SourceCounters& counters() const { return counters_; }

 private:
  bool inject_failure();

  std::uint64_t granularity_, capacity_;
  bool vmm_;
  std::mutex mu_;
  std::uint64_t next_address_;
  std::map<std::uintptr_t, std::uint64_t> ranges_;  // live segments and reservations
  std::int64_t fail_countdown_ = -1;
  SourceCounters counters_;
};

// Real host memory standing in for device memory: segments are anonymous
// mmaps; VMM reserves PROT_NONE address space and maps chunks of one memfd per
// reservation with MAP_FIXED (unmap punches the chunk out of the memfd, so its
// pages really go back). Thread-safe.
class CpuSegmentSource final : public SegmentSource {
 public:
  explicit CpuSegmentSource(std::uint64_t granularity = 2 * MiB,
                            std::uint64_t physical_capacity = 0);
  ~CpuSegmentSource() override;
  std::uint64_t granularity() const override { return granularity_; }
  bool supports_vmm() const override { return true; }
  Status allocate_segment(std::uint64_t bytes, void** base) override;
  Status free_segment(void* base, std::uint64_t bytes) override;
  Status reserve(std::uint64_t bytes, void** base) override;
  Status map(void* addr, std::uint64_t bytes) override;
  Status unmap(void* addr, std::uint64_t bytes) override;
  Status release(void* base, std::uint64_t bytes) override;
  const SourceCounters& counters() const { return counters_; }

 private:
  struct Reservation {
    std::uint64_t bytes;
    int fd;
  };
  // The reservation holding [addr, addr+bytes), or end().
  std::map<std::uintptr_t, Reservation>::iterator find_reservation(std::uintptr_t addr,
                                                                   std::uint64_t bytes);

  std::uint64_t granularity_, capacity_;
  std::mutex mu_;
  std::map<std::uintptr_t, Reservation> reservations_;
  SourceCounters counters_;
};

// Note [Pool configuration]
// Defaults follow PyTorch's caching allocator, whose constants are tuned for
// HBM-sized devices: requests are rounded up to `alignment`; requests up to
// `small_size` come from `small_segment` segments (the small pool), larger ones
// from `large_segment` segments when under `min_large_alloc`, else from a
// segment of their own size rounded up to `round_large` (the large pool). A
// split keeps its remainder as a free block only when the remainder is at least
// `alignment` (small pool) or more than `large_split_min` (large pool), so the
// large pool does not fill with slivers. `capacity` bounds the bytes the pool
// holds from its source (0 = unbounded); on hitting it the pool first returns
// its cached free segments, then answers out_of_memory.
struct PoolConfig {
  std::uint64_t alignment = 512;
  std::uint64_t small_size = 1 * MiB;
  std::uint64_t small_segment = 2 * MiB;
  std::uint64_t large_segment = 20 * MiB;
  std::uint64_t min_large_alloc = 10 * MiB;
  std::uint64_t round_large = 2 * MiB;
  std::uint64_t large_split_min = 1 * MiB;
  std::uint64_t capacity = 0;
  // Note [Expandable segments] in pool.cpp.
  bool expandable_segments = false;
  std::uint64_t expandable_reserve = 0;  // virtual bytes per pool; 0 = capacity, else 64 GiB
  std::uint64_t expandable_keep = 0;     // free tail bytes kept mapped (avoids map/unmap churn)
  // Note [Fast path] in pool.cpp: freed blocks kept whole for reuse by size.
  std::uint64_t fast_cache_blocks = 32;

  // Parses "key:value,key:value" (keys as the fields above; sizes take a
  // KiB/MiB/GiB suffix; booleans true/false), PyTorch's PYTORCH_CUDA_ALLOC_CONF
  // style. Throws InputError naming `where` and the key.
  static PoolConfig parse(std::string_view text, std::string_view where = "pool config");
  // Throws InputError naming the field when the config cannot work.
  void validate(std::string_view where = "pool config") const;
  std::string describe() const;  // the parse() form of every field
};

struct PoolStats {
  std::uint64_t allocated_bytes = 0;  // sum of allocated block sizes (rounded)
  std::uint64_t requested_bytes = 0;  // sum of the sizes callers asked for
  std::uint64_t reserved_bytes = 0;   // bytes held from the source (mapped, for expandable)
  std::uint64_t peak_allocated_bytes = 0, peak_reserved_bytes = 0;
  std::uint64_t active_blocks = 0, free_blocks = 0, segments = 0;
  std::uint64_t free_bytes = 0, largest_free_bytes = 0;  // cached, inside reserved segments
  double fragmentation = 0;  // 1 - largest_free / free_bytes; 0 when nothing is free
  std::uint64_t alloc_count = 0, free_count = 0, oom_count = 0;
  std::uint64_t source_calls = 0;   // allocate_segment/free_segment/reserve/map/unmap/release
  std::uint64_t cache_flushes = 0;  // times an allocation returned cached segments to retry
};

// 1 - largest / total, 0 when total is 0: the fragmentation metric of MISSION.md.
double fragmentation(std::uint64_t largest_free, std::uint64_t total_free);

struct PoolBlock;  // opaque; owned by the pool

// Note [Pool lock]
// The pool's critical sections are a few dozen instructions on the fast path,
// so it takes a test-and-test-and-set spin lock: unlock is a plain release
// store, where std::mutex pays a second atomic read-modify-write (measured by
// `u3m bench alloc`). A waiter spins briefly, then yields, so a holder that
// was preempted does not burn a core.
class SpinLock {
 public:
  void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins >= 64) yield();
      }
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  static void yield() noexcept;
  std::atomic<bool> locked_{false};
};

// A live allocation. The handle lets free() find the block in O(1); a stale
// or foreign handle is detected (generation check) and rejected. Generations
// are per block and odd while the block is allocated.
struct PoolAllocation {
  void* ptr = nullptr;
  std::uint64_t size = 0;       // bytes the block spans (>= requested, rounded)
  std::uint64_t requested = 0;  // bytes asked for
  PoolBlock* block = nullptr;
  std::uint64_t generation = 0;
  explicit operator bool() const { return ptr != nullptr; }
};

// One block of the address-ordered layout, for tests and diagnostics; free
// neighbours are shown merged (the coalesced layout, Note [Fast path]).
struct BlockInfo {
  std::uintptr_t ptr = 0;
  std::uint64_t size = 0;
  bool allocated = false, small_pool = false, expandable = false;
  std::size_t segment = 0;  // index in address order
};

// The caching pool allocator. Thread-safe: one lock guards the pool
// (Note [Pool lock]).
class DevicePool {
 public:
  // `source` must outlive the pool. Throws InputError on a bad config.
  DevicePool(SegmentSource& source, PoolConfig config = {});
  ~DevicePool();  // returns every segment to the source
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // out_of_memory when neither cache nor source can serve; invalid_argument
  // for 0 bytes or a null `out`.
  Status allocate(std::uint64_t bytes, PoolAllocation* out);
  // invalid_argument for a handle that is not live in this pool (double free).
  // A block may be freed by any thread, not only the one that allocated it.
  Status free(const PoolAllocation& a);

  // Returns every wholly free segment (and free expandable tails) to the
  // source; the bytes given back.
  std::uint64_t empty_cache();

  PoolStats stats() const;
  void reset_peaks();
  std::vector<BlockInfo> snapshot() const;
  const PoolConfig& config() const { return config_; }

 private:
  struct Segment;
  // Free blocks of one pool (small or large), for best fit by (size, address):
  // size-class bins with a bitmap, each bin a sorted flat array (Note [Free
  // index] in free_index.cpp).
  class FreeIndex {
   public:
    void insert(PoolBlock* b);
    // b must be in the index, with the size and ptr it went in with; false
    // (and an assert in debug builds) if it is not.
    bool erase(PoolBlock* b);
    // The smallest block of at least `size` bytes, the lowest-addressed among
    // equals; null when none.
    PoolBlock* best_fit(std::uint64_t size) const;
    PoolBlock* largest() const;  // null when empty
    std::size_t size() const { return count_; }
    bool empty() const { return count_ == 0; }

   private:
    struct Entry {
      std::uint64_t size;
      std::uintptr_t ptr;
      PoolBlock* block;
    };
    static constexpr int kClasses = 512;
    static int class_of(std::uint64_t size);
    int next_nonempty(int from) const;  // the first class >= from with blocks, or -1
    std::vector<Entry> bins_[kClasses];
    std::uint64_t bitmap_[kClasses / 64] = {};
    std::size_t count_ = 0;
  };
  using FreeSet = FreeIndex;
  enum Kind : int { kSmall = 0, kLarge = 1 };

  Kind kind_of(std::uint64_t rounded) const;
  PoolBlock* best_fit(Kind k, std::uint64_t size);
  Status grow(Kind k, std::uint64_t size, PoolBlock** out);
  Status new_segment(Kind k, std::uint64_t size, PoolBlock** out);
  Status extend_expandable(Kind k, std::uint64_t size, PoolBlock** out);
  std::uint64_t segment_size(Kind k, std::uint64_t size) const;
  bool within_capacity(std::uint64_t more) const;
  void split(PoolBlock* b, std::uint64_t size);
  void hand_out(PoolBlock* b, std::uint64_t requested, PoolAllocation* out);
  bool live(const PoolAllocation& a) const;
  void release_block(PoolBlock* b);  // allocated -> pool cache, or free (coalesced, trimmed)
  PoolBlock* coalesce(PoolBlock* b);
  PoolBlock* pop_cached(std::uint64_t size);
  void uncache(PoolBlock* b);
  void flush_cache();
  std::uint64_t trim_tail(Segment* s, std::uint64_t keep);
  std::uint64_t release_cached();
  void note_reserved(std::int64_t delta);
  PoolBlock* new_block();
  void recycle(PoolBlock* b);
  void insert_free(PoolBlock* b);
  void erase_free(PoolBlock* b);
  std::uint64_t total_free() const;
  std::uint64_t free_runs(std::uint64_t* largest) const;  // runs of free blocks, and the largest
  void destroy_segment(Segment* s);

  SegmentSource& source_;
  PoolConfig config_;
  std::uint64_t granularity_;
  bool expandable_;
  mutable SpinLock mu_;
  FreeSet free_[2];
  std::uint64_t free_bytes_[2] = {0, 0};
  std::vector<std::unique_ptr<Segment>> segments_;
  Segment* expandable_seg_[2] = {nullptr, nullptr};
  std::deque<PoolBlock> block_storage_;  // stable addresses; blocks are recycled, never freed
  std::vector<PoolBlock*> spare_blocks_;
  std::vector<PoolBlock*> cache_;  // the fast-path cache, newest last
  std::uint64_t cached_bytes_ = 0;
  PoolStats st_;
};

}  // namespace u3m::mem
