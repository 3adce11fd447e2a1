#include "commands.hpp"
namespace u3m::cli {
void add_trace_commands(CLI::App& app) {
  auto* trace = app.add_subcommand("trace", "Tensor-access traces: import, stats, convert, gen");
  trace->require_subcommand(1);
  add_trace_gen_command(*trace);
}
}  // namespace u3m::cli
