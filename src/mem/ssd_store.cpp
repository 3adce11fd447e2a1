// The SSD tier store (include/u3m/mem/ssd_store.hpp, docs/memory.md "SSD store").
#include "u3m/mem/ssd_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

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

namespace {

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuf = std::unique_ptr<unsigned char, AlignedFree>;

AlignedBuf aligned_buffer(std::size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, SsdStore::kBlock, bytes) != 0) return nullptr;
  return AlignedBuf(static_cast<unsigned char*>(p));
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

// One put or get in flight: its chunks complete independently (possibly on
// the engine thread, possibly inline in submit); the last one finishes it.
struct SsdStore::Request {
  struct Chunk {
    unsigned char* user = nullptr;  // the caller's bytes for this extent
    AlignedBuf bounce;              // set when the caller's bytes cannot go to O_DIRECT as is
  };
  IoKind kind = IoKind::read;
  std::uint64_t key = 0, seq = 0;
  std::unique_ptr<Entry> fresh;  // put: the version being written
  Entry* reading = nullptr;      // get: the pinned entry
  std::vector<Chunk> chunks;
  std::atomic<std::uint32_t> remaining{0};
  std::atomic<std::int32_t> status{0};  // first failure wins
  std::atomic<std::uint32_t> io_errors{0}, enospc{0}, shorts{0}, checksum_failures{0};
  SsdCallback done;

  void fail(Status s) {
    std::int32_t expected = 0;
    status.compare_exchange_strong(expected, static_cast<std::int32_t>(s));
  }
};

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

  bool direct = options.direct_io;
  int flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
  int fd = ::open(options.path.c_str(), flags | (direct ? O_DIRECT : 0), 0600);
  if (fd < 0 && direct && errno == EINVAL) {  // the file system has no O_DIRECT: go buffered
    direct = false;
    fd = ::open(options.path.c_str(), flags, 0600);
  }
  if (fd < 0)
    return fail(errno == ENOSPC ? Status::no_space : Status::io_error,
                fmt::format("{}: cannot open: {}", options.path, std::strerror(errno)));
  // Preallocate so the store can never hit ENOSPC later, and so extents are
  // real blocks (not holes) that O_DIRECT reads back as written.
  int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(options.capacity));
  if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS))
    rc = ::ftruncate(fd, static_cast<off_t>(options.capacity));  // sparse; ENOSPC stays possible
  if (rc != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(options.path.c_str());
    return fail(err == ENOSPC ? Status::no_space : Status::io_error,
                fmt::format("{}: cannot preallocate {} bytes: {}", options.path, options.capacity,
                            std::strerror(err)));
  }

  std::unique_ptr<SsdStore> s(new SsdStore(std::move(options)));
  s->fd_ = fd;
  s->engine_ = s->opt_.engine
                   ? s->opt_.engine
                   : std::shared_ptr<IoEngine>(make_default_io_engine(s->opt_.queue_depth));
  s->caps_.name = "ssd";
  s->caps_.tier = Tier::ssd;
  s->caps_.granularity = kBlock;
  s->caps_.direct_io = direct;
  s->caps_.capacity = s->opt_.capacity;
  s->stats_.capacity = s->opt_.capacity;
  out = std::move(s);
  return Status::ok;
}

SsdStore::~SsdStore() {
  {
    std::unique_lock lk(mu_);
    idle_cv_.wait(lk, [&] { return requests_in_flight_ == 0; });
  }
  if (fd_ >= 0) ::close(fd_);
  if (opt_.remove_on_close) ::unlink(opt_.path.c_str());
}

void SsdStore::free_extents_locked(const std::vector<Extent>& extents) {
  for (const Extent& x : extents) {
    bool freed = alloc_.free(x.offset, rounded(x.len));
    (void)freed;  // every extent was handed out by alloc_ and is freed once
  }
}

