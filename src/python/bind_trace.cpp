// Bindings of the trace model and io, the predictors' evaluation and the
// training simulator (issue 7). Results that the CLI prints as JSON come back
// as the same JSON, turned into Python dicts.
#include <cstdint>
#include <string>
#include <vector>

#include <pybind11/stl.h>
#include <nlohmann/json.hpp>

#include "bindings.hpp"
#include "u3m/experiments/offload_check.hpp"
#include "u3m/experiments/train.hpp"
#include "u3m/experiments/train_json.hpp"
#include "u3m/policy/tiering.hpp"
#include "u3m/predict/eval.hpp"
#include "u3m/predict/predictor.hpp"
#include "u3m/sim/calibrate.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/trace/io.hpp"
#include "u3m/trace/model.hpp"
#include "u3m/trace/stats.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/shape.hpp"

namespace py = pybind11;

namespace u3m::python {
namespace {

py::object to_python(const nlohmann::json& j) {
  // One conversion for every JSON result: through the json module, which
  // maps NaN/inf and big integers the way Python users expect. (Not cached in
  // a static: its destructor would run after the interpreter is gone.)
  return py::module_::import("json").attr("loads")(j.dump());
}

py::dict tensor_dict(const trace::Tensor& t) {
  py::dict d;
  d["id"] = t.id;
  d["name"] = t.name;
  d["bytes"] = t.bytes;
  d["dtype"] = std::string(trace::to_string(t.dtype));
  d["role"] = std::string(trace::to_string(t.role));
  d["layer"] = t.layer;
  d["job"] = t.job;
  return d;
}

py::dict op_dict(const trace::Op& o) {
  py::dict d;
  d["name"] = o.name;
  d["class"] = std::string(trace::to_string(o.cls));
  d["phase"] = std::string(trace::to_string(o.phase));
  d["job"] = o.job;
  d["iteration"] = o.iteration;
  d["layer"] = o.layer;
  d["flops"] = o.flops;
  d["bytes"] = o.bytes;
  return d;
}

nlohmann::json stats_of(const trace::Trace& t) {
  trace::StatsSink s;
  t.replay(s);
  return s.to_json();
}

// The result schema is the CLI's (experiments::train_sim_json), converted.
py::object train_result_dict(const experiments::TrainScenario& s,
                             const experiments::TrainResult& r) {
  return py::module_::import("json").attr("loads")(experiments::train_sim_json(s, r).dump());
}

}  // namespace

void bind_trace(py::module_& m) {
  py::register_exception<InputError>(m, "InputError", PyExc_ValueError);

  m.def("stable_id", &trace::stable_id, py::arg("name"),
        "xxh64 of a tensor name: the stable id a trace records (Note [Stable identity]).");

  py::class_<trace::Trace>(m, "Trace", "A whole u3m trace in memory (docs/trace-format.md).")
      .def(py::init<>(), "An empty trace.")
      .def_property_readonly("num_tensors", [](const trace::Trace& t) { return t.tensors.size(); })
      .def_property_readonly("num_ops", [](const trace::Trace& t) { return t.ops.size(); })
      .def_property_readonly("num_events", [](const trace::Trace& t) { return t.events.size(); })
      .def_property_readonly("jobs", [](const trace::Trace& t) { return t.jobs; })
      .def_property_readonly("metadata",
                             [](const trace::Trace& t) {
                               py::dict d;
                               for (const auto& [k, v] : t.metadata) d[py::str(k)] = v;
                               return d;
                             })
      .def(
          "tensor",
          [](const trace::Trace& t, std::size_t i) {
            if (i >= t.tensors.size())
              throw py::index_error("tensor index " + std::to_string(i) + " out of range");
            return tensor_dict(t.tensors[i]);
          },
          py::arg("index"))
      .def("tensors",
           [](const trace::Trace& t) {
             py::list l;
             for (const trace::Tensor& x : t.tensors) l.append(tensor_dict(x));
             return l;
           })
      .def("ops",
           [](const trace::Trace& t) {
             py::list l;
             for (const trace::Op& o : t.ops) l.append(op_dict(o));
             return l;
           })
      .def(
          "events",
          [](const trace::Trace& t) {
            py::list l;
            for (const trace::Event& e : t.events)
              l.append(
                  py::make_tuple(e.time_ns, e.op, e.tensor, std::string(trace::to_string(e.kind))));
            return l;
          },
          "Events as (time_ns, op index, tensor index, kind) tuples.")
      .def(
          "stats", [](const trace::Trace& t) { return to_python(stats_of(t)); },
          "What `u3m trace stats --json` prints.")
      .def(
          "write",
          [](const trace::Trace& t, const std::string& path) {
            py::gil_scoped_release nogil;
            std::unique_ptr<trace::TraceSink> w = trace::open_writer(path);
            t.replay(*w);
            w->finish();
          },
          py::arg("path"), "Writes .jsonl as JSON lines, anything else as the binary .u3mt.")
      .def("__repr__", [](const trace::Trace& t) {
        return "<u3m.Trace tensors=" + std::to_string(t.tensors.size()) +
               " ops=" + std::to_string(t.ops.size()) +
               " events=" + std::to_string(t.events.size()) + ">";
      });

  m.def(
      "load_trace",
      [](const std::string& path) {
        py::gil_scoped_release nogil;
        return trace::load_trace(path);
      },
      py::arg("path"), "Reads a .u3mt, .jsonl or PyTorch Execution Trace file.");

  m.def("predictor_names", &predict::predictor_names, "Names evaluate_predictor accepts.");
  m.def(
      "evaluate_predictor",
      [](const trace::Trace& t, const std::string& name, std::vector<std::uint32_t> horizons,
         std::uint32_t warmup_iterations, const std::string& headline) {
        if (horizons.empty()) input_error("horizons", "need at least one horizon (op steps)");
        for (std::uint32_t h : horizons)
          if (h == 0) input_error("horizons", "a horizon must be >= 1 op step");
        predict::EvalOptions o;
        o.horizons = horizons;
        o.warmup_iterations = warmup_iterations;
        const std::string head = headline.empty() ? std::to_string(horizons.back()) : headline;
        bool known = head == "iteration";
        for (std::uint32_t h : horizons) known = known || head == std::to_string(h);
        if (!known)
          input_error("headline", "'{}' is neither 'iteration' nor one of the horizons", head);
        nlohmann::json j;
        {
          py::gil_scoped_release nogil;
          predict::TraceFeed feed(t);
          auto p = predict::make_predictor(name, &feed);
          j = predict::to_json(predict::evaluate(feed, *p, o), head);
        }
        j["predictor"] = name;
        j["headline"] = head;
        j["label"] = "computed from the trace (ns_per_event measured on this machine)";
        return to_python(j);
      },
      py::arg("trace"), py::arg("predictor") = std::string(predict::kDefaultPredictor),
      py::arg("horizons") = std::vector<std::uint32_t>{8, 64}, py::arg("warmup_iterations") = 1,
      py::arg("headline") = "",
      "Scores a predictor on a trace (docs/prediction.md, 'Metrics'); what `u3m predict eval` "
      "reports for one predictor.");

  m.def(
      "simulate_offload",
      [](const trace::Trace& t, const std::string& hw, std::uint64_t budget_bytes,
         const std::string& policy, unsigned lookahead, std::uint64_t host_bytes,
         double access_overhead_s) {
        experiments::OffloadSimOptions o;
        o.access_overhead_s = access_overhead_s;
        o.budget_bytes = budget_bytes;
        o.host_bytes = host_bytes;
        o.policy = policy;
        o.lookahead = lookahead;
        const sim::HwProfile prof = sim::load_profile(hw);
        experiments::OffloadSim r;
        {
          py::gil_scoped_release nogil;
          r = experiments::simulate_offload(t, prof, o);
        }
        const auto link = [&](engine::Link l) { return r.report.links[static_cast<int>(l)].bytes; };
        nlohmann::json j = {
            {"label", fmt::format("simulated with profile '{}', policy {}, u3m.torch.offload's view "
                                  "of the trace (Note [Offload view])",
                                  prof.name, policy)},
            {"ok", r.report.ok()},
            {"first_error", r.report.first_error},
            {"step_s", r.step_s},
            {"compute_step_s", r.compute_step_s},
            {"captured_compute_step_s", r.captured_compute_step_s},
            {"managed_bytes", r.managed_bytes},
            {"device_budget", r.report.device_budget},
            {"ops", r.ops},
            {"copy_ops", r.copy_ops},
            {"stall_s", double(r.report.stall_ns) * 1e-9},
            {"h2d_bytes", link(engine::Link::h2d)},
            {"d2h_bytes", link(engine::Link::d2h)},
            {"evictions", r.report.engine.evictions},
            {"peak_device", r.report.peak_device}};
        return to_python(j);
      },
      py::arg("trace"), py::arg("hw"), py::arg("budget_bytes"), py::arg("policy") = "u3m",
      py::arg("lookahead") = 16, py::arg("host_bytes") = 0, py::arg("access_overhead_s") = -1.0,
      "The simulated side of the PyTorch sim-versus-real check: a trace captured by "
      "u3m.torch.capture, run as u3m.torch.offload runs it, on a hardware profile (name or "
      "TOML path) at the offload's device budget. Figures are simulated, never measured.");
  m.def(
      "calibrate_profile",
      [](double seconds, const std::string& dir, const std::string& host, const std::string& date) {
        sim::CalibrateOptions o;
        o.seconds = seconds;
        o.seconds_flag = "seconds";
        o.dir = dir;
        o.host = host;
        o.date = date;
        std::string text;
        {
          py::gil_scoped_release nogil;
          text = sim::to_toml(sim::profile_from_measurements(sim::measure_machine(o), o));
        }
        return text;
      },
      py::arg("seconds") = 3.0, py::arg("dir") = "/var/tmp", py::arg("host") = "this machine",
      py::arg("date") = "",
      "What `u3m hw calibrate` measures and writes: this machine's 'local' profile as TOML text.");
  m.def(
      "tiering_policy_names",
      [] {
        std::vector<std::string> v;
        for (const policy::PolicyInfo& p : policy::tiering_policies()) v.emplace_back(p.name);
        return v;
      },
      "Names u3m.torch.offload's policy= and simulate_offload accept.");
  m.def("train_policy_names", &experiments::train_policy_names);
  m.def(
      "simulate_training",
      [](const std::string& model, const std::string& hw, const std::string& policy,
         std::uint32_t cards, std::uint32_t steps, std::uint32_t seq_len,
         std::uint32_t micro_batch_size, std::uint32_t micro_batches, bool mixed_precision,
         bool recompute, std::uint32_t lora_rank, const std::string& card_model) {
        experiments::TrainScenario s;
        s.card_model = experiments::parse_card_model(card_model, "card_model");
        s.shape = experiments::find_model(model);
        s.hw = sim::load_profile(hw);
        s.policy = policy;
        s.cards = cards;
        s.steps = steps;
        s.train.seq_len = seq_len;
        s.train.micro_batch_size = micro_batch_size;
        s.train.micro_batches = micro_batches;
        s.train.mixed_precision = mixed_precision;
        s.train.recompute = recompute;
        s.train.lora_rank = lora_rank;
        s.validate();
        experiments::TrainResult r;
        {
          py::gil_scoped_release nogil;
          r = experiments::simulate_training(s);
        }
        return train_result_dict(s, r);
      },
      py::arg("model") = "tiny", py::arg("hw") = "ascend-910b-32g", py::arg("policy") = "u3m",
      py::arg("cards") = 1, py::arg("steps") = 3, py::arg("seq_len") = 2048,
      py::arg("micro_batch_size") = 1, py::arg("micro_batches") = 1,
      py::arg("mixed_precision") = true, py::arg("recompute") = false, py::arg("lora_rank") = 0,
      py::arg("card_model") = "symmetric",
      "One training step simulated under a tiering policy (`u3m train sim`); figures are "
      "simulated with the named hardware profile, never measured.");
}

}  // namespace u3m::python
