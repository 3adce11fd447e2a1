#include "u3m/engine/transport.hpp"

#include "u3m/mem/link.hpp"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace u3m::engine {

std::string_view to_string(Link l) {
  switch (l) {
    case Link::d2h:
      return "d2h";
    case Link::h2d:
      return "h2d";
    case Link::h2s:
      return "h2s";
    case Link::s2h:
      return "s2h";
  }
  return "?";
}

struct BackendTransport::Worker {
  BackendTransport& owner;
  Link link;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Transfer> queue;
  bool stop = false;
  std::uint64_t async_in_flight = 0;  // SSD ops whose callback has not run
  mem::LinkSchedule schedule;  // a throttled link's bookings (Note [Link model]), steady ns
  std::thread thread;

  // The link's own stream, with stream_copies (memory links only). If it
  // cannot be created the link keeps the synchronous copy, which then reports
  // the device's failure.
  mem::Stream stream{};
  bool has_stream = false;

  Worker(BackendTransport& o, Link l, bool stream_copies) : owner(o), link(l) {
    if (stream_copies && (l == Link::d2h || l == Link::h2d))
      has_stream = mem::ok(owner.device_.create_stream(&stream));
    thread = std::thread([this] { run(); });
  }

  ~Worker() {
    {
      std::lock_guard lk(mu);
      stop = true;
      cv.notify_all();
    }
    thread.join();  // the thread drains its queue before it exits
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return async_in_flight == 0; });
    }
    if (has_stream) owner.device_.destroy_stream(stream);
  }

  void push(const Transfer& t) {
    std::lock_guard lk(mu);
    queue.push_back(t);
    cv.notify_all();
  }

  // Note [Link throttle] in transport.hpp.
  void pace(const Transfer& t) {
    if (t.rate_limit <= 0) return;
    using Clock = std::chrono::steady_clock;
    const auto now = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
            .count());
    const mem::LinkSchedule::Slot s = schedule.book(now, t.bytes, t.rate_limit);
    if (s.start_ns > now)
      std::this_thread::sleep_until(Clock::time_point(std::chrono::nanoseconds(s.start_ns)));
  }

  void finish(const Transfer& t, Status s) { owner.done_(t, s); }

  void run() {
    for (;;) {
      Transfer t;
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;  // stop requested and drained
        t = queue.front();
        queue.pop_front();
      }
      pace(t);
      execute(t);
    }
  }

  void execute(const Transfer& t) {
    switch (t.link) {
      case Link::d2h:
      case Link::h2d: {
        auto kind = t.link == Link::d2h ? mem::CopyKind::d2h : mem::CopyKind::h2d;
        if (has_stream) {  // Note [Copies on u3m's streams]
          Status s = owner.device_.memcpy_async(t.dst, t.bytes, t.src, t.bytes, kind, stream);
          if (mem::ok(s)) s = owner.device_.synchronize_stream(stream);
          finish(t, s);
          return;
        }
        // The worker waits for its copy anyway: a synchronous copy (Note
        // [Synchronous copies] in mem/device_emu.cpp).
        finish(t, owner.device_.memcpy_sync(t.dst, t.bytes, t.src, t.bytes, kind));
        return;
      }
      case Link::h2s:
      case Link::s2h: {
        if (!owner.ssd_) return finish(t, Status::unsupported);
        {
          std::lock_guard lk(mu);
          ++async_in_flight;
        }
        auto cb = [this, t](Status s) {
          finish(t, s);
          std::lock_guard lk(mu);
          --async_in_flight;
          cv.notify_all();
        };
        if (t.link == Link::h2s) {
          owner.ssd_->put_async(t.tensor, t.src, t.bytes, /*evictable=*/false, cb);
        } else if (!t.dst) {
          owner.ssd_->verify_async(t.tensor, cb);  // Note [Verified before dropped]
        } else {
          owner.ssd_->get_async(t.tensor, t.dst, t.bytes, cb);
        }
        return;
      }
    }
  }
};

// Note [Copies on u3m's streams]
// On a real device a synchronous copy runs on the runtime's implicit stream:
// CUDA's cudaMemcpy uses the legacy default stream, which waits for, and
// holds up, every blocking stream of the process, PyTorch's default compute
// stream among them, so a prefetch would serialise with compute. With
// stream_copies (the real stack on cuda and acl) each memory link copies on a
// stream of its own (non-blocking on CUDA, Note [One backend, two runtimes])
// and waits for that stream only; the engine learns of completion when the
// bytes have landed, as before. device-emu keeps its synchronous copy, which
// is faster there and has no other stream to block.
BackendTransport::BackendTransport(mem::DeviceBackend& device, mem::SsdStore* ssd,
                                   bool stream_copies)
    : device_(device), ssd_(ssd) {
  for (int i = 0; i < kNumLinks; ++i) {
    workers_[i] = std::make_unique<Worker>(*this, static_cast<Link>(i), stream_copies);
  }
}

BackendTransport::~BackendTransport() {
  for (auto& w : workers_) w.reset();
}

void BackendTransport::set_completion(TransferDone done) {
  done_ = std::move(done);
}

void BackendTransport::start(const Transfer& t) {
  workers_[static_cast<int>(t.link)]->push(t);
}

Status BackendTransport::erase_ssd(std::uint64_t key) {
  if (!ssd_) return Status::unsupported;
  Status s = ssd_->erase(key);
  return s == Status::not_found ? Status::ok : s;
}

}  // namespace u3m::engine
