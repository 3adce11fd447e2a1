// Hardware profiles: the field table, TOML parsing with validation, and the
// writer (include/u3m/sim/profile.hpp).
#include "u3m/sim/profile.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "u3m/util/error.hpp"
#include "u3m/util/toml.hpp"

namespace u3m::sim {

namespace detail {
struct BuiltinProfile {
  const char* name;
  const char* text;
};
// Generated from data/hw/*.toml (hw_profiles_data.cpp.in).
extern const BuiltinProfile kBuiltinProfiles[];
extern const std::size_t kNumBuiltinProfiles;
}  // namespace detail

namespace {

using util::at_line;
using util::line_of;

#define U3M_PARAM(section, key, dim, expr)                              \
  ParamField {                                                          \
    section, key, Dim::dim, [](HwProfile& p) -> Param& { return expr; } \
  }
constexpr std::array kParams = {
    U3M_PARAM("device", "hbm_capacity", bytes, p.device.hbm_capacity),
    U3M_PARAM("device", "hbm_bandwidth", bandwidth, p.device.hbm_bandwidth),
    U3M_PARAM("device", "peak_flops", flop_rate, p.device.peak_flops),
    U3M_PARAM("device", "matmul_efficiency", fraction, p.device.matmul_efficiency),
    U3M_PARAM("device", "launch_overhead", time, p.device.launch_overhead),
    U3M_PARAM("host_link", "bandwidth_theoretical", bandwidth, p.host_link.bandwidth_theoretical),
    U3M_PARAM("host_link", "bandwidth_practical", bandwidth, p.host_link.bandwidth_practical),
    U3M_PARAM("host_link", "latency", time, p.host_link.latency),
    U3M_PARAM("peer_link", "bandwidth_theoretical", bandwidth, p.peer_link.bandwidth_theoretical),
    U3M_PARAM("peer_link", "bandwidth_practical", bandwidth, p.peer_link.bandwidth_practical),
    U3M_PARAM("peer_link", "latency", time, p.peer_link.latency),
    U3M_PARAM("host", "dram_capacity", bytes, p.host.dram_capacity),
    U3M_PARAM("host", "dram_bandwidth", bandwidth, p.host.dram_bandwidth),
    U3M_PARAM("ssd", "read_bandwidth", bandwidth, p.ssd.read_bandwidth),
    U3M_PARAM("ssd", "write_bandwidth", bandwidth, p.ssd.write_bandwidth),
    U3M_PARAM("ssd", "capacity", bytes, p.ssd.capacity),
    U3M_PARAM("ssd", "endurance", bytes, p.ssd.endurance),
    U3M_PARAM("ssd", "warranty", time, p.ssd.warranty),
    U3M_PARAM("ssd", "read_latency", time, p.ssd.read_latency),
    U3M_PARAM("ssd", "write_latency", time, p.ssd.write_latency),
    U3M_PARAM("ssd", "drives_per_node", count, p.ssd.drives_per_node),
    U3M_PARAM("node", "cards_per_node", count, p.node.cards_per_node),
    U3M_PARAM("network", "bandwidth_theoretical", bandwidth, p.network.bandwidth_theoretical),
    U3M_PARAM("network", "bandwidth_practical", bandwidth, p.network.bandwidth_practical),
    U3M_PARAM("network", "latency", time, p.network.latency),
    U3M_PARAM("network", "nics_per_node", count, p.nics_per_node),
    U3M_PARAM("pool", "capacity_per_node", bytes, p.pool.capacity_per_node),
};
#undef U3M_PARAM

#define U3M_TEXT(section, key, expr)                                \
  TextField {                                                       \
    section, key, [](HwProfile& p) -> std::string& { return expr; } \
  }
constexpr std::array kTexts = {
    U3M_TEXT("", "name", p.name),
    U3M_TEXT("", "description", p.description),
    U3M_TEXT("device", "model", p.device.model),
    U3M_TEXT("host_link", "kind", p.host_link.kind),
    U3M_TEXT("peer_link", "kind", p.peer_link.kind),
    U3M_TEXT("ssd", "model", p.ssd.model),
    U3M_TEXT("network", "kind", p.network.kind),
};
#undef U3M_TEXT

// Sections in file order (the order of first appearance in kParams).
std::vector<std::string_view> sections() {
  std::vector<std::string_view> out;
  for (const ParamField& f : kParams)
    if (std::find(out.begin(), out.end(), f.section) == out.end()) out.push_back(f.section);
  return out;
}

struct Unit {
  std::string_view name;
  double factor;
};
constexpr Unit kBytes[] = {{"B", 1},           {"KB", 1e3},           {"MB", 1e6},
                           {"GB", 1e9},        {"TB", 1e12},          {"KiB", 1024.0},
                           {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
constexpr Unit kBandwidth[] = {
    {"B/s", 1},     {"KB/s", 1e3},        {"MB/s", 1e6},          {"GB/s", 1e9},
    {"TB/s", 1e12}, {"MiB/s", 1048576.0}, {"GiB/s", 1073741824.0}};
constexpr Unit kFlopRate[] = {{"FLOPS", 1}, {"GFLOPS", 1e9}, {"TFLOPS", 1e12}, {"PFLOPS", 1e15}};
constexpr Unit kTime[] = {{"ns", 1e-9}, {"us", 1e-6},   {"ms", 1e-3},      {"s", 1},
                          {"h", 3600},  {"day", 86400}, {"year", 31536000}};  // 365 days
constexpr Unit kFraction[] = {{"fraction", 1}};
constexpr Unit kCount[] = {{"count", 1}};

std::span<const Unit> units(Dim d) {
  switch (d) {
    case Dim::bytes:
      return kBytes;
    case Dim::bandwidth:
      return kBandwidth;
    case Dim::flop_rate:
      return kFlopRate;
    case Dim::time:
      return kTime;
    case Dim::fraction:
      return kFraction;
    case Dim::count:
      return kCount;
  }
  return {};
}

std::string unit_list(Dim d) {
  std::string out;
  for (const Unit& u : units(d)) out += (out.empty() ? "" : ", ") + std::string(u.name);
  return out;
}

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

Param read_param(const toml::node& node, const ParamField& f, std::string_view where) {
  const std::string name = field_name(f.section, f.key);
  const int line = line_of(node);
  const std::string loc = at_line(where, line);
  const toml::table* t = node.as_table();
  if (!t)
    input_error(loc, "field '{}': expected {{ value = ..., unit = \"{}\", source = \"...\" }}",
                name, units(f.dim).front().name);
  for (auto&& [k, v] : *t)
    if (k != "value" && k != "unit" && k != "source")
      input_error(at_line(where, line_of(v)),
                  "field '{}': unknown key '{}' (expected value, unit, source)", name, k.str());
  Param p;
  p.line = line;
  const toml::node* value = t->get("value");
  if (!value) input_error(loc, "field '{}': missing 'value'", name);
  if (auto i = value->as_integer())
    p.value = static_cast<double>(i->get());
  else if (auto d = value->as_floating_point())
    p.value = d->get();
  else
    input_error(at_line(where, line_of(*value)), "field '{}': 'value' must be a number", name);
  if (!std::isfinite(p.value) || p.value <= 0)
    input_error(loc, "field '{}': value {} must be a finite number above zero", name, p.value);
  if (f.dim == Dim::fraction && p.value > 1)
    input_error(loc, "field '{}': value {} is a fraction and must be at most 1", name, p.value);
  if (f.dim == Dim::count && (p.value != std::floor(p.value) || p.value > 1e6))
    input_error(loc, "field '{}': value {} must be a whole count", name, p.value);

  const toml::node* unit = t->get("unit");
  if (!unit || !unit->is_string())
    input_error(loc, "field '{}': missing 'unit' (one of {})", name, unit_list(f.dim));
  p.unit = unit->as_string()->get();
  const double factor = unit_factor(f.dim, p.unit);
  if (factor == 0)
    input_error(loc, "field '{}': unit '{}' is not one of {}", name, p.unit, unit_list(f.dim));
  p.si = p.value * factor;
  if (!std::isfinite(p.si)) input_error(loc, "field '{}': {} {} overflows", name, p.value, p.unit);

  const toml::node* source = t->get("source");
  if (!source || !source->is_string() || blank(source->as_string()->get()))
    input_error(
        loc, "field '{}': missing 'source' (a datasheet, paper, measurement or stated assumption)",
        name);
  p.source = source->as_string()->get();
  return p;
}

// Practical bandwidth above the wire rate is a typo, not a measurement.
void check_link(const LinkSpec& l, std::string_view section, std::string_view where) {
  if (l.bandwidth_practical.si > l.bandwidth_theoretical.si * (1 + 1e-9))
    input_error(at_line(where, l.bandwidth_practical.line),
                "field '{}': practical bandwidth {} {} exceeds the theoretical {} {}",
                field_name(section, "bandwidth_practical"), l.bandwidth_practical.value,
                l.bandwidth_practical.unit, l.bandwidth_theoretical.value,
                l.bandwidth_theoretical.unit);
}

bool valid_name(std::string_view s) {
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
  });
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04X}", c);
        else
          out += ch;
    }
  }
  return out + "\"";
}

}  // namespace

