// The io_uring engine and the pread/pwrite fallback (include/u3m/mem/io_engine.hpp).
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "u3m/mem/io_engine.hpp"

namespace u3m::mem {
namespace {

// Atomic counters shared by both engines.
struct Counters {
  std::atomic<std::uint64_t> reads{0}, writes{0}, bytes_read{0}, bytes_written{0}, errors{0};
  std::atomic<std::uint64_t> completions{0}, depth_sum{0}, max_depth{0}, queued{0};
  void asked(IoKind k) { (k == IoKind::read ? reads : writes).fetch_add(1); }
  void result(IoKind k, std::int64_t res) {
    if (res < 0)
      errors.fetch_add(1);
    else
      (k == IoKind::read ? bytes_read : bytes_written).fetch_add(static_cast<std::uint64_t>(res));
  }
  // `n` ops completed with `depth` ops (them included) in flight.
  void reaped(std::uint64_t n, std::uint64_t depth) {
    completions.fetch_add(n);
    depth_sum.fetch_add(n * depth);
  }
  void started(std::uint64_t depth) {
    std::uint64_t m = max_depth.load();
    while (depth > m && !max_depth.compare_exchange_weak(m, depth)) {
    }
  }
  IoEngineStats snapshot() const {
    IoEngineStats s;
    s.reads = reads.load();
    s.writes = writes.load();
    s.bytes_read = bytes_read.load();
    s.bytes_written = bytes_written.load();
    s.errors = errors.load();
    s.completions = completions.load();
    s.depth_sum = depth_sum.load();
    s.max_depth = max_depth.load();
    s.queued = queued.load();
    return s;
  }
};

// Note [One submitter, one reaper]
// liburing's rings are not thread-safe as a whole, but the submission queue and
// the completion queue are independent: any number of threads may submit while
// holding sq_mu_, and the single reaper thread consumes completions without it
// (io_uring_wait_cqe with nothing to submit touches only the CQ). In-flight ops
// are capped at `queue_depth`, half the CQ's size, so the CQ can never
// overflow (the shutdown NOP fits in the other half). Ops beyond the cap wait
// in backlog_. Shutdown is a NOP whose user_data is 0, which the reaper takes
// as "stop once nothing is in flight".
//
// Note [Refill before callbacks]
// fio keeps its queue full from one loop: reap, then resubmit at once. Last
// session's engine made submitters block for a free slot, so every refill
// waited for the reaper to finish the whole batch of callbacks (an SSD store
// read callback hashes 1 MiB to verify it) and then for a submitting thread to
// wake up: on a loaded 2-core machine that hand-off is milliseconds, long
// enough to drain a queue of 16 1-MiB I/Os. Now the reaper consumes a batch of
// CQEs, starts waiting ops into the freed slots and submits them, and only
// then runs the callbacks, so the device queue stays full as long as callers
// have queued work, without any thread switch on the refill path.
class UringEngine final : public IoEngine {
 public:
  UringEngine() = default;
  ~UringEngine() override {
    if (!reaper_.joinable()) return;  // init failed: no ring, no thread
    {
      std::unique_lock lk(sq_mu_);
      io_uring_sqe* sqe = get_sqe_locked();
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);
      submit_locked();
    }
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }

  Status init(unsigned queue_depth, std::string* why) {
    if (queue_depth == 0) queue_depth = 1;
    int rc = io_uring_queue_init(queue_depth, &ring_, 0);
    if (rc < 0) {
      if (why) *why = fmt::format("io_uring_queue_init({}): {}", queue_depth, std::strerror(-rc));
      return Status::unsupported;
    }
    // The kernel may round the rings up; the cap is what was asked, and at
    // most half the CQ (Note [One submitter, one reaper]).
    max_inflight_ = std::min(queue_depth, ring_.cq.ring_entries / 2);
    reaper_ = std::thread([this] { reap(); });
    return Status::ok;
  }

  std::string_view name() const override { return "io_uring"; }
  IoEngineStats stats() const override { return counters_.snapshot(); }

  void submit(std::span<IoOp> ops) override {
    std::lock_guard lk(sq_mu_);
    bool started = false;
    for (IoOp& op : ops) {
      counters_.asked(op.kind);
      auto* owned = new Pending{std::move(op), {}};
      if (inflight_ < max_inflight_ && backlog_.empty()) {
        start_locked(owned);
        started = true;
      } else {
        backlog_.push_back(owned);
        counters_.queued.fetch_add(1);
      }
    }
    if (started) submit_locked();
  }

 private:
  // Note [Ordering the sanitizer can see]
  // The kernel's ring orders a submission before its completion, but TSan
  // cannot see through it: without help it reports the reaper's first touch
  // of an op (and of the buffers the caller filled before submitting) as a
  // race. A release store when the op is queued and an acquire load when it
  // completes state that ordering in terms TSan understands; it costs nothing.
  struct Pending {
    IoOp op;
    std::atomic<bool> published;
  };

