// Recompute or fetch (Note [Recompute or fetch] in src/kv/recompute.cpp): for each token block
// of an admission's hit run whose slots the block manager promotes (up from SSD, or from DRAM
// into HBM), the cheaper way to get its KV into those slots. Decision code: it reads no clock
// and no link; the driver says what things cost through callbacks.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>

#include "u3m/kv/block_manager.hpp"

namespace u3m::kv {

enum class KvSource : std::uint8_t { fetch, recompute };
std::string_view to_string(KvSource s);

struct RecomputeCosts {
  // Seconds to recompute logical token block `block` of the prompt, all layers.
  std::function<double(std::uint32_t block)> recompute_s;
  // Seconds from now until `bytes` moved from `from` to `to` would be through, issued now
  // behind whatever the links already hold (their backlog).
  std::function<double(Tier from, Tier to, std::uint64_t bytes)> fetch_s;
  // Seconds `bytes` from `from` hold the first link they cross: what one fetch the request
  // chose adds to the backlog its later fetches see.
  std::function<double(Tier from, std::uint64_t bytes)> hold_s;
};

// The choices of one admission, block by block in prompt order. The driver carries out each
// choice (books or starts the fetch, or adds the block to the prefill) before asking about the
// next block, so fetch_s sees the request's own earlier fetches; choose() takes their link
// time back out of it.
class RecomputeOrFetch {
 public:
  // recompute_allowed = false: every block is fetched (a policy without the choice).
  RecomputeOrFetch(const RecomputeCosts& costs, bool recompute_allowed)
      : costs_(costs), allowed_(recompute_allowed) {}

  // `moves`: the promotion actions of token block `block`'s slots (from DRAM, SSD or both).
  KvSource choose(std::uint32_t block, std::span<const Action* const> moves);

 private:
  const RecomputeCosts& costs_;
  bool allowed_;
  std::array<double, kTiers> own_{};  // link time of this admission's fetches, by source tier
};

// Note [Blend cost] in src/kv/recompute.cpp: how many of a blended block's `tokens` its
// request runs through all `layers` again, at recompute share `fraction` (in [0, 1]).
std::uint32_t blend_recompute_tokens(std::uint32_t tokens, double fraction, std::uint32_t layers);
inline constexpr double kDefaultBlendFraction = 0.15;  // CacheBlend's default share

}  // namespace u3m::kv
