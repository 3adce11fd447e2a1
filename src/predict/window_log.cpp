// WindowLog: Note [Shared window log] in window_log.hpp.
#include "u3m/predict/window_log.hpp"

namespace u3m::predict {

WindowLog::WindowLog(const trace::Trace& t, std::string predictor)
    : feed_(t), name_(std::move(predictor)), pred_(make_predictor(name_, &feed_)) {
  timed_ = pred_->answers_depend_on_time();
}

void WindowLog::run(Predictor& p, const Call& c, std::vector<Predicted>& entered,
                    std::vector<std::uint32_t>& left) {
  for (std::size_t e = feed_.step_begin(c.step); e < feed_.step_begin(c.step + 1); ++e) {
    Access a = feed_.access_at(e, c.step);
    a.time_ns = c.now_ns;
    p.observe(a);
  }
  p.step_done();
  p.predict_window_delta(c.horizon, entered, left);
  ++computed_;
}

WindowLog::Delta WindowLog::answer(std::size_t i) const {
  const std::size_t e0 = i > 0 ? calls_[i - 1].entered_end : 0;
  const std::size_t l0 = i > 0 ? calls_[i - 1].left_end : 0;
  return {std::span<const Predicted>(entered_).subspan(e0, calls_[i].entered_end - e0),
          std::span<const std::uint32_t>(left_).subspan(l0, calls_[i].left_end - l0)};
}

WindowLog::Delta WindowLog::Reader::step(std::size_t step, std::uint32_t horizon,
                                         std::uint64_t now_ns) {
  WindowLog& log = *log_;
  const Call want{step, horizon, now_ns, 0, 0};
  if (!own_) {
    if (next_ == log.calls_.size()) {  // nobody asked this yet: the log's predictor answers
      log.run(*log.pred_, want, log.scratch_entered_, log.scratch_left_);
      log.entered_.insert(log.entered_.end(), log.scratch_entered_.begin(),
                          log.scratch_entered_.end());
      log.left_.insert(log.left_.end(), log.scratch_left_.begin(), log.scratch_left_.end());
      log.calls_.push_back({step, horizon, now_ns, log.entered_.size(), log.left_.size()});
    }
    const Call& c = log.calls_[next_];
    if (c.step == step && c.horizon == horizon && (!log.timed_ || c.now_ns == now_ns))
      return log.answer(next_++);
    // Fork: a predictor of our own, fed the calls this reader made so far.
    own_ = make_predictor(log.name_, &log.feed_);
    for (std::size_t i = 0; i < next_; ++i) log.run(*own_, log.calls_[i], entered_, left_);
  }
  log.run(*own_, want, entered_, left_);
  return {entered_, left_};
}

}  // namespace u3m::predict
