// static-offload, zero-offload (ZeRO-Offload) and zero-infinity: the
// optimizer step runs on the host over DRAM; only optimizer state (and, for
// zero-offload and zero-infinity, gradients) may leave the device,
// everything else is pinned there; the trace's next 2 ops are prefetched
// (the updated weights). zero-offload also sends each gradient to the host
// as soon as the op that wrote it is done, as DeepSpeed's offload_optimizer
// streams gradients out during backward; static-offload leaves them on the
// device until the host step reads them. zero-infinity is zero-offload with
// the optimizer state resting on the NVMe SSD (Note [ZeRO-Infinity]).
//
// Note [ZeRO-Infinity]
// DeepSpeed's offload_optimizer with device "nvme" keeps the fp32 master
// weights and Adam's m and v on NVMe and steps them on the CPU a sub-group
// at a time, reading the next sub-group from NVMe into pinned DRAM buffers
// while the CPU updates the current one and writing the updated state back
// behind it (its aio engine; buffer_count at least the optimizer's states).
// Here: the state is created in DRAM and sent on to the SSD after its first
// use (SsdHoming), and at each step the state of the optimizer steps up to
// kStateAhead ops ahead is read from the SSD into DRAM at prefetch priority,
// so each host Adam step finds its state in DRAM while the SSD reads the
// next; after the step, the state goes back to the SSD. Parameters stay on
// the device (offload_param "nvme" is not modelled).
#include <limits>

#include "policies.hpp"

namespace u3m::policy {
namespace {

class StaticOffload final : public TieringPolicy {
 public:
  enum class Kind { static_offload, zero_offload, zero_infinity };
  StaticOffload(const trace::Trace& t, Kind kind, bool has_ssd)
      : trace_(t),
        kind_(kind),
        offload_grads_(kind != Kind::static_offload),
        state_on_ssd_(kind == Kind::zero_infinity && has_ssd) {}
  std::string_view name() const override {
    switch (kind_) {
      case Kind::static_offload: return "static-offload";
      case Kind::zero_offload: return "zero-offload";
      case Kind::zero_infinity: return "zero-infinity";
    }
    return "?";
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
    if (state_on_ssd_) state_from_ssd(step, ctx);
  }

 private:
  bool may_leave(trace::Role r) const {
    return optimizer_role(r) || (offload_grads_ && r == trace::Role::grad);
  }
  static constexpr std::size_t kStateAhead = 4;
  // Note [ZeRO-Infinity]: the previous step's state back to the SSD, the
  // next optimizer steps' state into DRAM.
  void state_from_ssd(std::size_t step, StepContext& ctx) {
    const auto& steps = ctx.steps();
    if (!started_) {  // loaded state was created in DRAM
      started_ = true;
      for (std::uint32_t i = 0; i < trace_.tensors.size(); ++i)
        if (optimizer_role(trace_.tensors[i].role)) ssd_.queue(i);
    }
    if (step > 0)
      for (const Touch& t : steps[step - 1].touches)
        if (optimizer_role(trace_.tensors[t.tensor].role)) ssd_.queue(t.tensor);
    ssd_.pass(ctx);
    for (std::size_t k = step + 1; k < steps.size() && k <= step + kStateAhead; ++k) {
      if (ctx.step_tier(k) != Tier::host) continue;
      for (const Touch& t : steps[k].touches)
        if (optimizer_role(trace_.tensors[t.tensor].role)) ctx.prefetch(t.tensor, Tier::host);
    }
  }
  const trace::Trace& trace_;
  Kind kind_;
  bool offload_grads_;
  bool state_on_ssd_;
  bool started_ = false;
  SsdHoming ssd_;
};

}  // namespace

std::unique_ptr<TieringPolicy> make_static_offload(const PolicyInputs& in) {
  return std::make_unique<StaticOffload>(in.trace, StaticOffload::Kind::static_offload, in.has_ssd);
}

std::unique_ptr<TieringPolicy> make_zero_offload(const PolicyInputs& in) {
  return std::make_unique<StaticOffload>(in.trace, StaticOffload::Kind::zero_offload, in.has_ssd);
}

std::unique_ptr<TieringPolicy> make_zero_infinity(const PolicyInputs& in) {
  return std::make_unique<StaticOffload>(in.trace, StaticOffload::Kind::zero_infinity, in.has_ssd);
}

}  // namespace u3m::policy
