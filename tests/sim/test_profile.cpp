// Hardware profiles: the built-ins load with a source for every number, files
// round-trip through to_toml, and every kind of bad input is an InputError
// naming the file, the line and the field.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "u3m/sim/profile.hpp"
#include "u3m/sim/profile_json.hpp"
#include "u3m/util/error.hpp"

namespace {

using u3m::sim::Dim;
using u3m::sim::HwProfile;
using u3m::sim::load_profile;
using u3m::sim::parse_profile;

std::string base_text() {
  return std::string(u3m::sim::builtin_profile_text("ascend-910b-32g"));
}

// 1-based line of the first line that starts with `prefix`.
int line_of(const std::string& text, const std::string& prefix) {
  int line = 1;
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (text.compare(pos, prefix.size(), prefix) == 0) return line;
    pos = text.find('\n', pos);
    if (pos == std::string::npos) break;
    ++pos;
    ++line;
  }
  return 0;
}

// Replaces the line starting with `prefix` by `replacement` ("" deletes it).
std::string with_line(std::string text, const std::string& prefix, const std::string& replacement) {
  const int line = line_of(text, prefix);
  EXPECT_GT(line, 0) << prefix;
  std::size_t start = 0;
  for (int i = 1; i < line; ++i) start = text.find('\n', start) + 1;
  const std::size_t end = text.find('\n', start);
  text.replace(start, end - start + (replacement.empty() ? 1 : 0), replacement);
  return text;
}

