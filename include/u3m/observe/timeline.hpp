// A run's timeline as Chrome trace / Perfetto JSON (the trace-event format;
// issue 20, docs/operators.md): ops and stalls on each card's compute track,
// transfers as spans on one track per link, tier occupancy as counters, step
// ends as instant events. Open the file in ui.perfetto.dev or chrome://tracing.
//
// Timeline is a RunObserver: it records what it is told (cheaply: a push
// into a vector under a mutex) and writes the file in write(), so recording
// costs the run no I/O.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "u3m/engine/run_observer.hpp"

namespace u3m::observe {

class Timeline final : public engine::RunObserver {
 public:
  // Occupancy samples of one tier closer than this to the previous one
  // replace it (a run changes a tier's use at every allocation; 1 us of
  // resolution keeps the file small and loses no step-scale shape).
  static constexpr double kOccupancyResolutionS = 1e-6;

  void op(int card, std::int64_t step, std::size_t index, std::string_view name,
          engine::OpWork work, double t0_s, double t1_s) override;
  void stall(int card, std::int64_t step, std::size_t index, double t0_s, double t1_s) override;
  void step_end(int card, std::int64_t step, double t_s) override;
  void transfer(const engine::TransferRecord& t) override;
  void occupancy(int card, mem::Tier tier, std::uint64_t used, double t_s) override;

  // Writes the JSON document to `path` (`what` names it in errors: the flag).
  // Times are microseconds after the earliest event, which otherData.origin_s
  // gives on the run's clock. InputError naming the path if it cannot be written.
  void write(const std::string& path, const std::string& clock = "",
             const std::string& what = "--timeline") const;
  // The document as write() writes it.
  std::string json(const std::string& clock = "") const;

  struct Counts {
    std::size_t ops = 0, stalls = 0, steps = 0, transfers = 0, occupancy = 0;
  };
  Counts counts() const;

 private:
  struct Span {  // an op or a stall
    int card;
    bool stall;
    std::int64_t step;
    std::size_t index;
    std::uint32_t name;  // into names_ (ops)
    double t0, t1;
  };
  struct StepEnd {
    int card;
    std::int64_t step;
    double t;
  };
  struct Sample {
    int card;
    mem::Tier tier;
    std::uint64_t used;
    double t;
  };
  mutable std::mutex mu_;
  std::vector<Span> spans_;
  std::vector<StepEnd> steps_;
  std::vector<engine::TransferRecord> transfers_;
  std::vector<Sample> samples_;
  // The latest sample of each (card, tier), index into samples_.
  std::unordered_map<std::uint64_t, std::size_t> last_sample_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, std::uint32_t> name_ids_;
};

}  // namespace u3m::observe
