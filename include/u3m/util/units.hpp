// Numbers and sizes as users write them, read the same way by the CLI's
// flags and by the run config (config/run_config.hpp).
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace u3m::util {

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
// "64 KiB", "4 MiB", "512 B": exact, for sizes a user chose.
std::string human_bytes(std::uint64_t bytes);

}  // namespace u3m::util
