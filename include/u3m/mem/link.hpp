// The one link-timing model (issue 15): what a transfer over a link costs
// and when it is through. The simulator's transport books its completions
// with it, the real transport paces a throttled link with it, device-emu
// throttles its copies with it, and the policy keeps its view of a link's
// backlog with it. Decision code: time comes in as arguments.
#pragma once

#include <cstdint>
#include <string_view>

namespace u3m::mem {

// Note [Link model]
// A link is a FIFO pipe: a transfer of B bytes issued at t starts carrying
// bytes at s = max(t, the link's free time), holds the link for B / rate, and
// completes at s + B / rate + latency. Latency is pipelined (a DMA's setup
// and flight time, an NVMe command's service time overlap the previous
// transfer's data), so concurrent transfers share the link's bandwidth
// between them: N transfers of B bytes issued together finish by
// latency + N*B/rate. Seconds become nanoseconds by rounding to the nearest
// (llround), everywhere, so two users of the model agree to the nanosecond.
struct LinkModel {
  double bandwidth = 0;  // bytes/s the link carries; 0 = unbounded (a real link not throttled)
  double latency_s = 0;  // fixed cost of one transfer, >= 0
  // Seconds the bytes hold the link (0 when unbounded) and to move them
  // over an idle link (hold + latency).
  double hold_s(std::uint64_t bytes) const;
  double seconds(std::uint64_t bytes) const { return hold_s(bytes) + latency_s; }
  // Throws InputError "where: name.bandwidth ..." unless bandwidth > 0 (or
  // 0 where `unbounded_ok`) and latency >= 0, both finite.
  void validate(std::string_view where, std::string_view name, bool unbounded_ok) const;
};

std::uint64_t seconds_to_ns(double s);  // llround(s * 1e9), s >= 0

// One link's schedule of booked transfers (Note [Link model]).
class LinkSchedule {
 public:
  struct Slot {
    std::uint64_t start_ns = 0;  // when its bytes start to flow
    std::uint64_t free_ns = 0;   // when they are through (the link is free again)
  };
  // Books `bytes` at `rate` bytes/s behind what is booked, issued at now_ns.
  // An unbounded link (rate <= 0) holds nothing: the slot starts and ends
  // at max(now, free).
  Slot book(std::uint64_t now_ns, std::uint64_t bytes, double rate);
  // How long a transfer issued at now_ns would wait for those booked before it.
  double ahead_s(std::uint64_t now_ns) const;
  std::uint64_t free_ns() const { return free_ns_; }

 private:
  std::uint64_t free_ns_ = 0;
};

}  // namespace u3m::mem
