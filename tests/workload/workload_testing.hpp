// Helpers for the workload tests: a sink that checks every record as it
// arrives and keeps the trace for later inspection.
#pragma once

#include "u3m/workload/generate.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "u3m/trace/model.hpp"

namespace u3m::workload::testing {

// Records the trace and checks, on the fly: references point at declared
// records; ids are stable_id(name); events of an op touch only its job's
// tensors; time never goes back; alloc only when dead, read/write/free only
// when alive; weights are never freed.
class CheckingSink final : public trace::TraceSink {
 public:
  trace::Trace t;
  std::vector<std::string> errors;
  bool finished = false;

  void meta(std::string_view k, std::string_view v) override { t.meta(k, v); }
  void job(std::string_view name) override { t.job(name); }
  void tensor(const trace::Tensor& x) override {
    if (x.job >= t.jobs.size()) fail("tensor {} names undeclared job {}", x.name, x.job);
    if (x.id != trace::stable_id(x.name)) fail("tensor {} id is not stable_id(name)", x.name);
    if (x.bytes == 0) fail("tensor {} has 0 bytes", x.name);
    t.tensor(x);
    alive_.push_back(0);
  }
  void op(const trace::Op& o) override {
    if (o.job >= t.jobs.size()) fail("op {} names undeclared job {}", o.name, o.job);
    t.op(o);
  }
  void event(const trace::Event& e) override {
    if (e.op >= t.ops.size() || e.tensor >= t.tensors.size()) {
      fail("event refers to undeclared op {} or tensor {}", e.op, e.tensor);
      return;
    }
    const trace::Tensor& x = t.tensors[e.tensor];
    const trace::Op& o = t.ops[e.op];
    if (e.time_ns < last_ns_) fail("time goes back at op {}", o.name);
    last_ns_ = e.time_ns;
    if (x.job != o.job) fail("op {} (job {}) touches {} (job {})", o.name, o.job, x.name, x.job);
    std::uint8_t& a = alive_[e.tensor];
    switch (e.kind) {
      case trace::EventKind::alloc:
        if (a) fail("{} allocated twice (op {})", x.name, o.name);
        a = 1;
        break;
      case trace::EventKind::free:
        if (!a) fail("{} freed while dead (op {})", x.name, o.name);
        if (x.role == trace::Role::param) fail("weight {} freed (op {})", x.name, o.name);
        a = 0;
        break;
      default:
        if (!a) fail("{} {} while dead (op {})", x.name, trace::to_string(e.kind), o.name);
    }
    t.event(e);
  }
  void finish() override { finished = true; }

  bool alive(std::uint32_t tensor) const { return alive_[tensor] != 0; }

 private:
  template <typename... A>
  void fail(fmt::format_string<A...> f, A&&... a) {
    if (errors.size() < 20) errors.push_back(fmt::format(f, std::forward<A>(a)...));
  }
  std::vector<std::uint8_t> alive_;
  std::uint64_t last_ns_ = 0;
};

// A generator's output: checked for reference and lifetime errors, counted.
struct Generated {
  CheckingSink check;
  CountingSink count{&check};
  GenResult result;
  const trace::Trace& t() const { return check.t; }
};

}  // namespace u3m::workload::testing
