#include "cli_util.hpp"

#include <algorithm>
#include <charconv>
#include <thread>

#include <fmt/format.h>
#include <unistd.h>

#include "u3m/util/error.hpp"

namespace u3m::cli {

std::string machine() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return fmt::format("{}, {} cores", host, std::thread::hardware_concurrency());
}

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
  std::uint64_t n = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || n == 0 ||
      n > max_bytes / mult)
    input_error(where, "'{}' is not a size between 1 byte and {} (e.g. 512, 64K, 4M, 1G)", text,
                human_bytes(max_bytes));
  return n * mult;
}

std::vector<std::uint64_t> parse_size_list(std::string_view list, std::string_view where,
                                           std::uint64_t max_bytes) {
  std::vector<std::uint64_t> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    if (i == list.size() || list[i] == ',') {
      out.push_back(parse_size(list.substr(start, i - start),
                               fmt::format("{} item {}", where, out.size() + 1), max_bytes));
      start = i + 1;
    }
  }
  return out;
}

std::string approx_bytes(double b) {
  const double a = b < 0 ? -b : b;
  if (a >= double(1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (a >= double(1ull << 20)) return fmt::format("{:.2f} MiB", b / double(1ull << 20));
  if (a >= 1024) return fmt::format("{:.1f} KiB", b / 1024);
  return fmt::format("{:.0f} B", b);
}

std::string human_bytes(std::uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace u3m::cli
