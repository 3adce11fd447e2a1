// The SSD tier store (include/u3m/mem/ssd_store.hpp, docs/memory.md "SSD store").
#include "u3m/mem/ssd_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <xxhash.h>
#if U3M_XXH3_DISPATCH
#include <xxh_x86dispatch.h>  // replaces XXH3_64bits_withSeed with the dispatching one
#endif

namespace u3m::mem {

// ---------------------------------------------------------------- allocator

ExtentAllocator::ExtentAllocator(std::uint64_t size, std::uint64_t align)
    : size_(size / align * align), align_(align), free_bytes_(0) {
  if (size_ > 0) insert_run(0, size_);
}

void ExtentAllocator::insert_run(std::uint64_t off, std::uint64_t len) {
  by_offset_.emplace(off, len);
  by_size_.emplace(len, off);
  free_bytes_ += len;
}

void ExtentAllocator::erase_run(std::map<std::uint64_t, std::uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_offset_.erase(it);
}

std::optional<std::uint64_t> ExtentAllocator::allocate(std::uint64_t len) {
  if (len == 0 || len % align_ != 0) return std::nullopt;
  auto fit = by_size_.lower_bound({len, 0});
  if (fit == by_size_.end()) return std::nullopt;
  auto [run_len, off] = *fit;
  erase_run(by_offset_.find(off));
  if (run_len > len) insert_run(off + len, run_len - len);
  return off;
}

bool ExtentAllocator::free(std::uint64_t off, std::uint64_t len) {
  if (len == 0 || len % align_ != 0 || off % align_ != 0 || off + len > size_) return false;
  // Reject a range that overlaps a free run: a double free would corrupt the map.
  auto next = by_offset_.lower_bound(off);
  if (next != by_offset_.end() && next->first < off + len) return false;
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > off) return false;
    if (prev->first + prev->second == off) {  // coalesce with the run before
      off = prev->first;
      len += prev->second;
      erase_run(prev);
    }
  }
  if (next != by_offset_.end() && next->first == off + len) {  // and with the run after
    len += next->second;
    erase_run(next);
  }
  insert_run(off, len);
  return true;
}

std::uint64_t ExtentAllocator::largest_free() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

// ------------------------------------------------------------------ requests

namespace detail {

// Note [Scratch buffers]
// Reads that only check (write verification, verify, scrub) need a buffer per
// extent in flight, and a put needs them as often as it writes. A fresh 1 MiB
// allocation per read is a fresh mmap: the kernel zeroes and faults in 256
// pages, then pins them for O_DIRECT, which measured at 0.7 s of CPU per GB
// verified on the VM, seven times the whole write path. So scratch buffers
// come from this pool: carved from 2 MiB-aligned slabs in transparent huge
// pages (one segment per I/O, cheap to pin), faulted in once, and reused. The
// pool keeps what peak concurrency needed, up to kScratchCap; a request that
// finds it exhausted beyond that gets a one-off buffer.
class ScratchPool {
 public:
  static constexpr std::size_t kSlab = 2u << 20, kScratchCap = 64u << 20;
  explicit ScratchPool(std::size_t bytes) : bytes_(bytes) {}
  ~ScratchPool() {
    for (void* slab : slabs_) std::free(slab);
  }
  std::size_t bytes() const { return bytes_; }
  // A buffer of bytes(), or null if the pool is at its cap or memory is short.
  unsigned char* take() {
    std::lock_guard lk(mu_);
    if (free_.empty() && slabs_.size() * slab_bytes() < kScratchCap) grow_locked();
    if (free_.empty()) return nullptr;
    unsigned char* p = free_.back();
    free_.pop_back();
    return p;
  }
  void give(unsigned char* p) {
    std::lock_guard lk(mu_);
    free_.push_back(p);
  }

 private:
  std::size_t slab_bytes() const { return (std::max(bytes_, kSlab) + kSlab - 1) / kSlab * kSlab; }
  void grow_locked() {
    void* slab = nullptr;
    if (posix_memalign(&slab, kSlab, slab_bytes()) != 0) return;
    ::madvise(slab, slab_bytes(), MADV_HUGEPAGE);  // advice only: fine if refused
    slabs_.push_back(slab);
    for (std::size_t at = 0; at + bytes_ <= slab_bytes(); at += bytes_)
      free_.push_back(static_cast<unsigned char*>(slab) + at);
  }

  const std::size_t bytes_;
  std::mutex mu_;
  std::vector<void*> slabs_;
  std::vector<unsigned char*> free_;
};

}  // namespace detail

namespace {

// An aligned buffer: the pool's (returned to it) or a one-off (freed).
struct AlignedFree {
  detail::ScratchPool* pool = nullptr;
  void operator()(unsigned char* p) const {
    if (pool)
      pool->give(p);
    else
      std::free(p);
  }
};
using AlignedBuf = std::unique_ptr<unsigned char, AlignedFree>;

AlignedBuf aligned_buffer(std::size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, SsdStore::kBlock, bytes) != 0) return nullptr;
  return AlignedBuf(static_cast<unsigned char*>(p));
}

AlignedBuf scratch_buffer(detail::ScratchPool& pool, std::size_t bytes) {
  if (bytes <= pool.bytes())
    if (unsigned char* p = pool.take()) return AlignedBuf(p, AlignedFree{&pool});
  return aligned_buffer(bytes);
}

bool aligned(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % SsdStore::kBlock == 0;
}

// Seeding each extent's checksum with the key and extent number also catches a
// misdirected read (another entry's extent, or this entry's extents swapped).
//
// Note [Checksum speed]
// Every byte put is hashed on the submitting thread and every byte read is
// hashed on the I/O completion thread, so the hash's speed is the store's CPU
// cost over fio: on a machine where other work competes for the cores, a side
// that needs more CPU per GB gets less bandwidth. libxxhash's plain XXH3 is
// its portable SSE2 build (7.7 GB/s on the 2-core VM under load); the
// dispatching entry point uses AVX2 or AVX-512 when the CPU has them (17.9 GB/s
// on the same VM, same load) and returns the same values.
std::uint64_t extent_checksum(std::uint64_t key, std::size_t i, const void* p, std::size_t len) {
  return XXH3_64bits_withSeed(p, len, key ^ ((i + 1) * 0x9E3779B97F4A7C15ULL));
}

