// The io_uring engine and the pread/pwrite fallback (include/u3m/mem/io_engine.hpp).
#include <liburing.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "u3m/mem/io_engine.hpp"

namespace u3m::mem {
namespace {

// Atomic counters shared by both engines.
struct Counters {
  std::atomic<std::uint64_t> reads{0}, writes{0}, bytes_read{0}, bytes_written{0}, errors{0};
  void asked(IoKind k) { (k == IoKind::read ? reads : writes).fetch_add(1); }
  void result(IoKind k, std::int64_t res) {
    if (res < 0)
      errors.fetch_add(1);
    else
      (k == IoKind::read ? bytes_read : bytes_written).fetch_add(static_cast<std::uint64_t>(res));
  }
  IoEngineStats snapshot() const {
    return {reads.load(), writes.load(), bytes_read.load(), bytes_written.load(), errors.load()};
  }
};

// Note [One submitter, one reaper]
// liburing's rings are not thread-safe as a whole, but the submission queue and
// the completion queue are independent: any number of threads may submit while
// holding sq_mu_, and the single reaper thread consumes completions without it
// (io_uring_wait_cqe with nothing to submit touches only the CQ). In-flight ops
// are capped at the CQ size, so the CQ can never overflow; a submitter that
// finds the cap reached flushes what it queued and waits for the reaper.
// Shutdown is a NOP whose user_data is 0, which the reaper takes as "stop once
// nothing is in flight".
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
    // One slot of the CQ is kept for the shutdown NOP.
    max_inflight_ = ring_.cq.ring_entries - 1;
    reaper_ = std::thread([this] { reap(); });
    return Status::ok;
  }

  std::string_view name() const override { return "io_uring"; }
  IoEngineStats stats() const override { return counters_.snapshot(); }

  void submit(std::span<IoOp> ops) override {
    std::unique_lock lk(sq_mu_);
    for (IoOp& op : ops) {
      while (inflight_ >= max_inflight_) {
        submit_locked();  // the queued ops must reach the kernel before we wait on them
        space_cv_.wait(lk);
      }
      counters_.asked(op.kind);
      auto* owned = new Pending{std::move(op), {}};
      io_uring_sqe* sqe = get_sqe_locked();
      const IoOp& o = owned->op;
      if (o.kind == IoKind::read)
        io_uring_prep_read(sqe, o.fd, o.buf, o.len, o.offset);
      else
        io_uring_prep_write(sqe, o.fd, o.buf, o.len, o.offset);
      io_uring_sqe_set_data(sqe, owned);
      owned->published.store(true, std::memory_order_release);  // last touch before the reaper's
      ++inflight_;
    }
    submit_locked();
  }

 private:
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
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        std::fprintf(stderr, "u3m: io_uring_wait_cqe failed: %s\n", std::strerror(-rc));
        std::abort();
      }
      unsigned head = 0, seen = 0, done_ops = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        auto* p = static_cast<Pending*>(io_uring_cqe_get_data(cqe));
        if (!p) {
          stopping = true;
          continue;
        }
        (void)p->published.load(std::memory_order_acquire);
        std::int64_t res = cqe->res;
        counters_.result(p->op.kind, res);
        if (p->op.done) p->op.done(res);
        delete p;
        ++done_ops;
      }
      io_uring_cq_advance(&ring_, seen);
      std::lock_guard lk(sq_mu_);
      inflight_ -= done_ops;
      space_cv_.notify_all();
      if (stopping && inflight_ == 0) return;
    }
  }

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

  io_uring ring_{};
  std::mutex sq_mu_;
  std::condition_variable space_cv_;
  unsigned inflight_ = 0;  // guarded by sq_mu_
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
