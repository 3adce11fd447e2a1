#include "u3m/kv/recompute.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

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

// Note [Blend cost]
// CacheBlend (Yao et al., EuroSys 2025, section 4) fixes a reused chunk's KV by recomputing
// the tokens whose KV deviates most from a full prefill, about 15% by default. It finds them
// with a first layer computed for every token of the chunk (then narrows layer by layer,
// which this count takes as settled after the first). So a blended block of t tokens costs
//   ceil(fraction * t)  tokens through all layers (the recomputed ones), plus
//   ceil(t / layers)    the selection layer: one layer of all t tokens, counted as t / layers
//                       tokens through all of them (exact for the linear FLOPs, which
//                       dominate at RAG lengths; attention is charged at the block's start).
// The rest of the block is fetched: its source's bytes are copied into the request's own block
// and its keys re-rotated to their new positions (read and write of K: the driver charges
// those bytes). Capped at t. At fraction 0 nothing is selected, so nothing is charged: pure
// reuse with re-rotation only.
std::uint32_t blend_recompute_tokens(std::uint32_t tokens, double fraction, std::uint32_t layers) {
  if (!(fraction >= 0 && fraction <= 1))
    throw std::invalid_argument(fmt::format("kv: blend fraction {} is not in [0, 1]", fraction));
  if (tokens == 0 || fraction == 0) return 0;  // pure reuse: nothing to select
  // Less a hair, so that 0.15 * 20 is 3 and not 3.0000000000000004.
  const auto recompute = static_cast<std::uint64_t>(std::ceil(fraction * tokens - 1e-9));
  const std::uint64_t selection = layers ? (tokens + layers - 1) / layers : tokens;
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(tokens, recompute + selection));
}

}  // namespace u3m::kv
