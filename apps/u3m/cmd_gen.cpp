#include "commands.hpp"
namespace u3m::cli {
void add_trace_gen_command(CLI::App&) {}  // placeholder until the workload layer lands
}  // namespace u3m::cli
