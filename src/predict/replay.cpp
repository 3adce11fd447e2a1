// trace-replay: DeepSpeed ZeRO-3 style prefetch by a recorded access order.
//
// Note [trace-replay]
// ZeRO-3's parameter coordinator records the order in which submodules fetch
// parameters during one step, prefetches by position in that record in later
// steps, and invalidates the record (and re-records) when the observed order
// diverges. Here, with ops in place of submodules:
// - an iteration is delimited by the `iteration` field of the first job seen
//   (the "anchor" job; DeepSpeed's trace is per training step, and whatever
//   else shares the device shows up inside it);
// - recording: one iteration's op steps, each with its signature and the
//   tensors it read or wrote;
// - replaying: position p in the record; the next H predicted steps are
//   slots p, p+1, ... wrapping into the next iteration;
// - divergence (an op whose signature differs from the slot's, or an
//   iteration of a different length) invalidates the record: nothing is
//   predicted until a fresh record is complete, as ZeRO-3 falls back to
//   fetching on demand.
#include "predictors_impl.hpp"

namespace u3m::predict {
namespace {

class TraceReplayPredictor final : public Predictor {
 public:
  std::string_view name() const override { return "trace-replay"; }
  void observe(const Access& a) override {
    track_time(a);
    if (a.step != step_ || !started_) begin_step(a);
    if (mode_ == Mode::recording && is_access(a.kind)) {
      if (a.tensor >= stamp_.size()) stamp_.resize(a.tensor + 1, UINT64_MAX);
      if (stamp_[a.tensor] != a.step) {
        stamp_[a.tensor] = a.step;
        building_.entries.push_back(a.tensor);
        building_.slots.back().end = static_cast<std::uint32_t>(building_.entries.size());
      }
    }
  }
  void predict(std::uint32_t horizon, std::vector<Predicted>& out) override {
    out.clear();
    if (mode_ != Mode::valid || record_.slots.empty()) return;
    if (out_stamp_.size() < stamp_.size()) out_stamp_.resize(stamp_.size(), 0);
    ++out_now_;
    std::size_t n = record_.slots.size();
    for (std::uint32_t i = 0; i < horizon; ++i) {
      const Slot& s = record_.slots[(pos_ + i) % n];
      for (std::uint32_t k = s.begin; k < s.end; ++k) {
        std::uint32_t t = record_.entries[k];
        if (out_stamp_[t] == out_now_) continue;
        out_stamp_[t] = out_now_;
        out.push_back({t, i});
      }
    }
  }

 private:
  enum class Mode { recording, valid, invalid };
  struct Slot {
    std::uint64_t sig;
    std::uint32_t begin, end;
  };
  struct Record {
    std::vector<Slot> slots;
    std::vector<std::uint32_t> entries;
    void clear() {
      slots.clear();
      entries.clear();
    }
  };

  void begin_step(const Access& a) {
    step_ = a.step;
    if (!started_) {
      started_ = true;
      anchor_job_ = a.job;
      anchor_iter_ = a.iteration;
      mode_ = Mode::recording;
    } else if (a.job == anchor_job_ && a.iteration != anchor_iter_) {
      anchor_iter_ = a.iteration;
      boundary();
    }
    if (mode_ == Mode::valid) {
      if (pos_ < record_.slots.size() && record_.slots[pos_].sig == a.op_sig)
        ++pos_;
      else
        mode_ = Mode::invalid;  // diverged: on-demand until re-recorded
    }
    if (mode_ == Mode::recording) {
      auto at = static_cast<std::uint32_t>(building_.entries.size());
      building_.slots.push_back({a.op_sig, at, at});
    }
  }
  void boundary() {
    switch (mode_) {
      case Mode::recording:
        std::swap(record_, building_);
        building_.clear();
        mode_ = Mode::valid;
        pos_ = 0;
        break;
      case Mode::valid:
        if (pos_ == record_.slots.size()) {
          pos_ = 0;
        } else {
          mode_ = Mode::recording;  // a step of another length: re-record
          building_.clear();
        }
        break;
      case Mode::invalid:
        mode_ = Mode::recording;
        building_.clear();
        break;
    }
  }

  bool started_ = false;
  Mode mode_ = Mode::recording;
  std::uint32_t anchor_job_ = 0, anchor_iter_ = 0;
  std::uint64_t step_ = 0;
  Record record_, building_;
  std::size_t pos_ = 0;
  std::vector<std::uint64_t> stamp_;
  std::vector<std::uint32_t> out_stamp_;
  std::uint32_t out_now_ = 0;
};

}  // namespace

std::unique_ptr<Predictor> make_trace_replay() {
  return std::make_unique<TraceReplayPredictor>();
}

}  // namespace u3m::predict
