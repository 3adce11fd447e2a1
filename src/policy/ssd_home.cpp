// SsdHoming (policies.hpp): what a policy rests on the SSD, sent there from DRAM.
#include "policies.hpp"

namespace u3m::policy {

void SsdHoming::queue(std::uint32_t t) {
  if (queued_.size() <= t) queued_.resize(static_cast<std::size_t>(t) + 1, 0);
  if (queued_[t]) return;
  queued_[t] = 1;
  pending_.push_back(t);
}

std::size_t SsdHoming::pass(StepContext& ctx, const std::vector<std::uint8_t>* hold) {
  std::size_t sent = 0, keep = 0;
  for (std::uint32_t t : pending_) {
    const auto r = ctx.engine().residency(StepContext::engine_id(t));
    const bool done = !r || r->valid[static_cast<int>(Tier::ssd)] ||
                      (!r->valid[static_cast<int>(Tier::device)] &&
                       !r->valid[static_cast<int>(Tier::host)]);  // no data: nothing to send
    const bool ready = !done && !r->valid[static_cast<int>(Tier::device)] && !r->in_flight &&
                       r->readers == 0 && !r->writer && !(hold && t < hold->size() && (*hold)[t]);
    if (ready) {
      ctx.demote(t, Tier::host);
      ++sent;
    }
    if (done || ready)
      queued_[t] = 0;
    else
      pending_[keep++] = t;  // on the device, in use or moving: later
  }
  pending_.resize(keep);
  return sent;
}

}  // namespace u3m::policy
