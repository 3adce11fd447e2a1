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

  Worker(BackendTransport& o, Link l) : owner(o), link(l) {
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

BackendTransport::BackendTransport(mem::DeviceBackend& device, mem::SsdStore* ssd)
    : device_(device), ssd_(ssd) {
  for (int i = 0; i < kNumLinks; ++i) {
    workers_[i] = std::make_unique<Worker>(*this, static_cast<Link>(i));
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