bool zeros(const unsigned char* p, std::size_t n) {
  return n == 0 || (p[0] == 0 && std::memcmp(p, p + 1, n - 1) == 0);
}

Status status_of_errno(std::int64_t neg_errno) {
  return neg_errno == -ENOSPC ? Status::no_space : Status::io_error;
}

}  // namespace

// Note [Verify on write, start empty after a crash]
// Why a put reads its extents back before it installs them: a lost, torn or
// misdirected write reports success, so no result code can reveal it; only
// the bytes can. At put time the caller still holds its copy (a tensor on the
// host, a KV block in DRAM), so a failed check costs one retry of the put and
// nothing else. Found later, by a get, the same fault costs the data itself
// whenever the upper copy has been dropped meanwhile. The read-back doubles
// the device traffic of a put (a read per write); `verify_writes = false`
// trades that safety for bandwidth. Where O_DIRECT is off, the read-back
// comes from the page cache, which catches a write lost on its way to the
// kernel but not one lost below it.
//
// Why the store starts empty after a crash instead of recovering: the index
// (which key owns which extents, and their checksums) lives in this process's
// memory only, and the tier is a cache of that process's state, whose owner
// (the engine, the KV store) is gone with it. The blocks on disk cannot be
// tied to keys, versions or checksums without a persistent index, and a
// persistent index would cost a synced metadata write per put to protect
// data nobody can ask for again. So open() takes an exclusive lock (two live
// stores on one file would overwrite each other), discards whatever an
// earlier process left and says so (open_notice, discarded_at_open_bytes),
// and serves nothing from before.

// One put, get or verify in flight. Its I/Os complete independently (possibly
// on the engine thread, possibly inline in submit); the last one of a pass
// starts the next pass or finishes the request.
//
// Note [One read path]
// Every read of the store goes through start_read(), which reads a list of
// extents and checks each one (checksum, and zero padding after the payload):
// a get reads into the caller's buffer (bouncing unaligned extents); write
// verification, verify(), the scrubber, re-validation and confirmation read
// into scratch buffers, at most kReadWindow extents at a time per request so
// that checking a 10 GiB entry needs 8 MiB, not 10 GiB.
//
// Note [Corrupt at rest]
// A failed check alone does not say where the bytes went wrong: on the disk,
// or on the way (a bit flipped in a transfer, as bit_flip_on_read injects).
// Retiring the entry on a transient fault would throw away good data, perhaps
// the only copy. So a pass that found bad extents re-reads just those (the
// confirmation), up to kConfirmReads times. An extent that reads back right
// was hit on the way: the entry stays. One that returns the same wrong bytes
// twice (compared by a hash of the whole I/O buffer) is corrupt at rest: the
// entry is retired and, unless a put is repairing it, on_corrupt is told. If
// every read disagrees with every other one, the path is not reliable enough
// to judge the data: the answer is io_error and the entry stays. Under random
// in-transit flips of probability p, retiring a good entry takes two reads
// flipped in exactly the same bit, so it does not happen; under real
// corruption at rest the second read already confirms it. A get answers
// corrupt whatever the confirmation finds (its buffer holds the bad bytes);
// verify() answers the confirmation's verdict.
struct SsdStore::Request {
  enum class Op : std::uint8_t { put, get, verify };
  enum class Pass : std::uint8_t { revalidate, write, write_verify, read };
  struct Chunk {
    unsigned char* user = nullptr;  // the caller's bytes for this extent
    AlignedBuf bounce;              // set when the caller's bytes cannot go to O_DIRECT as is
  };

  Op op = Op::get;
  Pass pass = Pass::read;
  std::uint64_t key = 0, seq = 0;
  SsdCallback done;
  Status final = Status::ok;

  // A put: the caller's bytes, the checksums admission computed, the version
  // being written.
  const unsigned char* src = nullptr;
  std::size_t bytes = 0;
  bool evictable = false;
  std::vector<std::uint64_t> sums;
  std::unique_ptr<Entry> fresh;
  std::vector<Chunk> chunks;  // the write pass, one per extent

  // A get, a verify, or a put re-validating the stored version: the entry read.
  Entry* pinned = nullptr;
  Status first = Status::ok;         // outcome of the first read pass, before confirmation
  unsigned rereads = 0;              // confirmation passes so far (Note [Corrupt at rest])
  Status reread_error = Status::ok;  // the first I/O failure of a confirmation pass
  bool retire = false;               // confirmed corrupt at rest
  std::vector<std::vector<std::uint64_t>> seen;  // per extent: hashes of its bad reads so far

  // The read pass in flight: extents `todo` of `*xs`, into the caller's buffer
  // (`user`) or scratch slots (`bufs`, the window).
  const std::vector<Extent>* xs = nullptr;
  std::vector<std::uint32_t> todo;
  unsigned char* user = nullptr;
  std::vector<AlignedBuf> bufs;      // scratch slots, or a user read's bounce buffers
  std::vector<std::uint8_t> bad;     // per extent of *xs: failed its check in this pass
  std::vector<std::uint64_t> print;  // per bad extent: a hash of the whole buffer it read
  std::atomic<std::size_t> next{0};  // the next index of todo to start

  std::atomic<std::uint32_t> remaining{0};
  std::atomic<std::int32_t> status{0};  // the pass's first failure wins
  std::atomic<std::uint32_t> io_errors{0}, enospc{0}, short_writes{0}, short_reads{0};
  std::atomic<std::uint32_t> checksum_failures{0}, verify_reads{0};

  // Reads started from completions queue here; one thread at a time submits
  // them (Note [Submitting from completions]).
  std::mutex pump_mu;
  std::vector<IoOp> pump_q;
  bool pumping = false;

  void fail(Status s) {
    std::int32_t expected = 0;
    status.compare_exchange_strong(expected, static_cast<std::int32_t>(s));
  }
};

