// Bindings of the run config (docs/config.md): the same parser and checks as
// `--config`, and the build's version.
#include <string>

#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "u3m/config/run_config.hpp"
#include "u3m/util/version.hpp"

namespace py = pybind11;

namespace u3m::python {

void bind_config(py::module_& m) {
  m.attr("__version__") = std::string(kVersion);
  m.def(
      "load_config",
      [](const std::string& path) {
        const config::RunConfig c = config::load_run_config(path);
        return py::module_::import("json").attr("loads")(c.to_json().dump());
      },
      py::arg("path"),
      "Reads a run config (TOML, docs/config.md) and returns the values it sets as a dict in "
      "the file's shape. Every key is checked: an unknown key or a bad value raises "
      "u3m.InputError naming the file, the line and the key.");
}

}  // namespace u3m::python