std::string error_of(const std::string& text) {
  try {
    parse_profile(text, "test.toml");
  } catch (const u3m::InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(HwProfile, BuiltinsLoadWithSourcesAndNames) {
  const auto names = u3m::sim::builtin_profile_names();
  ASSERT_EQ(names, (std::vector<std::string>{"ascend-910b-32g", "ascend-910b-64g", "nvidia-h200"}));
  for (const std::string& name : names) {
    HwProfile p = load_profile(name);
    EXPECT_EQ(p.name, name) << "the file's name field must match its file name";
    EXPECT_EQ(p.origin, "built-in");
    for (const auto& f : u3m::sim::param_fields()) {
      const u3m::sim::Param& v = f.at(p);
      EXPECT_GT(v.si, 0) << name << " " << f.key;
      EXPECT_GT(v.line, 0) << name << " " << f.key;
      EXPECT_GE(v.source.size(), 20u) << name << " " << f.key << ": a real source, not a stub";
    }
  }
}

// The conversions to base units that every model relies on.
TEST(HwProfile, BuiltinNumbersInBaseUnits) {
  HwProfile a = load_profile("ascend-910b-32g");
  EXPECT_DOUBLE_EQ(a.device.hbm_capacity.si, 32.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(a.device.hbm_bandwidth.si, 1.6e12);
  EXPECT_DOUBLE_EQ(a.device.peak_flops.si, 354e12);
  EXPECT_DOUBLE_EQ(a.device.launch_overhead.si, 10e-6);
  EXPECT_DOUBLE_EQ(a.host_link.bandwidth_practical.si, 25e9);
  EXPECT_DOUBLE_EQ(a.peer_link.bandwidth_theoretical.si, 56e9);
  EXPECT_EQ(a.host_link.kind, "PCIe 4.0 x16");
  // 7,008 TB over 5 years of 365 days on a 3.84 TB drive: 1 drive write per day.
  EXPECT_DOUBLE_EQ(a.ssd.capacity.si, 3.84e12);
  EXPECT_DOUBLE_EQ(a.ssd.warranty.si, 5 * 365 * 86400.0);
  EXPECT_NEAR(a.ssd.rated_dwpd(), 1.0, 1e-12);
  HwProfile b = load_profile("ascend-910b-64g");
  EXPECT_DOUBLE_EQ(b.device.hbm_capacity.si, 2 * a.device.hbm_capacity.si);
  // The two 910B profiles differ only in HBM capacity (and the words saying so).
  for (const auto& f : u3m::sim::param_fields()) {
    if (f.key != "hbm_capacity") {
      EXPECT_EQ(f.at(a).si, f.at(b).si) << f.key;
    }
  }
  HwProfile h = load_profile("nvidia-h200");
  EXPECT_DOUBLE_EQ(h.device.hbm_capacity.si, 141e9);
  EXPECT_DOUBLE_EQ(h.device.peak_flops.si, 989e12);
  EXPECT_DOUBLE_EQ(h.peer_link.bandwidth_practical.si, 370e9);
}

TEST(HwProfile, RoundTripsThroughToToml) {
  for (const std::string& name : u3m::sim::builtin_profile_names()) {
    HwProfile p = load_profile(name);
    HwProfile q = parse_profile(u3m::sim::to_toml(p), "written.toml");
    for (const auto& f : u3m::sim::text_fields()) EXPECT_EQ(f.at(p), f.at(q)) << f.key;
    for (const auto& f : u3m::sim::param_fields()) {
      EXPECT_EQ(f.at(p).value, f.at(q).value) << f.key;
      EXPECT_EQ(f.at(p).unit, f.at(q).unit) << f.key;
      EXPECT_EQ(f.at(p).source, f.at(q).source) << f.key;
      EXPECT_EQ(f.at(p).si, f.at(q).si) << f.key;
    }
  }
}

TEST(HwProfile, WriterEscapesStrings) {
  HwProfile p = load_profile("nvidia-h200");
  p.description = "quote \" backslash \\ tab \t newline \n bell \x07 end";
  p.device.hbm_bandwidth.source = "C:\\path \"x\"";
  HwProfile q = parse_profile(u3m::sim::to_toml(p), "written.toml");
  EXPECT_EQ(q.description, p.description);
  EXPECT_EQ(q.device.hbm_bandwidth.source, p.device.hbm_bandwidth.source);
}

TEST(HwProfile, LoadsAFileAndNamesItAsOrigin) {
  const std::string path = ::testing::TempDir() + "u3m_hw_profile_test.toml";
  { std::ofstream(path) << with_line(base_text(), "name = ", "name = \"my-box\""); }
  HwProfile p = load_profile(path);
  EXPECT_EQ(p.name, "my-box");
  EXPECT_EQ(p.origin, path);
  std::remove(path.c_str());
}

TEST(HwProfile, UnknownNameOrPathListsBuiltins) {
  try {
    load_profile("/nonexistent/dir/x.toml");
    FAIL() << "no error";
  } catch (const u3m::InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("/nonexistent/dir/x.toml"), std::string::npos) << m;
    EXPECT_NE(m.find("ascend-910b-32g, ascend-910b-64g, nvidia-h200"), std::string::npos) << m;
  }
}

struct BadCase {
  const char* what;
  const char* line_prefix;        // line to replace
  const char* replacement;        // "" deletes the line
  const char* message;            // expected in the error
  const char* error_line_prefix;  // line the error must name ("" = the replaced one)
};

TEST(HwProfile, BadInputNamesFileLineAndField) {
  const BadCase cases[] = {
      {"missing field", "hbm_bandwidth = ", "", "missing field 'device.hbm_bandwidth'", "[device]"},
      {"zero", "hbm_bandwidth = ", "hbm_bandwidth = { value = 0, unit = \"TB/s\", source = \"s\" }",
       "field 'device.hbm_bandwidth': value 0 must be a finite number above zero", ""},
      {"negative", "latency = ", "latency = { value = -3, unit = \"us\", source = \"s\" }",
       "field 'host_link.latency': value -3 must be a finite number above zero", ""},
      {"nan", "peak_flops = ", "peak_flops = { value = nan, unit = \"TFLOPS\", source = \"s\" }",
       "field 'device.peak_flops': value nan must be a finite number", ""},
      {"string value",
       "peak_flops = ", "peak_flops = { value = \"354\", unit = \"TFLOPS\", source = \"s\" }",
       "field 'device.peak_flops': 'value' must be a number", ""},
      {"bad unit",
       "hbm_capacity = ", "hbm_capacity = { value = 32, unit = \"GB/s\", source = \"s\" }",
       "field 'device.hbm_capacity': unit 'GB/s' is not one of B, KB", ""},
      {"blank source",
       "read_latency = ", "read_latency = { value = 80, unit = \"us\", source = \"  \" }",
       "field 'ssd.read_latency': missing 'source'", ""},
      {"no source", "read_latency = ", "read_latency = { value = 80, unit = \"us\" }",
       "field 'ssd.read_latency': missing 'source'", ""},
      {"extra key",
       "read_latency = ", "read_latency = { value = 80, unit = \"us\", source = \"s\", sigma = 3 }",
       "field 'ssd.read_latency': unknown key 'sigma'", ""},
      {"not a table", "read_latency = ", "read_latency = 80",
       "field 'ssd.read_latency': expected {", ""},
      {"fraction above 1", "matmul_efficiency = ",
       "matmul_efficiency = { value = 1.5, unit = \"fraction\", source = \"s\" }",
       "field 'device.matmul_efficiency': value 1.5 is a fraction and must be at most 1", ""},
      {"fractional count",
       "cards_per_node = ", "cards_per_node = { value = 8.5, unit = \"count\", source = \"s\" }",
       "field 'node.cards_per_node': value 8.5 must be a whole count", ""},
      {"typo",
       "hbm_bandwidth = ", "hbm_bandwith = { value = 1.6, unit = \"TB/s\", source = \"s\" }",
       "unknown field 'device.hbm_bandwith'", ""},
      {"unknown section", "[node]", "[nodes]", "unknown field 'nodes'", ""},
      {"practical above theoretical", "bandwidth_practical = { value = 25",
       "bandwidth_practical = { value = 40, unit = \"GB/s\", source = \"s\" }",
       "field 'host_link.bandwidth_practical': practical bandwidth 40 GB/s exceeds the theoretical "
       "31.5 GB/s",
       ""},
      {"empty string", "model = \"Ascend", "model = \"\"",
       "field 'device.model' must be a non-empty string", ""},
      {"syntax", "name = ", "name = \"unterminated", "TOML syntax", ""},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string text = with_line(base_text(), c.line_prefix, c.replacement);
    const std::string err = error_of(text);
    EXPECT_NE(err.find(c.message), std::string::npos) << err;
    const std::string at = *c.error_line_prefix ? c.error_line_prefix : c.replacement;
    const std::string want = "test.toml:" + std::to_string(line_of(text, at)) + ":";
    EXPECT_EQ(err.rfind(want, 0), 0u) << "wanted " << want << " in: " << err;
  }
}

// A NUL in a table header made toml++ 3.3.0 assert (found by the fuzzer);
// control characters are refused before toml++ sees the text.
TEST(HwProfile, ControlCharactersAreErrors) {
  const std::string text = base_text();
  const std::size_t at = text.find("[host_link]") + 1;
  for (char c : {'\0', '\x01', '\x1b', '\x7f'}) {
    std::string bad = text;
    bad.insert(at, 1, c);
    const std::string err = error_of(bad);
    const std::string want = "test.toml:" + std::to_string(line_of(text, "[host_link]")) +
                             ": control character 0x" + fmt::format("{:02x}", c);
    EXPECT_EQ(err.rfind(want, 0), 0u) << err;
  }
  // Tabs and CRLF line ends are TOML and stay allowed.
  std::string crlf;
  for (char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  EXPECT_EQ(parse_profile(crlf, "crlf.toml").name, "ascend-910b-32g");
}

// "[!x]" made toml++ 3.3.0 assert (found by the fuzzer); Note [toml++
// assertions] turns that into an InputError in every build.
TEST(HwProfile, MalformedTableHeaderIsAnError) {
  const std::string err = error_of(with_line(base_text(), "[host_link]", "[!host_link]"));
  EXPECT_EQ(err.rfind("test.toml: malformed TOML (the parser's check", 0), 0u) << err;
}

// Some non-ASCII code points made toml++ 3.3.0 reach __builtin_unreachable
// (found by the fuzzer); Note [Pre-scan] refuses them anywhere, and lets other
// non-ASCII text through.
TEST(HwProfile, CodePointsTomlppMishandlesAreErrors) {
  for (const char* ch :
       {"\xc3\xa9" /* U+00E9 */, "\xe3\x80\x81" /* U+3001 */, "\xef\xbb\xbe" /* U+FEFE */}) {
    const std::string bad =
        with_line(base_text(), "description = ", std::string("description = \"x") + ch + "\"");
    const std::string err = error_of(bad);
    const std::string want =
        "test.toml:" + std::to_string(line_of(bad, "description")) + ": character U+";
    EXPECT_EQ(err.rfind(want, 0), 0u) << err;
    EXPECT_NE(err.find("toml++ 3.3.0"), std::string::npos) << err;
  }
  const std::string fine =
      with_line(base_text(), "description = ",
                "description = \"\xe5\x8d\x8e \xe2\x80\x94 \xc2\xa0\" # \xe5\x8d\x8e comment");
  EXPECT_EQ(parse_profile(fine, "fine.toml").description, "\xe5\x8d\x8e \xe2\x80\x94 \xc2\xa0");
}

TEST(HwProfile, MissingTableAndBadNameAreErrors) {
  std::string text = base_text();
  text = text.substr(0, text.find("[node]")) + text.substr(text.find("[network]"));
  EXPECT_NE(error_of(text).find("test.toml: missing table [node]"), std::string::npos)
      << error_of(text);
  text = base_text();
  text = text.substr(0, text.find("[pool]"));
  EXPECT_NE(error_of(text).find("test.toml: missing table [pool]"), std::string::npos)
      << error_of(text);
  EXPECT_NE(error_of(with_line(base_text(), "name = ", "name = \"Bad Name\""))
                .find("field 'name': 'Bad Name' must be"),
            std::string::npos);
}

TEST(HwProfile, UnitsConvertToBaseUnits) {
  using u3m::sim::unit_factor;
  EXPECT_EQ(unit_factor(Dim::bytes, "GiB"), 1073741824.0);
  EXPECT_EQ(unit_factor(Dim::bytes, "GB"), 1e9);
  EXPECT_EQ(unit_factor(Dim::bandwidth, "TB/s"), 1e12);
  EXPECT_EQ(unit_factor(Dim::flop_rate, "TFLOPS"), 1e12);
  EXPECT_EQ(unit_factor(Dim::time, "us"), 1e-6);
  EXPECT_EQ(unit_factor(Dim::time, "GB"), 0);  // a unit of another dimension
  EXPECT_EQ(u3m::sim::units_for(Dim::fraction).size(), 1u);
}

TEST(HwProfile, JsonCarriesEveryNumberWithItsSource) {
  HwProfile p = load_profile("ascend-910b-64g");
  nlohmann::json j = u3m::sim::profile_json(p);
  EXPECT_EQ(j.at("name"), "ascend-910b-64g");
  EXPECT_EQ(j.at("host_link").at("kind"), "PCIe 4.0 x16");
  for (const auto& f : u3m::sim::param_fields()) {
    const auto& v = j.at(std::string(f.section)).at(std::string(f.key));
    EXPECT_EQ(v.at("si").get<double>(), f.at(p).si) << f.key;
    EXPECT_EQ(v.at("source").get<std::string>(), f.at(p).source) << f.key;
  }
}

}  // namespace
