// Bindings of the run observers (issue 20, docs/operators.md): Prometheus
// metrics served on a port and a Chrome-trace timeline, attached to a Runtime
// with Runtime.set_observer (python/u3m/metrics.py wraps the usual calls).
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "u3m/observe/fanout.hpp"
#include "u3m/observe/metrics.hpp"
#include "u3m/observe/timeline.hpp"

namespace py = pybind11;

namespace u3m::python {

void bind_metrics(py::module_& m) {
  py::class_<engine::RunObserver>(
      m, "RunObserver", "What watches a run: Metrics, Timeline or Observers (docs/operators.md)");

  py::class_<observe::Metrics, engine::RunObserver>(
      m, "Metrics",
      "Prometheus metrics of the engines attached to it (Runtime.set_observer), served as the "
      "text format on http://ADDRESS:PORT/metrics once serve() is called")
      .def(py::init<>())
      .def("serve", &observe::Metrics::serve, py::arg("port") = 0,
           py::arg("address") = "127.0.0.1", py::arg("what") = "port",
           "Starts serving; port 0 = any free one. Returns the port. InputError if it cannot bind.")
      .def_property_readonly("port", &observe::Metrics::port)
      .def("text", &observe::Metrics::text, "The exposition a scrape returns now")
      .def(
          "set_kv",
          [](observe::Metrics& self, std::uint64_t query_tokens, std::uint64_t hit_tokens,
             double usage, int card) {
            self.set_kv(card, {.query_tokens = query_tokens, .hit_tokens = hit_tokens, .usage = usage});
          },
          py::kw_only(), py::arg("query_tokens"), py::arg("hit_tokens"), py::arg("usage"),
          py::arg("card") = 0,
          "The KV cache's prefix queries and hits (cumulative, in tokens) and block usage in [0, 1]");

  py::class_<observe::Timeline, engine::RunObserver>(
      m, "Timeline",
      "Records a run's transfers, tier occupancy, ops and stalls; write() saves Chrome trace / "
      "Perfetto JSON")
      .def(py::init<>())
      .def("write", &observe::Timeline::write, py::arg("path"), py::arg("clock") = "",
           py::arg("what") = "path")
      .def("json", &observe::Timeline::json, py::arg("clock") = "")
      .def("counts", [](const observe::Timeline& t) {
        const observe::Timeline::Counts c = t.counts();
        py::dict d;
        d["ops"] = c.ops;
        d["stalls"] = c.stalls;
        d["steps"] = c.steps;
        d["transfers"] = c.transfers;
        d["occupancy"] = c.occupancy;
        return d;
      });

  py::class_<observe::Fanout, engine::RunObserver>(
      m, "Observers", "Passes a run's reports on to several observers (metrics and a timeline)")
      .def(py::init([](const std::vector<engine::RunObserver*>& to) {
             auto f = std::make_unique<observe::Fanout>();
             for (engine::RunObserver* o : to) f->add(o);
             return f;
           }),
           py::arg("observers"), py::keep_alive<1, 2>());
}

}  // namespace u3m::python
