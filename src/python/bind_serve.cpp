// Bindings of the serving simulator (`u3m serve sim`): one request trace
// served under a KV policy, figures simulated with a hardware profile.
#include <cstdint>
#include <string>

#include <pybind11/stl.h>

#include "bindings.hpp"
#include "u3m/experiments/serve.hpp"
#include "u3m/experiments/serve_json.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/rag.hpp"
#include "u3m/workload/shape.hpp"

namespace py = pybind11;

namespace u3m::python {
namespace {

// The result schema is the CLI's (experiments::serve_result_json: one policy's run), converted.
py::object serve_result_dict(const experiments::ServeScenario& s, const experiments::ServeResult& r) {
  return py::module_::import("json").attr("loads")(experiments::serve_result_json(s, r).dump());
}

}  // namespace

void bind_serve(py::module_& m) {
  m.def("serve_policy_names", &experiments::serve_policy_names);
  m.def(
      "simulate_serving",
      [](const std::string& requests, const std::string& model, const std::string& hw,
         const std::string& policy, std::uint32_t cards, double rate_scale, double slo_ttft_ms,
         double slo_tpot_ms, std::size_t limit) {
        experiments::ServeScenario s;
        s.shape = workload::preset(model);
        s.hw = sim::load_profile(hw);
        s.policy = policy;
        s.cards = cards;
        s.rate_scale = rate_scale;
        s.slo.ttft_ms = slo_ttft_ms;
        s.slo.tpot_ms = slo_tpot_ms;
        if (requests == "rag") {
          s.requests = workload::generate_rag(workload::RagConfig{});
        } else {
          s.requests = workload::load_requests(requests);
        }
        s.requests_label = requests;
        if (limit && s.requests.size() > limit) s.requests.resize(limit);
        if (s.requests.empty()) input_error(requests, "no requests");
        s.validate();
        experiments::ServeResult r;
        {
          py::gil_scoped_release nogil;
          r = experiments::simulate_serving(s);
        }
        return serve_result_dict(s, r);
      },
      py::arg("requests") = "rag", py::arg("model") = "llama3-8b",
      py::arg("hw") = "ascend-910b-32g", py::arg("policy") = "u3m", py::arg("cards") = 4,
      py::arg("rate_scale") = 1.0, py::arg("slo_ttft_ms") = 0.0, py::arg("slo_tpot_ms") = 0.0,
      py::arg("limit") = 0,
      "A request trace (a file in any supported format, or 'rag' for the built-in RAG "
      "generator's defaults) served under a KV policy (`u3m serve sim`); figures are simulated "
      "with the named hardware profile, never measured. SLOs of 0 take the model's defaults. "
      "Returns the policy's object of `u3m serve sim --json` (tiers device, host, ssd).");
}

}  // namespace u3m::python
