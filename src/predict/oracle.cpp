// oracle: reads the future; the upper bound for the others.
//
// It names exactly the tensors that the next H steps read or write, but only
// those already seen in some earlier event: no online predictor can name a
// tensor before it exists, so this is the bound that applies to them. (The
// metrics report first-touch accesses separately: see docs/prediction.md.)
#include "predictors_impl.hpp"

namespace u3m::predict {
namespace {

class OraclePredictor final : public Predictor {
 public:
  explicit OraclePredictor(const TraceFeed& feed)
      : steps_(build_step_tensors(feed)),
        known_(feed.trace().tensors.size(), false),
        out_stamp_(feed.trace().tensors.size(), 0) {}
  std::string_view name() const override { return "oracle"; }
  void observe(const Access& a) override {
    track_time(a);
    known_[a.tensor] = true;
    next_step_ = a.step + 1;
  }
  void predict(std::uint32_t horizon, std::vector<Predicted>& out) override {
    out.clear();
    ++out_now_;
    std::size_t n = steps_.begin.size() - 1;
    for (std::size_t s = next_step_; s < next_step_ + horizon && s < n; ++s)
      for (std::size_t k = steps_.begin[s]; k < steps_.begin[s + 1]; ++k) {
        std::uint32_t t = steps_.tensors[k];
        if (!known_[t] || out_stamp_[t] == out_now_) continue;
        out_stamp_[t] = out_now_;
        out.push_back({t, static_cast<std::uint32_t>(s - next_step_)});
      }
  }

 private:
  StepTensors steps_;
  std::vector<bool> known_;
  std::vector<std::uint32_t> out_stamp_;
  std::uint32_t out_now_ = 0;
  std::size_t next_step_ = 0;
};

}  // namespace

std::unique_ptr<Predictor> make_oracle(const TraceFeed& feed) {
  return std::make_unique<OraclePredictor>(feed);
}

}  // namespace u3m::predict
