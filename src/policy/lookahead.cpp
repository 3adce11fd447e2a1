// lookahead: the trace-replay baseline. The trace is its own predictor: at
// each step the tensors of the step `lookahead` ops ahead are prefetched;
// LRU eviction; no home tiers; the optimizer where the caller placed it.
#include "policies.hpp"

namespace u3m::policy {

void prefetch_ahead(std::size_t step, unsigned k, StepContext& ctx) {
  if (k == 0) return;
  const auto& steps = ctx.steps();
  const std::size_t first = step == 0 ? 1 : step + k;
  for (std::size_t a = first; a <= step + k && a < steps.size(); ++a) {
    if (ctx.step_tier(a) != Tier::device) continue;
    for (const Touch& t : steps[a].touches) ctx.prefetch(t.tensor);
  }
}

namespace {

bool is_gather(const trace::Op& op) {
  return op.cls == trace::OpClass::collective && op.name.find("all_gather") != std::string::npos;
}

}  // namespace

std::vector<std::size_t> next_gathers(const trace::Trace& t, const std::vector<Step>& steps) {
  std::vector<std::size_t> out(steps.size(), SIZE_MAX);
  std::size_t next = SIZE_MAX;
  for (std::size_t j = steps.size(); j-- > 0;) {
    out[j] = next;
    if (is_gather(t.ops[steps[j].op])) next = j;
  }
  return out;
}

void stream_layer_ahead(std::size_t step, const std::vector<std::size_t>& next, StepContext& ctx) {
  if (step >= next.size() || next[step] == SIZE_MAX) return;
  const trace::Trace& tr = ctx.trace();
  if (!is_gather(tr.ops[ctx.steps()[step].op])) return;
  for (const Touch& t : ctx.steps()[next[step]].touches)
    if (!t.writes && tr.tensors[t.tensor].role == trace::Role::param) ctx.prefetch(t.tensor);
}

namespace {

class Lookahead final : public TieringPolicy {
 public:
  Lookahead(unsigned k, bool host_optimizer) : k_(k), host_optimizer_(host_optimizer) {}
  std::string_view name() const override { return "lookahead"; }
  bool optimizer_on_host() const override { return host_optimizer_; }
  void on_step(std::size_t step, StepContext& ctx) override { prefetch_ahead(step, k_, ctx); }

 private:
  unsigned k_;
  bool host_optimizer_;
};

}  // namespace

std::unique_ptr<TieringPolicy> make_lookahead(const PolicyInputs& in) {
  return std::make_unique<Lookahead>(in.lookahead, in.host_optimizer);
}

}  // namespace u3m::policy
