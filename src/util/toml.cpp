#include "u3m/util/toml.hpp"

#include <cstdint>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::util {

namespace {

// Note [Pre-scan]
// Checks made before toml++ 3.3.0 sees the text, for defects in it that
// fuzz/fuzz_hw_profile.cpp found:
//  - control characters: TOML allows none but tab (CR only in CRLF, which
//    toml++ checks); a NUL in a table header tripped an assertion;
//  - some non-ASCII code points: its non-ASCII whitespace test
//    (is_non_ascii_horizontal_whitespace) reaches __builtin_unreachable,
//    undefined behaviour, for every code point in the 1018-wide blocks its
//    lookup table leaves out (U+00A1.., U+2C8E.., U+FB26..; toml_ws_gap
//    mirrors the test). toml++ calls it wherever it looks for whitespace,
//    including on its error paths, so these code points are refused anywhere
//    in a file. Other non-ASCII text (e.g. CJK) is fine.
bool toml_ws_gap(char32_t c) {
  if (c < 0xA0 || c > 0xFEFF) return false;
  const std::uint64_t block = (c - 0xA0) / 0x3FA;
  if ((1ull << block) & 0x7FFFFFFFFFFFF75Eull) return false;
  if (c == 0xA0 || c == 0x3000 || c == 0xFEFF) return false;
  return block != 5 && block != 7;
}

void check_text(std::string_view t, std::string_view where) {
  int line = 1;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const auto c = static_cast<unsigned char>(t[i]);
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f)
      input_error(at_line(where, line), "control character 0x{:02x} (the file is TOML text)", c);
    if (c == '\n') ++line;
    // Three-byte UTF-8 sequences cover every gap; anything malformed is left
    // to toml++'s UTF-8 check.
    if (c >= 0xC2 && c <= 0xEF && i + 1 < t.size()) {
      const std::size_t len = c < 0xE0 ? 2 : 3;
      if (i + len > t.size()) continue;
      char32_t cp = c & (len == 2 ? 0x1F : 0x0F);
      bool ok = true;
      for (std::size_t k = 1; k < len; ++k) {
        const auto cc = static_cast<unsigned char>(t[i + k]);
        ok = ok && (cc & 0xC0) == 0x80;
        cp = (cp << 6) | (cc & 0x3F);
      }
      if (ok && toml_ws_gap(cp))
        input_error(at_line(where, line),
                    "character U+{:04X} is refused: the TOML parser (toml++ 3.3.0) mishandles it; "
                    "write it in ASCII",
                    static_cast<std::uint32_t>(cp));
    }
  }
}

}  // namespace

std::string at_line(std::string_view where, int line) {
  return line > 0 ? fmt::format("{}:{}", where, line) : std::string(where);
}

int line_of(const toml::node& n) {
  return static_cast<int>(n.source().begin.line);
}

toml::table parse_toml(std::string_view text, std::string_view where) {
  check_text(text, where);
  try {
    return toml::parse(text, where);
  } catch (const toml::parse_error& e) {
    input_error(at_line(where, static_cast<int>(e.source().begin.line)),
                "TOML syntax, column {}: {}", e.source().begin.column, e.description());
  } catch (const detail::TomlInternalCheck& e) {
    // Note [toml++ assertions]: the parser gives no position here.
    input_error(where, "malformed TOML (the parser's check '{}' failed)", e.what());
  }
}

void check_keys(const toml::table& t, std::initializer_list<std::string_view> known,
                std::string_view where, std::string_view table) {
  for (auto&& [k, v] : t) {
    bool ok = false;
    for (std::string_view name : known) ok = ok || name == k.str();
    if (ok) continue;
    std::string expected;
    for (std::string_view name : known) expected += (expected.empty() ? "" : ", ") + std::string(name);
    input_error(at_line(where, line_of(v)), "unknown key '{}' in {} (expected {})", k.str(),
                table.empty() ? std::string("the top level") : fmt::format("[{}]", table),
                expected.empty() ? std::string("none") : expected);
  }
}

}  // namespace u3m::util
