// observe::Metrics: /metrics scraped over loopback HTTP while an engine on the
// real stack moves data, names present and values moving; counters kept
// after the engine goes; bad ports refused with the flag named.
#include <atomic>
#include <map>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "engine/rig.hpp"
#include "observe/http_get.hpp"
#include "u3m/observe/metrics.hpp"
#include "u3m/util/error.hpp"

namespace u3m::observe {
namespace {

using engine::Status;
using engine::testing::Rig;
using engine::testing::RigOptions;
using mem::KiB;
using mem::MiB;
using testing::http_get;
const auto parse = testing::parse_exposition;


const char* const kH2d = "u3m_link_bytes_total{card=\"0\",link=\"h2d\",from=\"host\",to=\"device\"}";

TEST(Metrics, ScrapedOverHttpWhileAnEngineMovesDataNamesPresentValuesMove) {
  Metrics metrics;
  const int port = metrics.serve(0);
  ASSERT_GT(port, 0);
  EXPECT_EQ(metrics.port(), port);
  std::map<std::string, double> first, last;
  int scrapes = 0;
  {
    RigOptions o;
    o.device = 512 * KiB;
    o.host = 1 * MiB;
    o.ssd = 16 * MiB;
    Rig rig(o);
    rig.engine->set_observer(&metrics, 0);
    std::atomic<bool> stop{false};
    std::atomic<int> rounds{0};
    std::thread work([&] {
      constexpr int kN = 24;  // 3 MiB through 1.5 MiB of memory tiers
      for (int i = 0; i < kN; ++i) {
        ASSERT_EQ(rig.engine->add(i, 128 * KiB), Status::ok);
        ASSERT_EQ(rig.write(i, 1), Status::ok);
      }
      while (!stop.load()) {
        for (int i = 0; i < kN; ++i) ASSERT_TRUE(rig.holds(i, 1));
        ++rounds;
      }
    });
    // Scrape while the work runs, until the h2d bytes moved between two
    // scrapes (bounded: the work moves ~3 MiB a round).
    for (int tries = 0; tries < 400; ++tries) {
      const std::string body = http_get(port);
      ASSERT_FALSE(body.empty()) << "no answer from 127.0.0.1:" << port;
      ++scrapes;
      last = parse(body);
      if (first.empty()) first = last;
      if (scrapes > 1 && last[kH2d] > first[kH2d] && rounds.load() > 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    stop = true;
    work.join();
  }
  ASSERT_GE(scrapes, 2);
  for (const char* name :
       {"u3m_tier_used_bytes{card=\"0\",tier=\"device\"}",
        "u3m_tier_used_bytes{card=\"0\",tier=\"ssd\"}",
        "u3m_tier_capacity_bytes{card=\"0\",tier=\"device\"}",
        "u3m_tier_hits_total{card=\"0\",tier=\"device\"}",
        "u3m_tier_misses_total{card=\"0\",tier=\"device\"}",
        "u3m_link_transfer_seconds_total{card=\"0\",link=\"d2h\",from=\"device\",to=\"host\"}",
        "u3m_ssd_written_bytes_total{card=\"0\"}", "u3m_evictions_total{card=\"0\"}",
        "u3m_acquire_stall_seconds_total{card=\"0\"}",
        "u3m_monitor_level{card=\"0\",tier=\"device\"}",
        "u3m_monitor_time_to_oom_seconds{card=\"0\",tier=\"host\"}", "u3m_op_stalls_total{card=\"0\"}"})
    EXPECT_TRUE(last.count(name)) << name;
  EXPECT_GT(last[kH2d], first[kH2d]);
  EXPECT_GT(last["u3m_tier_misses_total{card=\"0\",tier=\"device\"}"] +
                last["u3m_tier_hits_total{card=\"0\",tier=\"device\"}"],
            first["u3m_tier_misses_total{card=\"0\",tier=\"device\"}"] +
                first["u3m_tier_hits_total{card=\"0\",tier=\"device\"}"]);
  EXPECT_EQ(last["u3m_tier_capacity_bytes{card=\"0\",tier=\"device\"}"], 512.0 * 1024);
  // The engine is gone: its counters stay in the totals, never going back.
  const auto after = parse(http_get(port));
  EXPECT_GE(after.at(kH2d), last[kH2d]);
  EXPECT_GT(after.at("u3m_ssd_written_bytes_total{card=\"0\"}"), 0);
}

TEST(Metrics, DriverEventsAndKvAreCountedUnderVllmNames) {
  Metrics m;
  m.op(1, 0, 0, "matmul", {}, 1.0, 1.5);
  m.stall(1, 0, 1, 1.5, 1.75);
  m.op(1, 0, 1, "matmul", {}, 1.75, 2.0);
  m.step_end(1, 0, 2.0);
  m.set_kv(1, {.query_tokens = 300, .hit_tokens = 120, .usage = 0.25});
  const auto v = parse(m.text());
  EXPECT_EQ(v.at("u3m_ops_total{card=\"1\"}"), 2);
  EXPECT_EQ(v.at("u3m_op_seconds_total{card=\"1\"}"), 0.75);
  EXPECT_EQ(v.at("u3m_op_stalls_total{card=\"1\"}"), 1);
  EXPECT_EQ(v.at("u3m_op_stall_seconds_total{card=\"1\"}"), 0.25);
  EXPECT_EQ(v.at("u3m_steps_total{card=\"1\"}"), 1);
  EXPECT_EQ(v.at("u3m:prefix_cache_queries_total{card=\"1\"}"), 300);
  EXPECT_EQ(v.at("u3m:prefix_cache_hits_total{card=\"1\"}"), 120);
  EXPECT_EQ(v.at("u3m:kv_cache_usage_perc{card=\"1\"}"), 0.25);
  EXPECT_NE(m.text().find("# TYPE u3m:prefix_cache_hits_total counter"), std::string::npos);
}

TEST(Metrics, APortInUseOrOutOfRangeIsAnInputErrorNamingTheFlag) {
  Metrics a, b;
  const int port = a.serve(0);
  try {
    b.serve(port, "127.0.0.1", "--metrics-port");
    FAIL() << "a second server bound the same port";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--metrics-port"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Metrics().serve(70000), InputError);
  EXPECT_THROW(Metrics().serve(-1), InputError);
}

}  // namespace
}  // namespace u3m::observe
