// belady: as u3m's placement, but victims by Belady (the farthest next use,
// from the whole trace) and a perfect lookahead of 8 ops. Clairvoyant, yet
// not a bound: heat can beat Belady's victims when links, not misses, bind
// (the physical bound of train capacity is the bound, Note [Physical bound]).
#include <algorithm>
#include <limits>
#include <vector>

#include "policies.hpp"

namespace u3m::policy {
namespace {

// Note [Belady scores]
// Belady evicts the copy whose next use is farthest. -(index of the next use
// after the current step) orders copies so at every step, and changes only
// when the tensor is used: set when it is registered, then published at
// each step that uses it (Note [Published victim scores] in engine.hpp).
// Never used again: -inf, evicted first.
class Belady final : public TieringPolicy {
 public:
  explicit Belady(const PolicyInputs& in)
      : host_optimizer_(in.host_optimizer), device_home_(in.device_home),
        uses_(in.trace.tensors.size()), next_gather_(next_gathers(in.trace, in.steps)) {
    for (std::size_t j = 0; j < in.steps.size(); ++j)
      for (const Touch& t : in.steps[j].touches) uses_[t.tensor].push_back(j);
  }
  std::string_view name() const override { return "belady"; }
  engine::Engine::VictimOrder victim_order() const override {
    return engine::Engine::VictimOrder::scores;
  }
  engine::Engine::Scores initial_scores(std::uint32_t tensor, std::size_t step) const override {
    // Registered for step `step` (leased by it, so no victim until on_step
    // republishes), or created at home by a step that only creates tensors
    // and has no on_step: ranked by its next use after that step.
    const double s = score(tensor, step);
    return {s, s};
  }
  std::optional<Tier> home_tier(const trace::Tensor& x) const override {
    return tiered_home(x, device_home_, host_optimizer_);
  }
  bool optimizer_on_host() const override { return host_optimizer_; }
  void on_step(std::size_t step, StepContext& ctx) override {
    updates_.clear();
    for (const Touch& t : ctx.steps()[step].touches) {
      const double s = score(t.tensor, step);
      updates_.push_back({StepContext::engine_id(t.tensor), {s, s}});
    }
    ctx.publish(updates_);
    prefetch_ahead(step, 8, ctx);
    stream_layer_ahead(step, next_gather_, ctx);  // Note [Layer-ahead streaming] in u3m.cpp
  }

 private:
  double score(std::uint32_t tensor, std::size_t after) const {
    const auto& u = uses_[tensor];
    const auto it = std::upper_bound(u.begin(), u.end(), after);
    return it == u.end() ? -std::numeric_limits<double>::infinity() : -static_cast<double>(*it);
  }
  bool host_optimizer_, device_home_;
  std::vector<std::vector<std::size_t>> uses_;  // steps using each tensor, ascending
  std::vector<engine::Engine::ScoreUpdate> updates_;
  std::vector<std::size_t> next_gather_;
};

}  // namespace

std::unique_ptr<TieringPolicy> make_belady(const PolicyInputs& in) {
  return std::make_unique<Belady>(in);
}

}  // namespace u3m::policy
