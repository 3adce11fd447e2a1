#include "u3m/kv/eviction.hpp"

#include <algorithm>
#include <cmath>

#include "u3m/kv/block_manager.hpp"
#include "u3m/util/error.hpp"

namespace u3m::kv {

namespace {
struct Named {
  EvictionPolicy p;
  std::string_view name;
};
constexpr Named kPolicies[] = {
    {EvictionPolicy::lru, "lru"}, {EvictionPolicy::lfu, "lfu"}, {EvictionPolicy::pgdsf, "pgdsf"}};
}  // namespace

std::string_view to_string(EvictionPolicy p) {
  for (const Named& n : kPolicies)
    if (n.p == p) return n.name;
  return "?";
}

EvictionPolicy parse_eviction_policy(std::string_view name, std::string_view where) {
  for (const Named& n : kPolicies)
    if (name == n.name) return n.p;
  input_error(where, "unknown eviction policy '{}' (choices: lru, lfu, pgdsf)", name);
}

// Note [Eviction order] in block_manager.cpp gives the reasons for each.
namespace {

class LruEviction final : public Eviction {
 public:
  double priority(BlockUse&, std::uint32_t, std::uint64_t now) override {
    return static_cast<double>(now);
  }
};

class LfuEviction final : public Eviction {
 public:
  explicit LfuEviction(double half_life) : half_life_(half_life) {}
  double priority(BlockUse& use, std::uint32_t, std::uint64_t now) override {
    const double t = static_cast<double>(now);
    use.decayed =
        use.decayed * std::exp2(-(t - static_cast<double>(use.last_tick)) / half_life_) + 1;
    use.last_tick = now;
    return std::log2(use.decayed) + t / half_life_;
  }

 private:
  double half_life_;
};

class PgdsfEviction final : public Eviction {
 public:
  explicit PgdsfEviction(const KvGeometry& g) : g_(g) {}
  double priority(BlockUse& use, std::uint32_t index, std::uint64_t) override {
    return clock_ + static_cast<double>(use.freq) * g_.recompute_flops(index) /
                        static_cast<double>(g_.token_block_bytes());
  }
  void dropped(double prio) override { clock_ = std::max(clock_, prio); }

 private:
  KvGeometry g_;
  double clock_ = 0;  // the priority of the last block dropped
};

}  // namespace

std::unique_ptr<Eviction> make_eviction(EvictionPolicy p, const KvGeometry& g,
                                        double lfu_half_life) {
  switch (p) {
    case EvictionPolicy::lru:
      return std::make_unique<LruEviction>();
    case EvictionPolicy::lfu:
      return std::make_unique<LfuEviction>(lfu_half_life);
    case EvictionPolicy::pgdsf:
      return std::make_unique<PgdsfEviction>(g);
  }
  return std::make_unique<LruEviction>();
}

}  // namespace u3m::kv
