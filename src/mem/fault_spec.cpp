#include "u3m/mem/fault_spec.hpp"

#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::mem {

namespace {
// The spec's names, in IoFault order: the enumerators as written.
constexpr std::string_view kNames[kIoFaultKinds] = {
    "eio_on_write", "enospc_on_write", "short_write",       "bit_flip_on_read",
    "eio_on_read",  "lost_write",      "misdirected_write", "torn_write"};
std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}
std::string kinds() {
  std::string out;
  for (std::size_t i = 0; i < kIoFaultKinds; ++i)
    out += fmt::format("{}{}", i ? ", " : "", kNames[i]);
  return out;
}
}  // namespace

std::string_view fault_name(IoFault f) {
  return kNames[static_cast<std::size_t>(f)];
}

FaultSpec FaultSpec::parse(std::string_view text, std::string_view where) {
  FaultSpec spec;
  bool seen[kIoFaultKinds] = {};
  bool seeded = false;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = trim(text.substr(pos, comma - pos));
    pos = comma + 1;
    if (item.empty())
      input_error(where, "empty item in '{}' (expected kind=probability, ...)", text);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      input_error(where, "'{}' is not kind=probability (kinds: {}, or seed=N)", item, kinds());
    const std::string_view key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    if (key == "seed") {
      const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), spec.seed);
      if (ec != std::errc() || p != value.data() + value.size() || seeded)
        input_error(where, "'{}': seed must be given once, as a whole number", item);
      seeded = true;
      continue;
    }
    std::size_t kind = kIoFaultKinds;
    for (std::size_t i = 0; i < kIoFaultKinds; ++i)
      if (kNames[i] == key) kind = i;
    if (kind == kIoFaultKinds)
      input_error(where, "unknown fault '{}' (expected one of {}, or seed)", key, kinds());
    if (seen[kind]) input_error(where, "'{}' is given twice", key);
    seen[kind] = true;
    double p = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), p);
    if (ec != std::errc() || end != value.data() + value.size() || !(p > 0 && p <= 1))
      input_error(where, "'{}': the probability must be a number in (0, 1]", item);
    spec.rules.emplace_back(static_cast<IoFault>(kind), p);
  }
  if (spec.rules.empty()) input_error(where, "'{}' names no fault", text);
  return spec;
}

std::string FaultSpec::describe() const {
  std::string out;
  for (const auto& [f, p] : rules) out += fmt::format("{}={},", fault_name(f), p);
  return out + fmt::format("seed={}", seed);
}

std::shared_ptr<FaultInjectionIoEngine> make_fault_engine(const FaultSpec& spec,
                                                          unsigned queue_depth) {
  auto e = std::make_shared<FaultInjectionIoEngine>(
      std::shared_ptr<IoEngine>(make_default_io_engine(queue_depth)));
  for (const auto& [f, p] : spec.rules)
    e->fail_randomly(f, p, spec.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(f));
  return e;
}

}  // namespace u3m::mem
