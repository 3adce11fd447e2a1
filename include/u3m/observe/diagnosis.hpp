// Bandwidth diagnosis of a run (issue 20 item 7, docs/operators.md), from the
// same reports as the timeline: each link's bytes against its limit, the op
// families that moved and waited most, per steady-state step (the first, cold
// step left out) how much transfer time compute hid and how much was exposed,
// and, given a profile's roofline, the share of ops bound by HBM bandwidth
// against those bound by compute (the design's HBM-bandwidth view).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
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
  std::string name;         // the op family (trace::op_family: layer numbers folded)
  std::uint64_t bytes = 0;  // of transfers that ended while the op waited or ran
  double stall_s = 0;
};
struct StepOverlap {
  std::int64_t step = 0;
  double transfer_s = 0;  // the union of transfer spans within the step
  double hidden_s = 0;    // of it, under an op's compute
  double exposed_s = 0;   // the step's stalls: compute waited for data
};
// An op's two roofline terms on a profile: its flops at the achievable rate
// and its bytes at HBM bandwidth (sim::op_cost; observe does not know profiles).
struct RooflineTime {
  double compute_s = 0, memory_s = 0;
};
using Roofline = std::function<RooflineTime(double flops, double bytes)>;

// The steady-state op runs by what bounds them on the profile's roofline:
// HBM bandwidth (memory term above the compute term), compute, or unknown
// (the trace gives neither flops nor bytes). Times are the runs' own spans.
struct BoundShare {
  bool known = false;  // a roofline was given
  std::string profile;
  std::uint64_t ops_hbm = 0, ops_compute = 0, ops_unknown = 0;
  double hbm_s = 0, compute_s = 0, unknown_s = 0;
};

struct DiagnosisReport {
  double span_s = 0;  // first to last event
  std::array<LinkUse, engine::kNumLinks> links{};
  // At most 10 each, by op family, over the steady-state steps (all steps
  // when the run has only one: cold_step_included).
  std::vector<OpLoad> top_by_bytes, top_by_stall;
  std::vector<StepOverlap> steps;  // steady state: the first step left out
  bool cold_step_included = false;
  BoundShare bound;
};

class Diagnosis final : public engine::RunObserver {
 public:
  void op(int card, std::int64_t step, std::size_t index, std::string_view name,
          engine::OpWork work, double t0_s, double t1_s) override;
  void stall(int card, std::int64_t step, std::size_t index, double t0_s, double t1_s) override;
  void transfer(const engine::TransferRecord& t) override;

  // Card `card`'s run; `limit_bps`: each link's limit in bytes/s (0 = none
  // known); `roofline`, if given, classifies ops (`profile` names it).
  DiagnosisReport report(const std::array<double, engine::kNumLinks>& limit_bps, int card = 0,
                         const Roofline& roofline = {}, std::string_view profile = {}) const;
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
    engine::OpWork work;
    double t0, t1;
    bool stall;
  };
  mutable std::mutex mu_;
  std::vector<Span> spans_;
  std::vector<engine::TransferRecord> transfers_;
};

}  // namespace u3m::observe
