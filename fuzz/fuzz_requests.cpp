// libFuzzer target for the request-trace readers: the u3m format, the
// Mooncake and Azure importers (src/workload/request_trace.cpp), every
// format auto-detected and each forced. Bad input
// must end in an InputError; anything else (a crash, a sanitizer report,
// another exception) is a finding. Whatever parses must survive the writer:
// its u3m lines read back to the same requests.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "u3m/util/error.hpp"
#include "u3m/workload/request_trace.hpp"

namespace {

using namespace u3m::workload;

void check_written(const std::vector<ServeRequest>& rs) {
  std::string u3m;
  RequestStats stats({1000});
  for (const ServeRequest& r : rs) {
    u3m += to_json_line(r);
    u3m += '\n';
    stats.add(r);
  }
  ImportOptions back;
  back.format = RequestFormat::u3m;
  if (parse_requests(u3m, "fuzz-roundtrip", back) != rs) __builtin_trap();
  if (stats.report().requests != rs.size()) __builtin_trap();
}

void check(std::string_view text, const ImportOptions& opt) {
  std::vector<ServeRequest> rs;
  try {
    rs = parse_requests(text, "fuzz", opt);
  } catch (const u3m::InputError&) {
    return;
  }
  check_written(rs);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check(text, {});  // auto-detect
  ImportOptions o;
  o.format = RequestFormat::mooncake;
  o.mooncake_mismatch = MooncakeMismatch::fit;
  o.mooncake_block_tokens = 16;
  check(text, o);
  ImportOptions u;
  u.format = RequestFormat::u3m;
  check(text, u);
  o.format = RequestFormat::azure_csv;
  check(text, o);
  o.require_sorted = false;
  std::vector<ServeRequest> rs;
  try {
    rs = parse_requests(text, "fuzz", o);
  } catch (const u3m::InputError&) {
    return 0;
  }
  // Sorted, the requests keep their count, do not decrease and none is before 0.
  const std::size_t n = rs.size();
  sort_by_timestamp(rs);
  if (rs.size() != n) __builtin_trap();
  for (std::size_t i = 1; i < rs.size(); ++i)
    if (rs[i].timestamp_ms < rs[i - 1].timestamp_ms) __builtin_trap();
  if (!rs.empty() && !(rs.front().timestamp_ms >= 0)) __builtin_trap();
  check_written(rs);
  return 0;
}
