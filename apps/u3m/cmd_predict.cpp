// `u3m predict eval`: scores access predictors on traces (docs/prediction.md).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "u3m/config/run_config.hpp"
#include "u3m/predict/bound.hpp"
#include "u3m/predict/diagnose.hpp"
#include "u3m/util/version.hpp"
#include "u3m/predict/eval.hpp"
#include "u3m/predict/predictor.hpp"
#include "u3m/trace/io.hpp"
#include "u3m/util/error.hpp"

namespace u3m::cli {
namespace {

struct PredictEvalArgs {
  std::vector<std::string> traces;
  std::string predictors;
  bool predictors_given = false;  // an explicit empty list is an error, not "all"
  std::uint32_t horizon = 64;
  std::uint32_t warmup_iterations = 1;
  std::uint32_t switch_ops = 64;
  bool json = false;
  bool diagnose = false;
  bool window_delta = false;
  bool exchangeable = false;
  std::string config;          // --config FILE
  nlohmann::json config_used;  // what the run used, in the config's shape (docs/config.md)
};

// The --predictors list: every name known, none empty, none twice.
std::vector<std::string> parse_predictors(const std::string& list) {
  const auto& known = predict::predictor_names();
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::size_t pos = 0;
  for (std::string s; std::getline(ss, s, ',');) {
    ++pos;
    if (s.empty())
      input_error("--predictors",
                  "empty name at position {} in '{}' (a comma-separated list of {})", pos, list,
                  fmt::join(known, ", "));
    bool deprecated = false;
    const std::string canonical(predict::canonical_predictor_name(s, &deprecated));
    if (deprecated)  // Note [Predictor names]
      fmt::print(stderr, "u3m: note: --predictors: '{}' is an old name of '{}'; use '{}'\n", s,
                 canonical, canonical);
    s = canonical;
    if (std::find(known.begin(), known.end(), s) == known.end())
      input_error("--predictors", "unknown predictor '{}' (known: {})", s, fmt::join(known, ", "));
    if (std::find(out.begin(), out.end(), s) != out.end())
      input_error("--predictors", "'{}' is listed twice in '{}'", s, list);
    out.push_back(s);
  }
  if (list.empty() || list.back() == ',')  // getline drops a trailing empty field
    input_error("--predictors", "empty name at position {} in '{}' (a comma-separated list of {})",
                pos + 1, list, fmt::join(known, ", "));
  return out;
}

// Pooled counts add per trace, so a trace given twice would count twice.
void reject_duplicate_traces(const std::vector<std::string>& traces) {
  std::map<std::filesystem::path, std::string> seen;
  for (const std::string& t : traces) {
    std::error_code ec;
    std::filesystem::path c = std::filesystem::weakly_canonical(t, ec);
    if (ec) c = t;
    auto [it, fresh] = seen.emplace(c, t);
    if (!fresh)
      input_error(t, "given twice (also as '{}'): each trace may be evaluated once", it->second);
  }
}

std::string pct(double v) {
  return std::isnan(v) ? "   n/a" : fmt::format("{:6.1f}", 100 * v);
}

void print_table(const std::string& title, const std::vector<predict::EvalResult>& rs) {
  fmt::print("\n{}\n", title);
  fmt::print("{:<13} {:>9} | {:>6} {:>6} {:>6} {:>8} {:>6} | {:>6} {:>6} {:>6} {:>8} | {:>9}\n",
             "predictor", "horizon", "prec%", "rec%", "F1%", "recKnwn%", "ceil%", "precC%", "recC%",
             "F1C%", "recKnwnC", "ns/event");
  for (const auto& r : rs)
    for (const auto& h : r.horizons)
      fmt::print("{:<13} {:>9} | {} {} {} {:>8} {} | {} {} {} {:>8} | {:>9.1f}\n", r.predictor,
                 h.horizon, pct(h.precision()), pct(h.recall()),
                 pct(predict::f1(h.precision(), h.recall())), pct(h.recall_known()),
                 pct(h.recall_ceiling()), pct(h.precision_count()), pct(h.recall_count()),
                 pct(predict::f1(h.precision_count(), h.recall_count())),
                 pct(h.recall_known_count()), r.ns_per_event());
}

// Iterations of the job that runs longest, for the warm-up message.
std::uint32_t max_iterations(const trace::Trace& t) {
  std::vector<std::uint32_t> hi(t.jobs.size() + 1, 0);
  for (const trace::Op& o : t.ops) {
    if (o.job >= hi.size()) hi.resize(o.job + 1, 0);
    hi[o.job] = std::max(hi[o.job], o.iteration + 1);
  }
  return hi.empty() ? 0 : *std::max_element(hi.begin(), hi.end());
}

void print_slices(const std::vector<predict::EvalResult>& rs) {
  if (rs.empty()) return;
  fmt::print("per job and after switches (horizon {}, after warm-up; {} switches between jobs "
             "in the trace, after each the first {} op steps):\n",
             rs[0].slice_horizon, rs[0].switches, rs[0].switch_ops);
  fmt::print("{:<13} {:<16} | {:>6} {:>8} {:>6} {:>6} | {:>9}\n", "predictor", "slice", "prec%",
             "recKnwn%", "F1k%", "ceil%", "decisions");
  for (const auto& r : rs) {
    std::vector<const predict::SliceMetrics*> slices;
    for (const auto& j : r.per_job) slices.push_back(&j);
    slices.push_back(&r.after_switch);
    for (const predict::SliceMetrics* s : slices) {
      const predict::HorizonMetrics m = s->metrics();
      fmt::print("{:<13} {:<16} | {} {:>8} {} {} | {:>9}\n", r.predictor, s->name,
                 pct(m.precision()), pct(m.recall_known()),
                 pct(predict::f1(m.precision(), m.recall_known())), pct(m.recall_ceiling()),
                 m.sums.decisions);
    }
    if (r.switches_detected >= 0)
      fmt::print("{:<13} its own mode-switch detector applied {} switch(es)\n", r.predictor,
                 r.switches_detected);
  }
}

// The schedule bound of one trace and each predictor's expected figures
// under it (Note [Schedule bound] in src/predict/bound.cpp).
void print_bound(const predict::ScheduleBound& b, std::uint32_t horizon,
                 const std::string& expected) {
  fmt::print("schedule bound (horizon {}, after warm-up; assumed by --exchangeable-schedule: the "
             "order of the {} schedule items is exchangeable, an item's contents do not depend on "
             "where it runs; computed from the trace):\n",
             horizon, b.items);
  if (!b.computed) {
    fmt::print("  not computed: {}\n", b.why_not);
    return;
  }
  fmt::print("  {} of {} decisions bet on the next item; {:.1f}% of the expected known accessed "
             "bytes are uncertain\n",
             b.uncertain_decisions, b.decisions, 100 * b.uncertain_bytes / b.known_bytes);
  fmt::print("  no causal predictor, in expectation: recKnwn > {:.1f}% at prec >= {:.0f}%, or "
             "prec > {:.1f}% at recKnwn >= {:.0f}%: the bar is {} (the best predicts a tensor "
             "whose access within the horizon has probability >= {:.2f})\n",
             100 * b.recall_known_at_bar, 100 * b.precision_bar, 100 * b.precision_at_bar,
             100 * b.recall_bar, b.rules_out_bar() ? "ruled out" : "not ruled out", b.threshold);
  if (!expected.empty())
    fmt::print("{:<13} {:<10} | {:>6} {:>8} {:>6}\n{}", "predictor", "figures", "prec%",
               "recKnwn%", "F1k%", expected);
}

void run_eval(const PredictEvalArgs& a) {
  // Checked here, not by CLI11, so the message names the flag whatever the parser does.
  if (a.horizon < 1 || a.horizon > (1u << 20))
    input_error("--horizon-ops", "must be between 1 and {} op steps, got {}", 1u << 20, a.horizon);
  if (a.switch_ops < 1) input_error("--switch-ops", "must be at least 1 op step, got 0");
  std::vector<std::string> names =
      a.predictors_given ? parse_predictors(a.predictors) : predict::predictor_names();
  reject_duplicate_traces(a.traces);
  predict::EvalOptions opt;
  opt.horizons = {8, a.horizon};
  opt.warmup_iterations = a.warmup_iterations;
  opt.switch_ops = a.switch_ops;
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
    nlohmann::json pj = nlohmann::json::object(), dj = nlohmann::json::object();
    std::string diag_text, expected_text;
    predict::ScheduleBound bound;
    if (a.exchangeable) {  // Note [Schedule bound]
      predict::ScheduleBoundOptions bo;
      bo.horizon = a.horizon;
      bo.warmup_iterations = a.warmup_iterations;
      bound = predict::schedule_bound(feed, bo);
    }
    for (const auto& n : names) {
      auto p = predict::make_predictor(n, &feed);
      std::unique_ptr<predict::Diagnoser> diag;
      std::unique_ptr<predict::ExpectedScore> expected;
      predict::EvalOptions o = opt;
      if (a.diagnose) diag = std::make_unique<predict::Diagnoser>(feed, a.horizon);
      if (a.exchangeable && bound.computed)
        expected = std::make_unique<predict::ExpectedScore>(feed, a.horizon, a.warmup_iterations);
      if (diag || expected)
        o.on_decision = [&](std::size_t k, const std::vector<predict::Predicted>& out, bool warm) {
          if (diag) diag->on_decision(k, out, warm);
          if (expected) expected->on_decision(k, out);
        };
      rs.push_back(predict::evaluate(feed, *p, o));
      if (rs.back().horizons.front().sums.decisions == 0 && feed.num_steps() > 0)
        input_error("--warmup-iterations",
                    "{} excludes every decision point of {} (its longest job runs {} "
                    "iteration(s)); give a smaller value",
                    a.warmup_iterations, path, max_iterations(t));
      if (diag && a.json) dj[n] = diag->to_json();
      if (diag && !a.json)
        diag_text += fmt::format("\n{} on {}: error breakdown (computed from the trace)\n{}", n,
                                 path, diag->report());
      predict::accumulate(pooled[n], rs.back());
      pj[n] = predict::to_json(rs.back(), headline);
      if (expected && expected->computed()) {
        pj[n]["expected"] = {{"precision", expected->precision()},
                             {"recall_known", expected->recall_known()}};
        expected_text += fmt::format("{:<13} expected   | {} {:>8} {}\n", n,
                                     pct(expected->precision()), pct(expected->recall_known()),
                                     pct(predict::f1(expected->precision(), expected->recall_known())));
      }
    }
    per_trace[path] = {
        {"events", feed.num_events()}, {"steps", feed.num_steps()}, {"predictors", pj}};
    if (a.diagnose) per_trace[path]["diagnosis"] = dj;
    if (a.exchangeable) per_trace[path]["schedule_bound"] = predict::to_json(bound);
    if (!a.json) {
      print_table(fmt::format("{}: {} events, {} op steps; warm-up excluded: first {} iteration(s) "
                              "of each job ({} events)",
                              path, feed.num_events(), feed.num_steps(), a.warmup_iterations,
                              rs.empty() ? 0 : rs[0].warmup_events),
                  rs);
      print_slices(rs);
      if (a.exchangeable) print_bound(bound, a.horizon, expected_text);
      fmt::print("{}", diag_text);
    }
  }
  if (a.json) {
    nlohmann::json out;
    out["traces"] = a.traces;
    out["horizon_ops"] = a.horizon;
    nlohmann::json hs = nlohmann::json::array();  // as scored, not as configured
    for (const auto& h : pooled.at(names.front()).horizons) hs.push_back(h.horizon);
    out["horizons"] = hs;
    out["warmup_iterations"] = a.warmup_iterations;
    out["default_predictor"] = predict::kDefaultPredictor;
    out["figures"] =
        "precision/recall/f1 computed from the trace(s), byte-weighted; *_count: count-weighted; "
        "recall over every read/write (first touches count as misses); recall_known over "
        "reads/writes of tensors already seen; recall_ceiling = bytes(A_known)/bytes(A), the "
        "most recall any online predictor can reach (the oracle's); "
        "ns_per_event measured on " +
        machine();
    nlohmann::json pj = nlohmann::json::object();
    for (const auto& n : names) pj[n] = predict::to_json(pooled[n], headline);
    out["predictors"] = pj;
    out["per_trace"] = per_trace;
    out["config"] = a.config_used;
    out["version"] = kVersion;
    fmt::print("{}\n", out.dump(2));
  } else {
    if (a.traces.size() > 1) {
      std::vector<predict::EvalResult> rs;
      for (const auto& n : names) rs.push_back(pooled[n]);
      print_table("all traces pooled", rs);
    }
    fmt::print(
        "\nprec/rec/F1: computed from the trace, byte-weighted (C: count-weighted); rec: every "
        "read/write (first touches count as misses); recKnwn: reads/writes of tensors already "
        "seen; ceil: bytes(A_known)/bytes(A), the most rec any online predictor can reach (what "
        "oracle reaches).\n"
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
  auto* predictors =
      eval->add_option("--predictors", args->predictors,
                       fmt::format("Comma-separated list, each name once (default: all): {}",
                                   fmt::join(predict::predictor_names(), ", ")));
  eval->add_option("--horizon-ops", args->horizon,
                   "Headline horizon in op steps, 1 to 1048576 (8 and one "
                   "iteration are always reported too)")
      ->capture_default_str();
  eval->add_option("--switch-ops", args->switch_ops,
                   "Score the decision points in the first N op steps after each switch "
                   "between jobs apart (reported per trace)")
      ->capture_default_str();
  eval->add_option("--warmup-iterations", args->warmup_iterations,
                   "Leading iterations of each job excluded from the headline (reported)")
      ->capture_default_str();
  eval->add_flag("--json", args->json, "Print one JSON object");
  eval->add_flag("--exchangeable-schedule", args->exchangeable,
                 "The traces' schedule items (training steps, requests) run in a random, "
                 "exchangeable order: also report the schedule bound, the most any causal "
                 "predictor reaches in expectation, and each predictor's expected figures "
                 "(docs/prediction.md, \"The schedule bound\")");
  eval->add_flag("--window-delta", args->window_delta,
                 "Score the window a policy builds from predict_window_delta (entered/left) at "
                 "the headline horizon, and time that call instead of predict()");
  eval->add_flag("--diagnose", args->diagnose,
                 "Also report, per predictor and trace, where the false-positive, missed and "
                 "first-touch bytes at the headline horizon are (docs/prediction.md, "
                 "\"Diagnosis\"): after each table, or with --json under "
                 "per_trace.TRACE.diagnosis; slow");
  eval->add_option("--config", args->config,
                   "Run config, a TOML file (docs/config.md): predictor.name (scored alone), "
                   "predictor.horizon. A flag given here wins over the file")
      ->check(CLI::ExistingFile);
  eval->callback([args, predictors, eval] {
    args->predictors_given = predictors->count() > 0;
    config::Binder b = config_binder(args->config, eval);
    if (b.file().predictor.name && !args->predictors_given) args->predictors_given = true;
    b.bind(U3M_CONFIG_FIELD(predictor.name), "--predictors", args->predictors,
           [](const std::string& v) { return v; },
           [](const std::string& v) { return v.empty() ? std::nullopt : std::optional(v); });
    b.bind(U3M_CONFIG_FIELD(predictor.horizon), "--horizon-ops", args->horizon);
    args->config_used = b.effective();
    run_eval(*args);
  });
}

}  // namespace u3m::cli
