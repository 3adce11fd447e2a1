#include "u3m/util/units.hpp"

#include <utility>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::util {

std::uint64_t parse_size(std::string_view text, std::string_view where, std::uint64_t max_bytes) {
  std::string_view v = text;
  std::uint64_t mult = 1;
  for (auto [suffix, m] :
       {std::pair{"KiB", 1ull << 10}, std::pair{"MiB", 1ull << 20}, std::pair{"GiB", 1ull << 30},
        std::pair{"K", 1ull << 10}, std::pair{"M", 1ull << 20}, std::pair{"G", 1ull << 30},
        std::pair{"B", 1ull}}) {
    std::string_view s(suffix);
    if (v.size() > s.size() && v.ends_with(s)) {
      v.remove_suffix(s.size());
      mult = m;
      break;
    }
  }
  const auto n = parse_number<std::uint64_t>(v);
  if (!n || *n == 0 || *n > max_bytes / mult)
    input_error(where, "'{}' is not a size between 1 byte and {} (e.g. 512, 64K, 4M, 1G)", text,
                human_bytes(max_bytes));
  return *n * mult;
}

std::string human_bytes(std::uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

}  // namespace u3m::util
