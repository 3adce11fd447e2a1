// PoolConfig: parsing "key:value,..." (PYTORCH_CUDA_ALLOC_CONF style),
// validation and the parse() form (Note [Pool configuration] in pool.hpp).
#include <charconv>
#include <limits>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "pool_block.hpp"
#include "u3m/mem/pool.hpp"
#include "u3m/util/error.hpp"

namespace u3m::mem {

namespace {

std::uint64_t parse_size(std::string_view v, std::string_view where, std::string_view key) {
  std::uint64_t mult = 1;
  for (auto [suffix, m] : {std::pair{"GiB", GiB}, std::pair{"MiB", MiB}, std::pair{"KiB", KiB}}) {
    std::string_view s(suffix);
    if (v.size() > s.size() && v.substr(v.size() - s.size()) == s) {
      v.remove_suffix(s.size());
      mult = m;
      break;
    }
  }
  std::uint64_t n = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size() || v.empty()) {
    input_error(where, "{}: '{}' is not a size (bytes, or N with KiB/MiB/GiB)", key, v);
  }
  if (n > std::numeric_limits<std::uint64_t>::max() / mult)
    input_error(where, "{}: too large", key);
  return n * mult;
}

bool parse_bool(std::string_view v, std::string_view where, std::string_view key) {
  if (v == "true" || v == "True" || v == "1") return true;
  if (v == "false" || v == "False" || v == "0") return false;
  input_error(where, "{}: '{}' is not true or false", key, v);
}

}  // namespace

PoolConfig PoolConfig::parse(std::string_view text, std::string_view where) {
  PoolConfig c;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      input_error(where, "'{}' is not key:value", item);
    }
    std::string_view key = item.substr(0, colon), v = item.substr(colon + 1);
    struct SizeKey {
      std::string_view name;
      std::uint64_t PoolConfig::*field;
    };
    static constexpr SizeKey kSizes[] = {
        {"alignment", &PoolConfig::alignment},
        {"small_size", &PoolConfig::small_size},
        {"small_segment", &PoolConfig::small_segment},
        {"large_segment", &PoolConfig::large_segment},
        {"min_large_alloc", &PoolConfig::min_large_alloc},
        {"round_large", &PoolConfig::round_large},
        {"large_split_min", &PoolConfig::large_split_min},
        {"capacity", &PoolConfig::capacity},
        {"expandable_reserve", &PoolConfig::expandable_reserve},
        {"expandable_keep", &PoolConfig::expandable_keep},
        {"fast_cache_blocks", &PoolConfig::fast_cache_blocks},
    };
    bool found = false;
    for (const SizeKey& k : kSizes) {
      if (k.name == key) {
        c.*k.field = parse_size(v, where, key);
        found = true;
      }
    }
    if (key == "expandable_segments") {
      c.expandable_segments = parse_bool(v, where, key);
      found = true;
    }
    if (!found) {
      input_error(where,
                  "unknown key '{}' (known: alignment, small_size, small_segment, large_segment, "
                  "min_large_alloc, round_large, large_split_min, capacity, expandable_segments, "
                  "expandable_reserve, expandable_keep, fast_cache_blocks)",
                  key);
    }
  }
  c.validate(where);
  return c;
}

void PoolConfig::validate(std::string_view where) const {
  if (!pool_detail::is_pow2(alignment))
    input_error(where, "alignment: {} is not a power of two", alignment);
  if (small_size < alignment) input_error(where, "small_size: must be >= alignment");
  if (small_segment < small_size) input_error(where, "small_segment: must be >= small_size");
  if (small_segment % alignment || large_segment % alignment || round_large % alignment) {
    input_error(where, "segment sizes and round_large must be multiples of alignment");
  }
  if (round_large == 0) input_error(where, "round_large: must be > 0");
  if (large_segment < min_large_alloc) {
    input_error(where, "large_segment: must be >= min_large_alloc");
  }
}

std::string PoolConfig::describe() const {
  return fmt::format(
      "alignment:{},small_size:{},small_segment:{},large_segment:{},min_large_alloc:{},"
      "round_large:{},large_split_min:{},capacity:{},expandable_segments:{},"
      "expandable_reserve:{},expandable_keep:{},fast_cache_blocks:{}",
      alignment, small_size, small_segment, large_segment, min_large_alloc, round_large,
      large_split_min, capacity, expandable_segments, expandable_reserve, expandable_keep,
      fast_cache_blocks);
}

}  // namespace u3m::mem
