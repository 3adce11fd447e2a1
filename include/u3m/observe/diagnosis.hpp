// Bandwidth diagnosis of a run (issue 20 item 7, docs/operators.md), from the
// same reports as the timeline: each link's bytes against its limit, the ops
// that moved and waited most, and per steady-state step (the first, cold
// step left out) how much transfer time compute hid and how much was exposed.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "u3m/engine/run_observer.hpp"

namespace u3m::observe {

struct LinkUse {
  std::uint64_t bytes = 0;
  double busy_s = 0;         // time at least one transfer ran (the union of their spans)
  double achieved_bps = 0;   // bytes / the run's span
  double utilisation = 0;    // achieved / limit; 0 when the link has no limit
};
struct OpLoad {
  std::string name;
  std::uint64_t bytes = 0;  // of transfers that ended while the op waited or ran
  double stall_s = 0;
};
struct StepOverlap {
  std::int64_t step = 0;
  double transfer_s = 0;  // the union of transfer spans within the step
  double hidden_s = 0;    // of it, under an op's compute
  double exposed_s = 0;   // the step's stalls: compute waited for data
};
struct DiagnosisReport {
  double span_s = 0;  // first to last event
  std::array<LinkUse, engine::kNumLinks> links{};
  std::vector<OpLoad> top_by_bytes, top_by_stall;  // at most 10 each, by op name
  std::vector<StepOverlap> steps;                  // steady state: the first step left out
};

class Diagnosis final : public engine::RunObserver {
 public:
  void op(int card, std::int64_t step, std::size_t index, std::string_view name, double t0_s,
          double t1_s) override;
  void stall(int card, std::int64_t step, std::size_t index, double t0_s, double t1_s) override;
  void transfer(const engine::TransferRecord& t) override;

  // Card `card`'s run; `limit_bps`: each link's limit in bytes/s (0 = none known).
  DiagnosisReport report(const std::array<double, engine::kNumLinks>& limit_bps,
                         int card = 0) const;
  static nlohmann::json to_json(const DiagnosisReport& r);
  // The report as text, each figure labelled with `where` (measured on ...,
  // or simulated with ...).
  static std::string to_text(const DiagnosisReport& r, std::string_view where);

 private:
  struct Span {
    int card;
    std::int64_t step;
    std::size_t index;
    std::string name;
    double t0, t1;
    bool stall;
  };
  mutable std::mutex mu_;
  std::vector<Span> spans_;
  std::vector<engine::TransferRecord> transfers_;
};

}  // namespace u3m::observe
