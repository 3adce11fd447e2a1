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
//    submit(). It must be short, must not block on the engine and must not call
//    submit() (the completion thread also starts waiting ops).
//  - With O_DIRECT, buf, len and offset must be aligned to the file's logical
//    block size; the engine does not check, the kernel answers -EINVAL.
//  - Thread-safe: several threads may submit at once.
#pragma once

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
// counts these to prove a skipped write issued no I/O.
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
  eio_on_write,      // writes the first half (a torn write), then reports -EIO
  enospc_on_write,   // writes nothing, reports -ENOSPC
  short_write,       // writes about half (block-aligned) and reports that count
  bit_flip_on_read,  // reads, then flips one bit of the returned bytes
  eio_on_read,       // reads nothing, reports -EIO
};
std::string_view to_string(IoFault f);

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
  std::uint64_t injected_total() const;

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
  // Picks the fault for one op (or none) and draws the bit to flip.
  bool choose(IoKind kind, IoFault& fault, std::uint64_t& draw);

  std::shared_ptr<IoEngine> inner_;
  mutable std::mutex mu_;
  std::vector<Rule> rules_;
  std::uint64_t injected_[5] = {};
  IoEngineStats asked_;
};

}  // namespace u3m::mem
