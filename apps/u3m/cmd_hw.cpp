// `u3m hw show|calibrate`: the simulator's hardware profiles (docs/hardware.md).
#include <ctime>
#include <memory>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "u3m/sim/calibrate.hpp"
#include "u3m/sim/cost.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/sim/profile_json.hpp"
#include "u3m/util/error.hpp"
#include "u3m/util/output_file.hpp"

namespace u3m::cli {
namespace {

struct ShowArgs {
  std::string profile;
  bool json = false;
};

struct CalibrateArgs {
  std::string out;
  std::string dir = "/var/tmp";
  double seconds = 10;
  std::string hbm_capacity = "4G";
  bool json = false;
};

std::string figure(const sim::Param& p) {
  return fmt::format("{} {}", p.value, p.unit);
}

// Built-in profiles are nominal; a calibrated one says "measured" in its
// sources. The header line states which, for the whole listing.
std::string provenance(const sim::HwProfile& p) {
  std::size_t measured = 0;
  for (const sim::ParamField& f : sim::param_fields())
    measured += f.at(p).source.starts_with("measured") ? 1 : 0;
  if (measured == 0)
    return "nominal figures (datasheets, papers, stated assumptions), not measured by u3m";
  return fmt::format("{} of {} figures measured, as each source says", measured,
                     sim::param_fields().size());
}

void print_profile(const sim::HwProfile& p) {
  fmt::print("profile {} ({}): {}\n{}\n", p.name, p.origin, p.description, provenance(p));
  std::string_view section = "-";
  for (const sim::ParamField& f : sim::param_fields()) {
    if (f.section != section) {
      section = f.section;
      std::string label;
      for (const sim::TextField& t : sim::text_fields())
        if (t.section == section) label = t.at(p);
      fmt::print("\n[{}]{}\n", section, label.empty() ? "" : "  " + label);
    }
    const sim::Param& v = f.at(p);
    fmt::print("  {:<22} {}\n      source: {}\n", f.key, figure(v), v.source);
  }
  fmt::print("\nroofline ridge (computed from the figures above): {:.0f} FLOP/byte\n",
             sim::ridge_intensity(p));
}

void run_show(const ShowArgs& a) {
  if (!a.profile.empty()) {
    sim::HwProfile p = sim::load_profile(a.profile);
    if (a.json)
      fmt::print("{}\n", sim::profile_json(p).dump(2));
    else
      print_profile(p);
    return;
  }
  std::vector<sim::HwProfile> all;
  for (const std::string& name : sim::builtin_profile_names())
    all.push_back(sim::load_profile(name));
  if (a.json) {
    nlohmann::json j = {{"nominal", true}, {"profiles", nlohmann::json::array()}};
    for (const auto& p : all) j["profiles"].push_back(sim::profile_json(p));
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print(
      "built-in hardware profiles: nominal figures, not measured by u3m "
      "(`u3m hw show NAME` prints each number's source)\n");
  fmt::print("  {:<18} {:>9} {:>10} {:>12}  {:<16} {}\n", "name", "HBM", "HBM bw", "16-bit peak",
             "host link", "peer link");
  for (const auto& p : all)
    fmt::print("  {:<18} {:>9} {:>10} {:>12}  {:<16} {} ({})\n", p.name,
               figure(p.device.hbm_capacity), figure(p.device.hbm_bandwidth),
               figure(p.device.peak_flops), p.host_link.kind, p.peer_link.kind,
               figure(p.peer_link.bandwidth_theoretical));
}

std::string today_utc() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

void run_calibrate(const CalibrateArgs& a) {
  sim::CalibrateOptions o;
  o.dir = a.dir;
  o.seconds = a.seconds;
  o.hbm_capacity = parse_size(a.hbm_capacity, "--hbm-capacity", 1ull << 50);
  o.host = machine();
  o.date = today_utc();
  o.progress = [](std::string_view step) { fmt::print(stderr, "calibrate: {}...\n", step); };
  OutputFile out(a.out);  // a path that cannot be written fails now, not after measuring
  const sim::Measurements m = sim::measure_machine(o);
  const sim::HwProfile p = sim::profile_from_measurements(m, o);
  const std::string text = sim::to_toml(p);
  out.write(text.data(), text.size());
  out.commit();
  // The file must load like any profile; a failure here is a bug in the writer.
  const sim::HwProfile back = sim::load_profile(a.out);
  if (a.json) {
    nlohmann::json j = {{"measured", true},
                        {"machine", o.host},
                        {"file", a.out},
                        {"profile", sim::profile_json(back)}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("measured on {} ({}), {:.3g} s budget:\n", o.host, o.date, o.seconds);
  fmt::print(
      "  memcpy                 {:.2f} GB/s copied ({:.2f} GB/s traffic = hbm/dram bandwidth)\n",
      m.memcpy_bytes_per_s / 1e9, 2 * m.memcpy_bytes_per_s / 1e9);
  fmt::print("  GEMM, fp32, 1 thread   {:.2f} GFLOPS\n", m.gemm_flops / 1e9);
  fmt::print(
      "  device-emu h2d copy    {:.2f} GB/s, 4 KiB round trip {:.1f} us, empty op {:.1f} us\n",
      m.link_bytes_per_s / 1e9, m.link_latency_s * 1e6, m.op_overhead_s * 1e6);
  fmt::print(
      "  SSD store ({})   read {:.2f} GB/s, write {:.2f} GB/s, 4 KiB get {:.0f} us, put {:.0f} "
      "us\n",
      m.ssd_direct_io ? "O_DIRECT" : "buffered", m.ssd_read_bytes_per_s / 1e9,
      m.ssd_write_bytes_per_s / 1e9, m.ssd_read_latency_s * 1e6, m.ssd_write_latency_s * 1e6);
  fmt::print("  host DRAM              {:.1f} GiB (from the OS)\n", m.dram_bytes / 1073741824.0);
  fmt::print("wrote profile '{}' to {} (hbm_capacity {} is the --hbm-capacity setting)\n",
             back.name, a.out, human_bytes(o.hbm_capacity));
}

}  // namespace

void add_hw_commands(CLI::App& app) {
  auto* hw = app.add_subcommand(
      "hw", "Hardware profiles for the simulator: list/show them, or calibrate this machine");
  hw->require_subcommand(1);

  auto show_args = std::make_shared<ShowArgs>();
  auto* show = hw->add_subcommand(
      "show",
      "List the built-in profiles, or print one (a built-in NAME or a TOML FILE) with the "
      "source of every number");
  show->add_option("profile", show_args->profile, "built-in profile name or TOML file");
  show->add_flag("--json", show_args->json, "print JSON");
  show->callback([show_args] { run_show(*show_args); });

  auto cal = std::make_shared<CalibrateArgs>();
  auto* calibrate = hw->add_subcommand(
      "calibrate",
      "Measure this machine as the emulated device sees it (memcpy, device-emu copies, SSD store, "
      "CPU GEMM) and write a 'local' profile");
  calibrate->add_option("-o,--output", cal->out, "profile file to write (TOML)")->required();
  calibrate->add_option("--dir", cal->dir, "directory for the SSD test file")
      ->capture_default_str();
  calibrate->add_option("--seconds", cal->seconds, "total measuring time")->capture_default_str();
  calibrate
      ->add_option("--hbm-capacity", cal->hbm_capacity,
                   "the emulated device's HBM budget to record (a setting, e.g. 4G)")
      ->capture_default_str();
  calibrate->add_flag("--json", cal->json, "print JSON");
  calibrate->callback([cal] { run_calibrate(*cal); });
}

}  // namespace u3m::cli
