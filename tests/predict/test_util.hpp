// Hand-made traces for the predictor tests.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "u3m/predict/eval.hpp"
#include "u3m/predict/predictor.hpp"
#include "u3m/trace/model.hpp"

namespace u3m::predict::testing {

// Builds a trace one op at a time: op(...) then touches.
struct TraceMaker {
  trace::Trace t;
  std::uint64_t time_ns = 0, op_ns = 1000;

  TraceMaker() { t.job("job-0"); }
  std::uint32_t tensor(const std::string& name, std::uint64_t bytes,
                       trace::Role role = trace::Role::param, std::uint32_t job = 0) {
    t.tensors.push_back(
        trace::make_tensor(name, bytes, trace::DType::f16, role, trace::kNoLayer, job));
    return static_cast<std::uint32_t>(t.tensors.size() - 1);
  }
  // One op of class `cls` that touches `tensors` with `kind`.
  void op(const std::string& name, trace::OpClass cls, std::uint32_t iteration,
          const std::vector<std::uint32_t>& tensors, std::uint32_t job = 0,
          trace::EventKind kind = trace::EventKind::read) {
    trace::Op o;
    o.name = name;
    o.cls = cls;
    o.iteration = iteration;
    o.job = job;
    t.ops.push_back(o);
    auto idx = static_cast<std::uint32_t>(t.ops.size() - 1);
    for (std::uint32_t x : tensors) t.events.push_back({time_ns, idx, x, kind});
    time_ns += op_ns;
  }
};

inline EvalResult run(const trace::Trace& t, std::string_view predictor, EvalOptions opt = {}) {
  TraceFeed feed(t);
  auto p = make_predictor(predictor, &feed);
  return evaluate(feed, *p, opt);
}

inline const HorizonMetrics& horizon(const EvalResult& r, const std::string& h) {
  for (const auto& m : r.horizons)
    if (m.horizon == h) return m;
  throw std::runtime_error("no horizon " + h);
}

}  // namespace u3m::predict::testing
