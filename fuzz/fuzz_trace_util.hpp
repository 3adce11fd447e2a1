// Shared by the trace fuzzers: whatever a reader accepts must survive both
// writers. A trace is written as binary and as JSON lines (to a scratch file
// per process) and read back, and the copy must equal the original field by
// field. A difference is a writer/reader disagreement (a field dropped, a
// number rounded, a string mangled) that a user would see as silent data loss.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "u3m/trace/io.hpp"
#include "u3m/util/error.hpp"

namespace u3m::fuzz {

// The first difference, or empty when equal. NaN flops compare equal to NaN.
inline std::string trace_diff(const trace::Trace& a, const trace::Trace& b) {
  if (a.metadata != b.metadata) return "metadata";
  if (a.jobs != b.jobs) return "jobs";
  if (a.tensors.size() != b.tensors.size()) return "tensor count";
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const trace::Tensor &x = a.tensors[i], &y = b.tensors[i];
    if (x.id != y.id || x.name != y.name || x.bytes != y.bytes || x.dtype != y.dtype ||
        x.role != y.role || x.layer != y.layer || x.job != y.job)
      return "tensor " + std::to_string(i);
  }
  if (a.ops.size() != b.ops.size()) return "op count";
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    const trace::Op &x = a.ops[i], &y = b.ops[i];
    const bool same_flops = x.flops == y.flops || (x.flops != x.flops && y.flops != y.flops);
    if (x.name != y.name || x.cls != y.cls || x.phase != y.phase || x.job != y.job ||
        x.iteration != y.iteration || x.layer != y.layer || !same_flops || x.bytes != y.bytes)
      return "op " + std::to_string(i);
  }
  if (a.events.size() != b.events.size()) return "event count";
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    const trace::Event &x = a.events[i], &y = b.events[i];
    if (x.time_ns != y.time_ns || x.op != y.op || x.tensor != y.tensor || x.kind != y.kind)
      return "event " + std::to_string(i);
  }
  return {};
}

inline std::string scratch(const char* ext) {
  const char* dir = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
  return std::string(dir) + "/u3m-fuzz-" + std::to_string(::getpid()) + ext;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

[[noreturn]] inline void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz finding: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Writes `t` in both formats and reads each back; aborts on any difference or
// on a reader refusing what a writer wrote.
inline void check_round_trip(const trace::Trace& t) {
  for (const char* ext : {".u3mt", ".jsonl"}) {
    const std::string path = scratch(ext);
    trace::Trace back;
    try {
      auto w = trace::open_writer(path);
      t.replay(*w);  // ends with finish()
      const std::string data = slurp(path);
      if (ext[1] == 'u')
        trace::read_binary(data, path, back);
      else
        trace::read_jsonl(data, path, back);
    } catch (const InputError& e) {
      finding("a writer produced what its reader refuses", e.what());
    }
    std::remove(path.c_str());
    const std::string d = trace_diff(t, back);
    if (!d.empty()) finding(ext, "round trip changed " + d);
  }
}

}  // namespace u3m::fuzz
