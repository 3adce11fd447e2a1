// Small helpers shared by the CLI commands (sizes, labels for measured figures).
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace u3m::workload {
struct RagConfig;
}

namespace u3m::cli {

// "where measured": hostname and hardware threads, printed beside every
// measured figure.
std::string machine();

// The whole of `text` as a T: an integer in T's range, or a finite double
// (from_chars alone takes "nan" and "inf"); nullopt for anything else.
template <typename T>
std::optional<T> parse_number(std::string_view text) {
  T v{};
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end) return std::nullopt;
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(v)) return std::nullopt;
  return v;
}

// "512", "64K", "4M", "1G" (also "KiB", "MiB", "GiB", "B"): binary multiples.
// Throws InputError naming `where` unless 1 <= size <= max_bytes.
std::uint64_t parse_size(std::string_view text, std::string_view where, std::uint64_t max_bytes);
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
// "64 KiB", "4 MiB", "512 B": exact, for sizes a user chose.
std::string human_bytes(std::uint64_t bytes);
// "11.75 MiB", "812.0 KiB", "96 B": rounded, for measured amounts.
std::string approx_bytes(double bytes);
double median(std::vector<double> v);

}  // namespace u3m::cli
