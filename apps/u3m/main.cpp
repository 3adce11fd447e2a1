// u3m: the command-line front end. Each layer registers its commands in its
// own cmd_*.cpp; this file only wires them and turns errors into one line
// (Note [CLI errors]).
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "cli_util.hpp"
#include "commands.hpp"
#include "u3m/util/error.hpp"
#include "u3m/util/version.hpp"

namespace {

// The deepest command the parse reached ("u3m serve sim"), for the error line.
const CLI::App* reached(const CLI::App* app) {
  for (const CLI::App* sub : app->get_subcommands()) return reached(sub);
  return app;
}

std::string path_of(const CLI::App* app) {
  std::string p = app->get_name();
  for (const CLI::App* up = app->get_parent(); up; up = up->get_parent())
    p = up->get_name() + " " + p;
  return p;
}

// Note [CLI errors]
// Every bad command line exits 2 with one line "u3m: error: ..." that names
// the flag (or the missing subcommand), as InputError does. CLI11's own
// errors (a conversion, a range check, an unknown flag) carry their own
// exit codes (104-109) and a second line; they are rewritten here. --help
// and --version are ParseErrors with exit code 0 and pass through, and so
// does CLI::RuntimeError, which a command throws to exit with its own
// status (3: a run that found wrong data) after printing its report.
int parse_error(const CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == 0 || e.get_name() == "RuntimeError") return app.exit(e);
  const CLI::App* at = reached(&app);
  std::string what = e.what();
  if (e.get_name() == "RequiredError" && what.starts_with("A subcommand")) {
    std::string names;
    for (const CLI::App* sub : at->get_subcommands({}))
      names += (names.empty() ? "" : ", ") + sub->get_name();
    const std::vector<std::string> left = at->remaining();
    what = left.empty() ? fmt::format("'{}' needs a command: {}", path_of(at), names)
                        : fmt::format("'{}' has no command '{}' (commands: {})", path_of(at),
                                      left.front(), names);
  }
  for (char& c : what)
    if (c == '\n') c = ' ';
  fmt::print(stderr, "u3m: error: {} (see '{} --help')\n", what, path_of(at));
  return 2;
}

// Note [Numeric flags]
// CLI11 reads "nan", "inf" and "1e999" (as inf) into a double, "" as 0 and,
// for a 64-bit unsigned flag, "-1" and "99999999999999999999" as 2^64 - 1.
// No u3m flag means any of these, so every FLOAT flag checks for a finite
// number and every UINT or INT flag for an integer in its 64-bit range
// before its command sees it (CLI11 still refuses what a narrower field
// cannot hold; ranges stay with each command).
template <typename T>
std::string number_error(const std::string& s, const char* what) {
  return u3m::cli::parse_number<T>(s) ? std::string() : fmt::format("'{}' is not {}", s, what);
}

void check_numbers(CLI::App* app) {
  static const CLI::Validator finite(
      [](std::string& s) { return number_error<double>(s, "a finite number"); }, "");
  static const CLI::Validator uint(
      [](std::string& s) { return number_error<std::uint64_t>(s, "a non-negative integer"); }, "");
  static const CLI::Validator sint(
      [](std::string& s) { return number_error<std::int64_t>(s, "an integer"); }, "");
  for (CLI::Option* o : app->get_options()) {
    const std::string type = o->get_type_name();
    if (type.starts_with("FLOAT")) o->check(finite);
    if (type.starts_with("UINT")) o->check(uint);
    if (type.starts_with("INT")) o->check(sint);
  }
  for (CLI::App* sub : app->get_subcommands({})) check_numbers(sub);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "u3m: tiered memory (HBM, host DRAM, NVMe SSD) for LLM training and serving.\n"
      "Run 'u3m COMMAND --help' for the commands below."};
  app.name("u3m");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(u3m::kVersion));
  u3m::cli::add_trace_commands(app);
  u3m::cli::add_predict_commands(app);
  u3m::cli::add_bench_commands(app);
  u3m::cli::add_mem_commands(app);
  u3m::cli::add_run_commands(app);
  u3m::cli::add_train_commands(app);
  u3m::cli::add_serve_commands(app);
  u3m::cli::add_hw_commands(app);
  u3m::cli::add_requests_commands(app);
  u3m::cli::add_doctor_command(app);
  u3m::cli::add_report_command(app);
  u3m::cli::add_plan_commands(app);
  check_numbers(&app);  // Note [Numeric flags]
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return parse_error(app, e);
  } catch (const u3m::InputError& e) {
    fmt::print(stderr, "u3m: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "u3m: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
