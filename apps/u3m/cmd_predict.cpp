// `u3m predict eval`: scores access predictors on traces (docs/prediction.md).
#include <unistd.h>

#include <cmath>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "u3m/predict/diagnose.hpp"
#include "u3m/predict/eval.hpp"
#include "u3m/predict/predictor.hpp"
#include "u3m/trace/io.hpp"
#include "u3m/util/error.hpp"

namespace u3m::cli {
namespace {

struct PredictEvalArgs {
  std::vector<std::string> traces;
  std::string predictors;
  std::uint32_t horizon = 64;
  std::uint32_t warmup_iterations = 1;
  bool json = false;
  bool diagnose = false;
  bool window_delta = false;
};

std::string machine() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return fmt::format("{} ({} hardware threads)", host, std::thread::hardware_concurrency());
}

std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string s; std::getline(ss, s, ',');)
    if (!s.empty()) out.push_back(s);
  return out;
}

std::string pct(double v) {
  return std::isnan(v) ? "   n/a" : fmt::format("{:6.1f}", 100 * v);
}

void print_table(const std::string& title, const std::vector<predict::EvalResult>& rs) {
  fmt::print("\n{}\n", title);
  fmt::print("{:<13} {:>9} | {:>6} {:>6} {:>6} | {:>6} {:>6} {:>6} | {:>6} | {:>9}\n", "predictor",
             "horizon", "prec%", "rec%", "F1%", "precC%", "recC%", "F1C%", "recAll", "ns/event");
  for (const auto& r : rs)
    for (const auto& h : r.horizons)
      fmt::print("{:<13} {:>9} | {} {} {} | {} {} {} | {} | {:>9.1f}\n", r.predictor, h.horizon,
                 pct(h.precision()), pct(h.recall()), pct(predict::f1(h.precision(), h.recall())),
                 pct(h.precision_count()), pct(h.recall_count()),
                 pct(predict::f1(h.precision_count(), h.recall_count())), pct(h.recall_all()),
                 r.ns_per_event());
}

void run_eval(const PredictEvalArgs& a) {
  std::vector<std::string> names =
      a.predictors.empty() ? predict::predictor_names() : split_names(a.predictors);
  for (const auto& n : names) predict::make_predictor(n == "oracle" ? "lru" : n);  // validate early
  predict::EvalOptions opt;
  opt.horizons = {8, a.horizon};
  opt.warmup_iterations = a.warmup_iterations;
  if (a.window_delta) {  // the policy's view, scored at the headline horizon only
    opt.window_delta = a.horizon;
    opt.horizons = {a.horizon};
    opt.iteration_horizon = false;
  }
  const std::string headline = std::to_string(a.horizon);

  std::map<std::string, predict::EvalResult> pooled;
  nlohmann::json per_trace = nlohmann::json::object();
  for (const std::string& path : a.traces) {
    trace::Trace t = trace::load_trace(path);
    predict::TraceFeed feed(t);
    std::vector<predict::EvalResult> rs;
    nlohmann::json pj = nlohmann::json::object();
    for (const auto& n : names) {
      auto p = predict::make_predictor(n, &feed);
      std::unique_ptr<predict::Diagnoser> diag;
      predict::EvalOptions o = opt;
      if (a.diagnose) {
        diag = std::make_unique<predict::Diagnoser>(feed, a.horizon);
        o.on_decision = [&](std::size_t k, const std::vector<predict::Predicted>& out, bool warm) {
          diag->on_decision(k, out, warm);
        };
      }
      rs.push_back(predict::evaluate(feed, *p, o));
      if (diag)
        fmt::print("\n{} on {}: error breakdown (computed from the trace)\n{}", n, path,
                   diag->report());
      predict::accumulate(pooled[n], rs.back());
      pj[n] = predict::to_json(rs.back(), headline);
    }
    per_trace[path] = {
        {"events", feed.num_events()}, {"steps", feed.num_steps()}, {"predictors", pj}};
    if (!a.json) {
      print_table(fmt::format("{}: {} events, {} op steps; warm-up excluded: first {} iteration(s) "
                              "of each job ({} events)",
                              path, feed.num_events(), feed.num_steps(), a.warmup_iterations,
                              rs.empty() ? 0 : rs[0].warmup_events),
                  rs);
    }
  }
  if (a.json) {
    nlohmann::json out;
    out["traces"] = a.traces;
    out["horizon_ops"] = a.horizon;
    out["horizons"] = {"8", headline, "iteration"};
    out["warmup_iterations"] = a.warmup_iterations;
    out["default_predictor"] = predict::kDefaultPredictor;
    out["figures"] =
        "precision/recall/f1 computed from the trace(s), byte-weighted; *_count: count-weighted; "
        "recall counts reads/writes of tensors already seen, recall_all every read/write; "
        "ns_per_event measured on " +
        machine();
    nlohmann::json pj = nlohmann::json::object();
    for (const auto& n : names) pj[n] = predict::to_json(pooled[n], headline);
    out["predictors"] = pj;
    out["per_trace"] = per_trace;
    fmt::print("{}\n", out.dump(2));
  } else {
    if (a.traces.size() > 1) {
      std::vector<predict::EvalResult> rs;
      for (const auto& n : names) rs.push_back(pooled[n]);
      print_table("all traces pooled", rs);
    }
    fmt::print(
        "\nprec/rec/F1: computed from the trace, byte-weighted (C: count-weighted); rec: reads and "
        "writes of tensors already seen; recAll: every read/write (first touches count as "
        "misses).\n"
        "ns/event: measured on {}, the predictor's own calls only. Definitions: "
        "docs/prediction.md\n",
        machine());
  }
}

}  // namespace

void add_predict_commands(CLI::App& app) {
  auto* predict = app.add_subcommand("predict", "Access predictors");
  predict->require_subcommand(1);
  auto args = std::make_shared<PredictEvalArgs>();
  auto* eval = predict->add_subcommand(
      "eval", "Score predictors on traces: precision/recall of the predicted next-H-ops sets");
  eval->add_option("TRACE", args->traces, "Trace files (.u3mt, .jsonl, PyTorch ET)")
      ->required()
      ->check(CLI::ExistingFile);
  eval->add_option("--predictors", args->predictors,
                   "Comma-separated list (default: all): u3m-seq, u3m, lru, markov-reuse, "
                   "trace-replay, oracle");
  eval->add_option("--horizon-ops", args->horizon,
                   "Headline horizon in op steps (8 and one "
                   "iteration are always reported too)")
      ->check(CLI::Range(1u, 1u << 20));
  eval->add_option("--warmup-iterations", args->warmup_iterations,
                   "Leading iterations of each job excluded from the headline (reported)");
  eval->add_flag("--json", args->json, "Print one JSON object");
  eval->add_flag("--window-delta", args->window_delta,
                 "Score the window a policy builds from predict_window_delta (entered/left) at "
                 "the headline horizon, and time that call instead of predict()");
  eval->add_flag("--diagnose", args->diagnose,
                 "Also print, per predictor and trace, where the false-positive and missed bytes "
                 "at the headline horizon are (docs/prediction.md, \"Diagnosis\"); slow");
  eval->callback([args] { run_eval(*args); });
}

}  // namespace u3m::cli
