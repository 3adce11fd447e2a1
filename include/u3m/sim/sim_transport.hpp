// The simulator's Transport: books each transfer on a modelled link of the
// virtual clock instead of copying bytes. It never touches memory; the
// engine's pointers are fake (a pool over VirtualSegmentSource, SimHost).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "u3m/engine/transport.hpp"
#include "u3m/mem/link.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/sim/virtual_time.hpp"

namespace u3m::sim {

using engine::kNumLinks;

// One direction of one link.
// The one link model (Note [Link model] in mem/link.hpp).
using mem::LinkModel;

struct SimTransportConfig {
  std::array<LinkModel, kNumLinks> links{};  // indexed by engine::Link
  // h2s and s2h are one NVMe device: writes and reads queue behind each other.
  bool ssd_shared = true;
  // Bytes the modelled SSD holds; 0 = no SSD tier (has_ssd() is false).
  std::uint64_t ssd_capacity = 0;
  // Throws InputError naming the field; the SSD links are checked only when
  // there is an SSD tier.
  void validate() const;
  std::string describe() const;  // "d2h 25 GB/s + 10 us, ..." for labels
};

// Links from a hardware profile: the host link's practical bandwidth and
// latency for d2h/h2d; for h2s/s2h the NVMe write/read bandwidth times the
// drives `ssd_cards` cards get (drives_per_node / cards_per_node each) and the
// drive's latency. ssd_cards = 1: one card's static share; N: the drives of N
// cards pooled, for an SSD link the N cards share (SharedLinks). The profile
// has no field for a shared NVMe device, so ssd_shared keeps its default
// (one drive serves both directions).
SimTransportConfig links_from_profile(const HwProfile& hw, std::uint64_t ssd_capacity,
                                      std::uint32_t ssd_cards = 1);

struct SimLinkStats {
  std::uint64_t transfers = 0, bytes = 0, failures = 0;
  std::uint64_t busy_ns = 0;   // time the link carried bytes (latency excluded)
  std::uint64_t queue_ns = 0;  // summed time transfers waited for the link
};

// Links booked by several transports on one clock: the node's NVMe drives,
// which every card's SSD traffic crosses (Note [Link model]). It must
// outlive the transports that book on it.
struct SharedLinks {
  std::array<mem::LinkSchedule, kNumLinks> schedule{};  // per channel, as SimTransport's own
  std::array<SimLinkStats, kNumLinks> stats{};     // every transport's traffic on it
};

// How the simulated links book transfers: Note [Link model] in mem/link.hpp.
// The rate is the link's bandwidth, or Transfer::rate_limit when that is
// lower (the real transport books the same slots: Note [Link throttle] in
// transport.hpp). d2h and h2d are independent directions; h2s and s2h share
// one schedule when ssd_shared (an NVMe drive serves reads and writes from
// the same flash), each at its own bandwidth. With SharedLinks, h2s and s2h
// book on the shared schedules instead of the transport's own, so the SSD
// traffic of several simulated cards queues FIFO on one link: cards out of
// phase each get its whole bandwidth, cards in phase divide it (as a static
// 1/N share would).
class SimTransport final : public engine::Transport {
 public:
  // `clock` must outlive the transport, and the transport must outlive every
  // event it scheduled (run the clock's queue empty before destroying it).
  // `ssd`, when given, carries h2s/s2h (and must outlive the transport).
  SimTransport(VirtualTime& clock, SimTransportConfig config, SharedLinks* ssd = nullptr);

  void set_completion(engine::TransferDone done) override { done_ = std::move(done); }
  // Schedules the completion on the virtual clock; never calls it directly.
  void start(const engine::Transfer& t) override;
  engine::Status erase_ssd(std::uint64_t key) override;
  bool has_ssd() const override { return config_.ssd_capacity > 0; }
  bool ssd_holds(std::uint64_t key) const override { return ssd_.contains(key); }

  const SimLinkStats& link(engine::Link l) const { return stats_[static_cast<int>(l)]; }
  // Books `bytes` on `l` now for a transfer no engine asked for (the serving simulator's
  // decode reads of DRAM-resident KV, Note [KV streaming] in serving_sim.cpp): it queues with
  // the engine's transfers and counts in the link's stats. Returns when it is through (ns).
  std::uint64_t book(engine::Link l, std::uint64_t bytes);
  // Seconds a transfer issued now on `l` would wait for those booked before it.
  double ahead_s(engine::Link l) const;
  std::uint64_t ssd_used() const { return ssd_used_; }
  std::uint64_t ssd_peak() const { return ssd_peak_; }
  const SimTransportConfig& config() const { return config_; }
  // Completions scheduled and not yet run: what this transport still owes.
  std::size_t in_flight() const { return pending_.size() - free_.size(); }
  // Completions run so far (successes and failures).
  std::uint64_t completed() const { return completed_; }
  // Virtual time of the last completion (0 before any): where this card's
  // transfers ended, whatever other cards on the same clock do after.
  std::uint64_t last_done_ns() const { return last_done_ns_; }

 private:
  struct Pending {  // a transfer whose completion is scheduled
    engine::Transfer t;
    engine::Status status;
  };
  int channel(engine::Link l) const;
  mem::LinkSchedule& schedule(engine::Link l);
  void complete(std::uint32_t slot);

  VirtualTime& clock_;
  SimTransportConfig config_;
  engine::TransferDone done_;
  std::array<mem::LinkSchedule, kNumLinks> schedule_{};  // per channel
  std::array<SimLinkStats, kNumLinks> stats_{};
  std::unordered_map<std::uint64_t, std::uint64_t> ssd_;  // key -> bytes held (bookkeeping)
  std::vector<Pending> pending_;                          // by slot
  std::vector<std::uint32_t> free_;                       // slots of pending_ to reuse
  std::uint64_t ssd_used_ = 0, ssd_peak_ = 0;
  SharedLinks* shared_ssd_ = nullptr;
  std::uint64_t completed_ = 0;
  std::uint64_t last_done_ns_ = 0;
};

}  // namespace u3m::sim
