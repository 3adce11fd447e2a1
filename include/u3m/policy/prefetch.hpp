// Just-in-time prefetch (MISSION.md item 3, issue 5 item 3): when to start
// bringing a tensor to the device so that it arrives as its next use begins,
// from the link's transfer time. Decision code: every time is an argument,
// nothing reads a clock.
#pragma once

#include <cstdint>
#include <vector>

#include "u3m/mem/link.hpp"
#include "u3m/mem/status.hpp"

namespace u3m::policy {

// One direction of one link, as everything models it (Note [Link model] in
// mem/link.hpp).
using LinkCost = mem::LinkModel;

// Seconds to bring `bytes` to the device from `from` on idle links: 0 from
// the device, h2d from the host, s2h then h2d from the SSD (the engine
// stages SSD data through DRAM).
double fetch_seconds(std::uint64_t bytes, mem::Tier from, const LinkCost& h2d, const LinkCost& s2h);

// Note [Just-in-time prefetch]
// A tensor predicted for use in `until_use_s` seconds is fetched now when
//     until_use_s <= (transfer_s + queued_s) * factor + slack_ops * op_s
// where transfer_s is its transfer time on the path it must take, queued_s
// the work already queued ahead of it on that link and op_s the mean op
// time. Earlier would hold HBM (and push out something else) for nothing;
// later stalls compute. The margin covers what the estimate misses: the
// factor scales with the transfer (demand fetches and write-backs the policy
// did not issue share the link, the engine's link slots), the slack is one
// op of jitter in when the use comes (a decision is taken once per op, so a
// fetch due between two decision points must start at the earlier one). The
// predictor still needs an op-count window to look through (its cost is
// O(window) per op): the window must cover the slowest fetch, so it is the
// largest transfer time over the mean op time with the same margin, +1 for
// the op that runs meanwhile, clamped to [min_ops, max_ops].
struct JitConfig {
  double factor = 1.5;
  double slack_ops = 1;
  std::uint32_t min_ops = 8, max_ops = 256;
};

bool prefetch_due(double until_use_s, double transfer_s, double queued_s, double op_s,
                  const JitConfig& c);

// The predictor's window in ops (see the Note). op_s <= 0 (nothing measured
// yet) gives max_ops.
std::uint32_t horizon_ops(double max_transfer_s, double op_s, const JitConfig& c);

// The work a policy has queued on one link, as a FIFO schedule on the
// caller's clock (mem::LinkSchedule, Note [Link model] in mem/link.hpp):
// book() adds a transfer behind the ones already booked; ahead_s() is how
// long a transfer issued at `now_ns` would wait for them.
class LinkBacklog {
 public:
  explicit LinkBacklog(LinkCost link = {}) : link_(link) {}
  double ahead_s(std::uint64_t now_ns) const { return schedule_.ahead_s(now_ns); }
  void book(std::uint64_t bytes, std::uint64_t now_ns) {
    if (link_.bandwidth > 0) schedule_.book(now_ns, bytes, link_.bandwidth);  // 0 = unbounded
  }
  const LinkCost& link() const { return link_; }

 private:
  LinkCost link_;
  mem::LinkSchedule schedule_;
};

// The mean time from one op's start to the next, as an exponential moving
// average of the spacing of the caller's decision points (which includes the
// stalls the schedule should hide). `weight` is the newest sample's share.
class OpClock {
 public:
  explicit OpClock(double weight = 0.05) : weight_(weight) {}
  void tick(std::uint64_t now_ns);
  double mean_s() const { return mean_s_; }  // 0 until two ticks

 private:
  double weight_;
  double mean_s_ = 0;
  std::uint64_t last_ns_ = 0;
  bool started_ = false, measured_ = false;
};

// Note [Iteration profile]
// A training iteration repeats the previous one op for op, but its ops are
// far from equal: a ZeRO-3 all-gather takes ~10 ms, an Adam step on one
// weight ~0.3 ms. One mean op time then makes a fetch due during the
// optimizer phase ~10x too late. So the time to a use k ops ahead is read
// off the previous iteration: the time between its op at the same offset
// and the op k later (wrapping into its start for a use in the next
// iteration). This is online: only iterations already run are used. Until
// one iteration is complete, or past its end, the mean op time stands in.
class IterationProfile {
 public:
  // Call at every decision point with the op's iteration number.
  void tick(std::uint32_t iteration, std::uint64_t now_ns);
  // Seconds from the current decision point to the one `k` ops later;
  // `mean_op_s` where the previous iteration does not say.
  double until_s(std::uint64_t k, double mean_op_s) const;
  // The predictor window (in ops) that covers a fetch of `fetch_s` with the
  // margin from every point of the previous iteration: the largest number
  // of consecutive ops that take less than fetch_s * factor, + slack + 1,
  // clamped. horizon_ops(fetch_s, mean_op_s, c) before a full iteration.
  std::uint32_t horizon_ops(double fetch_s, double mean_op_s, const JitConfig& c) const;
  std::size_t previous_ops() const { return prev_.size(); }

 private:
  std::uint32_t iteration_ = 0;
  bool started_ = false;
  std::vector<std::uint64_t> prev_, cur_;  // decision times of each op, per iteration
};

}  // namespace u3m::policy
