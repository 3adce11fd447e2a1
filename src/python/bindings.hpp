// The pieces of the `u3m._core` extension; each binds one area of the library
// into the module (src/python/module.cpp calls them in order).
#pragma once

#include <pybind11/pybind11.h>

namespace u3m::python {

void bind_trace(pybind11::module_& m);    // bind_trace.cpp: traces, predictors, simulator
void bind_runtime(pybind11::module_& m);  // bind_runtime.cpp: the engine on real backends
void bind_kv(pybind11::module_& m);       // bind_kv.cpp: the tiered KV store
void bind_serve(pybind11::module_& m);    // bind_serve.cpp: the serving simulator
void bind_config(pybind11::module_& m);   // bind_config.cpp: the run config, the version
void bind_metrics(pybind11::module_& m);  // bind_metrics.cpp: metrics and timelines

}  // namespace u3m::python

namespace u3m::engine {
class RealStack;
}
namespace u3m::python {
// The SSD store's checks and the faults injected under a stack (bind_runtime.cpp).
pybind11::dict ssd_dict(const engine::RealStack& stack);

}  // namespace u3m::python
