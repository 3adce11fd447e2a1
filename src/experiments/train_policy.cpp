// The training policies (Note [Training policies] in train_policy.hpp).
#include "u3m/experiments/train_policy.hpp"

#include <limits>
#include <memory>

#include "u3m/policy/heat.hpp"
#include "u3m/policy/placement.hpp"
#include "u3m/predict/predictor.hpp"
#include "u3m/util/error.hpp"

namespace u3m::experiments {

using engine::Tier;
using sim::PrefetchContext;
using trace::Role;

bool optimizer_role(Role r) {
  return r == Role::optim_master || r == Role::optim_m || r == Role::optim_v;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The trace index of an engine id (PrefetchContext::engine_id's inverse).
std::uint32_t tensor_of(engine::TensorId id) {
  return static_cast<std::uint32_t>(id - 1);
}

// Next use of each tensor after the current step, from the whole trace (the
// oracle's knowledge).
class NextUse {
 public:
  explicit NextUse(const std::vector<sim::Step>& steps, std::size_t tensors)
      : uses_(tensors), pos_(tensors, 0) {
    for (std::size_t j = 0; j < steps.size(); ++j) {
      for (const sim::Touch& t : steps[j].touches) uses_[t.tensor].push_back(j);
    }
  }
  void at(std::size_t step) { now_ = step; }
  // Steps until the next use after now; +inf if never.
  double distance(std::uint32_t t) {
    auto& u = uses_[t];
    std::size_t& p = pos_[t];
    while (p < u.size() && u[p] <= now_) ++p;
    return p < u.size() ? static_cast<double>(u[p] - now_) : kInf;
  }

 private:
  std::vector<std::vector<std::size_t>> uses_;
  std::vector<std::size_t> pos_;
  std::size_t now_ = 0;
};

// State shared by the u3m policy's hooks: the heat of each tensor, and the
// predictor's current window.
struct U3mState {
  std::unique_ptr<predict::Predictor> predictor;
  std::unique_ptr<predict::TraceFeed> feed;
  policy::HeatTracker heat;
  std::vector<std::uint8_t> in_window;
  std::vector<predict::Predicted> entered;
  std::vector<std::uint32_t> left;
  std::uint64_t now_ns = 0;
  std::uint32_t horizon = 16;
  bool host_optimizer = false;
};

}  // namespace

TrainPolicy make_train_policy(const std::string& name, const TrainPolicyInputs& in) {
  const trace::Trace& t = in.trace;
  const std::vector<sim::Step>& steps = in.steps;
  const bool host_optimizer = in.host_optimizer;
  TrainPolicy p;
  // Loaded weights and optimizer state rest on the device for the untiered
  // policies, in DRAM where the placement rules say for the tiered ones.
  p.home = [](const trace::Tensor&) { return Tier::device; };
  const policy::PlacementRules rules = policy::PlacementRules::named("u3m");
  auto placed = [rules](const trace::Tensor& x) {
    Tier h = rules.home(x.role, x.layer, trace::kNoLayer);
    return h == Tier::ssd ? Tier::host : h;  // created in DRAM; pressure spills it to SSD
  };
  if (name == "hbm-only") {
    p.victim = [](engine::TensorId, Tier) { return kInf; };
    p.prefetch = sim::no_prefetch();
  } else if (name == "static-offload") {
    p.optimizer_on_host = true;
    p.home = [](const trace::Tensor& x) {
      return optimizer_role(x.role) ? Tier::host : Tier::device;
    };
    p.victim = [&t](engine::TensorId id, Tier tier) {
      if (tier != Tier::device) return 0.0;
      return optimizer_role(t.tensors[tensor_of(id)].role) ? 0.0 : kInf;
    };
    p.prefetch = sim::lookahead_prefetch(2);
  } else if (name == "lru") {
    p.home = placed;
    p.prefetch = sim::no_prefetch();
  } else if (name == "u3m") {
    p.optimizer_on_host = host_optimizer;
    p.home = placed;
    auto st = std::make_shared<U3mState>();
    st->host_optimizer = host_optimizer;
    st->feed = std::make_unique<predict::TraceFeed>(t);
    st->predictor = predict::make_predictor("u3m-seq", st->feed.get());
    st->in_window.assign(t.tensors.size(), 0);
    for (std::uint32_t i = 0; i < t.tensors.size(); ++i) st->heat.set_tensor(i, t.tensors[i].bytes);
    p.victim = [st](engine::TensorId id, Tier) {
      const std::uint32_t i = tensor_of(id);
      // Expected soon: keep, unless nothing else can go (large, finite).
      return st->heat.heat(i, st->now_ns) + (st->in_window[i] ? 1e12 : 0.0);
    };
    p.prefetch = [st](std::size_t j, PrefetchContext& ctx) {
      st->now_ns = ctx.now_ns();
      const auto& feed = *st->feed;
      for (std::size_t e = feed.step_begin(j); e < feed.step_begin(j + 1); ++e) {
        predict::Access a = feed.access_at(e, j);
        a.time_ns = st->now_ns;  // virtual time, not the trace's nominal stamps
        st->predictor->observe(a);
        if (predict::is_access(a.kind)) st->heat.access(a.tensor, st->now_ns);
      }
      st->predictor->step_done();
      st->predictor->predict_window_delta(st->horizon, st->entered, st->left);
      for (std::uint32_t x : st->left) st->in_window[x] = 0;
      for (const predict::Predicted& x : st->entered) {
        st->in_window[x.tensor] = 1;
        // State the host optimizer works on stays in DRAM.
        if (!(st->host_optimizer && optimizer_role(ctx.trace().tensors[x.tensor].role)))
          ctx.prefetch(x.tensor);
      }
    };
  } else if (name == "oracle") {
    p.optimizer_on_host = host_optimizer;
    p.home = placed;
    auto next = std::make_shared<NextUse>(steps, t.tensors.size());
    p.victim = [next](engine::TensorId id, Tier) {
      return -next->distance(tensor_of(id));  // farthest first
    };
    auto ahead = sim::lookahead_prefetch(8);
    p.prefetch = [next, ahead](std::size_t j, PrefetchContext& ctx) {
      next->at(j);
      ahead(j, ctx);
    };
  } else {
    input_error("--policy",
                "unknown policy '{}' (expected hbm-only, static-offload, lru, u3m or oracle)",
                name);
  }
  return p;
}

}  // namespace u3m::experiments
