// Each layer's CLI commands live in their own file and register here.
#pragma once

#include <CLI/CLI.hpp>

namespace u3m::cli {

void add_trace_commands(CLI::App& app);       // cmd_trace.cpp: import, stats, convert
void add_trace_gen_command(CLI::App& trace);  // cmd_gen.cpp: trace gen
void add_predict_commands(CLI::App& app);     // cmd_predict.cpp: predict eval

}  // namespace u3m::cli
