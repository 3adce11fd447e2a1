// u3m bench copy | ssd | alloc: measured bandwidths and latencies, each shown
// next to this machine's own reference measured in the same run.
#include "commands.hpp"

namespace u3m::cli {

void add_bench_commands(CLI::App& app) {
  auto* bench = app.add_subcommand(
      "bench", "Measure the memory tiers on this machine (figures are measured, with references)");
  bench->require_subcommand(1);
  add_bench_copy_command(*bench);
  add_bench_ssd_command(*bench);
  add_bench_alloc_command(*bench);
}

}  // namespace u3m::cli
