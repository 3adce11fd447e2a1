// Small helpers shared by the CLI commands (sizes, labels for measured figures).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace u3m::cli {

// "where measured": hostname and hardware threads, printed beside every
// measured figure.
std::string machine();

// "512", "64K", "4M", "1G" (also "KiB", "MiB", "GiB", "B"): binary multiples.
// Throws InputError naming `where` unless 1 <= size <= max_bytes.
std::uint64_t parse_size(std::string_view text, std::string_view where, std::uint64_t max_bytes);
// A comma-separated list of sizes ("64K,1M,4M"); empty items and lists are errors.
std::vector<std::uint64_t> parse_size_list(std::string_view list, std::string_view where,
                                           std::uint64_t max_bytes);
// "64 KiB", "4 MiB", "512 B": exact, for sizes a user chose.
std::string human_bytes(std::uint64_t bytes);
// "11.75 MiB", "812.0 KiB", "96 B": rounded, for measured amounts.
std::string approx_bytes(double bytes);
double median(std::vector<double> v);

}  // namespace u3m::cli
