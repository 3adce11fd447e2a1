// static-offload and zero-offload (ZeRO-Offload): the optimizer step runs on
// the host over DRAM, where its state lives; only optimizer state (and, for
// zero-offload, gradients) may leave the device, everything else is pinned
// there; the trace's next 2 ops are prefetched (the updated weights).
// zero-offload also sends each gradient to the host as soon as the op that
// wrote it is done, as DeepSpeed's offload_optimizer streams gradients out
// during backward; static-offload leaves them on the device until the host
// step reads them.
#include <limits>

#include "policies.hpp"

namespace u3m::policy {
namespace {

class StaticOffload final : public TieringPolicy {
 public:
  StaticOffload(const trace::Trace& t, bool offload_grads)
      : trace_(t), offload_grads_(offload_grads) {}
  std::string_view name() const override {
    return offload_grads_ ? "zero-offload" : "static-offload";
  }
  engine::Engine::VictimOrder victim_order() const override {
    return engine::Engine::VictimOrder::scores;
  }
  // Device copies: what may leave first (0), the rest never (+inf); host
  // copies in LRU order (all 0).
  engine::Engine::Scores initial_scores(std::uint32_t tensor, std::size_t) const override {
    return {may_leave(trace_.tensors[tensor].role) ? 0.0 : std::numeric_limits<double>::infinity(),
            0.0};
  }
  std::optional<Tier> home_tier(const trace::Tensor& x) const override {
    return optimizer_role(x.role) ? Tier::host : Tier::device;
  }
  bool optimizer_on_host() const override { return true; }
  void on_step(std::size_t step, StepContext& ctx) override {
    // The previous step's gradients are no longer leased: out they go.
    if (offload_grads_ && step > 0) {
      for (const Touch& t : ctx.steps()[step - 1].touches)
        if (t.writes && trace_.tensors[t.tensor].role == trace::Role::grad)
          ctx.demote(t.tensor, Tier::device);
    }
    prefetch_ahead(step, 2, ctx);
  }

 private:
  bool may_leave(trace::Role r) const {
    return optimizer_role(r) || (offload_grads_ && r == trace::Role::grad);
  }
  const trace::Trace& trace_;
  bool offload_grads_;
};

}  // namespace

std::unique_ptr<TieringPolicy> make_static_offload(const PolicyInputs& in) {
  return std::make_unique<StaticOffload>(in.trace, false);
}

std::unique_ptr<TieringPolicy> make_zero_offload(const PolicyInputs& in) {
  return std::make_unique<StaticOffload>(in.trace, true);
}

}  // namespace u3m::policy
