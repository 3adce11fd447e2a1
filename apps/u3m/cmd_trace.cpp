// u3m trace import | convert | stats  (gen lives in cmd_gen.cpp)
#include <chrono>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "progress.hpp"
#include "u3m/trace/et_import.hpp"
#include "u3m/trace/io.hpp"
#include "u3m/trace/stats.hpp"
#include "u3m/util/error.hpp"
#include "u3m/util/file.hpp"

namespace u3m::cli {
namespace {

struct CopyOptions {
  std::string input, output, job = "train-0";
  bool job_given = false;
  bool foreign_ok = true;  // import takes PyTorch ET; convert only u3m formats
};

// Reads any format and writes a u3m trace, reporting what it did. Timing is
// wall clock of this process: a measurement on the machine that runs it.
void copy_trace(const CopyOptions& o) {
  using namespace trace;
  auto t0 = std::chrono::steady_clock::now();
  Format fmt_in = detect_format(o.input);
  if (fmt_in == Format::pytorch_et && !o.foreign_ok)
    input_error(o.input, "is a PyTorch Execution Trace: use 'u3m trace import'");
  if (o.job_given && fmt_in != Format::pytorch_et)
    input_error("--job", "applies to PyTorch ET input only; {} is {}", o.input, to_string(fmt_in));
  std::error_code ec;
  if (o.output != "-" && std::filesystem::equivalent(o.input, o.output, ec))
    input_error(o.output, "is also the input; write to another path");
  auto writer = open_writer(o.output);
  StatsSink stats;
  struct Tee final : TraceSink {
    TraceSink &a, &b;
    Tee(TraceSink& a, TraceSink& b) : a(a), b(b) {}
    void meta(std::string_view k, std::string_view v) override { a.meta(k, v), b.meta(k, v); }
    void job(std::string_view n) override { a.job(n), b.job(n); }
    void tensor(const Tensor& t) override { a.tensor(t), b.tensor(t); }
    void op(const Op& x) override { a.op(x), b.op(x); }
    void event(const Event& e) override { a.event(e), b.event(e); }
    void finish() override { a.finish(), b.finish(); }
  } tee(*writer, stats);
  ProgressSink progress(tee, o.input);
  if (fmt_in == Format::pytorch_et) {
    import_pytorch_et_file(o.input, progress, EtImportOptions{o.job});
  } else {
    load(o.input, progress);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto j = stats.to_json();
  auto in_bytes = std::filesystem::file_size(o.input);
  std::uint64_t out_bytes = o.output == "-" ? 0 : std::filesystem::file_size(o.output);
  fmt::print(stderr,
             "{} ({}, {:.2f} MB) -> {} ({:.2f} MB): {} events, {} ops, {} tensors; "
             "{:.2f} s, {:.1f} M events/s (measured, wall clock on this machine)\n",
             o.input, to_string(fmt_in), in_bytes / 1e6, o.output, out_bytes / 1e6,
             j["events"].get<std::uint64_t>(), j["ops"].get<std::uint64_t>(),
             j["tensors"].get<std::uint64_t>(), secs, j["events"].get<double>() / secs / 1e6);
}

void add_copy_command(CLI::App& trace, const char* name, const char* help, bool foreign_ok) {
  auto o = std::make_shared<CopyOptions>();
  o->foreign_ok = foreign_ok;
  auto* cmd = trace.add_subcommand(name, help);
  cmd->add_option("FILE", o->input,
                  "Input trace: PyTorch ET (.json/.json.gz), u3m JSONL or u3m binary")
      ->required();
  cmd->add_option("-o,--output", o->output,
                  "Output file: .jsonl writes JSON lines ('-' for stdout), anything else the "
                  "binary format (.u3mt)")
      ->required();
  CLI::Option* job = nullptr;
  if (foreign_ok)
    job = cmd->add_option("--job", o->job, "Job name given to an imported PyTorch ET")
              ->capture_default_str();
  cmd->callback([o, job] {
    o->job_given = job && job->count() > 0;
    copy_trace(*o);
  });
}

void print_stats_table(const nlohmann::json& j) {
  fmt::print("events        {:>14}\n", j["events"].get<std::uint64_t>());
  fmt::print("ops           {:>14}\n", j["ops"].get<std::uint64_t>());
  fmt::print("tensors       {:>14}\n", j["tensors"].get<std::uint64_t>());
  fmt::print("bytes_unique  {:>14}  ({:.3f} GiB)\n", j["bytes_unique"].get<std::uint64_t>(),
             j["bytes_unique"].get<double>() / (1ull << 30));
  fmt::print("iterations    {:>14}\n", j["iterations"].get<std::uint64_t>());
  fmt::print("duration      {:>14.3f} ms  (trace time; see meta time_model)\n",
             j["duration_ns"].get<double>() / 1e6);
  fmt::print("\njobs:\n");
  for (auto& [name, s] : j["jobs"].items())
    fmt::print("  {:<12} {:>10} ops {:>12} events {:>9} tensors {:>6} iterations {:>10.3f} GiB\n",
               name, s["ops"].get<std::uint64_t>(), s["events"].get<std::uint64_t>(),
               s["tensors"].get<std::uint64_t>(), s["iterations"].get<std::uint64_t>(),
               s["bytes_unique"].get<double>() / (1ull << 30));
  auto section = [](const char* title, const nlohmann::json& m, bool bytes) {
    fmt::print("\n{}:\n", title);
    for (auto& [k, v] : m.items()) {
      if (v.get<std::uint64_t>() == 0) continue;
      if (bytes)
        fmt::print("  {:<14} {:>14.3f} MiB\n", k, v.get<double>() / (1 << 20));
      else
        fmt::print("  {:<14} {:>14}\n", k, v.get<std::uint64_t>());
    }
  };
  section("op classes (ops)", j["op_classes"], false);
  section("phases (ops)", j["phases"], false);
  section("event kinds", j["event_kinds"], false);
  section("unique bytes by role", j["bytes_by_role"], true);
  if (!j["meta"].empty()) {
    fmt::print("\nmeta:\n");
    for (auto& [k, v] : j["meta"].items()) fmt::print("  {}: {}\n", k, v.get<std::string>());
  }
}

}  // namespace

void add_trace_commands(CLI::App& app) {
  auto* trace = app.add_subcommand("trace", "Tensor-access traces: import, convert, stats, gen");
  trace->require_subcommand(1);

  add_copy_command(*trace, "import",
                   "Import a trace (format detected from content: PyTorch Execution Trace, u3m "
                   "JSONL, u3m binary) into a u3m trace file",
                   true);
  add_copy_command(*trace, "convert",
                   "Convert between u3m trace formats (binary .u3mt <-> JSON lines .jsonl)", false);

  struct StatsOptions {
    std::string input;
    bool json = false;
  };
  auto so = std::make_shared<StatsOptions>();
  auto* stats = trace->add_subcommand("stats", "Print statistics of a trace (any format)");
  stats->add_option("FILE", so->input, "Trace file")->required();
  stats->add_flag("--json", so->json,
                  "Print one JSON object: events, ops, tensors, bytes_unique (sum of distinct "
                  "tensor sizes), iterations, op_classes, phases, bytes_by_role, event_kinds, "
                  "jobs, duration_ns, meta");
  stats->callback([so] {
    trace::StatsSink s;
    ProgressSink progress(s, so->input);
    trace::load(so->input, progress);
    if (so->json)
      fmt::print("{}\n", s.to_json().dump(2));
    else
      print_stats_table(s.to_json());
  });

  add_trace_gen_command(*trace);
}

}  // namespace u3m::cli
