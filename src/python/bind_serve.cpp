// Bindings of the serving simulator (`u3m serve sim`): one request trace
// served under a KV policy, figures simulated with a hardware profile.
#include <cstdint>
#include <string>

#include <pybind11/stl.h>

#include "bindings.hpp"
#include "u3m/experiments/serve.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/rag.hpp"
#include "u3m/workload/shape.hpp"

namespace py = pybind11;

namespace u3m::python {
namespace {

py::dict percentiles(const experiments::Percentiles& p) {
  py::dict d;
  d["p50"] = p.p50;
  d["p90"] = p.p90;
  d["p99"] = p.p99;
  return d;
}

py::dict serve_result_dict(const experiments::ServeScenario& s, const experiments::ServeResult& r) {
  py::dict d;
  d["label"] = "simulated (profile " + s.hw.name + ", model " + s.shape.name + ", cards " +
               std::to_string(s.cards) + ")";
  d["policy"] = r.policy;
  d["requests"] = r.requests;
  d["finished"] = r.finished;
  d["too_large"] = r.too_large;
  d["met"] = r.met;
  d["met_fraction"] = r.met_fraction;
  d["goodput_rps"] = r.goodput_rps;
  d["throughput_rps"] = r.throughput_rps;
  d["ttft_ms"] = percentiles(r.ttft_ms);
  d["tpot_ms"] = percentiles(r.tpot_ms);
  d["slo_ttft_ms"] = r.slo.ttft_ms;
  d["slo_tpot_ms"] = r.slo.tpot_ms;
  d["kv_hit_rate"] = r.kv_hit_rate;
  d["max_concurrency"] = r.max_concurrency;
  py::dict peak;
  peak["device"] = r.peak_bytes[0];
  peak["host"] = r.peak_bytes[1];
  peak["ssd"] = r.peak_bytes[2];
  d["peak_bytes"] = peak;
  return d;
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
      "with the named hardware profile, never measured. SLOs of 0 take the model's defaults.");
}

}  // namespace u3m::python
