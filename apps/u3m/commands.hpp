// Each layer's CLI commands live in their own file and register here.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "u3m/config/run_config.hpp"

namespace u3m::cli {

// The run config `--config PATH` names ("" = none) against `cmd`'s flags: a
// flag given on the command line wins over the file (docs/config.md).
inline config::Binder config_binder(const std::string& path, const CLI::App* cmd) {
  return config::Binder(path.empty() ? config::RunConfig{} : config::load_run_config(path),
                        [cmd](std::string_view flag) { return cmd->count(std::string(flag)) > 0; });
}

void add_trace_commands(CLI::App& app);       // cmd_trace.cpp: import, stats, convert
void add_trace_gen_command(CLI::App& trace);  // cmd_gen.cpp: trace gen
void add_predict_commands(CLI::App& app);     // cmd_predict.cpp: predict eval
void add_bench_commands(CLI::App& app);       // cmd_bench.cpp: bench copy|ssd|alloc
void add_mem_commands(CLI::App& app);         // cmd_mem.cpp: mem plan
void add_hw_commands(CLI::App& app);        // cmd_hw.cpp: hw show|calibrate (sim profiles)
void add_requests_commands(CLI::App& app);  // cmd_requests.cpp: requests import|gen|stats
void add_run_commands(CLI::App& app);       // cmd_run.cpp: run replay (runtime under a budget)
void add_train_commands(CLI::App& app);     // cmd_train.cpp: train sim|capacity (simulated)
void add_serve_commands(CLI::App& app);     // cmd_serve.cpp: serve sim|capacity (simulated)
void add_bench_copy_command(CLI::App& bench);   // cmd_bench_copy.cpp (device-emu, host)
void add_bench_ssd_command(CLI::App& bench);    // cmd_bench_ssd.cpp (SSD store)
void add_bench_alloc_command(CLI::App& bench);  // cmd_bench_alloc.cpp (pool allocator)
void add_doctor_command(CLI::App& app);         // cmd_doctor.cpp: doctor (what this machine offers)
void add_report_command(CLI::App& app);         // cmd_report.cpp: report (plots, HTML; python/u3m_report)
void add_plan_commands(CLI::App& app);          // cmd_plan.cpp: plan cost (cheapest hardware for a target)

}  // namespace u3m::cli