namespace {

constexpr std::size_t kReadWindow = 8;  // scratch extents in flight per request
constexpr unsigned kConfirmReads = 3;   // re-reads of a bad extent (Note [Corrupt at rest])

std::vector<std::uint32_t> all_extents(std::size_t n) {
  std::vector<std::uint32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint32_t>(i);
  return v;
}

std::string human_size(std::uint64_t b) {
  constexpr double KiB = 1024.0, MiB = KiB * 1024, GiB = MiB * 1024;
  if (b >= GiB) return fmt::format("{:.1f} GiB", b / GiB);
  if (b >= MiB) return fmt::format("{:.1f} MiB", b / MiB);
  if (b >= KiB) return fmt::format("{:.1f} KiB", b / KiB);
  return fmt::format("{} bytes", b);
}

// Who holds the flock on fd's file, from /proc/locks: its pid, or 0 when it
// cannot be told.
long lock_holder(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  std::FILE* f = std::fopen("/proc/locks", "re");
  if (!f) return 0;
  long found = 0;
  char line[512];
  while (found == 0 && std::fgets(line, sizeof line, f)) {
    // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; a waiter has "->" after the number.
    char type[16], arrow[4];
    long pid = 0;
    unsigned maj = 0, min = 0;
    unsigned long long ino = 0;
    if (std::sscanf(line, "%*d: %3s", arrow) == 1 && std::strcmp(arrow, "->") == 0) continue;
    if (std::sscanf(line, "%*d: %15s %*s %*s %ld %x:%x:%llu", type, &pid, &maj, &min, &ino) != 5)
      continue;
    if (std::strcmp(type, "FLOCK") == 0 && ino == st.st_ino && makedev(maj, min) == st.st_dev &&
        pid > 0)
      found = pid;
  }
  std::fclose(f);
  return found;
}

// Whether pid is a process that has not exited (a zombie has).
bool running(long pid) {
  std::FILE* f = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "re");
  if (!f) return false;
  char buf[512];
  std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* end = std::strrchr(buf, ')');  // "pid (comm) S ..."; comm may hold spaces
  return end && end[1] == ' ' && end[2] != 'Z' && end[2] != 'X';
}

// Note [A dead holder's lock]
// A process killed while it had I/O in flight in io_uring does not release its
// files at once: the kernel cancels or completes that I/O after the process
// is gone, and the file (with its flock) stays open until then, for a few
// milliseconds. So a lock whose holder has exited, or cannot be named, is
// retried for up to kLockGrace before open() answers busy; a lock held by a
// running process is refused at once.
constexpr auto kLockGrace = std::chrono::seconds(2);

// Takes the store's exclusive lock on fd: ok, busy (with the reason), or
// unsupported when the file system has no flock (the reason says so too).
Status lock_store_file(int fd, const std::string& path, std::string& why) {
  const auto give_up = std::chrono::steady_clock::now() + kLockGrace;
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return Status::ok;
    if (errno != EWOULDBLOCK) {
      why = fmt::format("{}: cannot lock the file ({}), so another store could open it too", path,
                        std::strerror(errno));
      return Status::unsupported;
    }
    const long pid = lock_holder(fd);
    const bool live = pid > 0 && running(pid);
    if (live || std::chrono::steady_clock::now() >= give_up) {
      why = fmt::format("{}: in use by another process", path);
      if (pid == ::getpid())
        why += fmt::format(" (pid {}, this process)", pid);
      else if (live)
        why += fmt::format(" (pid {})", pid);
      else if (pid > 0)
        why += fmt::format(" (pid {}, which has exited; its I/O still holds the file)", pid);
      return Status::busy;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

// ---------------------------------------------------------------------- store

SsdStore::SsdStore(SsdStoreOptions options)
    : opt_(std::move(options)), alloc_(opt_.capacity, kBlock) {}

Status SsdStore::open(SsdStoreOptions options, std::unique_ptr<SsdStore>& out, std::string* why) {
  auto fail = [&](Status s, std::string msg) {
    if (why) *why = std::move(msg);
    return s;
  };
  options.capacity = options.capacity / kBlock * kBlock;
  if (options.path.empty()) return fail(Status::invalid_argument, "ssd store: empty path");
  if (options.capacity == 0)
    return fail(Status::invalid_argument,
                fmt::format("{}: capacity must be at least {} bytes", options.path, kBlock));
  options.chunk_bytes = options.chunk_bytes / kBlock * kBlock;
  if (options.chunk_bytes == 0) options.chunk_bytes = kBlock;
  const std::string& path = options.path;

  // Not O_TRUNC: the file may be a live store's, which the lock must see first.
  bool direct = options.direct_io;
  const int flags = O_RDWR | O_CREAT | O_CLOEXEC;
  int fd = ::open(path.c_str(), flags | (direct ? O_DIRECT : 0), 0600);
  if (fd < 0 && direct && errno == EINVAL) {  // the file system has no O_DIRECT: go buffered
    direct = false;
    fd = ::open(path.c_str(), flags, 0600);
  }
  if (fd < 0)
    return fail(errno == ENOSPC ? Status::no_space : Status::io_error,
                fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string notice;
  if (Status locked = lock_store_file(fd, path, notice); locked == Status::busy) {
    ::close(fd);
    return fail(Status::busy, std::move(notice));
  }  // unsupported: go on unlocked, and say so in the notice
  // Ours now. Whatever an earlier process left is discarded (Note [Verify on
  // write, start empty after a crash]).
  struct stat st {};
  std::uint64_t left = ::fstat(fd, &st) == 0 && st.st_size > 0 ? std::uint64_t(st.st_size) : 0;
  if (left > 0 && ::ftruncate(fd, 0) != 0) {
    int err = errno;
    ::close(fd);
    return fail(Status::io_error, fmt::format("{}: cannot empty the {} an earlier process left: {}",
                                              path, human_size(left), std::strerror(err)));
  }
  // Preallocate so the store can never hit ENOSPC later, and so extents are
  // real blocks (not holes) that O_DIRECT reads back as written.
  int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(options.capacity));
  if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS))
    rc = ::ftruncate(fd, static_cast<off_t>(options.capacity));  // sparse; ENOSPC stays possible
  if (rc != 0) {
    int err = errno;
    ::unlink(path.c_str());
    ::close(fd);
    return fail(err == ENOSPC ? Status::no_space : Status::io_error,
                fmt::format("{}: cannot preallocate {} bytes: {}", path, options.capacity,
                            std::strerror(err)));
  }
  if (left > 0) {
    if (!notice.empty()) notice += "; ";
    notice += fmt::format(
        "{}: discarded {} left by an earlier process that did not remove it (killed, or "
        "remove_on_close = false); the index lives in memory, so none of it can be trusted; "
        "starting empty",
        path, human_size(left));
  }

  std::unique_ptr<SsdStore> s(new SsdStore(std::move(options)));
  s->fd_ = fd;
  s->notice_ = std::move(notice);
  s->scratch_ = std::make_unique<detail::ScratchPool>(s->rounded(s->opt_.chunk_bytes));
  s->engine_ = s->opt_.engine
                   ? s->opt_.engine
                   : std::shared_ptr<IoEngine>(make_default_io_engine(s->opt_.queue_depth));
  s->caps_.name = "ssd";
  s->caps_.tier = Tier::ssd;
  s->caps_.granularity = kBlock;
  s->caps_.direct_io = direct;
  s->caps_.capacity = s->opt_.capacity;
  s->stats_.capacity = s->opt_.capacity;
  s->stats_.discarded_at_open_bytes = left;
  if (s->opt_.scrub_bytes_per_s > 0) s->scrubber_ = std::thread([p = s.get()] { p->scrub_loop(); });
  out = std::move(s);
  return Status::ok;
}

