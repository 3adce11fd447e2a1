// The run config (include/u3m/config/run_config.hpp): every key read, every
// defect refused with the file, the line and the key (Note [Strict config]).
#include <string>

#include <gtest/gtest.h>

#include "u3m/config/run_config.hpp"
#include "u3m/util/error.hpp"

namespace u3m::config {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_run_config(text, "cfg.toml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_REFUSED(text, needle)                                      \
  do {                                                                    \
    const std::string err = error_of(text);                               \
    EXPECT_NE(err.find(needle), std::string::npos) << "error: " << err;   \
  } while (0)

TEST(RunConfig, ExampleFileParsesWithEveryValue) {
  const RunConfig c = load_run_config(U3M_SOURCE_DIR "/examples/u3m.toml");
  EXPECT_EQ(c.hw, "ascend-910b-32g");
  EXPECT_EQ(c.device.fraction, 0.5);
  EXPECT_FALSE(c.device.budget);
  EXPECT_EQ(c.device.high_watermark, 0.90);
  EXPECT_EQ(c.device.low_watermark, 0.80);
  EXPECT_EQ(c.host.budget, 64ull << 30);
  EXPECT_EQ(c.ssd.dir, "/tmp");
  EXPECT_EQ(c.ssd.size, 4ull << 30);
  EXPECT_EQ(c.ssd.endurance_dwpd, 1.0);
  EXPECT_EQ(c.links.h2d_gbps, 0.0);
  EXPECT_EQ(c.pool, "expandable_segments:true");
  EXPECT_EQ(c.policy.tiering, "u3m");
  EXPECT_EQ(c.policy.host_optimizer, false);
  EXPECT_EQ(c.prefetch.lookahead, 4u);
  EXPECT_EQ(c.prefetch.mode, "fixed");
  EXPECT_EQ(c.predictor.name, "u3m");
  EXPECT_EQ(c.predictor.horizon, 64u);
  EXPECT_EQ(c.kv.policy, "u3m-tiered");
  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j["tiers"]["host"]["budget"], 64ull << 30);
  EXPECT_EQ(j["policy"]["tiering"], "u3m");
  EXPECT_FALSE(j["tiers"]["device"].contains("budget"));
}

TEST(RunConfig, EmptyFileSetsNothing) {
  const RunConfig c = parse_run_config("", "empty.toml");
  EXPECT_FALSE(c.hw || c.device.budget || c.policy.tiering || c.kv.policy);
  EXPECT_TRUE(c.to_json().empty());
  EXPECT_EQ(c.source, "empty.toml");
}

TEST(RunConfig, SizesAsIntegersOrText) {
  EXPECT_EQ(parse_run_config("[tiers.device]\nbudget = 4096\n", "c").device.budget, 4096u);
  EXPECT_EQ(parse_run_config("[tiers.device]\nbudget = \"512M\"\n", "c").device.budget,
            512ull << 20);
  EXPECT_REFUSED("[tiers.device]\nbudget = \"lots\"\n", "cfg.toml:2: 'tiers.device.budget'");
  EXPECT_REFUSED("[tiers.device]\nbudget = 0\n", "cfg.toml:2: 'tiers.device.budget' is 0");
  EXPECT_REFUSED("[tiers.device]\nbudget = 1.5\n", "must be a size");
}

TEST(RunConfig, UnknownKeysAreErrorsNamingThem) {
  EXPECT_REFUSED("[tier]\n", "cfg.toml:1: unknown key 'tier' in the top level");
  EXPECT_REFUSED("[tiers.device]\nhigh_watermak = 0.9\n",
                 "cfg.toml:2: unknown key 'high_watermak' in [tiers.device]");
  EXPECT_REFUSED("[tiers.host]\nfraction = 0.5\n", "unknown key 'fraction' in [tiers.host]");
  EXPECT_REFUSED("[tiers.nvme]\n", "unknown key 'nvme' in [tiers]");
  EXPECT_REFUSED("\n\n[kv]\npolicy = \"u3m\"\nblock = 16\n", "cfg.toml:5: unknown key 'block'");
}

TEST(RunConfig, WrongTypesAndRangesAreRefused) {
  EXPECT_REFUSED("policy = 3\n", "'policy' must be a table");
  EXPECT_REFUSED("[policy]\nhost_optimizer = \"yes\"\n", "must be true or false");
  EXPECT_REFUSED("[tiers.device]\nhigh_watermark = 1.5\n", "must be in (0, 1]");
  EXPECT_REFUSED("[tiers.device]\nfraction = 0\n", "must be in (0, 1]");
  EXPECT_REFUSED("[tiers.host]\nhigh_watermark = 0.7\nlow_watermark = 0.8\n",
                 "cfg.toml:3: 'tiers.host.low_watermark' (0.8) must not be above");
  EXPECT_REFUSED("[tiers.device]\nbudget = 64\nfraction = 0.5\n", "both set");
  EXPECT_REFUSED("[links]\nh2d_gbps = -1\n", "'links.h2d_gbps' is -1");
  EXPECT_REFUSED("[predictor]\nhorizon = 0\n", "'predictor.horizon' is 0");
  EXPECT_REFUSED("[prefetch]\nlookahead = 1.5\n", "must be a whole number");
  EXPECT_REFUSED("[policy]\ntiering = \"\"\n", "must not be empty");
}

TEST(RunConfig, NamesAreCheckedByTheirRegistries) {
  EXPECT_REFUSED("[policy]\ntiering = \"fifo\"\n", "cfg.toml:2: 'policy.tiering'");
  EXPECT_REFUSED("[predictor]\nname = \"psychic\"\n", "'predictor.name' is 'psychic'");
  EXPECT_REFUSED("[kv]\npolicy = \"vllm\"\n", "'kv.policy' is 'vllm'; expected one of");
  EXPECT_REFUSED("[kv]\neviction = \"lru\"\n", "unknown key 'eviction' in [kv]");
  EXPECT_REFUSED("[prefetch]\nmode = \"eager\"\n", "expected one of fixed, link");
  EXPECT_REFUSED("[profile]\nhw = \"no-such-card\"\n", "cfg.toml:2: 'profile.hw'");
  EXPECT_REFUSED("[pool]\nconfig = \"max_split:7\"\n", "'pool.config'");
  EXPECT_REFUSED("[tiers.ssd]\ndir = \"/tmp\"\nfaults = \"gremlins=1\"\n", "'tiers.ssd.faults'");
  EXPECT_REFUSED("[tiers.ssd]\nfaults = \"lost_write=0.1\"\n", "needs an SSD tier");
  // An old predictor name is read as what it stands for.
  EXPECT_EQ(parse_run_config("[predictor]\nname = \"u3m-seq\"\n", "c").predictor.name, "u3m");
}

TEST(RunConfig, SyntaxAndFileErrorsNameThePlace) {
  EXPECT_REFUSED("[policy\n", "cfg.toml:1: TOML syntax");
  EXPECT_REFUSED("a = 1\na = 2\n", "cfg.toml:2");
  EXPECT_REFUSED(std::string("[kv]\npolicy = \"u3m\x01\"\n"), "cfg.toml:2: control character");
  EXPECT_THROW(load_run_config("/no/such/u3m.toml"), InputError);
}

}  // namespace
}  // namespace u3m::config
