// KV eviction policies as classes (issue 15 item 5; Note [Eviction order] in
// src/kv/block_manager.cpp): each gives a token block its priority when a request touches it
// (lower goes first). The block manager keeps the ordered victim sets and the rules every
// policy shares (a prefix never ranks below its extension; pinned blocks are never victims).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

namespace u3m::kv {

struct KvGeometry;

// The names users give (KvConfig::policy, `KvConfig(policy=...)` in Python, serve policies).
enum class EvictionPolicy : std::uint8_t { lru, lfu, pgdsf };
std::string_view to_string(EvictionPolicy p);
// "lru", "lfu" (LFU with exponential aging), "pgdsf"; InputError naming `where` and the choices.
EvictionPolicy parse_eviction_policy(std::string_view name, std::string_view where);

// What a policy keeps of a token block between touches.
struct BlockUse {
  std::uint64_t freq = 0;       // uses, this one included
  double decayed = 0;           // LFU: uses, halved every half-life
  std::uint64_t last_tick = 0;  // LFU: when `decayed` was last updated
};

class Eviction {
 public:
  virtual ~Eviction() = default;
  // The priority of token block number `index` of its sequence, touched at admission tick
  // `now` (one tick per admission); may update `use` (freq is already counted).
  virtual double priority(BlockUse& use, std::uint32_t index, std::uint64_t now) = 0;
  // A cached block of priority `prio` left the cache (PGDSF's clock ages by it).
  virtual void dropped(double prio) { (void)prio; }
};

// LruEviction, LfuEviction and PgdsfEviction (src/kv/eviction.cpp), by name.
std::unique_ptr<Eviction> make_eviction(EvictionPolicy p, const KvGeometry& g,
                                        double lfu_half_life);

}  // namespace u3m::kv
