#include "u3m/trace/stats.hpp"

#include <nlohmann/json.hpp>

namespace u3m::trace {

void StatsSink::meta(std::string_view k, std::string_view v) { meta_.emplace_back(k, v); }

void StatsSink::job(std::string_view name) {
  jobs_.emplace_back();
  jobs_.back().name = name;
}

void StatsSink::tensor(const Tensor& t) {
  ++tensors_;
  if (t.job < jobs_.size()) ++jobs_[t.job].tensors;
  // bytes_unique sums distinct logical tensors: a re-declared id counts once.
  if (seen_ids_.insert(t.id).second) {
    bytes_unique_ += t.bytes;
    roles_bytes_[static_cast<std::size_t>(t.role)] += t.bytes;
    if (t.job < jobs_.size()) jobs_[t.job].bytes_unique += t.bytes;
  }
}

void StatsSink::op(const Op& o) {
  ++ops_;
  op_job_.push_back(o.job);
  ++op_classes_[static_cast<std::size_t>(o.cls)];
  ++phases_[static_cast<std::size_t>(o.phase)];
  if (o.job < jobs_.size()) {
    ++jobs_[o.job].ops;
    jobs_[o.job].iterations.insert(o.iteration);
  }
}

void StatsSink::event(const Event& e) {
  ++events_;
  ++kinds_[static_cast<std::size_t>(e.kind)];
  if (e.op < op_job_.size() && op_job_[e.op] < jobs_.size()) ++jobs_[op_job_[e.op]].events;
  t_min_ = std::min(t_min_, e.time_ns);
  t_max_ = std::max(t_max_, e.time_ns);
}

nlohmann::json StatsSink::to_json() const {
  using nlohmann::json;
  json classes = json::object(), phases = json::object(), roles = json::object(),
       kinds = json::object(), jobs = json::object(), meta = json::object();
  for (int i = 0; i < kNumOpClasses; ++i)
    classes[std::string(to_string(static_cast<OpClass>(i)))] = op_classes_[i];
  for (int i = 0; i < kNumPhases; ++i)
    phases[std::string(to_string(static_cast<Phase>(i)))] = phases_[i];
  for (std::size_t i = 0; i < roles_bytes_.size(); ++i)
    roles[std::string(to_string(static_cast<Role>(i)))] = roles_bytes_[i];
  for (std::size_t i = 0; i < kinds_.size(); ++i)
    kinds[std::string(to_string(static_cast<EventKind>(i)))] = kinds_[i];
  std::uint64_t iterations = 0;
  for (const JobStats& j : jobs_) {
    iterations += j.iterations.size();
    jobs[j.name] = {{"ops", j.ops},
                    {"events", j.events},
                    {"tensors", j.tensors},
                    {"bytes_unique", j.bytes_unique},
                    {"iterations", j.iterations.size()}};
  }
  for (auto& [k, v] : meta_) meta[k] = v;
  return {{"events", events_},
          {"ops", ops_},
          {"tensors", tensors_},
          {"bytes_unique", bytes_unique_},
          {"iterations", iterations},
          {"op_classes", classes},
          {"phases", phases},
          {"bytes_by_role", roles},
          {"event_kinds", kinds},
          {"jobs", jobs},
          {"duration_ns", events_ ? t_max_ - t_min_ : 0},
          {"meta", meta}};
}

}  // namespace u3m::trace
