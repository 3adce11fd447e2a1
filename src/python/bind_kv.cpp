// Bindings of the tiered KV store (issue 6/7).
#include "bindings.hpp"

namespace u3m::python {

void bind_kv(pybind11::module_& m) {}

}  // namespace u3m::python