SsdStore::~SsdStore() {
  if (scrubber_.joinable()) {
    {
      std::lock_guard lk(scrub_mu_);
      stopping_ = true;
    }
    scrub_cv_.notify_all();
    scrubber_.join();
  }
  {
    std::unique_lock lk(mu_);
    idle_cv_.wait(lk, [&] { return requests_in_flight_ == 0; });
  }
  // Removed while still locked, so no other store opens the old file meanwhile.
  if (opt_.remove_on_close) ::unlink(opt_.path.c_str());
  if (fd_ >= 0) ::close(fd_);
}

void SsdStore::free_extents_locked(const std::vector<Extent>& extents) {
  for (const Extent& x : extents) {
    bool freed = alloc_.free(x.offset, rounded(x.len));
    (void)freed;  // every extent was handed out by alloc_ and is freed once
  }
}

void SsdStore::install_locked(Slot& slot, std::unique_ptr<Entry> e) {
  if (slot.entry) retire_locked(std::move(slot.entry));
  if (e->evictable) e->lru = lru_.insert(lru_.end(), e.get());
  e->ring = scrub_ring_.insert(scrub_ring_.end(), e.get());
  stats_.entries++;
  stats_.bytes_stored += e->size;
  stats_.extents += e->extents.size();
  slot.entry = std::move(e);
}

void SsdStore::retire_locked(std::unique_ptr<Entry> e) {
  if (e->evictable) lru_.erase(e->lru);
  if (scrub_cursor_ == e->ring) ++scrub_cursor_;
  scrub_ring_.erase(e->ring);
  stats_.entries--;
  stats_.bytes_stored -= e->size;
  stats_.extents -= e->extents.size();
  if (e->pins == 0) {
    free_extents_locked(e->extents);
    return;
  }
  e->retired = true;
  Entry* raw = e.get();
  retired_.emplace(raw, std::move(e));
}

bool SsdStore::retire_corrupt_locked(std::uint64_t key, const Entry* e) {
  auto found = index_.find(key);
  if (found == index_.end() || found->second.entry.get() != e) return false;  // replaced meanwhile
  retire_locked(std::move(found->second.entry));
  if (found->second.puts_in_flight == 0) index_.erase(found);
  return true;
}

void SsdStore::unpin_locked(Entry* e) {
  if (--e->pins > 0 || !e->retired) return;
  free_extents_locked(e->extents);
  retired_.erase(e);
}

Status SsdStore::allocate_locked(std::uint64_t keep, std::size_t bytes,
                                 std::vector<Extent>& extents,
                                 std::vector<std::uint64_t>& evicted) {
  std::uint64_t need = 0;
  for (std::size_t off = 0; off < bytes; off += opt_.chunk_bytes)
    need += rounded(std::min<std::size_t>(opt_.chunk_bytes, bytes - off));
  if (need > alloc_.size()) return Status::no_space;

  auto try_allocate = [&]() -> bool {
    extents.clear();
    // One contiguous run keeps a blob sequential on disk; failing that, each
    // extent goes wherever it fits.
    if (auto run = alloc_.allocate(need)) {
      std::uint64_t at = *run;
      for (std::size_t off = 0; off < bytes; off += opt_.chunk_bytes) {
        auto len = static_cast<std::uint32_t>(std::min<std::size_t>(opt_.chunk_bytes, bytes - off));
        extents.push_back({at, len, 0});
        at += rounded(len);
      }
      return true;
    }
    for (std::size_t off = 0; off < bytes; off += opt_.chunk_bytes) {
      auto len = static_cast<std::uint32_t>(std::min<std::size_t>(opt_.chunk_bytes, bytes - off));
      auto at = alloc_.allocate(rounded(len));
      if (!at) {
        free_extents_locked(extents);
        extents.clear();
        return false;
      }
      extents.push_back({*at, len, 0});
    }
    return true;
  };
  if (bytes == 0 || try_allocate()) return Status::ok;

  // Evict only if it can succeed: never drop clean copies for a put that fails anyway.
  std::uint64_t reclaimable = alloc_.free_bytes();
  for (Entry* e : lru_)
    if (e->pins == 0 && e->key != keep)
      for (const Extent& x : e->extents) reclaimable += rounded(x.len);
  if (reclaimable < need) return Status::no_space;

  for (auto it = lru_.begin(); it != lru_.end();) {
    Entry* victim = *it++;
    if (victim->pins > 0 || victim->key == keep) continue;
    std::uint64_t key = victim->key;
    Slot& slot = index_.at(key);
    retire_locked(std::move(slot.entry));
    if (slot.puts_in_flight == 0) index_.erase(key);
    stats_.evictions++;
    evicted.push_back(key);
    if (try_allocate()) return Status::ok;
  }
  return Status::no_space;  // enough bytes, but too fragmented for an extent
}

