// observe::Timeline: the trace-event JSON it writes passes the format's
// schema check (observe/trace_event_check.hpp), overlapping transfers are
// dealt onto lanes that nest, and an engine on the real stack reports its
// transfers and occupancy into it.
#include <cstdio>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "engine/rig.hpp"
#include "observe/trace_event_check.hpp"
#include "u3m/observe/timeline.hpp"
#include "u3m/util/error.hpp"

namespace u3m::observe {
namespace {

using engine::Link;
using engine::Status;
using engine::TransferRecord;
using engine::testing::Rig;
using engine::testing::RigOptions;
using mem::KiB;
using mem::MiB;
using testing::check_trace_events;

std::string problems(const nlohmann::json& doc) {
  std::string s;
  for (const std::string& p : check_trace_events(doc)) s += p + "\n";
  return s;
}

TEST(TraceEventCheck, CatchesWhatTheViewersRefuse) {
  // The check itself must fail on bad documents, or passing it means nothing.
  EXPECT_FALSE(check_trace_events(nlohmann::json::array()).empty());
  auto doc = [](nlohmann::json e) { return nlohmann::json{{"traceEvents", {e}}}; };
  EXPECT_FALSE(check_trace_events(doc({{"ph", "X"}, {"name", "a"}, {"pid", 0}, {"ts", 1}})).empty());
  EXPECT_FALSE(check_trace_events(doc({{"ph", "Q"}, {"name", "a"}, {"pid", 0}, {"ts", 1}})).empty());
  EXPECT_FALSE(check_trace_events(doc({{"ph", "C"}, {"name", "a"}, {"pid", 0}, {"ts", 1},
                                       {"args", {{"v", "x"}}}}))
                   .empty());
  EXPECT_FALSE(check_trace_events(doc({{"ph", "i"}, {"name", "a"}, {"pid", 0}, {"ts", -1}})).empty());
  nlohmann::json overlap = {{"traceEvents",
                             {{{"ph", "X"}, {"name", "a"}, {"pid", 0}, {"tid", 1}, {"ts", 0}, {"dur", 10}},
                              {{"ph", "X"}, {"name", "b"}, {"pid", 0}, {"tid", 1}, {"ts", 5}, {"dur", 10}}}}};
  EXPECT_FALSE(check_trace_events(overlap).empty());
  overlap["traceEvents"][1]["dur"] = 5;  // now nested
  EXPECT_TRUE(check_trace_events(overlap).empty()) << problems(overlap);
}

TEST(Timeline, WritesValidTraceEventsWithLanesForOverlappingTransfers) {
  Timeline tl;
  const double t0 = 5000.0;  // a steady clock's epoch is far from 0: rebased
  tl.stall(0, 0, 0, t0, t0 + 0.001);
  tl.op(0, 0, 0, "attn \"q\"\\k", {}, t0 + 0.001, t0 + 0.003);  // escaped in JSON
  tl.op(0, 0, 1, "mlp", {}, t0 + 0.003, t0 + 0.004);
  tl.step_end(0, 0, t0 + 0.004);
  // Three h2d transfers, two overlapping: two lanes.
  tl.transfer({.card = 0, .link = Link::h2d, .priority = 0, .bytes = 4096, .start_s = t0, .end_s = t0 + 0.002});
  tl.transfer({.card = 0, .link = Link::h2d, .priority = 1, .bytes = 8192, .start_s = t0 + 0.001, .end_s = t0 + 0.003});
  tl.transfer({.card = 0, .link = Link::h2d, .priority = 2, .bytes = 1, .start_s = t0 + 0.002,
               .end_s = t0 + 0.0025, .ok = false});
  tl.occupancy(0, mem::Tier::device, 100, t0);
  tl.occupancy(0, mem::Tier::device, 200, t0 + 1e-7);  // within 1 us: replaces the sample
  tl.occupancy(0, mem::Tier::device, 50, t0 + 0.002);
  tl.occupancy(1, mem::Tier::host, 7, t0 + 0.002);
  const Timeline::Counts c = tl.counts();
  EXPECT_EQ(c.ops, 2u);
  EXPECT_EQ(c.stalls, 1u);
  EXPECT_EQ(c.transfers, 3u);
  EXPECT_EQ(c.occupancy, 3u);

  const std::string path = ::testing::TempDir() + "u3m_timeline_test.json";
  tl.write(path, "test clock");
  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::remove(path.c_str());
  EXPECT_TRUE(check_trace_events(doc).empty()) << problems(doc);
  EXPECT_EQ(doc["otherData"]["origin_s"], t0);
  EXPECT_EQ(doc["otherData"]["clock"], "test clock");
  std::set<long long> h2d_lanes;
  std::vector<double> device_used;
  bool saw_escaped = false, saw_failed = false, saw_stall = false;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == "transfer") {
      h2d_lanes.insert(e["tid"].get<long long>());
      if (e["args"]["ok"] == false) saw_failed = e["name"] == "failed writeback";
    }
    if (e["ph"] == "X" && e["cat"] == "op" && e["name"] == "attn \"q\"\\k") {
      saw_escaped = true;
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 1000.0);  // us after the origin
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 2000.0);
    }
    if (e["ph"] == "X" && e["cat"] == "stall") saw_stall = e["ts"].get<double>() == 0.0;
    if (e["ph"] == "C" && e["name"] == "device used") device_used.push_back(e["args"]["bytes"]);
  }
  EXPECT_EQ(h2d_lanes.size(), 2u);  // the third fits after the first
  EXPECT_TRUE(saw_escaped);
  EXPECT_TRUE(saw_failed);
  EXPECT_TRUE(saw_stall);
  EXPECT_EQ(device_used, (std::vector<double>{200, 50}));
}

TEST(Timeline, AnUnwritablePathIsAnInputErrorNamingIt) {
  Timeline tl;
  try {
    tl.write("/nonexistent-dir/t.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/t.json"), std::string::npos);
  }
}

TEST(Timeline, AnEngineOnTheRealStackReportsTransfersAndOccupancyIntoIt) {
  Timeline tl;
  {
    RigOptions o;
    o.device = 512 * KiB;
    o.host = 1 * MiB;
    o.ssd = 16 * MiB;
    Rig rig(o);
    rig.engine->set_observer(&tl, 2);
    for (int i = 0; i < 16; ++i) {
      ASSERT_EQ(rig.engine->add(i, 128 * KiB), Status::ok);
      ASSERT_EQ(rig.write(i, 1), Status::ok);
    }
    for (int i = 0; i < 16; ++i) ASSERT_TRUE(rig.holds(i, 1));
  }
  const Timeline::Counts c = tl.counts();
  EXPECT_GT(c.transfers, 0u);
  EXPECT_GT(c.occupancy, 0u);
  const nlohmann::json doc = nlohmann::json::parse(tl.json());
  EXPECT_TRUE(check_trace_events(doc).empty()) << problems(doc);
  std::set<std::string> tracks;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      EXPECT_EQ(e["pid"], 2);
      tracks.insert(e["args"]["name"].get<std::string>());
    }
  for (const char* t : {"d2h", "h2d", "h2s", "s2h"}) EXPECT_TRUE(tracks.count(t)) << t;
}

}  // namespace
}  // namespace u3m::observe
