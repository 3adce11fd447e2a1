// `u3m report RESULT.json [more.json] -o report.html [--summary]`: plots and a
// self-contained HTML report from u3m's JSON results, drawn by the Python
// module python/u3m_report with matplotlib (docs/report.md).
// This command only finds the interpreter and the module and hands over its
// arguments; the module reads and checks the results, so bad input, like a
// missing matplotlib, ends there in one line and exit 2.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "commands.hpp"
#include "u3m/util/error.hpp"

#ifndef U3M_SOURCE_PYTHON_DIR
#define U3M_SOURCE_PYTHON_DIR ""
#endif

namespace u3m::cli {
namespace {

namespace fs = std::filesystem;

struct ReportArgs {
  std::vector<std::string> results;
  std::string output, python;
  bool summary = false;
};

bool has_module(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "u3m_report" / "__main__.py", ec);
}

// Note [Finding the report module]
// In order: $U3M_PYTHONPATH (a directory holding u3m_report/), the source
// tree this binary was built from, then python/ three levels above the
// binary (build/<dir>/apps/u3m/u3m in a checkout).
std::string module_dir() {
  std::vector<fs::path> tried;
  if (const char* env = std::getenv("U3M_PYTHONPATH"); env && *env) tried.emplace_back(env);
  if (*U3M_SOURCE_PYTHON_DIR) tried.emplace_back(U3M_SOURCE_PYTHON_DIR);
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) tried.push_back(self.parent_path() / ".." / ".." / ".." / "python");
  for (const fs::path& d : tried)
    if (has_module(d)) return fs::weakly_canonical(d, ec).string();
  input_error("u3m report", "cannot find the python/u3m_report module (set U3M_PYTHONPATH to "
                            "the directory that holds it)");
}

// --python, else $U3M_PYTHON, else Debian's /usr/bin/python3 (where
// python3-matplotlib installs), else the first python3 on PATH.
std::string interpreter(const std::string& flag) {
  if (!flag.empty()) {
    if (access(flag.c_str(), X_OK) != 0) input_error("--python", "{}: not an executable", flag);
    return flag;
  }
  if (const char* env = std::getenv("U3M_PYTHON"); env && *env) {
    if (access(env, X_OK) != 0) input_error("U3M_PYTHON", "{}: not an executable", env);
    return env;
  }
  if (access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  if (const char* path = std::getenv("PATH")) {
    std::string_view rest(path);
    while (!rest.empty()) {
      const std::size_t colon = std::min(rest.find(':'), rest.size());
      const std::string cand = std::string(rest.substr(0, colon)) + "/python3";
      if (colon > 0 && access(cand.c_str(), X_OK) == 0) return cand;
      rest.remove_prefix(std::min(colon + 1, rest.size()));
    }
  }
  input_error("u3m report", "no python3 found (install python3 and python3-matplotlib)");
}

[[noreturn]] void run_report(const ReportArgs& a) {
  if (a.output.empty() && !a.summary)
    input_error("-o", "give -o REPORT.html, --summary, or both");
  const std::string python = interpreter(a.python);
  const std::string dir = module_dir();
  const char* old = std::getenv("PYTHONPATH");
  const std::string path = old && *old ? dir + ":" + old : dir;
  setenv("PYTHONPATH", path.c_str(), 1);
  setenv("PYTHONDONTWRITEBYTECODE", "1", 1);  // the source tree stays clean
  std::vector<std::string> args = {python, "-m", "u3m_report"};
  args.insert(args.end(), a.results.begin(), a.results.end());
  if (!a.output.empty()) args.insert(args.end(), {"-o", a.output});
  if (a.summary) args.emplace_back("--summary");
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  execv(python.c_str(), argv.data());  // the module's exit status is the command's
  input_error("u3m report", "cannot run {}: {}", python, std::strerror(errno));
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  auto* cmd = app.add_subcommand(
      "report",
      "Plots and a self-contained HTML report from results (train capacity, serve capacity, "
      "predict eval, plan cost --json; --timeline files); needs python3-matplotlib");
  cmd->add_option("RESULT", a->results, "JSON results and timelines")->required();
  cmd->add_option("-o,--output", a->output, "HTML file to write (images embedded)");
  cmd->add_flag("--summary", a->summary, "Print a few lines per result");
  cmd->add_option("--python", a->python,
                  "Interpreter with matplotlib (default: $U3M_PYTHON, /usr/bin/python3, python3)");
  cmd->callback([a] { run_report(*a); });
}

}  // namespace u3m::cli
