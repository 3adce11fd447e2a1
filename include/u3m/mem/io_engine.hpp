// Asynchronous file I/O behind one small interface, so the SSD store runs on
// io_uring for real, on plain pread/pwrite where io_uring is unavailable, and
// under a fault-injecting wrapper in tests (after RocksDB's
// utilities/fault_injection_fs: the test layer sits between the store and the
// real engine and rewrites results, it does not patch the store).
//
// Contract shared by every engine:
//  - submit() never fails synchronously and never waits for the device: ops
//    beyond the engine's queue depth wait in the engine, in order. Every op's
//    outcome arrives exactly once through its `done` callback as bytes
//    transferred (>= 0; fewer than asked is a short transfer) or -errno.
//  - `done` may run on the engine's completion thread or inline inside
//    submit(). It must be short and must not block on the engine. It may call
//    submit() for a follow-up op (the SSD store reads an extent back after
//    writing it): submit() never waits, so the completion thread cannot stall
//    on itself. With the sync engine such a submit runs inline, one level
//    deeper; a caller that chains many ops should queue them and submit from
//    one loop instead of recursing.
//  - With O_DIRECT, buf, len and offset must be aligned to the file's logical
//    block size; the engine does not check, the kernel answers -EINVAL.
//  - Thread-safe: several threads may submit at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "u3m/mem/status.hpp"

namespace u3m::mem {

enum class IoKind : std::uint8_t { read, write };

struct IoOp {
  IoKind kind = IoKind::read;
  int fd = -1;
  void* buf = nullptr;
  std::uint32_t len = 0;
  std::uint64_t offset = 0;
  std::function<void(std::int64_t result)> done;  // bytes or -errno, exactly once
};

// Ops the engine was asked for (not what succeeded): the write-admission test
// counts these to prove a skipped write issued no write.
struct IoEngineStats {
  std::uint64_t reads = 0, writes = 0;
  std::uint64_t bytes_read = 0, bytes_written = 0;  // bytes actually transferred
  std::uint64_t errors = 0;                         // results < 0
  // Queue depth actually reached at the device: for each completed op, the ops
  // in flight when it was reaped (itself included) are added to depth_sum, so
  // depth_sum / completions is the mean depth. 0 where an engine (the fault
  // wrapper) does not track it.
  std::uint64_t completions = 0, depth_sum = 0;
  std::uint64_t max_depth = 0;  // most ops ever in flight at once
  std::uint64_t queued = 0;     // ops that waited in the engine for a free slot
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual std::string_view name() const = 0;
  // Starts every op in `ops`; the ops' callbacks are moved out.
  virtual void submit(std::span<IoOp> ops) = 0;
  virtual IoEngineStats stats() const = 0;
};

// io_uring (liburing) with one completion thread. At most `queue_depth` ops are
// in flight; ops beyond that wait in a FIFO inside the engine (never dropped,
// and submit() does not block) and the completion thread starts them as slots
// free, before it runs any callback (Note [Refill before callbacks]). Fails
// with `unsupported` where the kernel refuses io_uring (old kernel, seccomp,
// io_uring_disabled); `why` then says what the kernel said.
Status make_uring_engine(unsigned queue_depth, std::unique_ptr<IoEngine>& out,
                         std::string* why = nullptr);

// pread/pwrite in the submitting thread; callbacks run inline. The fallback
// where io_uring is unavailable, and a simple reference for tests.
std::unique_ptr<IoEngine> make_sync_engine();

// io_uring if the kernel allows it, else the sync engine.
std::unique_ptr<IoEngine> make_default_io_engine(unsigned queue_depth);

enum class IoFault : std::uint8_t {
  // Loud faults: the op reports the failure.
  eio_on_write,      // writes the first half (a torn write), then reports -EIO
  enospc_on_write,   // writes nothing, reports -ENOSPC
  short_write,       // writes about half (block-aligned) and reports that count
  bit_flip_on_read,  // reads, then flips one bit of the returned bytes
  eio_on_read,       // reads nothing, reports -EIO
  // Silent faults: the write reports full success (Note [Silent write faults]).
  lost_write,         // nothing is written
  misdirected_write,  // the data lands at another block-aligned offset inside the file
  torn_write,         // only a block-aligned prefix (possibly empty) is written
};
inline constexpr std::size_t kIoFaultKinds = 8;
std::string_view to_string(IoFault f);
constexpr bool is_silent(IoFault f) {
  return f == IoFault::lost_write || f == IoFault::misdirected_write || f == IoFault::torn_write;
}

// Note [Silent write faults]
// RocksDB's fault-injection file system keeps every write since the last sync
// in a buffer and, to simulate a crash, drops that buffer (the writes are
// lost) or truncates it at a random point (a torn write): the writer was told
// each write succeeded. Our store never syncs (it is a cache of one process's
// state), so the same faults are modelled per op, where the drive's firmware
// or the file system would produce them: a write that reports success but
// never reached the medium (lost), reached it only in part (torn: a
// block-aligned prefix, as a device writes whole blocks) or reached the wrong
// place (misdirected: another block-aligned offset of the same file, which may
// overwrite another entry's data). None can be seen from the op's result; only
// reading the data back can. Corruption at rest (a bit that changes after it
// was written and read back fine) is injected separately, into the file
// itself, by corrupt_at_rest() and corrupt_random_written().

// Wraps another engine and injects faults on chosen ops. Faults target the ops
// of their own kind (write faults count writes, read faults count reads), so
// "the 3rd write from now" is independent of interleaved reads.
class FaultInjectionIoEngine final : public IoEngine {
 public:
  explicit FaultInjectionIoEngine(std::shared_ptr<IoEngine> inner);

