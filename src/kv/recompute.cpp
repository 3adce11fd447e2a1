#include "u3m/kv/recompute.hpp"

#include <algorithm>

namespace u3m::kv {

// Note [Recompute or fetch]
// A cached block found on SSD, or in DRAM with HBM room (Note [Promoting DRAM hits] in
// block_manager.cpp), is promoted by the manager at admission. Its KV can reach the promoted
// slots two ways:
//   fetch      the moves, behind what the links carry now. A token block whose groups come up
//              from DRAM and from SSD waits for the slower source. The request's own fetches
//              pipeline behind each other: the backlog a block sees is what was on the links
//              before this admission plus its own link time, not its siblings' (they are the
//              request's own queue, which the prefill waits for anyway).
//   recompute  the block's FLOPs at the achievable rate (recompute_flops grows with the
//              block's position, through attention). Recomputes run serially in the prefill.
// The cheaper one wins; ties fetch (no compute spent). Only the driver knows the costs (the
// serving simulator from its profile and its links), so they come in as callbacks: the rule
// stays here, beside the manager whose promotions it prices.
KvSource RecomputeOrFetch::choose(std::uint32_t block, std::span<const Action* const> moves) {
  std::array<std::uint64_t, kTiers> from_bytes{};
  std::array<Tier, kTiers> from_to{};
  for (const Action* m : moves) {
    from_bytes[static_cast<int>(m->from)] += m->bytes;
    from_to[static_cast<int>(m->from)] = m->to;
  }
  if (allowed_) {
    double fetch = 0;
    for (Tier f : {Tier::host, Tier::ssd}) {
      const int i = static_cast<int>(f);
      if (from_bytes[i] > 0) fetch = std::max(fetch, costs_.fetch_s(f, from_to[i], from_bytes[i]) - own_[i]);
    }
    if (costs_.recompute_s(block) < fetch) return KvSource::recompute;
  }
  for (Tier f : {Tier::host, Tier::ssd}) {
    const int i = static_cast<int>(f);
    if (from_bytes[i] > 0) own_[i] += costs_.hold_s(f, from_bytes[i]);
  }
  return KvSource::fetch;
}

std::string_view to_string(KvSource s) {
  return s == KvSource::fetch ? "fetch" : "recompute";
}

}  // namespace u3m::kv
