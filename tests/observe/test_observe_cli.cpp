// `u3m run replay --metrics-port / --timeline` end to end: /metrics scraped
// over loopback HTTP while a real replay runs (names present, values
// moving), and the timeline it writes passes the trace-event schema check.
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_testing.hpp"
#include "mem/test_ssd_util.hpp"
#include "observe/http_get.hpp"
#include "observe/trace_event_check.hpp"

namespace {

using u3m::observe::testing::check_trace_events;
using u3m::observe::testing::free_port;
using u3m::observe::testing::http_get;
const auto parse = u3m::observe::testing::parse_exposition;
using u3m::testing::run_cli;


class ObserveCli : public ::testing::Test {
 protected:
  void SetUp() override {
    trace_ = dir_.file("tiny.u3mt");
    auto r = run_cli("trace gen --model tiny --workload train --steps 3 -o " + trace_);
    ASSERT_EQ(r.status, 0) << r.output;
  }
  u3m::mem::testing::ScratchDir dir_;
  std::string trace_;
};

const char* const kOps = "u3m_ops_total{card=\"0\"}";
const char* const kH2d =
    "u3m_link_bytes_total{card=\"0\",link=\"h2d\",from=\"host\",to=\"device\"}";

// A timeline file: parsed, schema-checked, with events of each category.
nlohmann::json checked_timeline(const std::string& path, std::initializer_list<const char*> cats) {
  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  const auto bad = check_trace_events(doc);
  EXPECT_TRUE(bad.empty()) << bad.front();
  std::map<std::string, int> seen;
  for (const auto& e : doc["traceEvents"])
    if (e.contains("cat")) ++seen[e["cat"].get<std::string>()];
  for (const char* c : cats) EXPECT_GT(seen[c], 0) << path << ": no '" << c << "' events";
  return doc;
}

TEST_F(ObserveCli, MetricsScrapedDuringARealReplayHaveTheirNamesAndMove) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  // A throttled host-to-device link stretches the replay to a few seconds.
  u3m::testing::CliRun run;
  std::thread replay([&] {
    run = run_cli("run replay " + trace_ + " --device-fraction 0.5 --h2d-gbps 0.05 --metrics-port " +
                  std::to_string(port));
  });
  std::vector<std::map<std::string, double>> scrapes;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    const std::string body = http_get(port);
    if (!body.empty()) {
      scrapes.push_back(parse(body));
      if (scrapes.size() > 1 && scrapes.back()[kOps] > scrapes.front()[kOps]) break;
    } else if (!scrapes.empty()) {
      break;  // the replay ended and took the server with it
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  replay.join();
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("serving metrics on http://127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << run.output;
  ASSERT_GE(scrapes.size(), 2u) << "the replay ended before two scrapes: " << run.output;
  auto first = scrapes.front();  // copies: [] reads an absent series (no op yet) as 0
  auto last = scrapes.back();
  for (const char* name :
       {kOps, kH2d, "u3m_tier_used_bytes{card=\"0\",tier=\"device\"}",
        "u3m_tier_capacity_bytes{card=\"0\",tier=\"device\"}",
        "u3m_tier_hits_total{card=\"0\",tier=\"device\"}",
        "u3m_tier_misses_total{card=\"0\",tier=\"device\"}", "u3m_evictions_total{card=\"0\"}",
        "u3m_op_stall_seconds_total{card=\"0\"}", "u3m_ssd_written_bytes_total{card=\"0\"}",
        "u3m_monitor_level{card=\"0\",tier=\"device\"}",
        "u3m_monitor_time_to_oom_seconds{card=\"0\",tier=\"device\"}"})
    EXPECT_TRUE(last.count(name)) << name;
  EXPECT_GT(last[kOps], first[kOps]);
  EXPECT_GT(last["u3m_op_seconds_total{card=\"0\"}"], first["u3m_op_seconds_total{card=\"0\"}"]);
  // The engine's own series move too: the step driver attaches the replay's
  // engine to the observer.
  EXPECT_GT(last[kH2d], first[kH2d]);
}

TEST_F(ObserveCli, ReplayTimelinePassesTheTraceEventSchemaCheck) {
  const std::string out = dir_.file("replay-timeline.json");
  auto r = run_cli("run replay " + trace_ + " --device-fraction 0.5 --timeline " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  // Transfers and occupancy come from the engine the driver attaches.
  const nlohmann::json doc = checked_timeline(out, {"op", "step", "stall", "transfer", "occupancy"});
  EXPECT_NE(doc["otherData"]["clock"].get<std::string>().find("measured"), std::string::npos);
}

// The simulator's timeline: the same observer on virtual time, two cards.
TEST_F(ObserveCli, TrainSimTimelinePassesTheTraceEventSchemaCheck) {
  const std::string out = dir_.file("train-timeline.json");
  auto r = run_cli("train sim --model tiny --cards 2 --timeline " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json doc = checked_timeline(out, {"op", "step", "transfer", "occupancy"});
  EXPECT_NE(doc["otherData"]["clock"].get<std::string>().find("simulated"), std::string::npos);
}

// The serving simulator's timeline: iterations on the group's compute track,
// waits for KV blocks as stalls, the store's transfers and tier use, on
// virtual time. One 13B card cannot hold the sample's KV in HBM, so blocks
// move to the SSD and back.
TEST_F(ObserveCli, ServeSimTimelinePassesTheTraceEventSchemaCheck) {
  const std::string out = dir_.file("serve-timeline.json");
  auto r =
      run_cli(std::string("serve sim --model llama2-13b --cards 1 --kv-policy u3m --requests ") +
              U3M_SOURCE_DIR "/data/requests/samples/mooncake_conversation_head20.jsonl" +
              " --ssd-admit-after 0 --timeline " + out);  // write every victim to SSD
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json doc = checked_timeline(out, {"op", "stall", "transfer", "occupancy"});
  EXPECT_NE(doc["otherData"]["clock"].get<std::string>().find("simulated"), std::string::npos);
  // --timeline is serve sim's: the capacity search runs many simulations.
  r = run_cli("serve capacity --requests rag:requests=5 --timeline " + out);
  EXPECT_EQ(r.status, 2) << r.output;
}

// --diagnose on a real replay and a simulated run: bytes per link, the top
// ops, the steady-state steps (the cold first one left out) and the ops'
// roofline bound on the profile. The replay at half the footprint fetches in
// every step; the tiny model's simulated run fits after its cold step, so its
// steady steps charge no bytes to any op.
TEST_F(ObserveCli, DiagnosisOfARealAndASimulatedRun) {
  for (const std::string cmd :
       {"run replay " + trace_ + " --device-fraction 0.5 --h2d-gbps 1 --hw ascend-910b-32g",
        std::string("train sim --model tiny --cards 1")}) {
    SCOPED_TRACE(cmd);
    const bool replay = cmd.starts_with("run replay");
    auto r = run_cli(cmd + " --diagnose --json");
    ASSERT_EQ(r.status, 0) << r.output;
    const nlohmann::json d = nlohmann::json::parse(r.output)["diagnosis"];
    EXPECT_GT(d["links"]["h2d"]["bytes"].get<std::uint64_t>(), 0u);
    EXPECT_GT(d["links"]["h2d"]["utilisation"].get<double>(), 0.0);
    EXPECT_EQ(d["top_ops_by_bytes"].empty(), !replay);
    EXPECT_FALSE(d["cold_step_included"].get<bool>());
    ASSERT_FALSE(d["steady_steps"].empty());
    EXPECT_GE(d["steady_steps"][0]["step"].get<int>(), 1);  // step 0, the cold one, left out
    ASSERT_TRUE(d["roofline"].is_object());
    EXPECT_EQ(d["roofline"]["profile"], "ascend-910b-32g");
    const auto& ops = d["roofline"]["ops"];
    EXPECT_GT(ops["hbm_bound"].get<std::uint64_t>() + ops["compute_bound"].get<std::uint64_t>(),
              0u);
  }
  // Without a profile a replay's diagnosis says it has no roofline.
  auto r = run_cli("run replay " + trace_ + " --device-fraction 0.5 --diagnose --json");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(nlohmann::json::parse(r.output)["diagnosis"]["roofline"].is_null());
  // --hw is for --diagnose; an unknown profile names the flag's value.
  r = run_cli("run replay " + trace_ + " --hw ascend-910b-32g");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--hw"), std::string::npos) << r.output;
  r = run_cli("run replay " + trace_ + " --diagnose --hw no-such-card");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("no-such-card"), std::string::npos) << r.output;
}

TEST_F(ObserveCli, BadFlagsNameThemselvesAndExit2) {
  auto r = run_cli("run replay " + trace_ + " --timeline /nonexistent-dir/t.json");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--timeline"), std::string::npos) << r.output;
  r = run_cli("run replay " + trace_ + " --metrics-port 70000");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--metrics-port"), std::string::npos) << r.output;
}

}  // namespace
