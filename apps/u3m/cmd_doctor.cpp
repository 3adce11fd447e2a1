// `u3m doctor [--json]`: what this machine offers u3m, probed now: the device
// backends (device-emu, cuda, acl) with the reason any is unavailable,
// io_uring and O_DIRECT, page locking, membarrier and huge pages, the torch
// that /usr/bin/python3 imports, and the SSD directory's free space and file
// system. Nothing here is a measured figure; each line says what was found.
//
// Note [Doctor sections]
// A section is a name and a probe that returns its JSON object and the text
// lines to print; `--json` prints every section's object under its name.
// Adding a section is one function and one row in sections() (the operators
// issue adds its own the same way).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "u3m/mem/backend_registry.hpp"
#include "u3m/mem/sys_probe.hpp"
#include "u3m/util/error.hpp"

namespace u3m::cli {
namespace {

struct DoctorArgs {
  bool json = false;
  std::string ssd_dir = "/tmp";
  std::string python = "/usr/bin/python3";
};

struct Section {
  nlohmann::json data;
  std::vector<std::string> lines;
};
using Probe = Section (*)(const DoctorArgs&);

nlohmann::json finding(const mem::ProbeResult& r) {
  return {{"ok", r.ok}, {"detail", r.detail}};
}
std::string mark(bool ok) {
  return ok ? "yes" : "no ";
}

Section backends(const DoctorArgs&) {
  Section s;
  s.data = nlohmann::json::array();
  for (const mem::BackendProbe& p : mem::probe_backends()) {
    nlohmann::json b = {{"name", p.name}, {"available", p.available}, {"detail", p.detail}};
    if (p.info) {
      const mem::AccelInfo& i = *p.info;
      b["library"] = i.library;
      b["driver_library"] = i.driver_library;
      b["device"] = i.device_name;
      b["runtime_version"] = i.runtime_version;
      b["driver_version"] = i.driver_version;
      b["total_bytes"] = i.total_bytes;
      b["vmm"] = i.vmm;
      b["vmm_note"] = i.vmm_note;
      b["granularity"] = i.granularity;
      b["test_double"] = i.test_double;
    }
    s.lines.push_back(fmt::format("{:<10} {:<11} {}", p.name,
                                  p.available ? "available" : "unavailable", p.detail));
    s.data.push_back(std::move(b));
  }
  return s;
}

Section io(const DoctorArgs& a) {
  const mem::ProbeResult uring = mem::probe_io_uring();
  const mem::ProbeResult direct = mem::probe_direct_io(a.ssd_dir);
  return {{{"io_uring", finding(uring)}, {"o_direct", finding(direct)}},
          {fmt::format("io_uring   {} {}", mark(uring.ok), uring.detail),
           fmt::format("O_DIRECT   {} {}", mark(direct.ok), direct.detail)}};
}

Section memory(const DoctorArgs&) {
  const mem::MemlockProbe ml = mem::probe_mlock();
  const mem::ProbeResult mb = mem::probe_membarrier();
  const mem::HugePageProbe hp = mem::probe_huge_pages();
  auto limit = [](const std::optional<std::uint64_t>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  nlohmann::json d = {{"mlock",
                       {{"soft_bytes", limit(ml.soft)},
                        {"hard_bytes", limit(ml.hard)},
                        {"unlimited", !ml.soft.has_value()},
                        {"can_lock", ml.can_lock},
                        {"detail", ml.detail}}},
                      {"membarrier", finding(mb)},
                      {"huge_pages",
                       {{"transparent", hp.thp_enabled},
                        {"hugetlb_total", hp.hugetlb_total},
                        {"hugetlb_free", hp.hugetlb_free},
                        {"hugetlb_page_bytes", hp.hugetlb_page_bytes}}}};
  return {d,
          {fmt::format("mlock      {} {}", mark(ml.can_lock), ml.detail),
           fmt::format("membarrier {} {}", mark(mb.ok), mb.detail),
           fmt::format("huge pages    transparent [{}]; hugetlb {} of {} free ({})", hp.thp_enabled,
                       hp.hugetlb_free, hp.hugetlb_total,
                       hp.hugetlb_page_bytes ? human_bytes(hp.hugetlb_page_bytes) : "n/a")}};
}

// Runs the interpreter (bounded by `timeout`, since importing torch can hang
// on a broken install); the output's last line is a version or the error.
Section torch(const DoctorArgs& a) {
  nlohmann::json d = {{"python", a.python}, {"version", nullptr}, {"cuda_available", nullptr}};
  if (access(a.python.c_str(), X_OK) != 0) {
    d["status"] = "not found";
    return {d, {fmt::format("torch      not found ({} does not exist)", a.python)}};
  }
  const std::string cmd = fmt::format(
      "timeout 120 '{}' -c 'import torch; print(torch.__version__, torch.cuda.is_available())' "
      "2>&1",
      a.python);
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int rc = pclose(p);
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    std::string last = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
    if (rc == 0) {
      const auto sp = last.find(' ');
      d["status"] = "found";
      d["version"] = last.substr(0, sp);
      d["cuda_available"] = sp != std::string::npos && last.substr(sp + 1) == "True";
      return {
          d,
          {fmt::format("torch      {} via {} (CUDA {})", d["version"].get<std::string>(), a.python,
                       d["cuda_available"].get<bool>() ? "available" : "not available")}};
    }
    d["status"] = "not importable";
    d["detail"] = last;
    return {d, {fmt::format("torch      not importable with {}: {}", a.python, last)}};
  }
  d["status"] = "not importable";
  return {d, {fmt::format("torch      could not run {}", a.python)}};
}

Section ssd(const DoctorArgs& a) {
  std::string why;
  const auto free_bytes = mem::free_bytes(a.ssd_dir, &why);
  const std::string fs = mem::fs_type(a.ssd_dir);
  nlohmann::json d = {{"dir", a.ssd_dir},
                      {"filesystem", fs},
                      {"free_bytes", free_bytes ? nlohmann::json(*free_bytes) : nlohmann::json()}};
  return {d,
          {fmt::format("ssd dir    {} ({}), {} free", a.ssd_dir, fs,
                       free_bytes ? approx_bytes(double(*free_bytes)) : "unknown: " + why)}};
}

// Note [Doctor sections]: name, probe.
const std::vector<std::pair<const char*, Probe>>& sections() {
  static const std::vector<std::pair<const char*, Probe>> s = {
      {"backends", backends}, {"io", io}, {"memory", memory}, {"torch", torch}, {"ssd", ssd}};
  return s;
}

void run_doctor(const DoctorArgs& a, const std::vector<std::string>& extra) {
  if (!extra.empty()) input_error(extra.front(), "unknown flag or argument for 'u3m doctor'");
  struct stat st {};
  if (stat(a.ssd_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    input_error("--ssd-dir", "{}: not a directory", a.ssd_dir);
  nlohmann::json out = {{"u3m", "0.1.0"},
                        {"machine", machine()},
                        {"note", "probed on this machine now; no figure here is a benchmark"}};
  if (!a.json) fmt::print("u3m doctor on {} (probed now)\n", machine());
  for (const auto& [name, probe] : sections()) {
    Section s = probe(a);
    if (a.json) {
      out[name] = std::move(s.data);
      continue;
    }
    fmt::print("\n{}\n", name);
    for (const std::string& line : s.lines) fmt::print("  {}\n", line);
  }
  if (a.json) fmt::print("{}\n", out.dump(2));
}

}  // namespace

void add_doctor_command(CLI::App& app) {
  auto args = std::make_shared<DoctorArgs>();
  auto* cmd = app.add_subcommand(
      "doctor",
      "What this machine offers u3m: backends (with reasons), I/O, memory, torch, SSD dir");
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
  cmd->add_option("--ssd-dir", args->ssd_dir, "Directory the SSD tier would use")
      ->capture_default_str();
  cmd->add_option("--python", args->python, "Interpreter whose torch is reported")
      ->capture_default_str();
  // Unknown flags are this command's to report (one line, exit 2).
  cmd->allow_extras();
  cmd->callback([args, cmd] { run_doctor(*args, cmd->remaining()); });
}

}  // namespace u3m::cli
