// lru: loaded state created where the seed rules place it, least recently
// used evicted first, demand fetches only.
#include "policies.hpp"

namespace u3m::policy {
namespace {

class Lru final : public TieringPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  std::optional<Tier> home_tier(const trace::Tensor& x) const override { return seed_home(x); }
  void on_step(std::size_t, StepContext&) override {}
};

}  // namespace

std::unique_ptr<TieringPolicy> make_lru(const PolicyInputs&) {
  return std::make_unique<Lru>();
}

}  // namespace u3m::policy
