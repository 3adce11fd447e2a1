// The SSD tier: blobs keyed by a 64-bit id (a tensor id or a KV block id) in
// one preallocated file, read and written with O_DIRECT through an IoEngine
// (io_uring by default). See docs/memory.md, "SSD store".
//
// Guarantees:
//  - bounded: the file is preallocated to `capacity` and nothing is ever
//    written past it. When full, entries marked evictable (clean copies) go in
//    LRU order; anything else is kept and the put answers no_space;
//  - every extent has an xxh3 checksum in the in-memory index, verified on
//    every read (mismatch: Status::corrupt, counted);
//  - a put writes to fresh extents and switches the index only after every
//    byte is confirmed written, so a failed put leaves the previous version
//    intact and readable;
//  - a put whose content equals the stored version (same size, same
//    checksums) issues no I/O ("writes avoided"), to spare the SSD;
//  - thread-safe; no exceptions: every call returns a Status.
//
// The index lives in memory only: the file is scratch space for one process
// (created on open, removed on close), not a persistent database.
//
// Callers' buffers go to the device as they are (when 4 KiB aligned), so their
// physical layout matters: a 1 MiB I/O into scattered 4 KiB pages is up to 256
// segments, which some devices split or queue fewer of (measured on the VM's
// virtio disk: about half the bandwidth). Buffers in transparent huge pages
// (2 MiB aligned, madvise(MADV_HUGEPAGE)) avoid it; see Note [Huge-page
// buffers] in apps/u3m/cmd_bench_ssd.cpp.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "u3m/mem/io_engine.hpp"
#include "u3m/mem/status.hpp"

namespace u3m::mem {

// Free-space map of the store's file: runs of free bytes kept by offset (to
// coalesce with both neighbours on free) and by size (for best fit). Offsets
// and lengths are multiples of `align`. Not thread-safe (the store locks).
class ExtentAllocator {
 public:
  ExtentAllocator(std::uint64_t size, std::uint64_t align);
  // Best fit: the smallest free run that holds len (lowest offset on ties).
  std::optional<std::uint64_t> allocate(std::uint64_t len);
  // Returns false (and changes nothing) if the range is not wholly allocated.
  bool free(std::uint64_t offset, std::uint64_t len);

  std::uint64_t size() const { return size_; }
  std::uint64_t free_bytes() const { return free_bytes_; }
  std::uint64_t largest_free() const;
  std::size_t free_runs() const { return by_offset_.size(); }

 private:
  void insert_run(std::uint64_t off, std::uint64_t len);
  void erase_run(std::map<std::uint64_t, std::uint64_t>::iterator it);

  std::uint64_t size_, align_, free_bytes_;
  std::map<std::uint64_t, std::uint64_t> by_offset_;           // offset -> length
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;  // (length, offset)
};

struct SsdStoreOptions {
  std::string path;            // the store's file; created (or truncated), preallocated
  std::uint64_t capacity = 0;  // bytes, > 0; rounded down to the 4 KiB block
  bool direct_io = true;       // O_DIRECT; falls back to buffered if the file system refuses
  std::uint32_t chunk_bytes = 1u << 20;  // largest single I/O (and checksummed extent)
  unsigned queue_depth = 128;            // for the default io_uring engine
  std::shared_ptr<IoEngine> engine;      // null: io_uring, or pread/pwrite if unavailable
  bool remove_on_close = true;
  // Called (outside the store's lock) with each key the store evicted to make
  // room, so the owner can forget its SSD copy. Must not call back into the
  // store synchronously.
  std::function<void(std::uint64_t key)> on_evict;
};

struct SsdStoreStats {
  std::uint64_t capacity = 0;
  std::uint64_t bytes_used = 0;    // allocated, block-rounded, including writes in flight
  std::uint64_t bytes_stored = 0;  // payload bytes of installed entries
  std::uint64_t entries = 0;
  std::uint64_t extents = 0;  // extents of installed entries
  std::uint64_t free_runs = 0, largest_free = 0;
  std::uint64_t puts = 0, gets = 0;
  std::uint64_t bytes_written = 0, bytes_read = 0;  // payload, successful ops only
  std::uint64_t evictions = 0;
  std::uint64_t writes_avoided = 0;     // puts skipped because the content was unchanged
  std::uint64_t no_space = 0;           // puts refused: full of non-evictable data
  std::uint64_t checksum_failures = 0;  // extents whose checksum did not match on read
  std::uint64_t io_errors = 0;          // ops that returned -errno
  std::uint64_t enospc = 0;             // of which the file system said ENOSPC
  std::uint64_t short_writes = 0, short_reads = 0;
};

// A put/get completion: runs on the I/O completion thread (or inline), so it
// must be short and must not wait on this store.
using SsdCallback = std::function<void(Status)>;

class SsdStore {
 public:
  static Status open(SsdStoreOptions options, std::unique_ptr<SsdStore>& out,
                     std::string* why = nullptr);
  ~SsdStore();  // waits for the store's I/O in flight
  SsdStore(const SsdStore&) = delete;
  SsdStore& operator=(const SsdStore&) = delete;

