// Runs the built `u3m` binary for end-to-end tests. The test target defines
// U3M_BIN_PATH="$<TARGET_FILE:u3m>" and depends on u3m (see tests/CMakeLists.txt).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace u3m::testing {

struct CliRun {
  int status;          // exit code, or -1 if it did not exit normally
  std::string output;  // stdout, plus stderr unless dropped
};

inline CliRun run_cli(const std::string& args, bool with_stderr = true) {
  std::string cmd =
      std::string(U3M_BIN_PATH) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  CliRun r{-1, {}};
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) r.output.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace u3m::testing
