// libFuzzer target for the hardware-profile parser (src/sim/profile.cpp). Bad
// input must end in an InputError; anything else (a crash, a sanitizer report,
// another exception) is a finding. A profile that parses must also survive
// to_toml and parse back to the same profile: the writer may not produce what
// the reader refuses, nor drop or round a field (compared as the rewritten
// text, which holds every field).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "u3m/sim/profile.hpp"
#include "u3m/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  u3m::sim::HwProfile p;
  try {
    p = u3m::sim::parse_profile(std::string_view(reinterpret_cast<const char*>(data), size),
                                "fuzz");
  } catch (const u3m::InputError&) {
    return 0;
  }
  try {
    const std::string text = u3m::sim::to_toml(p);
    const u3m::sim::HwProfile q = u3m::sim::parse_profile(text, "fuzz-rewritten");
    if (u3m::sim::to_toml(q) != text) std::abort();  // a field changed on the way
    if (q.device.hbm_bandwidth.si != p.device.hbm_bandwidth.si) std::abort();
  } catch (const u3m::InputError&) {
    std::abort();  // the writer produced text the reader refuses
  }
  return 0;
}
