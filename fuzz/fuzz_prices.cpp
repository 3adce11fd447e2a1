// libFuzzer target for the price table `u3m plan cost` reads
// (apps/u3m/prices.cpp). Bad input must end in an InputError; anything else
// (a crash, a sanitizer report, another exception) is a finding. A table
// that parses must keep the parser's promises: a positive, finite CNY price
// for every item with a value, none for a "not found" one, and a source and
// a date on each.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "prices.hpp"
#include "u3m/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  u3m::cli::PriceTable t;
  try {
    t = u3m::cli::parse_prices(std::string_view(reinterpret_cast<const char*>(data), size),
                               "fuzz");
  } catch (const u3m::InputError&) {
    return 0;
  }
  if (!(t.usd_cny > 0 && std::isfinite(t.usd_cny))) std::abort();
  for (const auto& [key, p] : t.items) {
    if (p.source.empty() || p.date.size() != 10) std::abort();
    if (p.value ? !(p.cny > 0 && std::isfinite(p.cny)) : p.cny != 0) std::abort();
  }
  return 0;
}
