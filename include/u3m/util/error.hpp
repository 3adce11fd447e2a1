// Errors for bad input. Parsers throw InputError with a message that already
// names the file, the line (or byte offset) and the field; the CLI prints it on
// one line and exits nonzero. Backends (mem/) never throw: they return Status.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace u3m {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds "where: message" and throws InputError.
template <typename... Args>
[[noreturn]] void input_error(std::string_view where, fmt::format_string<Args...> f,
                              Args&&... args) {
  throw InputError(fmt::format("{}: {}", where, fmt::format(f, std::forward<Args>(args)...)));
}

}  // namespace u3m
