// u3m: the command-line front end. Each layer registers its commands in its
// own cmd_*.cpp; this file only wires them and turns errors into one line.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "commands.hpp"
#include "u3m/util/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "u3m: tiered memory (HBM, host DRAM, NVMe SSD) for LLM training and serving.\n"
      "Run 'u3m COMMAND --help' for the commands below."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "u3m 0.1.0");
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const u3m::InputError& e) {
    fmt::print(stderr, "u3m: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "u3m: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
