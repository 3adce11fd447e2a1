// The SSD tier: blobs keyed by a 64-bit id (a tensor id or a KV block id) in
// one preallocated file, read and written with O_DIRECT through an IoEngine
// (io_uring by default). See docs/memory.md, "SSD store".
//
// Guarantees:
//  - bounded: the file is preallocated to `capacity` and nothing is ever
//    written past it. When full, entries marked evictable (clean copies) go in
//    LRU order; anything else is kept and the put answers no_space;
//  - every extent has an xxh3 checksum in the in-memory index, verified on
//    every read (mismatch: Status::corrupt, counted). An entry whose check
//    fails again on a second read is corrupt at rest: it is retired from the
//    index and on_corrupt(key) tells the owner;
//  - a put writes to fresh extents, reads them back and checks them
//    (verify_writes), and switches the index only then, so a failed put,
//    loud or silent (lost, torn, misdirected), leaves the previous version
//    intact and readable, and is reported while the caller still has its copy;
//  - a put whose content equals the stored version (same size, same
//    checksums) writes nothing if the stored extents read back intact
//    ("writes avoided"), to spare the SSD;
//  - verify() and scrub() (and a background scrubber at a bounded rate) find
//    corruption at rest before a get needs the data;
//  - thread-safe; no exceptions: every call returns a Status.
//
// The index lives in memory only: the file is scratch space for one process
// (locked, emptied on open, removed on close), not a persistent database. A
// file left by a process that died is discarded on the next open, which says
// so in open_notice(). See Note [Verify on write, start empty after a crash].
//
// Callers' buffers go to the device as they are (when 4 KiB aligned), so their
// physical layout matters: a 1 MiB I/O into scattered 4 KiB pages is up to 256
// segments, which some devices split or queue fewer of (measured on the VM's
// virtio disk: about half the bandwidth). Buffers in transparent huge pages
// (2 MiB aligned, madvise(MADV_HUGEPAGE)) avoid it; see Note [Huge-page
// buffers] in apps/u3m/cmd_bench_ssd.cpp.
#pragma once

#include <atomic>
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
#include <thread>
#include <unordered_map>
#include <vector>

#include "u3m/mem/io_engine.hpp"
#include "u3m/mem/status.hpp"

namespace u3m::mem {

namespace detail {
class ScratchPool;  // src/mem/ssd_store.cpp, Note [Scratch buffers]
}

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
  // Read every put's extents back and check them before installing it: the
  // only way to see a lost, torn or misdirected write, which reports success.
  bool verify_writes = true;
  // > 0: a background thread verifies installed entries round robin at about
  // this many bytes a second (scrub()); 0: no scrubber.
  std::uint64_t scrub_bytes_per_s = 0;
  // Called (outside the store's lock) with each key the store evicted to make
  // room, so the owner can forget its SSD copy. Must not call back into the
  // store synchronously.
  std::function<void(std::uint64_t key)> on_evict;
  // Called (outside the store's lock, before the failed get or verify
  // completes, on the thread that completes it) with each key whose installed
  // entry was found corrupt at rest and retired: the owner's SSD copy is gone
  // and should be rewritten from an upper copy if there is one. Not called
  // when a put finds its own stale copy corrupt (the put replaces it). Must
  // not call back into the store synchronously.
  std::function<void(std::uint64_t key)> on_corrupt;
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
  std::uint64_t writes_avoided = 0;  // puts skipped: unchanged, and the stored copy re-validated
  std::uint64_t revalidations = 0;   // unchanged puts that read the stored copy back to check it
  // Of which the stored copy did not check out (corrupt at rest: retired, not
  // reported through on_corrupt; or unreadable), so the put wrote it again.
  std::uint64_t revalidation_failures = 0;
  std::uint64_t no_space = 0;  // puts refused: full of non-evictable data
  // Extents whose checksum (or zero padding) did not match on any read: gets,
  // write verification, verify(), the scrubber, re-validation.
  std::uint64_t checksum_failures = 0;
  std::uint64_t write_verify_failures = 0;  // puts failed (corrupt): the read-back did not match
  std::uint64_t verify_reads = 0;           // extents read only to check them, for any reason
  // Installed entries a get, verify() or the scrubber found corrupt at rest
  // and retired: one on_corrupt call each.
  std::uint64_t corrupt_retired = 0;
  std::uint64_t scrubbed_bytes = 0;           // payload bytes of the entries scrub() checked
  std::uint64_t scrub_failures = 0;           // entries scrub() found corrupt (so retired)
  std::uint64_t discarded_at_open_bytes = 0;  // size of the file an earlier process left
  std::uint64_t io_errors = 0;                // ops that returned -errno
  std::uint64_t enospc = 0;                   // of which the file system said ENOSPC
  std::uint64_t short_writes = 0, short_reads = 0;
};

