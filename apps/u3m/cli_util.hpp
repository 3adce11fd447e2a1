// Small helpers shared by the CLI commands (sizes, labels for measured figures).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "u3m/util/units.hpp"

namespace u3m::workload {
struct RagConfig;
}

namespace u3m::cli {

// "where measured": hostname and hardware threads, printed beside every
// measured figure.
std::string machine();

// Shared with the run config (u3m/util/units.hpp).
using util::human_bytes;
using util::parse_number;
using util::parse_size;

// A comma-separated list of sizes ("64K,1M,4M"); empty items and lists are errors.
std::vector<std::uint64_t> parse_size_list(std::string_view list, std::string_view where,
                                           std::uint64_t max_bytes);
// A comma-separated list of positive token counts ("4096,65536"); an empty
// list is no list (returns none), an empty or zero item is an error.
std::vector<std::uint64_t> parse_token_list(std::string_view list, std::string_view where);
// A comma-separated list of names, each one of `known` ("hbm-only,u3m");
// an empty list or item and an unknown name are errors naming `where`.
std::vector<std::string> parse_name_list(std::string_view list, std::string_view where,
                                         const std::vector<std::string>& known);
// "rag" or "rag:KEY=V,...": serve's built-in RAG generator (docs/serving.md),
// validated. Errors name `--requests rag:KEY` (the spec's key, not a flag).
workload::RagConfig parse_rag_spec(std::string_view spec);
// "11.75 MiB", "812.0 KiB", "96 B": rounded, for measured amounts.
std::string approx_bytes(double bytes);
double median(std::vector<double> v);

}  // namespace u3m::cli