Status SsdStore::start_put_locked(Request& r, std::vector<std::uint64_t>& evicted) {
  auto e = std::make_unique<Entry>();
  e->key = r.key;
  e->size = r.bytes;
  e->evictable = r.evictable;
  Status s = allocate_locked(r.key, r.bytes, e->extents, evicted);
  if (!ok(s)) {
    stats_.no_space++;
    return s;
  }
  Slot& slot = index_[r.key];
  if (r.seq == 0) {  // a new put (a re-validated one already has its place in the order)
    r.seq = slot.latest_seq = ++next_seq_;
    slot.puts_in_flight++;
    requests_in_flight_++;
  }
  e->seq = r.seq;
  r.fresh = std::move(e);
  return Status::ok;
}

void SsdStore::notify(const std::function<void(std::uint64_t)>& cb,
                      const std::vector<std::uint64_t>& keys) const {
  if (cb)
    for (std::uint64_t k : keys) cb(k);
}

// Note [Hashing while writing]
// A put needs an extent's checksum before it can compare it with the stored
// version (write admission), but only then. A put of a key with no stored
// version of the same size hashes each extent just before it is queued, and
// extents go to the engine as they are hashed, so a 64 MiB put starts writing
// after 1 MiB of hashing instead of 64 and hashing overlaps the device's work.
// A put that may be unchanged hashes extents first only while they match the
// stored ones: changed data (the usual rewrite) stops at the first extent, and
// only truly unchanged data is hashed whole before deciding.
//
// Note [Re-validated admission]
// Matching checksums say the caller's bytes equal what the store wrote, not
// what the disk now holds: a write lost after its check, or a bit that rotted
// since, would make "unchanged, skip it" keep a bad copy while the caller
// drops its good one. So an unchanged put reads the stored extents back and
// checks them (a read, which spares the SSD's wear where a rewrite would
// not), and skips the write only if they pass. If they fail, the stale entry
// is retired and the put writes as any other; on_corrupt is not called, since
// this put is the repair. The put takes its place in the key's order before
// the read, so a later put or erase of the key still wins.
void SsdStore::put_async(std::uint64_t key, const void* data, std::size_t bytes, bool evictable,
                         SsdCallback done) {
  if (bytes > 0 && !data) return done(Status::invalid_argument);
  bool maybe_unchanged = false;
  std::vector<std::uint64_t> stored;  // the stored version's checksums, if the same size
  {
    std::lock_guard lk(mu_);
    auto found = index_.find(key);
    maybe_unchanged = found != index_.end() && found->second.entry &&
                      found->second.entry->size == bytes && found->second.puts_in_flight == 0;
    if (maybe_unchanged)
      for (const Extent& x : found->second.entry->extents) stored.push_back(x.checksum);
  }
  // Admission compares against these under the lock below; if the entry
  // changed meanwhile the put just writes (admission is an optimisation, never
  // needed for correctness).
  auto r = std::make_unique<Request>();
  r->op = Request::Op::put;
  r->key = key;
  r->src = static_cast<const unsigned char*>(data);
  r->bytes = bytes;
  r->evictable = evictable;
  r->done = std::move(done);
  for (std::size_t i = 0; maybe_unchanged && i < stored.size(); ++i) {
    std::size_t off = i * opt_.chunk_bytes;
    r->sums.push_back(extent_checksum(key, i, r->src + off,
                                      std::min<std::size_t>(opt_.chunk_bytes, bytes - off)));
    maybe_unchanged = r->sums.back() == stored[i];
  }

  std::vector<std::uint64_t> evicted;
  Status refused = Status::ok;
  {
    std::lock_guard lk(mu_);
    stats_.puts++;
    auto found = index_.find(key);
    Entry* cur = found == index_.end() ? nullptr : found->second.entry.get();
    if (maybe_unchanged && cur && found->second.puts_in_flight == 0 && cur->size == bytes &&
        cur->extents.size() == r->sums.size() &&
        std::equal(r->sums.begin(), r->sums.end(), cur->extents.begin(),
                   [](std::uint64_t s, const Extent& x) { return s == x.checksum; })) {
      // Note [Re-validated admission]
      stats_.revalidations++;
      Slot& slot = found->second;
      r->seq = slot.latest_seq = ++next_seq_;
      slot.puts_in_flight++;
      cur->pins++;
      r->pinned = cur;
      r->pass = Request::Pass::revalidate;
      requests_in_flight_++;
    } else {
      refused = start_put_locked(*r, evicted);
    }
  }
  notify(opt_.on_evict, evicted);
  if (!ok(refused)) return r->done(refused);
  Request* raw = r.release();
  if (raw->pinned)
    return start_read(raw, raw->pinned->extents, all_extents(raw->pinned->extents.size()), nullptr);
  start_write(raw);
}