// A put/get completion: runs on the I/O completion thread (or inline), so it
// must be short and must not wait on this store.
using SsdCallback = std::function<void(Status)>;

class SsdStore {
 public:
  // Creates or takes over options.path, locked (flock) for this store alone:
  // busy if another live store holds it (`why` names the holder's pid when
  // /proc/locks does). Whatever the file held is discarded (see open_notice).
  static Status open(SsdStoreOptions options, std::unique_ptr<SsdStore>& out,
                     std::string* why = nullptr);
  ~SsdStore();  // stops the scrubber, waits for the store's I/O in flight
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

  // Reads the installed entry and checks every extent, copying nothing out:
  // ok, not_found, corrupt (confirmed by a second read, so the entry was
  // retired and on_corrupt called) or the I/O error. A check that fails once
  // but passes on the second read was a transient read fault: ok.
  Status verify(std::uint64_t key);
  void verify_async(std::uint64_t key, SsdCallback done);
  // Verifies installed entries round robin from where the last scrub stopped,
  // whole entries until about max_bytes of payload (at most one pass over the
  // store), synchronously. Returns the payload bytes checked.
  std::uint64_t scrub(std::uint64_t max_bytes);

  // Removes the entry; a put of this key still in flight is cancelled (its
  // data is discarded when it completes). not_found if there was neither.
  Status erase(std::uint64_t key);
  bool contains(std::uint64_t key, std::size_t* size = nullptr) const;
  // Where the installed entry's extents lie in the store's file (offset,
  // payload bytes), in order; empty if none. For diagnosis and for tests that
  // corrupt a known copy at rest (FaultInjectionIoEngine::corrupt_at_rest on
  // file()).
  std::vector<std::pair<std::uint64_t, std::uint32_t>> extents(std::uint64_t key) const;
  int file() const { return fd_; }
  // Changes whether an installed entry may be evicted.
  Status set_evictable(std::uint64_t key, bool evictable);

  SsdStoreStats stats() const;
  // What open() found and did that the owner should hear about (a discarded
  // file from an earlier process; a file system that refused the lock); empty
  // when nothing.
  const std::string& open_notice() const { return notice_; }
  const Capabilities& capabilities() const { return caps_; }
  const SsdStoreOptions& options() const { return opt_; }
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
    std::list<Entry*>::iterator ring;  // place in scrub_ring_
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
  // A put's fresh version: allocated, sequenced and counted in flight. Locked.
  Status start_put_locked(Request& r, std::vector<std::uint64_t>& evicted);
  void free_extents_locked(const std::vector<Extent>& extents);
  void retire_locked(std::unique_ptr<Entry> e);  // out of the index; freed now or when unpinned
  // Retires `e` as corrupt if it is still key's installed version. Locked.
  bool retire_corrupt_locked(std::uint64_t key, const Entry* e);
  void install_locked(Slot& slot, std::unique_ptr<Entry> e);
  void unpin_locked(Entry* e);
  void set_evictable_locked(Entry& e, bool evictable);
  Request* start_verify_locked(Entry* e, SsdCallback done);  // pins e

  // The passes a request goes through (Note [One read path]).
  void start_write(Request* r);
  void start_read(Request* r, const std::vector<Extent>& xs, std::vector<std::uint32_t> todo,
                  unsigned char* user);
  void submit_reads(Request* r, std::vector<IoOp> ops);
  IoOp read_op(Request* r, std::size_t k, std::size_t slot);
  void pass_done(Request* r);
  void revalidated(Request* r, Status verdict);
  void finish(Request* r);
  void notify(const std::function<void(std::uint64_t)>& cb,
              const std::vector<std::uint64_t>& keys) const;
  void scrub_loop();

  SsdStoreOptions opt_;
  Capabilities caps_;
  std::shared_ptr<IoEngine> engine_;
  int fd_ = -1;
  std::string notice_;
  std::unique_ptr<detail::ScratchPool> scratch_;

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  std::uint64_t requests_in_flight_ = 0;
  std::uint64_t next_seq_ = 0;
  ExtentAllocator alloc_;
  std::unordered_map<std::uint64_t, Slot> index_;
  std::list<Entry*> lru_;         // evictable installed entries, least recently used first
  std::list<Entry*> scrub_ring_;  // every installed entry; scrub() walks it from scrub_cursor_
  std::list<Entry*>::iterator scrub_cursor_ = scrub_ring_.end();
  std::unordered_map<Entry*, std::unique_ptr<Entry>> retired_;  // pinned, awaiting unpin
  SsdStoreStats stats_;

  // The background scrubber (scrub_bytes_per_s > 0).
  std::mutex scrub_mu_;
  std::condition_variable scrub_cv_;
  std::atomic<bool> stopping_{false};
  std::thread scrubber_;
};

}  // namespace u3m::mem