std::span<const ParamField> param_fields() {
  return kParams;
}
std::span<const TextField> text_fields() {
  return kTexts;
}

std::span<const std::string_view> units_for(Dim d) {
  // Names only, for help texts; kept beside the factors.
  static const auto names = [] {
    std::array<std::vector<std::string_view>, 6> out;
    for (int i = 0; i < 6; ++i)
      for (const Unit& u : units(static_cast<Dim>(i))) out[i].push_back(u.name);
    return out;
  }();
  return names[static_cast<int>(d)];
}

double unit_factor(Dim d, std::string_view unit) {
  for (const Unit& u : units(d))
    if (u.name == unit) return u.factor;
  return 0;
}

std::string field_name(std::string_view section, std::string_view key) {
  return section.empty() ? std::string(key) : fmt::format("{}.{}", section, key);
}

HwProfile parse_profile(std::string_view text, std::string_view where) {
  const toml::table root = util::parse_toml(text, where);
  const std::vector<std::string_view> secs = sections();
  auto known_in = [&](std::string_view section, std::string_view key) {
    for (const ParamField& f : kParams)
      if (f.section == section && f.key == key) return true;
    for (const TextField& f : kTexts)
      if (f.section == section && f.key == key) return true;
    return false;
  };
  // Unknown keys are errors: a misspelt field must not pass silently.
  for (auto&& [k, v] : root) {
    const bool is_section = std::find(secs.begin(), secs.end(), k.str()) != secs.end();
    if (is_section) {
      const toml::table* t = v.as_table();
      if (!t)
        input_error(at_line(where, line_of(v)), "'{}' must be a table ([{}])", k.str(), k.str());
      for (auto&& [k2, v2] : *t)
        if (!known_in(k.str(), k2.str()))
          input_error(at_line(where, line_of(v2)), "unknown field '{}'",
                      field_name(k.str(), k2.str()));
    } else if (!known_in("", k.str())) {
      input_error(at_line(where, line_of(v)), "unknown field '{}'", k.str());
    }
  }
  auto section_of = [&](std::string_view section) -> const toml::table& {
    if (section.empty()) return root;
    const toml::table* t = root.get_as<toml::table>(section);
    if (!t) input_error(where, "missing table [{}]", section);
    return *t;
  };

  HwProfile p;
  for (const TextField& f : kTexts) {
    const toml::table& t = section_of(f.section);
    const toml::node* n = t.get(f.key);
    const std::string name = field_name(f.section, f.key);
    if (!n) input_error(at_line(where, line_of(t)), "missing field '{}' (a string)", name);
    if (!n->is_string() || blank(n->as_string()->get()))
      input_error(at_line(where, line_of(*n)), "field '{}' must be a non-empty string", name);
    f.get(p) = n->as_string()->get();
  }
  if (!valid_name(p.name))
    input_error(where, "field 'name': '{}' must be 1-64 characters of a-z, 0-9, '-', '_', '.'",
                p.name);
  for (const ParamField& f : kParams) {
    const toml::table& t = section_of(f.section);
    const toml::node* n = t.get(f.key);
    if (!n)
      input_error(
          at_line(where, line_of(t)),
          "missing field '{}' (expected {{ value = ..., unit = \"{}\", source = \"...\" }})",
          field_name(f.section, f.key), units(f.dim).front().name);
    f.get(p) = read_param(*n, f, where);
  }
  check_link(p.host_link, "host_link", where);
  check_link(p.peer_link, "peer_link", where);
  check_link(p.network, "network", where);
  p.origin = std::string(where);
  return p;
}

