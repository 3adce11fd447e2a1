// The observers a run's flags ask for (--timeline, --diagnose, and what a
// command adds, such as run replay's metrics), fanned out to the one
// engine::RunObserver the step driver reports to (docs/operators.md).
#pragma once

#include <array>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "u3m/observe/diagnosis.hpp"
#include "u3m/observe/fanout.hpp"
#include "u3m/observe/timeline.hpp"
#include "u3m/sim/cost.hpp"
#include "u3m/util/error.hpp"

namespace u3m::cli {

class RunWatch {
 public:
  // Checks now that the timeline can be written, not after the run.
  RunWatch(std::string timeline_path, bool diagnose) : path_(std::move(timeline_path)) {
    if (!path_.empty()) {
      if (std::FILE* f = std::fopen(path_.c_str(), "wb"))
        std::fclose(f);
      else
        input_error("--timeline", "cannot write '{}'", path_);
      all_.add(&timeline_);
    }
    if (diagnose) all_.add(&diagnosis_);
    diagnose_ = diagnose;
  }
  RunWatch(const RunWatch&) = delete;  // the fan-out points into it

  void add(engine::RunObserver* o) { all_.add(o); }  // before the run
  engine::RunObserver* observer() { return all_.empty() ? nullptr : &all_; }

  // After the run: writes the timeline (its clock named by `clock`) and
  // returns the diagnosis against `limit_bps`, if asked for, with the ops
  // placed on the roofline of `hw` if given.
  std::optional<observe::DiagnosisReport> finish(
      const std::string& clock, const std::array<double, engine::kNumLinks>& limit_bps,
      const sim::HwProfile* hw = nullptr) const {
    if (!path_.empty()) timeline_.write(path_, clock);
    if (!diagnose_) return std::nullopt;
    observe::Roofline roofline;
    if (hw)
      roofline = [hw](double flops, double bytes) {
        const sim::OpCost c = sim::op_cost(*hw, flops, bytes);
        return observe::RooflineTime{c.compute_s, c.memory_s};
      };
    return diagnosis_.report(limit_bps, 0, roofline, hw ? hw->name : std::string());
  }

 private:
  std::string path_;
  bool diagnose_ = false;
  observe::Timeline timeline_;
  observe::Diagnosis diagnosis_;
  observe::Fanout all_;
};

}  // namespace u3m::cli
