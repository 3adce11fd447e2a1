// hbm-only: everything on the device and nothing may leave it (+inf scores),
// no prefetch: the trace fits in HBM or it does not.
#include <limits>

#include "policies.hpp"

namespace u3m::policy {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

class HbmOnly final : public TieringPolicy {
 public:
  std::string_view name() const override { return "hbm-only"; }
  engine::Engine::VictimOrder victim_order() const override {
    return engine::Engine::VictimOrder::scores;
  }
  engine::Engine::Scores initial_scores(std::uint32_t, std::size_t) const override {
    return {kNever, kNever};
  }
  std::optional<Tier> home_tier(const trace::Tensor&) const override { return Tier::device; }
  void on_step(std::size_t, StepContext&) override {}
};

}  // namespace

std::unique_ptr<TieringPolicy> make_hbm_only(const PolicyInputs&) {
  return std::make_unique<HbmOnly>();
}

}  // namespace u3m::policy
