// The `u3m._core` extension module (docs/pytorch.md).
#include "bindings.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "u3m: tiered memory for LLM training and serving (C++ core)";
  u3m::python::bind_kv(m);
}