// Extents the caller's buffer can serve as is (aligned, whole blocks) go
// straight from it; the rest bounce through an aligned copy. The new entry is
// this request's alone until finish(), so its checksums are filled in here
// without the lock. The first extent goes out alone so the device starts at
// once; then a few at a time, to save submit calls.
void SsdStore::start_write(Request* r) {
  constexpr std::size_t kSubmitBatch = 4;
  r->pass = Request::Pass::write;
  r->status = 0;  // a re-validation that failed came first
  auto& xs = r->fresh->extents;
  r->chunks.resize(xs.size());
  r->remaining = static_cast<std::uint32_t>(xs.size() + 1);  // +1: held until all are submitted
  std::vector<IoOp> ops;
  ops.reserve(std::min(xs.size(), kSubmitBatch));
  for (std::size_t i = 0; i < xs.size(); ++i) {
    auto& c = r->chunks[i];
    c.user = const_cast<unsigned char*>(r->src) + i * opt_.chunk_bytes;
    xs[i].checksum =
        i < r->sums.size() ? r->sums[i] : extent_checksum(r->key, i, c.user, xs[i].len);
    std::uint32_t io_len = static_cast<std::uint32_t>(rounded(xs[i].len));
    void* buf = c.user;
    if (!aligned(c.user) || io_len != xs[i].len) {
      c.bounce = aligned_buffer(io_len);
      std::memcpy(c.bounce.get(), c.user, xs[i].len);
      std::memset(c.bounce.get() + xs[i].len, 0, io_len - xs[i].len);
      buf = c.bounce.get();
    }
    ops.push_back(
        IoOp{IoKind::write, fd_, buf, io_len, xs[i].offset, [this, r, io_len](std::int64_t res) {
               if (res < 0) {
                 r->io_errors++;
                 if (res == -ENOSPC) r->enospc++;
                 r->fail(status_of_errno(res));
               } else if (res != io_len) {
                 r->short_writes++;
                 r->fail(Status::short_io);
               }
               if (--r->remaining == 0) pass_done(r);
             }});
    if (i == 0 || ops.size() == kSubmitBatch || i + 1 == xs.size()) {
      engine_->submit(ops);
      ops.clear();
    }
  }
  if (--r->remaining == 0) pass_done(r);
}

// Note [Submitting from completions]
// A scratch read's completion starts the next extent into the slot it frees,
// so a pass keeps kReadWindow reads in flight. With the sync engine that
// completion runs inside submit(), so submitting from it directly would
// recurse once per extent. Instead the ops queue on the request and whichever
// thread is already submitting for it (the pass's starter, or the completion
// that found the queue idle) drains the queue in a loop.
void SsdStore::submit_reads(Request* r, std::vector<IoOp> ops) {
  {
    std::lock_guard lk(r->pump_mu);
    for (IoOp& op : ops) r->pump_q.push_back(std::move(op));
    if (r->pumping) return;
    r->pumping = true;
  }
  // The caller holds one of r->remaining, so r outlives this loop.
  for (;;) {
    std::vector<IoOp> batch;
    {
      std::lock_guard lk(r->pump_mu);
      if (r->pump_q.empty()) {
        r->pumping = false;
        return;
      }
      batch.swap(r->pump_q);
    }
    engine_->submit(batch);
  }
}

void SsdStore::start_read(Request* r, const std::vector<Extent>& xs,
                          std::vector<std::uint32_t> todo, unsigned char* user) {
  r->xs = &xs;
  r->todo = std::move(todo);
  r->user = user;
  r->status = 0;
  r->bad.assign(xs.size(), 0);
  r->print.assign(xs.size(), 0);
  r->bufs.clear();
  const std::size_t n = r->todo.size();
  const std::size_t window = user ? n : std::min(n, kReadWindow);
  if (user) {
    r->bufs.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      const Extent& x = xs[r->todo[k]];
      std::uint64_t io_len = rounded(x.len);
      if (!aligned(user + r->todo[k] * std::size_t{opt_.chunk_bytes}) || io_len != x.len)
        r->bufs[k] = aligned_buffer(io_len);
    }
  } else {
    std::uint64_t biggest = 0;
    for (std::uint32_t i : r->todo) biggest = std::max(biggest, rounded(xs[i].len));
    for (std::size_t k = 0; k < window; ++k) r->bufs.push_back(scratch_buffer(*scratch_, biggest));
    r->verify_reads += static_cast<std::uint32_t>(n);
  }
  r->next = window;
  r->remaining = static_cast<std::uint32_t>(n + 1);  // +1: held until all are submitted
  std::vector<IoOp> ops;
  ops.reserve(window);
  for (std::size_t k = 0; k < window; ++k) ops.push_back(read_op(r, k, k));
  if (!ops.empty()) submit_reads(r, std::move(ops));
  if (--r->remaining == 0) pass_done(r);
}

// The read of todo[k] into slot `slot` (a scratch slot, or k itself for a
// read into the caller's buffer), and its check: the one place a read is
// judged (Note [One read path]).
IoOp SsdStore::read_op(Request* r, std::size_t k, std::size_t slot) {
  const std::uint32_t i = r->todo[k];
  const Extent& x = (*r->xs)[i];
  const auto io_len = static_cast<std::uint32_t>(rounded(x.len));
  unsigned char* dst = r->user ? r->user + i * std::size_t{opt_.chunk_bytes} : nullptr;
  unsigned char* buf = r->bufs[slot] ? r->bufs[slot].get() : dst;
  return IoOp{IoKind::read,
              fd_,
              buf,
              io_len,
              x.offset,
              [this, r, slot, i, x, io_len, dst, buf](std::int64_t res) {
                if (res < 0) {
                  r->io_errors++;
                  r->fail(status_of_errno(res));
                } else if (res != io_len) {
                  r->short_reads++;
                  r->fail(Status::short_io);
                } else {
                  if (dst && buf != dst) std::memcpy(dst, buf, x.len);
                  // The padding after the payload was written as zeros; if it
                  // reads back otherwise, the extent is not what we wrote.
                  if (extent_checksum(r->key, i, dst ? dst : buf, x.len) != x.checksum ||
                      (buf != dst && !zeros(buf + x.len, io_len - x.len))) {
                    r->checksum_failures++;
                    r->bad[i] = 1;
                    r->print[i] = XXH3_64bits(buf ? buf : dst, io_len);
                    r->fail(Status::corrupt);
                  }
                }
                if (!r->user) {  // a scratch slot: start the next extent in it
                  std::size_t next = r->next++;
                  if (next < r->todo.size()) {
                    std::vector<IoOp> more;
                    more.push_back(read_op(r, next, slot));
                    submit_reads(r, std::move(more));
                  }
                }
                if (--r->remaining == 0) pass_done(r);
              }};
}

