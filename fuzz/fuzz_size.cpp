// libFuzzer target for the CLI's size and count parsers (apps/u3m/cli_util.cpp):
// parse_size, parse_size_list and parse_token_list. Input: 8 bytes of the
// largest size allowed (little endian), then the text.
//
// Checked against an independent reading of the grammar (digits, then an
// optional B/K/M/G/KiB/MiB/GiB suffix): each parser accepts exactly what the
// grammar allows within 1..max and returns its value, and refuses the rest
// with an InputError. A parser that accepts 0, a value over the limit, a
// wrapped-around product or a sign is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "cli_util.hpp"
#include "u3m/util/error.hpp"

namespace {

// The grammar's value, saturated at 2^64 (std::nullopt: not in the grammar).
std::optional<unsigned __int128> reference(std::string_view t) {
  unsigned __int128 mult = 1;
  for (auto [suffix, m] : {std::pair{"KiB", 1u << 10}, std::pair{"MiB", 1u << 20},
                           std::pair{"GiB", 1u << 30}, std::pair{"K", 1u << 10},
                           std::pair{"M", 1u << 20}, std::pair{"G", 1u << 30},
                           std::pair{"B", 1u}}) {
    const std::size_t n = std::strlen(suffix);
    if (t.size() > n && t.substr(t.size() - n) == suffix) {
      t.remove_suffix(n);
      mult = m;
      break;
    }
  }
  if (t.empty()) return std::nullopt;
  const unsigned __int128 cap = static_cast<unsigned __int128>(1) << 64;
  unsigned __int128 v = 0;
  for (char c : t) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<unsigned>(c - '0');
    if (v > cap) v = cap;  // from here on the value only grows
  }
  v *= mult;
  return v > cap ? cap : v;
}

template <typename F>
bool refused(F&& f) {
  try {
    f();
  } catch (const u3m::InputError&) {
    return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 8) return 0;
  std::uint64_t max = 0;
  std::memcpy(&max, data, 8);
  const std::string_view text(reinterpret_cast<const char*>(data) + 8, size - 8);

  // parse_size against the grammar.
  const auto want = reference(text);
  const bool ok = want && *want >= 1 && *want <= max;
  std::uint64_t got = 0;
  const bool threw = refused([&] { got = u3m::cli::parse_size(text, "--size", max); });
  if (threw == ok) std::abort();             // accepted what it must refuse, or the reverse
  if (ok && got != *want) std::abort();      // the wrong value
  if (!threw && (got < 1 || got > max)) std::abort();

  // parse_size_list: every comma-separated item as parse_size, none empty.
  std::vector<std::uint64_t> want_list;
  bool list_ok = true;
  for (std::size_t b = 0;;) {
    const std::size_t e = std::min(text.find(',', b), text.size());
    const auto v = reference(text.substr(b, e - b));
    if (!v || *v < 1 || *v > max) list_ok = false;
    if (list_ok) want_list.push_back(static_cast<std::uint64_t>(*v));
    if (e == text.size()) break;
    b = e + 1;
  }
  std::vector<std::uint64_t> got_list;
  if (refused([&] { got_list = u3m::cli::parse_size_list(text, "--sizes", max); }) == list_ok)
    std::abort();
  if (list_ok && got_list != want_list) std::abort();

  // parse_token_list: plain positive integers; the empty text is no list.
  std::vector<std::uint64_t> tokens;
  if (!refused([&] { tokens = u3m::cli::parse_token_list(text, "--cache-tokens"); })) {
    if (text.empty() != tokens.empty()) std::abort();
    for (std::uint64_t t : tokens)
      if (t == 0) std::abort();
    std::size_t commas = 0;
    for (char c : text) commas += c == ',';
    if (!text.empty() && tokens.size() != commas + 1) std::abort();
  }
  return 0;
}
