// lru: recency as the prediction.
//
// Note [LRU as a predictor]
// LRU does not predict times; it ranks by recency. To compare it with the
// others on "the next H steps", it predicts that the tensors touched in the
// last H steps are the ones touched in the next H steps (for a stationary
// access stream the two sets have the same expected size), and estimates a
// tensor's next access as far ahead as its last one lies behind.
#include "predictors_impl.hpp"

namespace u3m::predict {
namespace {

class LruPredictor final : public Predictor {
 public:
  std::string_view name() const override { return "lru"; }
  void observe(const Access& a) override {
    track_time(a);
    next_step_ = a.step + 1;
    if (a.kind == trace::EventKind::free)
      list_.remove(a.tensor);
    else
      list_.touch(a.tensor, a.step);
  }
  void predict(std::uint32_t horizon, std::vector<Predicted>& out) override {
    out.clear();
    list_.walk([&](std::uint32_t t, std::uint64_t step) {
      std::uint64_t behind = next_step_ - 1 - step;
      if (behind >= horizon) return false;
      out.push_back({t, static_cast<std::uint32_t>(behind)});
      return true;
    });
  }

 private:
  RecencyList list_;
  std::uint64_t next_step_ = 0;
};

}  // namespace

std::unique_ptr<Predictor> make_lru() {
  return std::make_unique<LruPredictor>();
}

}  // namespace u3m::predict
