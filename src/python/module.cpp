// The `u3m._core` extension module (docs/pytorch.md).
#include "bindings.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "u3m: tiered memory for LLM training and serving (C++ core)";
  // Traces first: it registers u3m.InputError, which the others raise.
  u3m::python::bind_trace(m);
  u3m::python::bind_runtime(m);
  u3m::python::bind_kv(m);
  u3m::python::bind_serve(m);
  u3m::python::bind_config(m);
  u3m::python::bind_metrics(m);
}