void SsdStore::retire_locked(std::unique_ptr<Entry> e) {
  if (e->evictable) lru_.erase(e->lru);
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

void SsdStore::notify_evicted(const std::vector<std::uint64_t>& keys) const {
  if (opt_.on_evict)
    for (std::uint64_t k : keys) opt_.on_evict(k);
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
  std::vector<std::uint64_t> sums;
  const auto* src = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; maybe_unchanged && i < stored.size(); ++i) {
    std::size_t off = i * opt_.chunk_bytes;
    sums.push_back(
        extent_checksum(key, i, src + off, std::min<std::size_t>(opt_.chunk_bytes, bytes - off)));
    maybe_unchanged = sums.back() == stored[i];
  }

  auto r = std::make_unique<Request>();
  r->kind = IoKind::write;
  r->key = key;
  r->done = std::move(done);
  std::vector<std::uint64_t> evicted;
  bool avoided = false;
  {
    std::lock_guard lk(mu_);
    stats_.puts++;
    auto found = index_.find(key);
    if (maybe_unchanged && sums.size() == stored.size() && found != index_.end() &&
        found->second.entry && found->second.puts_in_flight == 0) {
      Entry& cur = *found->second.entry;
      avoided = cur.size == bytes && cur.extents.size() == sums.size() &&
                std::equal(sums.begin(), sums.end(), cur.extents.begin(),
                           [](std::uint64_t s, const Extent& x) { return s == x.checksum; });
      if (avoided) {  // write admission: unchanged content costs no I/O
        stats_.writes_avoided++;
        set_evictable_locked(cur, evictable);
        if (evictable) lru_.splice(lru_.end(), lru_, cur.lru);  // a put is a use
      }
    }
    if (!avoided) {
      auto e = std::make_unique<Entry>();
      e->key = key;
      e->size = bytes;
      e->evictable = evictable;
      Status s = allocate_locked(key, bytes, e->extents, evicted);
      if (!ok(s)) {
        stats_.no_space++;
        r->fail(s);
      } else {
        Slot& slot = index_[key];
        e->seq = r->seq = slot.latest_seq = ++next_seq_;
        slot.puts_in_flight++;
        r->fresh = std::move(e);
        requests_in_flight_++;
      }
    }
  }
  notify_evicted(evicted);
  if (!r->fresh) return r->done(static_cast<Status>(r->status.load()));

  // Extents the caller's buffer can serve as is (aligned, whole blocks) go
  // straight from it; the rest bounce through an aligned copy. The new entry
  // is this request's alone until finish(), so its checksums are filled in
  // here without the lock.
  // The first extent goes out alone so the device starts at once; then a few
  // at a time, to save submit calls.
  constexpr std::size_t kSubmitBatch = 4;
  Request* raw = r.release();
  auto& xs = raw->fresh->extents;
  raw->chunks.resize(xs.size());
  raw->remaining = static_cast<std::uint32_t>(xs.size() + 1);  // +1: held until all are submitted
  std::vector<IoOp> ops;
  ops.reserve(std::min(xs.size(), kSubmitBatch));
  for (std::size_t i = 0; i < xs.size(); ++i) {
    auto& c = raw->chunks[i];
    c.user = const_cast<unsigned char*>(src) + i * opt_.chunk_bytes;
    xs[i].checksum = i < sums.size() ? sums[i] : extent_checksum(key, i, c.user, xs[i].len);
    std::uint32_t io_len = static_cast<std::uint32_t>(rounded(xs[i].len));
    void* buf = c.user;
    if (!aligned(c.user) || io_len != xs[i].len) {
      c.bounce = aligned_buffer(io_len);
      std::memcpy(c.bounce.get(), c.user, xs[i].len);
      std::memset(c.bounce.get() + xs[i].len, 0, io_len - xs[i].len);
      buf = c.bounce.get();
    }
    ops.push_back(
        IoOp{IoKind::write, fd_, buf, io_len, xs[i].offset, [this, raw, io_len](std::int64_t res) {
               if (res < 0) {
                 raw->io_errors++;
                 if (res == -ENOSPC) raw->enospc++;
                 raw->fail(status_of_errno(res));
               } else if (res != io_len) {
                 raw->shorts++;
                 raw->fail(Status::short_io);
               }
               if (--raw->remaining == 0) finish(raw);
             }});
    if (i == 0 || ops.size() == kSubmitBatch || i + 1 == xs.size()) {
      engine_->submit(ops);
      ops.clear();
    }
  }
  if (--raw->remaining == 0) finish(raw);
}

