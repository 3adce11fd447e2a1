// The workload generators: LLaMA-shape training steps, continuous-batching
// serving, and the two co-location patterns. Each streams records into a
// TraceSink (so huge traces go straight to disk) and calls sink.finish().
//
// Jobs are named "train-0" and "infer-0"; tensor names follow Note [Stable
// identity] in u3m/trace/model.hpp, e.g. "train-0.layer_12.attn.q_proj.out".
// docs/workloads.md describes the operator sequence, naming and formulas.
#pragma once

#include <array>
#include <cstdint>

#include "u3m/trace/model.hpp"
#include "u3m/workload/config.hpp"
#include "u3m/workload/requests.hpp"
#include "u3m/workload/shape.hpp"

namespace u3m::workload {

struct GenResult {
  std::uint64_t ops = 0, events = 0, tensors = 0;
  std::uint64_t end_ns = 0;  // nominal time of the last event
  std::uint32_t train_steps = 0;
  std::uint32_t infer_iterations = 0;
  std::uint32_t requests_completed = 0;
};

GenResult generate_train(const ModelShape& shape, const TrainConfig& cfg, trace::TraceSink& out,
                         const GenOptions& opt = {});
GenResult generate_infer(const ModelShape& shape, const InferConfig& cfg, RequestSource& requests,
                         trace::TraceSink& out, const GenOptions& opt = {});
// alternate: rollouts take the next cfg.rollout_batch requests from `requests`
// (arrival times ignored, output capped at max_new_tokens); timeshare: arrival
// times drive when inference iterations interleave with training.
GenResult generate_mixed(const ModelShape& shape, const MixedConfig& cfg, RequestSource& requests,
                         trace::TraceSink& out, const GenOptions& opt = {});

// A pass-through sink that counts what flows by: records, and live/peak bytes
// per (job, role) from alloc/free events. Feeds `next` when given.
class CountingSink final : public trace::TraceSink {
 public:
  static constexpr int kRoles = 9;
  static constexpr int kMaxJobs = 4;
  explicit CountingSink(trace::TraceSink* next = nullptr) : next_(next) {}

  void meta(std::string_view k, std::string_view v) override;
  void job(std::string_view name) override;
  void tensor(const trace::Tensor& t) override;
  void op(const trace::Op& o) override;
  void event(const trace::Event& e) override;
  void finish() override;

  std::uint64_t ops() const { return ops_; }
  std::uint64_t events() const { return events_; }
  std::uint64_t tensors() const { return tensor_bytes_.size(); }
  std::uint64_t last_ns() const { return last_ns_; }
  // Peak of live bytes of one role in one job (jobs >= kMaxJobs are ignored).
  std::uint64_t peak(std::uint32_t job, trace::Role r) const {
    return peak_[job][static_cast<int>(r)];
  }
  std::uint64_t peak_total() const { return peak_total_; }  // all jobs, all roles

 private:
  trace::TraceSink* next_;
  std::vector<std::uint64_t> tensor_bytes_;
  std::vector<std::uint8_t> tensor_slot_;  // job * kRoles + role, or 255
  std::uint64_t ops_ = 0, events_ = 0, last_ns_ = 0;
  std::array<std::array<std::uint64_t, kRoles>, kMaxJobs> live_{}, peak_{};
  std::uint64_t live_total_ = 0, peak_total_ = 0;
};

}  // namespace u3m::workload
