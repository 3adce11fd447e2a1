// Small helpers shared by the trace tests.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "u3m/trace/model.hpp"

namespace u3m::trace::testing {

// A hand-made trace with two jobs and every record kind, every enum used.
inline Trace sample_trace() {
  Trace t;
  t.meta("source", "unit test \"quoted\"\n");
  t.job("train-0");
  t.job("infer-0");
  auto add_tensor = [&](std::string name, std::uint64_t bytes, DType d, Role r, int layer,
                        std::uint32_t job) { t.tensor(make_tensor(name, bytes, d, r, layer, job)); };
  add_tensor("train-0.layer_0.attn.q_proj.weight", 8192, DType::f16, Role::param, 0, 0);
  add_tensor("train-0.layer_0.attn.q_proj.out", 1 << 20, DType::bf16, Role::activation, 0, 0);
  add_tensor("infer-0.req_3.layer_1.kv.blk_0", 65536, DType::f16, Role::kv, 1, 1);
  add_tensor("train-0.adam.m", 1ull << 40, DType::f32, Role::optim_m, kNoLayer, 0);
  t.op(Op{"aten::mm", OpClass::matmul, Phase::forward, 0, 0, 0, 2.5e9, 123});
  t.op(Op{"u3m::attention", OpClass::attn_decode, Phase::decode, 1, 7, 1, 0, 0});
  t.op(Op{"u3m::adam", OpClass::optimizer, Phase::optimizer, 0, 0, kNoLayer, 1e3, 1ull << 40});
  t.event(Event{100, 0, 0, EventKind::read});
  t.event(Event{100, 0, 1, EventKind::alloc});
  t.event(Event{250, 0, 1, EventKind::write});
  t.event(Event{90, 1, 2, EventKind::read});  // time may go backwards between jobs
  t.event(Event{5000000000ull, 2, 3, EventKind::write});
  t.event(Event{5000000001ull, 0, 1, EventKind::free});
  return t;
}

inline std::filesystem::path temp_dir() {
  auto p = std::filesystem::temp_directory_path() /
           ("u3m-test-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  std::filesystem::create_directories(p);
  return p;
}

inline std::string source_dir() {
  const char* s = std::getenv("U3M_SOURCE_DIR");
  return s ? s : U3M_SOURCE_DIR;
}

}  // namespace u3m::trace::testing
