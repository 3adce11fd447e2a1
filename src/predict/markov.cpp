// markov-reuse: the design document's description of GMT-Reuse.
//
// Note [markov-reuse follows a description, not GMT's code]
// The design describes GMT-Reuse as "a Hot/Warm/Cold state per tensor plus a
// Markov chain over reuse distance". We implement that description, not the
// GMT artefact:
// - reuse distance of an access = op steps since the tensor's previous access;
//   it falls in class c = floor(log2(distance)) (kClasses classes);
// - one chain for all tensors, learned online: counts[c_prev][c_next], where
//   c_prev is the class of the tensor's previous reuse (row kClasses for a
//   tensor's first reuse); the predicted next class is the row's argmax;
// - the state follows the predicted distance: Hot (< kHotSteps), Warm
//   (< kWarmSteps), Cold (beyond; not predicted within any horizon here);
// - a Hot or Warm tensor is predicted at last access + 1.5 * 2^c (the middle
//   of the class), and stays predicted until half a class width after that.
#include <array>

#include "predictors_impl.hpp"
#include "u3m/predict/step_wheel.hpp"

namespace u3m::predict {
namespace {

constexpr int kClasses = 24;
constexpr std::uint64_t kHotSteps = 64;
constexpr std::uint64_t kWarmSteps = 4096;

int reuse_class(std::uint64_t d) {
  int c = 63 - __builtin_clzll(d);  // d >= 1
  return c < kClasses ? c : kClasses - 1;
}

class MarkovReusePredictor final : public Predictor {
 public:
  enum class Heat : std::uint8_t { cold, warm, hot };

  std::string_view name() const override { return "markov-reuse"; }
  void observe(const Access& a) override {
    track_time(a);
    step_ = a.step;
    if (a.tensor >= ts_.size()) ts_.resize(a.tensor + 1);
    T& s = ts_[a.tensor];
    if (a.kind == trace::EventKind::free) {
      wheel_.cancel(a.tensor);
      s.heat = Heat::cold;
      return;
    }
    if (!is_access(a.kind)) return;
    if (s.seen && a.step > s.last_step) {
      int c = reuse_class(a.step - s.last_step);
      int row = s.last_class < 0 ? kClasses : s.last_class;
      auto& r = counts_[row];
      if (++r[c] > r[argmax_[row]]) argmax_[row] = static_cast<std::uint8_t>(c);
      s.last_class = static_cast<std::int8_t>(c);
    }
    if (s.seen && a.step == s.last_step) return;  // second touch in one step
    s.seen = true;
    s.last_step = a.step;
    int row = s.last_class < 0 ? kClasses : s.last_class;
    if (counts_[row][argmax_[row]] == 0) {  // the chain knows nothing yet
      wheel_.cancel(a.tensor);
      return;
    }
    int next = argmax_[row];
    std::uint64_t width = std::uint64_t{1} << next;
    std::uint64_t dist = width + width / 2;
    s.heat = dist < kHotSteps ? Heat::hot : dist < kWarmSteps ? Heat::warm : Heat::cold;
    if (s.heat == Heat::cold)
      wheel_.cancel(a.tensor);
    else
      wheel_.schedule(a.tensor, a.step + dist, a.step + dist + width / 2);
  }
  void step_done() override { wheel_.advance(step_ + 1); }
  void predict(std::uint32_t horizon, std::vector<Predicted>& out) override {
    out.clear();
    std::uint64_t now = wheel_.now();
    wheel_.for_each(horizon, [&](std::uint32_t t, std::uint64_t at) {
      out.push_back({t, static_cast<std::uint32_t>(at > now ? at - now : 0)});
    });
  }

 private:
  struct T {
    std::uint64_t last_step = 0;
    std::int8_t last_class = -1;
    bool seen = false;
    Heat heat = Heat::cold;
  };
  std::vector<T> ts_;
  std::array<std::array<std::uint64_t, kClasses>, kClasses + 1> counts_{};
  std::array<std::uint8_t, kClasses + 1> argmax_{};
  StepWheel wheel_;
  std::uint64_t step_ = 0;
};

}  // namespace

std::unique_ptr<Predictor> make_markov_reuse() {
  return std::make_unique<MarkovReusePredictor>();
}

}  // namespace u3m::predict
