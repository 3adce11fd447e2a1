// lru: loaded state created where the seed rules place it, least recently
// used evicted first, demand fetches only; the optimizer where the caller
// placed it (the settings search tries both).
#include "policies.hpp"

namespace u3m::policy {
namespace {

class Lru final : public TieringPolicy {
 public:
  Lru(bool host_optimizer, bool device_home)
      : host_optimizer_(host_optimizer), device_home_(device_home) {}
  std::string_view name() const override { return "lru"; }
  bool optimizer_on_host() const override { return host_optimizer_; }
  std::optional<Tier> home_tier(const trace::Tensor& x) const override {
    return tiered_home(x, device_home_, host_optimizer_);
  }
  void on_step(std::size_t, StepContext&) override {}

 private:
  bool host_optimizer_, device_home_;
};

}  // namespace

std::unique_ptr<TieringPolicy> make_lru(const PolicyInputs& in) {
  return std::make_unique<Lru>(in.host_optimizer, in.device_home);
}

}  // namespace u3m::policy
