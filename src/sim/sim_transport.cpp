#include "u3m/sim/sim_transport.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::sim {

namespace {
using mem::seconds_to_ns;
bool ssd_link(int i) {
  return i == static_cast<int>(engine::Link::h2s) || i == static_cast<int>(engine::Link::s2h);
}
}  // namespace

void SimTransportConfig::validate() const {
  for (int i = 0; i < kNumLinks; ++i) {
    if (ssd_link(i) && ssd_capacity == 0) continue;
    links[i].validate("sim links", engine::to_string(static_cast<engine::Link>(i)),
                      /*unbounded_ok=*/false);
  }
}

std::string SimTransportConfig::describe() const {
  std::string out;
  for (int i = 0; i < kNumLinks; ++i) {
    if (ssd_link(i) && ssd_capacity == 0) continue;
    if (!out.empty()) out += ", ";
    out +=
        fmt::format("{} {:.3g} GB/s + {:.3g} us", engine::to_string(static_cast<engine::Link>(i)),
                    links[i].bandwidth / 1e9, links[i].latency_s * 1e6);
  }
  if (ssd_capacity > 0 && ssd_shared) out += " (h2s/s2h share one drive)";
  return out;
}

SimTransportConfig links_from_profile(const HwProfile& hw, std::uint64_t ssd_capacity,
                                      std::uint32_t ssd_cards) {
  SimTransportConfig c;
  const LinkModel pcie = hw.host_link.model();
  c.links[static_cast<int>(engine::Link::d2h)] = pcie;
  c.links[static_cast<int>(engine::Link::h2d)] = pcie;
  // A card's share of the node's drives (profile.hpp: bandwidths are per drive).
  const double drives =
      hw.ssd.drives_per_node.si / hw.node.cards_per_node.si * static_cast<double>(ssd_cards);
  c.links[static_cast<int>(engine::Link::h2s)] = {hw.ssd.write_bandwidth.si * drives,
                                                  hw.ssd.write_latency.si};
  c.links[static_cast<int>(engine::Link::s2h)] = {hw.ssd.read_bandwidth.si * drives,
                                                  hw.ssd.read_latency.si};
  c.ssd_capacity = ssd_capacity;
  return c;
}

SimTransport::SimTransport(VirtualTime& clock, SimTransportConfig config, SharedLinks* ssd)
    : clock_(clock), config_(config), shared_ssd_(ssd) {
  config_.validate();
}

int SimTransport::channel(engine::Link l) const {
  return config_.ssd_shared && l == engine::Link::s2h ? static_cast<int>(engine::Link::h2s)
                                                      : static_cast<int>(l);
}

mem::LinkSchedule& SimTransport::schedule(engine::Link l) {
  const int c = channel(l);
  return shared_ssd_ && ssd_link(c) ? shared_ssd_->schedule[c] : schedule_[c];
}

void SimTransport::start(const engine::Transfer& t) {
  const int li = static_cast<int>(t.link);
  const LinkModel& m = config_.links[li];
  const std::uint64_t now = clock_.now_ns();
  engine::Status status = engine::Status::ok;
  if (ssd_link(li) && !has_ssd()) {
    status = engine::Status::unsupported;
  } else if (t.link == engine::Link::h2s) {
    // Space is taken when the write is issued, as the real store reserves extents.
    auto it = ssd_.find(t.tensor);
    const std::uint64_t old = it == ssd_.end() ? 0 : it->second;
    if (ssd_used_ - old + t.bytes > config_.ssd_capacity) {
      status = engine::Status::no_space;
    } else {
      ssd_used_ = ssd_used_ - old + t.bytes;
      ssd_peak_ = std::max(ssd_peak_, ssd_used_);
      ssd_[t.tensor] = t.bytes;
    }
  } else if (t.link == engine::Link::s2h && !ssd_.contains(t.tensor)) {
    status = engine::Status::io_error;  // the engine asked for a copy it never wrote
  }

  SimLinkStats& st = stats_[li];
  std::uint64_t done_at = now + seconds_to_ns(m.latency_s);
  if (mem::ok(status)) {
    const double rate = t.rate_limit > 0 ? std::min(m.bandwidth, t.rate_limit) : m.bandwidth;
    const mem::LinkSchedule::Slot slot = schedule(t.link).book(now, t.bytes, rate);
    const std::uint64_t s = slot.start_ns, hold = slot.free_ns - slot.start_ns;
    done_at = slot.free_ns + seconds_to_ns(m.latency_s);
    st.busy_ns += hold;
    st.queue_ns += s - now;
    if (shared_ssd_ && ssd_link(li)) {
      shared_ssd_->stats[li].busy_ns += hold;
      shared_ssd_->stats[li].queue_ns += s - now;
    }
  }
  // A refused transfer fails after the link's latency, without holding the link.
  // The event captures only a slot index, small enough for std::function's
  // inline buffer: no allocation per transfer.
  std::uint32_t slot;
  if (free_.empty()) {
    slot = static_cast<std::uint32_t>(pending_.size());
    pending_.push_back(Pending{t, status});
  } else {
    slot = free_.back();
    free_.pop_back();
    pending_[slot] = Pending{t, status};
  }
  clock_.schedule_at(done_at, [this, slot] { complete(slot); });
}

void SimTransport::complete(std::uint32_t slot) {
  const Pending p = pending_[slot];
  free_.push_back(slot);
  ++completed_;
  last_done_ns_ = clock_.now_ns();
  const int li = static_cast<int>(p.t.link);
  auto count = [&p](SimLinkStats& s) {
    if (mem::ok(p.status)) {
      ++s.transfers;
      s.bytes += p.t.bytes;
    } else {
      ++s.failures;
    }
  };
  count(stats_[li]);
  if (shared_ssd_ && ssd_link(li)) count(shared_ssd_->stats[li]);
  if (done_) done_(p.t, p.status);
}

std::uint64_t SimTransport::book(engine::Link l, std::uint64_t bytes) {
  const int li = static_cast<int>(l);
  const LinkModel& m = config_.links[li];
  const std::uint64_t now = clock_.now_ns();
  const mem::LinkSchedule::Slot slot = schedule(l).book(now, bytes, m.bandwidth);
  SimLinkStats& st = stats_[li];
  ++st.transfers;
  st.bytes += bytes;
  st.busy_ns += slot.free_ns - slot.start_ns;
  st.queue_ns += slot.start_ns - now;
  return slot.free_ns + seconds_to_ns(m.latency_s);
}

double SimTransport::ahead_s(engine::Link l) const {
  const int c = channel(l);
  const mem::LinkSchedule& s = shared_ssd_ && ssd_link(c) ? shared_ssd_->schedule[c] : schedule_[c];
  return s.ahead_s(clock_.now_ns());
}

engine::Status SimTransport::erase_ssd(std::uint64_t key) {
  auto it = ssd_.find(key);
  if (it == ssd_.end()) return engine::Status::not_found;
  ssd_used_ -= it->second;
  ssd_.erase(it);
  return engine::Status::ok;
}

}  // namespace u3m::sim
