// libFuzzer target for the binary trace reader. Bad input must end in an
// InputError; anything else (a crash, a sanitizer report, another exception)
// is a finding. What the reader accepts must come back unchanged through
// both writers (fuzz_trace_util.hpp).
//
// Two modes. Input starting with 'U' is taken as a whole file, which
// exercises the framing (magic, blocks, checksums, end block). Any other
// input is "W, record count (2 bytes LE), payload": the payload is wrapped in
// a valid header and a correctly checksummed block, so mutations reach the
// record decoder instead of dying at the checksum.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <xxhash.h>

#include "fuzz_trace_util.hpp"
#include "u3m/trace/io.hpp"
#include "u3m/util/error.hpp"

namespace {

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::string wrap(const uint8_t* data, size_t size) {
  std::uint32_t count = size >= 3 ? data[1] | (data[2] << 8) : 0;
  std::string_view payload =
      size > 3 ? std::string_view(reinterpret_cast<const char*>(data) + 3, size - 3)
               : std::string_view();
  std::string f(u3m::trace::kBinaryMagic, sizeof u3m::trace::kBinaryMagic);
  put<std::uint32_t>(f, u3m::trace::kBinaryVersion);
  put<std::uint32_t>(f, 0);
  put<std::uint32_t>(f, static_cast<std::uint32_t>(payload.size()));
  put<std::uint32_t>(f, count);
  put<std::uint64_t>(f, XXH64(payload.data(), payload.size(), 0));
  f.append(payload);
  put<std::uint32_t>(f, 0);
  put<std::uint32_t>(f, 0);
  put<std::uint64_t>(f, count);
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string wrapped;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  if (size == 0 || data[0] != 'U') {
    wrapped = wrap(data, size);
    input = wrapped;
  }
  u3m::trace::Trace out;
  try {
    u3m::trace::read_binary(input, "fuzz", out);
  } catch (const u3m::InputError&) {
    return 0;
  }
  u3m::fuzz::check_round_trip(out);
  return 0;
}