  // Puts one op into the SQ (not yet submitted to the kernel).
  void start_locked(Pending* p) {
    io_uring_sqe* sqe = get_sqe_locked();
    const IoOp& o = p->op;
    if (o.kind == IoKind::read)
      io_uring_prep_read(sqe, o.fd, o.buf, o.len, o.offset);
    else
      io_uring_prep_write(sqe, o.fd, o.buf, o.len, o.offset);
    io_uring_sqe_set_data(sqe, p);
    p->published.store(true, std::memory_order_release);  // last touch before the reaper's
    counters_.started(++inflight_);
  }

  io_uring_sqe* get_sqe_locked() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (!sqe) {  // SQ full of queued entries: hand them to the kernel
      submit_locked();
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  void submit_locked() {
    for (;;) {
      int rc = io_uring_submit(&ring_);
      if (rc >= 0) return;
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) {
        std::this_thread::yield();
        continue;
      }
      // Only a broken ring (EBADF, EFAULT) gets here: a programming error, and
      // the queued ops could never complete, so continuing would hang callers.
      std::fprintf(stderr, "u3m: io_uring_submit failed: %s\n", std::strerror(-rc));
      std::abort();
    }
  }

  void reap() {
    bool stopping = false;
    std::vector<std::pair<Pending*, std::int64_t>> batch;
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        std::fprintf(stderr, "u3m: io_uring_wait_cqe failed: %s\n", std::strerror(-rc));
        std::abort();
      }
      batch.clear();
      unsigned head = 0, seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        auto* p = static_cast<Pending*>(io_uring_cqe_get_data(cqe));
        if (!p)
          stopping = true;
        else
          batch.emplace_back(p, cqe->res);
      }
      io_uring_cq_advance(&ring_, seen);
      {
        std::lock_guard lk(sq_mu_);
        counters_.reaped(batch.size(), inflight_);
        inflight_ -= static_cast<unsigned>(batch.size());
        bool started = false;
        while (inflight_ < max_inflight_ && !backlog_.empty()) {  // Note [Refill before callbacks]
          start_locked(backlog_.front());
          backlog_.pop_front();
          started = true;
        }
        if (started) submit_locked();
      }
      for (auto [p, res] : batch) {
        (void)p->published.load(std::memory_order_acquire);
        counters_.result(p->op.kind, res);
        if (p->op.done) p->op.done(res);
        delete p;
      }
      // Checked after the callbacks, which may have submitted follow-up ops.
      if (stopping) {
        std::lock_guard lk(sq_mu_);
        if (inflight_ == 0 && backlog_.empty()) return;
      }
    }
  }

  io_uring ring_{};
  std::mutex sq_mu_;
  unsigned inflight_ = 0;         // in the kernel; guarded by sq_mu_
  std::deque<Pending*> backlog_;  // waiting for a slot, oldest first; guarded by sq_mu_
  unsigned max_inflight_ = 0;
  std::thread reaper_;
  Counters counters_;
};

class SyncEngine final : public IoEngine {
 public:
  std::string_view name() const override { return "pread/pwrite"; }
  IoEngineStats stats() const override { return counters_.snapshot(); }

  void submit(std::span<IoOp> ops) override {
    for (IoOp& op : ops) {
      counters_.asked(op.kind);
      ssize_t n;
      do {
        n = op.kind == IoKind::read
                ? ::pread(op.fd, op.buf, op.len, static_cast<off_t>(op.offset))
                : ::pwrite(op.fd, op.buf, op.len, static_cast<off_t>(op.offset));
      } while (n < 0 && errno == EINTR);
      std::int64_t res = n < 0 ? -errno : n;
      counters_.started(1);
      counters_.reaped(1, 1);  // one op at a time per submitting thread
      counters_.result(op.kind, res);
      if (op.done) op.done(res);
    }
  }

 private:
  Counters counters_;
};

}  // namespace

Status make_uring_engine(unsigned queue_depth, std::unique_ptr<IoEngine>& out, std::string* why) {
  auto e = std::make_unique<UringEngine>();
  Status s = e->init(queue_depth, why);
  if (ok(s)) out = std::move(e);
  return s;
}

std::unique_ptr<IoEngine> make_sync_engine() {
  return std::make_unique<SyncEngine>();
}

std::unique_ptr<IoEngine> make_default_io_engine(unsigned queue_depth) {
  std::unique_ptr<IoEngine> e;
  if (ok(make_uring_engine(queue_depth, e))) return e;
  return make_sync_engine();
}

}  // namespace u3m::mem
