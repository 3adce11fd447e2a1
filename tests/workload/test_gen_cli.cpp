// End to end: `u3m trace gen` writes a loadable trace and a summary whose
// figures match the shape; bad input fails with a message naming the flag.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "cli_testing.hpp"

#include "u3m/trace/io.hpp"

namespace {

using u3m::testing::CliRun;
CliRun run(const std::string& args) {
  return u3m::testing::run_cli(args);
}

std::filesystem::path temp_path(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("u3m-gen-" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d / name;
}

TEST(GenCli, WritesALoadableTraceAndASummary) {
  const auto out = temp_path("mixed.jsonl"), summary = temp_path("summary.json");
  const CliRun r =
      run("trace gen --model tiny --workload mixed --pattern timeshare --steps 1 "
          "--seq-len 16 --requests 4 --arrival-rate 5000 --prompt-len uniform:4:8 "
          "--output-len fixed:3 --block-tokens 4 --seed 9 -o " +
          out.string() + " --summary-json " + summary.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("analytic (from the model shape)"), std::string::npos);
  EXPECT_NE(r.output.find("counted from the generated trace"), std::string::npos);

  const u3m::trace::Trace t = u3m::trace::load_trace(out.string());
  EXPECT_EQ(t.jobs, (std::vector<std::string>{"train-0", "infer-0"}));
  EXPECT_EQ(t.find_meta("seed"), "9");
  EXPECT_EQ(t.find_meta("mixed.pattern"), "timeshare");
  EXPECT_TRUE(t.find_meta("generator").has_value());

  nlohmann::json j;
  std::ifstream(summary) >> j;
  // tiny: V*d*2 + L*(2 d^2 + 2 d kv + 3 d f + 2 d) + d
  const std::uint64_t params =
      256 * 64 * 2 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 172 + 128) + 64;
  EXPECT_EQ(j["analytic"]["params"].get<std::uint64_t>(), params);
  EXPECT_EQ(j["counted"]["events"].get<std::uint64_t>(), t.events.size());
  EXPECT_EQ(j["counted"]["requests_completed"].get<int>(), 4);
  EXPECT_EQ(j["counted"]["peak_bytes"]["train-0"]["param"].get<std::uint64_t>(), 2 * params);
  std::filesystem::remove_all(out.parent_path());
}

TEST(GenCli, BadShapeNamesTheField) {
  const CliRun r = run("trace gen --model tiny --workload train --heads 3");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("heads (3) must divide d_model (64)"), std::string::npos) << r.output;
  const CliRun r2 = run("trace gen --model tiny --workload infer --prompt-len uniform:9:3");
  EXPECT_NE(r2.status, 0);
  EXPECT_NE(r2.output.find("--prompt-len"), std::string::npos) << r2.output;
  const CliRun r3 = run("trace gen --model nope");
  EXPECT_NE(r3.status, 0);
  EXPECT_NE(r3.output.find("llama2-13b"), std::string::npos) << r3.output;
}

TEST(GenCli, OutOfRangeValuesAreRejectedNotWrapped) {
  struct Case {
    const char* args;
    const char* needle;
  };
  for (const Case& c : {
           Case{"trace gen --model tiny --d-model 4294967295 --heads 1 --kv-heads 1", "d_model"},
           Case{"trace gen --model tiny --workload train --lora-rank 100000", "--lora-rank"},
           Case{"trace gen --model tiny --workload train --lora-rank 64", "--lora-rank"},
           Case{"trace gen --model tiny --workload infer --requests 3 --arrival-rate 1e-300",
                "--arrival-rate"},
       }) {
    const CliRun r = run(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
