// trace-replay: DeepSpeed ZeRO-3 style prefetch by a recorded access order.
//
// Note [trace-replay]
// ZeRO-3's parameter coordinator records the order in which submodules fetch
// parameters during one step, prefetches by position in that record in later
// steps, and invalidates the record (and re-records) when the observed order
// diverges. Here, with ops in place of submodules:
// - one coordinator per job: DeepSpeed's trace lives inside the training
//   process, so a co-located serving process cannot perturb its record or
//   its position; each job's own ops advance its own pointer, and an
//   iteration is delimited by that job's `iteration` field (a single global
//   record, anchored on one job, would be invalidated by every interleaving
//   change: a strawman, not what ZeRO-3 does when co-located);
// - recording: one iteration of the job's op steps, each with its signature
//   and the tensors it read or wrote;
// - replaying: position p in the running job's record; the next H predicted
//   steps are its slots p, p+1, ... wrapping into its next iteration (the
//   coordinator knows nothing of the other jobs, so it predicts as if its
//   job ran alone; jobs not running now predict nothing, as a coordinator
//   prefetches only from inside its own forward/backward hooks);
// - divergence (an op whose signature differs from the slot's, or an
//   iteration of a different length) invalidates the job's record: nothing
//   is predicted for it until a fresh record is complete, as ZeRO-3 falls
//   back to fetching on demand.
#include "predictors_impl.hpp"

namespace u3m::predict {
namespace {

class TraceReplayPredictor final : public Predictor {
 public:
  std::string_view name() const override { return "trace-replay"; }
  void observe(const Access& a) override {
    track_time(a);
    if (a.step != step_ || !started_) begin_step(a);
    Coord& c = jobs_[a.job];
    if (c.mode == Mode::recording && is_access(a.kind)) {
      if (a.tensor >= stamp_.size()) stamp_.resize(a.tensor + 1, UINT64_MAX);
      if (stamp_[a.tensor] != a.step) {
        stamp_[a.tensor] = a.step;
        c.building.entries.push_back(a.tensor);
        c.building.slots.back().end = static_cast<std::uint32_t>(c.building.entries.size());
      }
    }
  }
  void predict(std::uint32_t horizon, std::vector<Predicted>& out) override {
    out.clear();
    if (!started_) return;
    const Coord& c = jobs_[job_];
    if (c.mode != Mode::valid || c.record.slots.empty()) return;
    if (out_stamp_.size() < stamp_.size()) out_stamp_.resize(stamp_.size(), 0);
    ++out_now_;
    std::size_t n = c.record.slots.size();
    for (std::uint32_t i = 0; i < horizon; ++i) {
      const Slot& s = c.record.slots[(c.pos + i) % n];
      for (std::uint32_t k = s.begin; k < s.end; ++k) {
        std::uint32_t t = c.record.entries[k];
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
  struct Coord {  // one job's coordinator
    bool started = false;
    std::uint32_t iteration = 0;
    Mode mode = Mode::recording;
    Record record, building;
    std::size_t pos = 0;
  };

  void begin_step(const Access& a) {
    started_ = true;
    step_ = a.step;
    job_ = a.job;
    if (a.job >= jobs_.size()) jobs_.resize(a.job + 1);
    Coord& c = jobs_[a.job];
    if (!c.started) {
      c.started = true;
      c.iteration = a.iteration;
    } else if (a.iteration != c.iteration) {
      c.iteration = a.iteration;
      boundary(c);
    }
    if (c.mode == Mode::valid) {
      if (c.pos < c.record.slots.size() && c.record.slots[c.pos].sig == a.op_sig)
        ++c.pos;
      else
        c.mode = Mode::invalid;  // diverged: on-demand until re-recorded
    }
    if (c.mode == Mode::recording) {
      auto at = static_cast<std::uint32_t>(c.building.entries.size());
      c.building.slots.push_back({a.op_sig, at, at});
    }
  }
  static void boundary(Coord& c) {
    switch (c.mode) {
      case Mode::recording:
        std::swap(c.record, c.building);
        c.building.clear();
        c.mode = Mode::valid;
        c.pos = 0;
        break;
      case Mode::valid:
        if (c.pos == c.record.slots.size()) {
          c.pos = 0;
        } else {
          c.mode = Mode::recording;  // a step of another length: re-record
          c.building.clear();
        }
        break;
      case Mode::invalid:
        c.mode = Mode::recording;
        c.building.clear();
        break;
    }
  }

  bool started_ = false;
  std::uint64_t step_ = 0;
  std::uint32_t job_ = 0;
  std::vector<Coord> jobs_;
  std::vector<std::uint64_t> stamp_;
  std::vector<std::uint32_t> out_stamp_;
  std::uint32_t out_now_ = 0;
};

}  // namespace

std::unique_ptr<Predictor> make_trace_replay() {
  return std::make_unique<TraceReplayPredictor>();
}

}  // namespace u3m::predict
