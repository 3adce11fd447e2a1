// libFuzzer target for the JSON-lines trace reader. Bad input must end in an
// InputError; anything else (a crash, a sanitizer report, another exception)
// is a finding. What the reader accepts must come back unchanged through
// both writers (fuzz_trace_util.hpp).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_trace_util.hpp"
#include "u3m/trace/io.hpp"
#include "u3m/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  u3m::trace::Trace out;
  try {
    u3m::trace::read_jsonl(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz",
                            out);
  } catch (const u3m::InputError&) {
    return 0;
  }
  u3m::fuzz::check_round_trip(out);
  return 0;
}
