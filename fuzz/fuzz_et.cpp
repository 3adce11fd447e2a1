// libFuzzer target for the PyTorch Execution Trace importer. Bad input must
// end in u3m::InputError; any other exception, a crash or a sanitizer report
// is a finding. Seeds: fuzz/corpus/et/ (tiny documents of each schema). An
// imported trace must be one u3m's own formats can hold: it comes back
// unchanged through both writers (fuzz_trace_util.hpp).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_trace_util.hpp"
#include "u3m/trace/et_import.hpp"
#include "u3m/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view json(reinterpret_cast<const char*>(data), size);
  u3m::trace::Trace trace;
  try {
    u3m::trace::import_pytorch_et(json, "fuzz-input", trace);
  } catch (const u3m::InputError&) {
    return 0;
  }
  u3m::fuzz::check_round_trip(trace);
  return 0;
}