  // Stores `bytes` bytes (0 allowed) under key, replacing any previous version
  // once the new one is written. `data` must stay valid until completion.
  Status put(std::uint64_t key, const void* data, std::size_t bytes, bool evictable);
  void put_async(std::uint64_t key, const void* data, std::size_t bytes, bool evictable,
                 SsdCallback done);
  std::future<Status> put_async(std::uint64_t key, const void* data, std::size_t bytes,
                                bool evictable);

  // Reads the entry into out (capacity out_bytes >= its size, else
  // invalid_argument); *size receives its size. On any error the contents of
  // out are unspecified. `out` must stay valid until completion.
  Status get(std::uint64_t key, void* out, std::size_t out_bytes, std::size_t* size = nullptr);
  void get_async(std::uint64_t key, void* out, std::size_t out_bytes, SsdCallback done,
                 std::size_t* size = nullptr);
  std::future<Status> get_async(std::uint64_t key, void* out, std::size_t out_bytes,
                                std::size_t* size = nullptr);

  // Removes the entry; a put of this key still in flight is cancelled (its
  // data is discarded when it completes). not_found if there was neither.
  Status erase(std::uint64_t key);
  bool contains(std::uint64_t key, std::size_t* size = nullptr) const;
  // Changes whether an installed entry may be evicted.
  Status set_evictable(std::uint64_t key, bool evictable);

  SsdStoreStats stats() const;
  const Capabilities& capabilities() const { return caps_; }
  const IoEngine& engine() const { return *engine_; }
  static constexpr std::uint32_t kBlock = 4096;

 private:
  struct Extent {
    std::uint64_t offset;
    std::uint32_t len;  // payload bytes; the allocation is len rounded up to kBlock
    std::uint64_t checksum;
  };
  struct Entry {
    std::uint64_t key = 0, size = 0, seq = 0;
    std::vector<Extent> extents;
    bool evictable = false;
    std::uint32_t pins = 0;  // reads in flight; a pinned entry's extents are never freed
    bool retired = false;    // no longer in the index; freed when unpinned
    std::list<Entry*>::iterator lru;
  };
  struct Slot {
    std::unique_ptr<Entry> entry;
    std::uint64_t latest_seq = 0;  // the put or erase the key's state must reflect
    std::uint32_t puts_in_flight = 0;
  };
  struct Request;

  explicit SsdStore(SsdStoreOptions options);
  std::uint64_t rounded(std::uint64_t n) const { return (n + kBlock - 1) / kBlock * kBlock; }
  // Allocates extents for `bytes`, evicting LRU evictable entries (never
  // `keep`) as needed. Evicted keys are appended to `evicted`. Locked.
  Status allocate_locked(std::uint64_t keep, std::size_t bytes, std::vector<Extent>& extents,
                         std::vector<std::uint64_t>& evicted);
  void free_extents_locked(const std::vector<Extent>& extents);
  void retire_locked(std::unique_ptr<Entry> e);  // out of the index; freed now or when unpinned
  void unpin_locked(Entry* e);
  void set_evictable_locked(Entry& e, bool evictable);
  void finish(Request* r);
  void notify_evicted(const std::vector<std::uint64_t>& keys) const;

  SsdStoreOptions opt_;
  Capabilities caps_;
  std::shared_ptr<IoEngine> engine_;
  int fd_ = -1;

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  std::uint64_t requests_in_flight_ = 0;
  std::uint64_t next_seq_ = 0;
  ExtentAllocator alloc_;
  std::unordered_map<std::uint64_t, Slot> index_;
  std::list<Entry*> lru_;  // evictable installed entries, least recently used first
  std::unordered_map<Entry*, std::unique_ptr<Entry>> retired_;  // pinned, awaiting unpin
  SsdStoreStats stats_;
};

}  // namespace u3m::mem