void SsdStore::get_async(std::uint64_t key, void* out, std::size_t out_bytes, SsdCallback done,
                         std::size_t* size) {
  auto r = std::make_unique<Request>();
  r->kind = IoKind::read;
  r->key = key;
  r->done = std::move(done);
  {
    std::lock_guard lk(mu_);
    stats_.gets++;
    auto found = index_.find(key);
    Entry* e = found == index_.end() ? nullptr : found->second.entry.get();
    if (!e) {
      r->fail(Status::not_found);
    } else {
      if (size) *size = e->size;
      if (e->size > out_bytes || (e->size > 0 && !out)) {
        r->fail(Status::invalid_argument);
      } else {
        e->pins++;
        if (e->evictable) lru_.splice(lru_.end(), lru_, e->lru);
        r->reading = e;
        requests_in_flight_++;
      }
    }
  }
  if (!r->reading) return r->done(static_cast<Status>(r->status.load()));

  Request* raw = r.release();
  auto* dst = static_cast<unsigned char*>(out);
  // A pinned entry's extents are immutable, so reading them unlocked is safe.
  const auto& xs = raw->reading->extents;
  raw->chunks.resize(xs.size());
  std::vector<IoOp> ops(xs.size());
  raw->remaining = static_cast<std::uint32_t>(xs.size() + 1);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    auto& c = raw->chunks[i];
    c.user = dst + i * opt_.chunk_bytes;
    std::uint32_t io_len = static_cast<std::uint32_t>(rounded(xs[i].len));
    void* buf = c.user;
    if (!aligned(c.user) || io_len != xs[i].len) {
      c.bounce = aligned_buffer(io_len);
      buf = c.bounce.get();
    }
    const Extent x = xs[i];
    ops[i] = IoOp{
        IoKind::read, fd_, buf, io_len, x.offset, [this, raw, io_len, x, i, key](std::int64_t res) {
          auto& c = raw->chunks[i];
          if (res < 0) {
            raw->io_errors++;
            raw->fail(status_of_errno(res));
          } else if (res != io_len) {
            raw->shorts++;
            raw->fail(Status::short_io);
          } else {
            if (c.bounce) std::memcpy(c.user, c.bounce.get(), x.len);
            // The padding after the payload was written as zeros; if it
            // reads back otherwise, the extent is not what we wrote.
            if (extent_checksum(key, i, c.user, x.len) != x.checksum ||
                (c.bounce && !zeros(c.bounce.get() + x.len, io_len - x.len))) {
              raw->checksum_failures++;
              raw->fail(Status::corrupt);
            }
          }
          if (--raw->remaining == 0) finish(raw);
        }};
  }
  if (!ops.empty()) engine_->submit(ops);
  if (--raw->remaining == 0) finish(raw);
}

void SsdStore::finish(Request* raw) {
  std::unique_ptr<Request> r(raw);
  auto status = static_cast<Status>(r->status.load());
  {
    std::lock_guard lk(mu_);
    stats_.io_errors += r->io_errors;
    stats_.enospc += r->enospc;
    stats_.checksum_failures += r->checksum_failures;
    if (r->kind == IoKind::write) {
      stats_.short_writes += r->shorts;
      Slot& slot = index_.at(r->key);
      slot.puts_in_flight--;
      if (ok(status) && r->seq == slot.latest_seq) {
        stats_.bytes_written += r->fresh->size;
        if (slot.entry) retire_locked(std::move(slot.entry));
        Entry* e = r->fresh.get();
        if (e->evictable) e->lru = lru_.insert(lru_.end(), e);
        stats_.entries++;
        stats_.bytes_stored += e->size;
        stats_.extents += e->extents.size();
        slot.entry = std::move(r->fresh);
      } else {
        // Failed, or superseded by a later put or erase: the previous state stands.
        free_extents_locked(r->fresh->extents);
      }
      if (!slot.entry && slot.puts_in_flight == 0) index_.erase(r->key);
    } else {
      stats_.short_reads += r->shorts;
      if (ok(status)) stats_.bytes_read += r->reading->size;
      unpin_locked(r->reading);
    }
    requests_in_flight_--;
    idle_cv_.notify_all();  // under the lock: the destructor may free us once it sees zero
  }
  r->done(status);
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
