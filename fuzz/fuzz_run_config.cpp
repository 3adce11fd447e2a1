// libFuzzer target for the run config (config/run_config.hpp). Bad text must
// end in an InputError; anything else (a crash, a sanitizer report, another
// exception) is a finding. What parses must hold the parser's promises: each
// watermark pair ordered (low <= high, as the engine requires), fractions in
// (0, 1], and to_json() holding exactly the fields that were set.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "u3m/config/run_config.hpp"
#include "u3m/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const u3m::config::RunConfig c = u3m::config::parse_run_config(text, "fuzz.toml");
    for (const auto* t : {&c.device, &c.host}) {
      if (t->high_watermark && t->low_watermark && !(*t->low_watermark <= *t->high_watermark))
        std::abort();
      if (t->fraction && !(*t->fraction > 0 && *t->fraction <= 1)) std::abort();
      if (t->budget && *t->budget == 0) std::abort();
    }
    const nlohmann::json j = c.to_json();
    if (c.policy.tiering.has_value() != (j.contains("policy") && j["policy"].contains("tiering")))
      std::abort();
  } catch (const u3m::InputError&) {
  }
  return 0;
}
