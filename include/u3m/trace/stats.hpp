// Streaming statistics of a trace: what `u3m trace stats` prints.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "u3m/trace/model.hpp"

namespace u3m::trace {

class StatsSink final : public TraceSink {
 public:
  struct JobStats {
    std::string name;
    std::uint64_t ops = 0, events = 0, tensors = 0, bytes_unique = 0;
    std::unordered_set<std::uint32_t> iterations;
  };

  void meta(std::string_view k, std::string_view v) override;
  void job(std::string_view name) override;
  void tensor(const Tensor& t) override;
  void op(const Op& o) override;
  void event(const Event& e) override;

  // {"events", "ops", "tensors", "bytes_unique", "iterations", "op_classes",
  //  "phases", "bytes_by_role", "event_kinds", "jobs": {name: {...}}, "duration_ns", "meta"}
  nlohmann::json to_json() const;

 private:
  std::vector<std::pair<std::string, std::string>> meta_;
  std::vector<JobStats> jobs_;
  std::unordered_set<TensorId> seen_ids_;
  std::vector<std::uint32_t> op_job_;
  std::uint64_t events_ = 0, ops_ = 0, tensors_ = 0, bytes_unique_ = 0;
  std::array<std::uint64_t, kNumOpClasses> op_classes_{};
  std::array<std::uint64_t, kNumPhases> phases_{};
  std::array<std::uint64_t, 9> roles_bytes_{};
  std::array<std::uint64_t, 4> kinds_{};
  std::uint64_t t_min_ = UINT64_MAX, t_max_ = 0;
};

}  // namespace u3m::trace
