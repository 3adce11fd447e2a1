// Where a predictor's errors are: a breakdown of false-positive bytes
// (predicted, not accessed within the horizon), missed bytes (accessed,
// already known, not predicted) and first-touch bytes (accessed, never seen
// before: no online predictor can name them) by tensor role and job, by the phase and op
// class of the decision point, by distance to the next job switch and the next
// iteration boundary, by how many times that switch had happened before, and
// by where a false positive's next access really was. `u3m predict eval
// --diagnose` prints it; docs/prediction.md ("Diagnosis") defines the columns.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "u3m/predict/predictor.hpp"

namespace u3m::predict {

class Diagnoser {
 public:
  // Scores the sets at `horizon` op steps; `feed` must outlive this.
  Diagnoser(const TraceFeed& feed, std::uint32_t horizon);
  ~Diagnoser();
  Diagnoser(const Diagnoser&) = delete;
  Diagnoser& operator=(const Diagnoser&) = delete;
  // Call at each decision point k (before step k) with the predictor's answer
  // (any horizon >= this one's; entries past it are ignored). Warm-up
  // decisions are skipped, as in the headline figures.
  void on_decision(std::size_t k, const std::vector<Predicted>& out, bool warm);
  // The breakdown as JSON (what `u3m predict eval --json --diagnose` embeds)
  // and as plain-text tables rendered from it; `top` = how many tensor-name
  // patterns and runs to list.
  nlohmann::json to_json(std::size_t top = 10) const;
  std::string report(std::size_t top = 10) const;
  // Totals, for tests, summed over non-warm-up decisions: bytes predicted,
  // false-positive bytes, accessed bytes (A), known accessed bytes
  // (A_known), missed known bytes, and unpredicted first-touch bytes.
  double predicted_bytes() const;
  double false_positive_bytes() const;
  double accessed_bytes() const;
  double known_bytes() const;
  double missed_bytes() const;
  double first_touch_missed_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace u3m::predict