// The last I/O of a pass completed: every other one has, so r is ours alone.
void SsdStore::pass_done(Request* r) {
  const auto s = static_cast<Status>(r->status.load());
  switch (r->pass) {
    case Request::Pass::write:
      r->chunks.clear();  // the bounce copies are written
      if (ok(s) && opt_.verify_writes && !r->fresh->extents.empty()) {
        r->pass = Request::Pass::write_verify;
        return start_read(r, r->fresh->extents, all_extents(r->fresh->extents.size()), nullptr);
      }
      r->final = s;
      return finish(r);
    case Request::Pass::write_verify:
      r->final = s;
      return finish(r);
    case Request::Pass::revalidate:
    case Request::Pass::read:
      break;
  }
  // Note [Corrupt at rest]: which bad extents are still undecided.
  std::vector<std::uint32_t> undecided;
  if (r->rereads == 0) {
    r->first = s;
    r->seen.resize(r->bad.size());
  } else if (!ok(s) && s != Status::corrupt && ok(r->reread_error)) {
    r->reread_error = s;  // a re-read that failed outright settles nothing
  }
  for (std::uint32_t i : r->todo) {
    if (!r->bad[i]) continue;
    auto& seen = r->seen[i];
    if (std::find(seen.begin(), seen.end(), r->print[i]) != seen.end()) {
      r->retire = true;  // the same wrong bytes twice
      break;
    }
    seen.push_back(r->print[i]);
    undecided.push_back(i);
  }
  if (!r->retire && !undecided.empty() && r->rereads < kConfirmReads) {
    ++r->rereads;
    return start_read(r, *r->xs, std::move(undecided), nullptr);
  }
  // What the entry's data is: corrupt at rest; unjudgeable (every read of an
  // extent differed); else what the reads said.
  const Status verdict = r->retire                     ? Status::corrupt
                         : !undecided.empty()          ? Status::io_error
                         : r->first == Status::corrupt ? r->reread_error
                                                       : r->first;
  r->bufs.clear();
  if (r->pass == Request::Pass::revalidate) return revalidated(r, verdict);
  r->final = r->op == Request::Op::get ? r->first : verdict;
  finish(r);
}

// A re-validating put read the stored version (Note [Re-validated admission]).
void SsdStore::revalidated(Request* r, Status verdict) {
  std::vector<std::uint64_t> evicted;
  Status outcome = Status::ok;
  bool write = false;
  {
    std::lock_guard lk(mu_);
    Slot& slot = index_.at(r->key);  // kept: this put is in flight
    Entry* e = std::exchange(r->pinned, nullptr);
    if (r->retire) retire_corrupt_locked(r->key, e);  // no on_corrupt: this put repairs it
    const bool installed = slot.entry.get() == e;
    unpin_locked(e);
    if (r->seq != slot.latest_seq) {
      // Superseded by a later put or erase: like a put that completed late, it is discarded.
    } else if (ok(verdict) && installed) {
      stats_.writes_avoided++;
      Entry& cur = *slot.entry;
      set_evictable_locked(cur, r->evictable);
      if (r->evictable) lru_.splice(lru_.end(), lru_, cur.lru);  // a put is a use
    } else {
      if (!ok(verdict)) stats_.revalidation_failures++;
      outcome = start_put_locked(*r, evicted);
      write = ok(outcome);
    }
  }
  notify(opt_.on_evict, evicted);
  if (write) return start_write(r);
  r->final = outcome;
  finish(r);
}

void SsdStore::finish(Request* raw) {
  std::unique_ptr<Request> r(raw);
  r->bufs.clear();  // back to scratch_ while the store is sure to exist
  const Status status = r->final;
  bool tell = false;  // on_corrupt(key), outside the lock
  {
    std::lock_guard lk(mu_);
    stats_.io_errors += r->io_errors;
    stats_.enospc += r->enospc;
    stats_.short_writes += r->short_writes;
    stats_.short_reads += r->short_reads;
    stats_.checksum_failures += r->checksum_failures;
    stats_.verify_reads += r->verify_reads;
    if (r->op == Request::Op::put) {
      Slot& slot = index_.at(r->key);
      slot.puts_in_flight--;
      if (r->fresh) {
        if (r->pass == Request::Pass::write_verify && status == Status::corrupt)
          stats_.write_verify_failures++;
        if (ok(status) && r->seq == slot.latest_seq) {
          stats_.bytes_written += r->fresh->size;
          install_locked(slot, std::move(r->fresh));
        } else {
          // Failed, or superseded by a later put or erase: the previous state stands.
          free_extents_locked(r->fresh->extents);
        }
      }
      if (!slot.entry && slot.puts_in_flight == 0) index_.erase(r->key);
    } else {
      if (r->op == Request::Op::get && ok(status)) stats_.bytes_read += r->pinned->size;
      if (r->retire && retire_corrupt_locked(r->key, r->pinned)) {
        stats_.corrupt_retired++;
        tell = true;
      }
      unpin_locked(r->pinned);
    }
    if (!tell) {
      requests_in_flight_--;
      idle_cv_.notify_all();  // under the lock: the destructor may free us once it sees zero
    }
  }
  if (tell) {
    // Still counted in flight, so the store (and opt_) outlive the call.
    notify(opt_.on_corrupt, {r->key});
    std::lock_guard lk(mu_);
    requests_in_flight_--;
    idle_cv_.notify_all();
  }
  r->done(status);
}

void SsdStore::get_async(std::uint64_t key, void* out, std::size_t out_bytes, SsdCallback done,
                         std::size_t* size) {
  auto r = std::make_unique<Request>();
  r->op = Request::Op::get;
  r->key = key;
  r->done = std::move(done);
  Status refused = Status::ok;
  {
    std::lock_guard lk(mu_);
    stats_.gets++;
    auto found = index_.find(key);
    Entry* e = found == index_.end() ? nullptr : found->second.entry.get();
    if (!e) {
      refused = Status::not_found;
    } else {
      if (size) *size = e->size;
      if (e->size > out_bytes || (e->size > 0 && !out)) {
        refused = Status::invalid_argument;
      } else {
        e->pins++;
        if (e->evictable) lru_.splice(lru_.end(), lru_, e->lru);
        r->pinned = e;
        requests_in_flight_++;
      }
    }
  }
  if (!ok(refused)) return r->done(refused);
  // A pinned entry's extents are immutable, so reading them unlocked is safe.
  Request* raw = r.release();
  start_read(raw, raw->pinned->extents, all_extents(raw->pinned->extents.size()),
             static_cast<unsigned char*>(out));
}

