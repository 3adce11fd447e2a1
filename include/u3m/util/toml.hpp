// TOML input for every file u3m reads as TOML (hardware profiles, the run
// config, price tables): toml++ included once with its checks made to throw,
// one parse entry that turns every failure into an InputError naming the file
// and line, and the strict-key check that makes a misspelt key an error.
//
// Include toml++ only through this header (Note [toml++ assertions]).
#pragma once

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>

// Note [toml++ assertions]
// toml++ 3.3.0 asserts on some malformed input (e.g. "[!x]": a table header
// whose key starts with a character that is neither a bare-key character nor
// a quote; found by fuzz/fuzz_hw_profile.cpp). With assertions on, that
// aborts; with NDEBUG its TOML_ASSERT_ASSUME becomes __builtin_assume under
// clang, which is undefined behaviour. So we compile its checks in, in every
// build, and make a failed one throw: bad input stays an InputError. Where
// toml++ checks inside a noexcept function the throw ends in std::terminate
// (g++ says so with -Wterminate, silenced below): a clean stop, never UB. The
// known triggers are refused before parsing (Note [Pre-scan] in
// src/util/toml.cpp), and fuzzing found no other. toml++ is header-only here:
// no shared library to find at run time, and the fuzzers instrument the
// parser along with our checks.
namespace u3m::util::detail {
struct TomlInternalCheck : std::logic_error {
  using std::logic_error::logic_error;
};
}  // namespace u3m::util::detail
#pragma push_macro("NDEBUG")
#undef NDEBUG
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wterminate"
#endif
#define TOML_ASSERT(expr) \
  ((expr) ? static_cast<void>(0) : throw ::u3m::util::detail::TomlInternalCheck(#expr))
#include <toml++/toml.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#pragma pop_macro("NDEBUG")

namespace u3m::util {

// Parses TOML text read from `where` (a path, or a name such as a built-in
// profile's); throws InputError "where:LINE: ..." on any defect.
toml::table parse_toml(std::string_view text, std::string_view where);

// "where:LINE", or just where when the line is unknown (0).
std::string at_line(std::string_view where, int line);
int line_of(const toml::node& n);

// Every key of `t` must be one of `known`; otherwise InputError
// "where:LINE: unknown key 'k' in [table] (expected a, b, c)". `table` is the
// dotted name of `t` ("" for the root).
void check_keys(const toml::table& t, std::initializer_list<std::string_view> known,
                std::string_view where, std::string_view table);

}  // namespace u3m::util
