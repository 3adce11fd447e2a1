// static-offload (ZeRO-Offload): the optimizer step runs on the host over
// DRAM, where its state lives; only optimizer state may leave the device,
// everything else is pinned there; the trace's next 2 ops are prefetched
// (the updated weights).
#include <limits>

#include "policies.hpp"

namespace u3m::policy {
namespace {

class StaticOffload final : public TieringPolicy {
 public:
  explicit StaticOffload(const trace::Trace& t) : trace_(t) {}
  std::string_view name() const override { return "static-offload"; }
  engine::Engine::VictimOrder victim_order() const override {
    return engine::Engine::VictimOrder::scores;
  }
  // Device copies: optimizer state first (0), the rest never (+inf); host
  // copies in LRU order (all 0).
  engine::Engine::Scores initial_scores(std::uint32_t tensor, std::size_t) const override {
    return {optimizer_role(trace_.tensors[tensor].role) ? 0.0
                                                        : std::numeric_limits<double>::infinity(),
            0.0};
  }
  std::optional<Tier> home_tier(const trace::Tensor& x) const override {
    return optimizer_role(x.role) ? Tier::host : Tier::device;
  }
  bool optimizer_on_host() const override { return true; }
  void on_step(std::size_t step, StepContext& ctx) override { prefetch_ahead(step, 2, ctx); }

 private:
  const trace::Trace& trace_;
};

}  // namespace

std::unique_ptr<TieringPolicy> make_static_offload(const PolicyInputs& in) {
  return std::make_unique<StaticOffload>(in.trace);
}

}  // namespace u3m::policy