std::vector<std::string> builtin_profile_names() {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < detail::kNumBuiltinProfiles; ++i)
    out.emplace_back(detail::kBuiltinProfiles[i].name);
  std::sort(out.begin(), out.end());
  return out;
}

std::string_view builtin_profile_text(std::string_view name) {
  for (std::size_t i = 0; i < detail::kNumBuiltinProfiles; ++i)
    if (name == detail::kBuiltinProfiles[i].name) return detail::kBuiltinProfiles[i].text;
  return {};
}

HwProfile load_profile(std::string_view name_or_path) {
  if (std::string_view text = builtin_profile_text(name_or_path); !text.empty()) {
    HwProfile p = parse_profile(text, fmt::format("built-in {}", name_or_path));
    p.origin = "built-in";
    return p;
  }
  std::ifstream in{std::string(name_or_path), std::ios::binary};
  if (!in) {
    std::string names;
    for (const std::string& n : builtin_profile_names()) names += (names.empty() ? "" : ", ") + n;
    input_error(name_or_path, "neither a built-in profile ({}) nor a readable file", names);
  }
  std::ostringstream text;
  text << in.rdbuf();
  constexpr std::size_t kMaxBytes = 1 << 20;  // profiles are a few KiB
  if (text.str().size() > kMaxBytes)
    input_error(name_or_path, "{} bytes is too large for a hardware profile", text.str().size());
  return parse_profile(text.str(), name_or_path);
}

std::string to_toml(const HwProfile& p) {
  std::string out =
      "# Hardware profile (docs/hardware.md). Every number: { value, unit, source }.\n";
  for (const TextField& f : kTexts)
    if (f.section.empty()) out += fmt::format("{} = {}\n", f.key, quote(f.at(p)));
  for (std::string_view section : sections()) {
    out += fmt::format("\n[{}]\n", section);
    for (const TextField& f : kTexts)
      if (f.section == section) out += fmt::format("{} = {}\n", f.key, quote(f.at(p)));
    for (const ParamField& f : kParams) {
      if (f.section != section) continue;
      const Param& v = f.at(p);
      // {} prints the shortest text that reads back to the same double.
      out += fmt::format("{} = {{ value = {}, unit = {}, source = {} }}\n", f.key, v.value,
                         quote(v.unit), quote(v.source));
    }
  }
  return out;
}

}  // namespace u3m::sim