  // The n-th matching op from now (1 = the next one) gets the fault, once.
  void fail_nth(IoFault f, std::uint64_t n);
  // Every matching op gets the fault with probability p, drawn from a
  // generator seeded with `seed` (deterministic for a given op order).
  void fail_randomly(IoFault f, double p, std::uint64_t seed);
  void clear();  // removes every rule; counters stay
  std::uint64_t injected(IoFault f) const;
  std::uint64_t injected_total() const;  // faults on ops, every kind; not those at rest

  // Corruption at rest: flips one bit, chosen by `seed`, inside [offset,
  // offset + len) of the real file, with a read-modify-write of the 4 KiB
  // block around it (aligned, so `fd` may be O_DIRECT). A write of the store's
  // into the same block at the same moment may be undone too; the checksum
  // catches that as well. invalid_argument if the range is empty or past the
  // end of the file, io_error if the file cannot be read or written.
  Status corrupt_at_rest(int fd, std::uint64_t offset, std::uint64_t len, std::uint64_t seed);
  // The same, in a range picked by `seed` among the last kWriteLog writes the
  // wrapper passed to its engine (where they landed, as much as was written).
  // False if there were none or the flip failed (e.g. the file was closed:
  // use it only while the files written are open).
  bool corrupt_random_written(std::uint64_t seed);
  std::uint64_t injected_at_rest() const;

  // The writes passed to the inner engine, oldest first (at most kWriteLog):
  // a test puts a blob and corrupts what it just wrote.
  struct WrittenRange {
    int fd;
    std::uint64_t offset;
    std::uint32_t len;
  };
  std::vector<WrittenRange> recent_writes() const;
  static constexpr std::size_t kWriteLog = 256;

  // Silent write faults whose target range was later read whole, by a read
  // that completed in full and had no fault of its own, before any other
  // write touched the range. A fault that left the range holding the bytes
  // the write carried anyway (a failed write retried into the same place) is
  // not counted. Each counted read saw wrong bytes, so a reader that checks
  // what it reads must have caught every one: a test compares this with the
  // reader's count of failed checks.
  std::uint64_t silent_faults_read_back() const;

  std::string_view name() const override { return "fault-injection"; }
  void submit(std::span<IoOp> ops) override;
  IoEngineStats stats() const override;  // every op asked of the wrapper

 private:
  struct Rule {
    IoFault fault;
    std::uint64_t countdown = 0;  // > 0: fire when it reaches 1; 0: probabilistic
    double probability = 0;
    std::mt19937_64 rng;
    bool spent = false;
  };
  // Picks the fault for one op (or none) and draws the bit to flip, the
  // offset to misdirect to or the prefix to keep.
  bool choose(IoKind kind, IoFault& fault, std::uint64_t& draw);
  // Locked: bookkeeping of one write about to reach the inner engine, and of
  // one silent fault's target range.
  void wrote_locked(int fd, std::uint64_t offset, std::uint32_t len);
  void read_back_locked(int fd, std::uint64_t offset, std::uint32_t len);

  std::shared_ptr<IoEngine> inner_;
  mutable std::mutex mu_;
  std::vector<Rule> rules_;
  std::uint64_t injected_[kIoFaultKinds] = {};
  std::uint64_t injected_at_rest_ = 0;
  std::uint64_t silent_read_back_ = 0;
  std::vector<WrittenRange> write_log_;  // ring of kWriteLog
  std::size_t write_log_next_ = 0;
  // Silent faults not yet read back or overwritten, the newest kSilentPending.
  std::vector<WrittenRange> silent_pending_;
  static constexpr std::size_t kSilentPending = 1024;
  IoEngineStats asked_;
};

}  // namespace u3m::mem