SsdStore::Request* SsdStore::start_verify_locked(Entry* e, SsdCallback done) {
  auto* r = new Request();
  r->op = Request::Op::verify;
  r->key = e->key;
  r->done = std::move(done);
  e->pins++;
  r->pinned = e;
  requests_in_flight_++;
  return r;
}

void SsdStore::verify_async(std::uint64_t key, SsdCallback done) {
  Request* r = nullptr;
  {
    std::lock_guard lk(mu_);
    auto found = index_.find(key);
    if (found != index_.end() && found->second.entry)
      r = start_verify_locked(found->second.entry.get(), std::move(done));
  }
  if (!r) return done(Status::not_found);
  start_read(r, r->pinned->extents, all_extents(r->pinned->extents.size()), nullptr);
}

Status SsdStore::verify(std::uint64_t key) {
  auto p = std::make_shared<std::promise<Status>>();  // outlives set_value's return
  auto f = p->get_future();
  verify_async(key, [p](Status s) { p->set_value(s); });
  return f.get();
}

std::uint64_t SsdStore::scrub(std::uint64_t max_bytes) {
  std::uint64_t checked = 0;
  std::size_t budget;  // entries: at most one pass over the store
  {
    std::lock_guard lk(mu_);
    budget = scrub_ring_.size();
  }
  for (; budget > 0 && checked < max_bytes && !stopping_.load(); --budget) {
    auto p = std::make_shared<std::promise<Status>>();
    auto f = p->get_future();
    Request* r = nullptr;
    std::uint64_t size = 0;
    {
      std::lock_guard lk(mu_);
      if (scrub_ring_.empty()) break;
      if (scrub_cursor_ == scrub_ring_.end()) scrub_cursor_ = scrub_ring_.begin();
      Entry* e = *scrub_cursor_++;
      size = e->size;
      r = start_verify_locked(e, [p](Status s) { p->set_value(s); });
    }
    start_read(r, r->pinned->extents, all_extents(r->pinned->extents.size()), nullptr);
    const Status s = f.get();
    checked += size;
    std::lock_guard lk(mu_);
    stats_.scrubbed_bytes += size;
    if (s == Status::corrupt) stats_.scrub_failures++;
  }
  return checked;
}

// Slices of about 50 ms' worth at the rate, each followed by a wait that keeps
// the average at the rate; a slow slice is not made up for by a burst.
void SsdStore::scrub_loop() {
  using Clock = std::chrono::steady_clock;
  const double rate = static_cast<double>(opt_.scrub_bytes_per_s);
  const std::uint64_t slice = std::max<std::uint64_t>(kBlock, opt_.scrub_bytes_per_s / 20);
  auto next = Clock::now();
  std::unique_lock lk(scrub_mu_);
  while (!stopping_) {
    lk.unlock();
    const std::uint64_t bytes = scrub(slice);
    lk.lock();
    next = std::max(next, Clock::now());
    if (bytes > 0)
      next += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(static_cast<double>(bytes) / rate));
    else
      next += std::chrono::milliseconds(100);  // nothing to scrub yet
    scrub_cv_.wait_until(lk, next, [&] { return stopping_.load(); });
  }
}

Status SsdStore::erase(std::uint64_t key) {
  std::lock_guard lk(mu_);
  auto found = index_.find(key);
  if (found == index_.end()) return Status::not_found;
  Slot& slot = found->second;
  slot.latest_seq = ++next_seq_;  // cancels puts still in flight
  if (slot.entry) retire_locked(std::move(slot.entry));
  if (slot.puts_in_flight == 0) index_.erase(found);
  return Status::ok;
}

bool SsdStore::contains(std::uint64_t key, std::size_t* size) const {
  std::lock_guard lk(mu_);
  auto found = index_.find(key);
  if (found == index_.end() || !found->second.entry) return false;
  if (size) *size = found->second.entry->size;
  return true;
}

std::vector<std::pair<std::uint64_t, std::uint32_t>> SsdStore::extents(std::uint64_t key) const {
  std::lock_guard lk(mu_);
  std::vector<std::pair<std::uint64_t, std::uint32_t>> out;
  auto found = index_.find(key);
  if (found == index_.end() || !found->second.entry) return out;
  for (const Extent& x : found->second.entry->extents) out.emplace_back(x.offset, x.len);
  return out;
}

Status SsdStore::set_evictable(std::uint64_t key, bool evictable) {
  std::lock_guard lk(mu_);
  auto found = index_.find(key);
  if (found == index_.end() || !found->second.entry) return Status::not_found;
  set_evictable_locked(*found->second.entry, evictable);
  return Status::ok;
}

void SsdStore::set_evictable_locked(Entry& e, bool evictable) {
  if (e.evictable && !evictable) lru_.erase(e.lru);
  if (!e.evictable && evictable) e.lru = lru_.insert(lru_.end(), &e);
  e.evictable = evictable;
}

SsdStoreStats SsdStore::stats() const {
  std::lock_guard lk(mu_);
  SsdStoreStats s = stats_;
  s.bytes_used = alloc_.size() - alloc_.free_bytes();
  s.free_runs = alloc_.free_runs();
  s.largest_free = alloc_.largest_free();
  return s;
}

// ------------------------------------------------------ synchronous wrappers

std::future<Status> SsdStore::put_async(std::uint64_t key, const void* data, std::size_t bytes,
                                        bool evictable) {
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  put_async(key, data, bytes, evictable, [p](Status s) { p->set_value(s); });
  return f;
}

std::future<Status> SsdStore::get_async(std::uint64_t key, void* out, std::size_t out_bytes,
                                        std::size_t* size) {
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  get_async(
      key, out, out_bytes, [p](Status s) { p->set_value(s); }, size);
  return f;
}

Status SsdStore::put(std::uint64_t key, const void* data, std::size_t bytes, bool evictable) {
  return put_async(key, data, bytes, evictable).get();
}

Status SsdStore::get(std::uint64_t key, void* out, std::size_t out_bytes, std::size_t* size) {
  return get_async(key, out, out_bytes, size).get();
}

}  // namespace u3m::mem
