// The KV block manager (src/kv/block_manager.cpp, docs/kv.md): geometry,
// block keys, prefix sharing against workload::PrefixCache, tiers and
// eviction policies, overcommit, the admission queue, the DRAM emergency,
// and a randomized run that checks every invariant and that no request is lost.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>

#include "u3m/kv/block_manager.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/analytic.hpp"
#include "u3m/workload/rag.hpp"
#include "u3m/workload/request_trace.hpp"

using namespace u3m;
using namespace u3m::kv;
using workload::PromptSegment;
using workload::ServeRequest;

namespace {

// 8 layers in 2 groups of 4; 4-token blocks; 16 B per token and layer.
KvGeometry tiny_geometry() {
  KvGeometry g;
  g.block_tokens = 4;
  g.layers = 8;
  g.layers_per_group = 4;
  g.bytes_per_token_layer = 16;
  g.linear_flops = 1000;
  g.attn_flops_per_ctx = 100;
  return g;
}

// HBM-only: the vLLM-like baseline (prefix caching, no lower tier).
KvConfig hbm_only(std::uint64_t device_slots) {
  KvConfig c;
  c.geometry = tiny_geometry();
  c.capacity_slots = {device_slots, 0, 0};
  c.home.assign(c.geometry.groups(), Tier::device);
  c.overcommit = 1.0;
  return c;
}

// The design's default placement: group 0 (layers 0-3) in HBM, group 1 in DRAM.
KvConfig tiered(std::uint64_t device, std::uint64_t host, std::uint64_t ssd) {
  KvConfig c;
  c.geometry = tiny_geometry();
  c.capacity_slots = {device, host, ssd};
  c.overcommit = 0;
  return c;
}

ServeRequest req(std::vector<PromptSegment> prompt, std::uint32_t out = 1) {
  ServeRequest r;
  r.output_tokens = out;
  r.prompt = std::move(prompt);
  return r;
}

// Finishes every request the manager admitted from its queue in `adm`.
void drain(BlockManager& m, std::vector<Admission> adm) {
  while (!adm.empty()) {
    const RequestId id = adm.back().id;
    adm.pop_back();
    auto more = m.finish(id);
    adm.insert(adm.end(), more.begin(), more.end());
  }
}

Admission run_once(BlockManager& m, RequestId id, const ServeRequest& r) {
  Admission a;
  EXPECT_EQ(m.submit(id, r, &a), SubmitResult::admitted) << "request " << id;
  drain(m, m.finish(id));
  m.check_invariants();
  return a;
}

}  // namespace

// ---------------------------------------------------------------- geometry and config

TEST(KvGeometry, FromModelsMatchesTheAnalyticKvBytes) {
  for (const char* name : {"llama2-13b", "llama3-8b"}) {
    const auto& m = workload::preset(name);
    const KvGeometry g = KvGeometry::of(m, 128);
    EXPECT_EQ(g.groups(), (m.layers + 3) / 4) << name;
    EXPECT_EQ(g.token_block_bytes(), workload::analytic::kv_bytes_per_token(m) * 128) << name;
    std::uint64_t sum = 0;
    for (std::uint32_t i = 0; i < g.groups(); ++i) sum += g.group_bytes(i);
    EXPECT_EQ(sum, g.token_block_bytes()) << name;
    EXPECT_EQ(g.slot_bytes(), g.group_bytes(0)) << name;
    // Attention makes a later block dearer to recompute.
    EXPECT_GT(g.recompute_flops(10), g.recompute_flops(0)) << name;
  }
  // llama2-13b: 2 (K,V) * 40 heads * 128 dims * 2 B = 20,480 B per token and layer.
  EXPECT_EQ(KvGeometry::of(workload::preset("llama2-13b"), 128).bytes_per_token_layer, 20480u);
}

TEST(KvGeometry, SmallerLastGroupKeepsAFullSlot) {
  KvGeometry g = tiny_geometry();
  g.layers = 10;  // groups of 4, 4, 2
  ASSERT_EQ(g.groups(), 3u);
  EXPECT_EQ(g.group_layers(2), 2u);
  EXPECT_EQ(g.group_bytes(2), g.slot_bytes() / 2);
}

TEST(KvConfig, DefaultHomesPutTheFirstFourLayersInHbm) {
  const KvGeometry g13 = KvGeometry::of(workload::preset("llama2-13b"), 128);
  auto h = KvConfig::default_homes(g13);
  ASSERT_EQ(h.size(), 10u);
  EXPECT_EQ(h[0], Tier::device);
  for (std::size_t i = 1; i < h.size(); ++i) EXPECT_EQ(h[i], Tier::host) << i;
  // Per-layer groups: layers 0-3 are four HBM groups.
  const KvGeometry per_layer = KvGeometry::of(workload::preset("llama3-8b"), 128, 1);
  h = KvConfig::default_homes(per_layer);
  EXPECT_EQ(std::count(h.begin(), h.end(), Tier::device), 4);
  EXPECT_EQ(h[3], Tier::device);
  EXPECT_EQ(h[4], Tier::host);
}

TEST(KvConfig, BadFieldsAreNamed) {
  auto expect_error = [](KvConfig c, const std::string& field) {
    try {
      BlockManager m(c);
      FAIL() << "accepted a bad " << field;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  KvConfig c = tiered(4, 4, 4);
  c.geometry.layers_per_group = 0;
  expect_error(c, "layers_per_group");
  c = tiered(4, 4, 4);
  c.home = {Tier::device, Tier::ssd};
  expect_error(c, "home[1]");
  c = tiered(4, 0, 4);  // group 1's home is DRAM, which has no capacity
  expect_error(c, "home[1]");
  c = tiered(0, 4, 4);
  expect_error(c, "capacity_slots[device]");
  c = tiered(4, 4, 4);
  c.emergency_low = 0.99;
  expect_error(c, "emergency_low");
  try {
    parse_eviction_policy("arc", "--kv-policy");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-policy"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("pgdsf"), std::string::npos);
  }
  for (auto p : {EvictionPolicy::lru, EvictionPolicy::lfu, EvictionPolicy::pgdsf})
    EXPECT_EQ(parse_eviction_policy(to_string(p), "x"), p);
}

// ---------------------------------------------------------------- block keys

TEST(BlockKeys, FollowTheSegmentChain) {
  const auto a = block_keys({{"sys", 8}, {"p1", 5}}, 4);
  const auto b = block_keys({{"sys", 8}, {"p1", 5}, {"q", 3}}, 4);
  const auto c = block_keys({{"sys", 8}, {"p2", 5}}, 4);
  ASSERT_EQ(a.size(), 3u);  // 13 tokens: 3 full blocks, the partial 4th has no key
  ASSERT_EQ(b.size(), 4u);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));  // same chain, same keys
  EXPECT_EQ(c[0], a[0]);
  EXPECT_EQ(c[1], a[1]);
  EXPECT_NE(c[2], a[2]);
  // KV depends on every earlier token: `sys` after `x` is not `sys` first.
  const auto d = block_keys({{"x", 4}, {"sys", 8}}, 4);
  EXPECT_NE(d[1], a[0]);
  EXPECT_NE(d[2], a[1]);
  // Two segments of 2 are not one segment of 4, nor is a boundary elsewhere.
  EXPECT_NE(block_keys({{"u", 2}, {"v", 2}}, 4)[0], block_keys({{"uv", 4}}, 4)[0]);
  EXPECT_NE(block_keys({{"u", 2}, {"v", 2}}, 4)[0], block_keys({{"u", 2}, {"w", 2}}, 4)[0]);
  EXPECT_TRUE(block_keys({{"s", 3}}, 4).empty());
}

TEST(PromptBlocks, BlendLayoutStartsEverySegmentOnABlock) {
  const std::vector<PromptSegment> p = {{"sys", 6}, {"p1", 5}, {"q", 3}};
  const PromptBlocks exact = prompt_blocks(p, 4, Reuse::exact);
  EXPECT_EQ(exact.keys, block_keys(p, 4));
  EXPECT_EQ(exact.start, (std::vector<std::uint32_t>{0, 4, 8}));
  EXPECT_EQ(exact.tail, 2u);          // 14 tokens: 3 full blocks and 2
  EXPECT_EQ(exact.blocks(3, 4), 5u);  // ceil(17 / 4)
  const PromptBlocks blend = prompt_blocks(p, 4, Reuse::blend);
  // sys: [0,4) [4,6); p1: [6,10) [10,11); q: [11,14) is the partial last block, private.
  EXPECT_EQ(blend.start, (std::vector<std::uint32_t>{0, 4, 6, 10}));
  EXPECT_EQ(blend.tokens, (std::vector<std::uint32_t>{4, 2, 4, 1}));
  EXPECT_EQ(blend.tail, 3u);
  EXPECT_EQ(blend.blocks(3, 4), 4u + 2u);  // 3 + 3 tokens in the private blocks
  // p1's blocks have one content wherever p1 sits, and chain keys that follow the context.
  const PromptBlocks moved = prompt_blocks({{"x", 4}, {"p1", 5}, {"q", 3}}, 4, Reuse::blend);
  EXPECT_EQ(moved.content[1], blend.content[2]);
  EXPECT_EQ(moved.content[2], blend.content[3]);
  EXPECT_NE(moved.keys[1], blend.keys[2]);
  const PromptBlocks same = prompt_blocks({{"sys", 6}, {"p1", 5}, {"r", 4}}, 4, Reuse::blend);
  EXPECT_EQ(same.keys[3], blend.keys[3]);  // same chain before it: the same key
  EXPECT_EQ(same.tail, 0u);                // r fills its block: shareable
  EXPECT_EQ(same.keys.size(), 5u);
}

// ---------------------------------------------------------------- prefix sharing

TEST(KvPrefix, BaselineRepeatedPromptHits) {
  BlockManager m(hbm_only(64));
  const ServeRequest r = req({{"sys", 8}, {"q", 6}}, 3);  // 14 tokens: 3 full blocks
  const Admission first = run_once(m, 1, r);
  EXPECT_EQ(first.hit_blocks, 0u);
  EXPECT_EQ(first.new_blocks, 3u);
  EXPECT_EQ(first.blocks, 5u);  // 17 tokens with the output
  EXPECT_EQ(m.cached_prefix_blocks(r), 3u);
  const Admission again = run_once(m, 2, r);
  EXPECT_EQ(again.hit_blocks, 3u);
  EXPECT_EQ(again.hit_tokens, 12u);
  EXPECT_EQ(again.hit_blocks_by_tier[0], 3u);
  EXPECT_EQ(again.new_blocks, 0u);
  EXPECT_EQ(m.stats().hit_tokens, 12u);
}

TEST(KvPrefix, RunningRequestsShareFullBlocksOnlyAndKeepTheirTailsPrivate) {
  BlockManager m(hbm_only(64));
  const ServeRequest r = req({{"sys", 8}, {"a", 3}}, 6);  // 11 prompt + 6 = 17 tokens
  Admission a1, a2;
  ASSERT_EQ(m.submit(1, r, &a1), SubmitResult::admitted);
  ASSERT_EQ(m.submit(2, r, &a2), SubmitResult::admitted);
  EXPECT_EQ(a1.prompt_full_blocks, 2u);
  EXPECT_EQ(a1.private_blocks, 3u);  // the partial block of `a` and the decode blocks
  EXPECT_EQ(a2.hit_blocks, 2u);
  const auto& t1 = m.table(1);
  const auto& t2 = m.table(2);
  ASSERT_EQ(t1.size(), 5u);
  ASSERT_EQ(t2.size(), 5u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(t1[i], t2[i]) << i;
  for (int i = 2; i < 5; ++i) EXPECT_NE(t1[i], t2[i]) << i;
  // 2 shared + 2 * 3 private token blocks, 2 groups each.
  EXPECT_EQ(m.use(Tier::device).used, (2u + 6u) * 2u);
  EXPECT_EQ(m.referenced_slots(), 16u);
  m.check_invariants();
  m.finish(1);
  EXPECT_EQ(m.use(Tier::device).used, (2u + 3u) * 2u);  // 1's private blocks are gone
  m.finish(2);
  EXPECT_EQ(m.use(Tier::device).used, 2u * 2u);  // the shared prefix stays cached
  EXPECT_EQ(m.cached_blocks(), 2u);
  m.check_invariants();
}

// Note [Block-granular vs segment-granular hits]: with nothing evicted the
// block hit tokens are B * floor(H / B) per request, H from PrefixCache.
void expect_agreement(const std::vector<ServeRequest>& rs, std::uint32_t bt,
                      bool segments_are_whole_blocks) {
  std::uint64_t slots = 0;
  for (const auto& r : rs) slots += (r.prompt_tokens() + r.output_tokens + bt - 1) / bt * 2;
  KvConfig c = hbm_only(slots);
  c.geometry.block_tokens = bt;
  BlockManager m(c);
  workload::PrefixCache ideal(std::nullopt);
  std::uint64_t block_hits = 0, seg_hits = 0;
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const std::uint64_t h = ideal.access(rs[i], workload::chain_keys(rs[i]));
    Admission a;
    ASSERT_EQ(m.submit(i, rs[i], &a), SubmitResult::admitted);
    ASSERT_EQ(a.hit_tokens, h / bt * bt) << "request " << i << " block " << bt;
    if (segments_are_whole_blocks) {
      ASSERT_EQ(a.hit_tokens, h) << "request " << i;
    }
    EXPECT_EQ(a.adopted_blocks, 0u);
    m.finish(i);
    block_hits += a.hit_tokens;
    seg_hits += h;
  }
  EXPECT_GT(block_hits, 0u);
  EXPECT_LE(block_hits, seg_hits);
  EXPECT_EQ(m.stats().dropped_blocks, 0u);  // truly unbounded
  m.check_invariants();
}

TEST(KvPrefix, UnboundedCacheAgreesWithPrefixCacheOnRag) {
  workload::RagConfig rc;
  rc.requests = 300;
  rc.corpus = 50;
  rc.turns = 3;
  rc.followup_prob = 0.5;
  const auto rs = workload::generate_rag(rc);
  for (std::uint32_t bt : {16u, 128u, 512u}) expect_agreement(rs, bt, false);
  // All segment lengths multiples of the block: the two agree exactly.
  rc.passage = workload::LengthDist::fixed_len(256);
  rc.question = workload::LengthDist::fixed_len(64);
  rc.output = workload::LengthDist::fixed_len(64);
  rc.turns = 1;
  expect_agreement(workload::generate_rag(rc), 64, true);
}

TEST(KvPrefix, UnboundedCacheAgreesWithPrefixCacheOnMooncakeAndHandmade) {
  const std::string dir = std::string(U3M_SOURCE_DIR) + "/data/requests/samples/";
  const auto mc = workload::load_requests(dir + "mooncake_conversation_head20.jsonl");
  expect_agreement(mc, 512, false);
  expect_agreement(mc, 128, false);
  expect_agreement(workload::load_requests(dir + "prefix_handmade.jsonl"), 10, true);
  expect_agreement(workload::load_requests(dir + "prefix_handmade.jsonl"), 16, false);
}

// ---------------------------------------------------------------- eviction

namespace {
// One-block prompts; each request adds one private decode block.
ServeRequest one_block(const std::string& id) {
  return req({{id, 4}}, 1);
}
}  // namespace

TEST(KvEviction, LruEvictsTheLeastRecentlyUsed) {
  BlockManager m(hbm_only(8));  // 4 token blocks
  run_once(m, 1, one_block("A"));
  run_once(m, 2, one_block("B"));
  run_once(m, 3, one_block("C"));
  run_once(m, 4, one_block("A"));
  run_once(m, 5, one_block("D"));  // needs 2 token blocks, 1 free: evicts B
  EXPECT_EQ(m.cached_prefix_blocks(one_block("B")), 0u);
  for (const char* k : {"A", "C", "D"}) EXPECT_EQ(m.cached_prefix_blocks(one_block(k)), 1u) << k;
  EXPECT_EQ(m.stats().dropped_blocks, 1u);
}

TEST(KvEviction, LfuResistsAScanAndStillAgesOut) {
  auto scan = [](BlockManager& m, RequestId& id, int n) {
    for (int i = 0; i < n; ++i, ++id) run_once(m, id, one_block("scan" + std::to_string(id)));
  };
  for (auto policy : {EvictionPolicy::lru, EvictionPolicy::lfu}) {
    KvConfig c = hbm_only(8);
    c.policy = policy;
    c.lfu_half_life = 20;
    BlockManager m(c);
    RequestId id = 1;
    for (int i = 0; i < 4; ++i) run_once(m, id++, one_block("hot"));
    scan(m, id, 10);  // ten one-off prompts through a 3-block cache
    const bool kept = m.cached_prefix_blocks(one_block("hot")) == 1;
    EXPECT_EQ(kept, policy == EvictionPolicy::lfu) << to_string(policy);
    // Used 4 times, the hot block outranks one-off blocks for log2(4) = 2
    // half-lives after its last use; beyond that it goes.
    scan(m, id, 60);
    EXPECT_EQ(m.cached_prefix_blocks(one_block("hot")), 0u) << to_string(policy);
  }
}

TEST(KvEviction, PgdsfKeepsTheBlocksDearestToRecompute) {
  // Y: a 3-block prompt (later blocks cost more attention), then X: 1 block.
  const ServeRequest y = req({{"y", 12}}, 1), x = one_block("x");
  for (auto policy : {EvictionPolicy::lru, EvictionPolicy::pgdsf}) {
    KvConfig c = hbm_only(12);  // 6 token blocks
    c.policy = policy;
    BlockManager m(c);
    run_once(m, 1, y);
    run_once(m, 2, x);
    run_once(m, 3, one_block("z"));  // needs 2, 2 free after y and x: no eviction yet
    EXPECT_EQ(m.stats().dropped_blocks, 0u);
    run_once(m, 4, one_block("w"));  // needs one block evicted
    EXPECT_EQ(m.stats().dropped_blocks, 1u);
    if (policy == EvictionPolicy::lru) {
      // Oldest is y; its deepest block goes first, the prefix stays.
      EXPECT_EQ(m.cached_prefix_blocks(y), 2u);
      EXPECT_EQ(m.cached_prefix_blocks(x), 1u);
    } else {
      // x (position 0) is the cheapest to recompute; y's chain takes its last
      // block's cost, z's too, but z and x tie on cost and x is older.
      EXPECT_EQ(m.cached_prefix_blocks(y), 3u);
      EXPECT_EQ(m.cached_prefix_blocks(x), 0u);
    }
    m.check_invariants();
  }
}

TEST(KvEviction, PinnedPrefixIsNeverEvicted) {
  KvConfig c = hbm_only(8);
  c.pin_budget_slots = 2;  // one token block
  BlockManager m(c);
  EXPECT_FALSE(m.pin_prefix({{"sys", 8}}));  // two blocks: over budget, nothing pinned
  ASSERT_TRUE(m.pin_prefix({{"sys", 4}}));
  run_once(m, 1, req({{"sys", 4}, {"q", 4}}, 1));  // creates the pinned block
  for (RequestId id = 2; id < 20; ++id) run_once(m, id, one_block("o" + std::to_string(id)));
  EXPECT_EQ(m.cached_prefix_blocks(one_block("sys")), 1u);
  EXPECT_EQ(m.use(Tier::device).locked, 2u);
  // 4 token blocks = 8 slots; with the pin budget reserved that can never run.
  EXPECT_EQ(m.submit(99, req({{"big", 12}}, 1)), SubmitResult::too_large);
  m.check_invariants();
}

// ---------------------------------------------------------------- tiers

TEST(KvTiers, DefaultPlacementSplitsLayerGroupsAndDemotesDownwards) {
  BlockManager m(tiered(2, 2, 2));
  Admission a;
  ASSERT_EQ(m.submit(1, one_block("A"), &a), SubmitResult::admitted);
  auto acts = m.take_actions();
  ASSERT_EQ(acts.size(), 4u);  // 2 token blocks x 2 groups
  for (const Action& x : acts) {
    EXPECT_EQ(x.kind, Action::Kind::allocate);
    EXPECT_EQ(x.to, (x.block % kMaxGroups) == 0 ? Tier::device : Tier::host);
    EXPECT_EQ(x.bytes, 4u * 16u * 4u);
  }
  auto by_group = m.slots_by_group(1);
  EXPECT_EQ(by_group[0][0], 2u);
  EXPECT_EQ(by_group[1][1], 2u);
  m.finish(1);
  m.take_actions();
  // B needs 2 slots in each memory tier: A's slots are demoted, HBM -> DRAM -> SSD.
  run_once(m, 2, one_block("B"));
  acts = m.take_actions();
  int moves = 0;
  for (const Action& x : acts)
    if (x.kind == Action::Kind::move) {
      ++moves;
      EXPECT_EQ(x.reason, Action::Reason::evict);
      EXPECT_EQ(static_cast<int>(x.to), static_cast<int>(x.from) + 1);
    }
  EXPECT_GE(moves, 2);
  EXPECT_EQ(m.stats().demoted_slots[0] + m.stats().demoted_slots[1], static_cast<unsigned>(moves));
  EXPECT_EQ(m.cached_prefix_blocks(one_block("A")), 1u);  // still cached, lower down
  m.check_invariants();
}

TEST(KvTiers, SsdHitIsPromotedBeforeUse) {
  BlockManager m(tiered(2, 2, 4));
  run_once(m, 1, one_block("A"));
  run_once(m, 2, one_block("B"));
  run_once(m, 3, one_block("C"));  // A ends up on SSD (both slots)
  m.take_actions();
  Admission a;
  ASSERT_EQ(m.submit(4, one_block("A"), &a), SubmitResult::admitted);
  EXPECT_EQ(a.hit_blocks, 1u);
  EXPECT_EQ(a.hit_blocks_by_tier[2], 1u);
  EXPECT_GE(a.promoted_slots, 1u);
  int promotions = 0;
  for (const Action& x : m.take_actions())
    if (x.reason == Action::Reason::promote) {
      ++promotions;
      EXPECT_EQ(x.from, Tier::ssd);
      EXPECT_NE(x.to, Tier::ssd);
    }
  EXPECT_EQ(promotions, static_cast<int>(a.promoted_slots));
  for (std::uint32_t g = 0; g < 2; ++g) EXPECT_NE(m.slot_tier(m.table(4)[0], g), Tier::ssd);
  m.check_invariants();
}

TEST(KvTiers, FullHomeTierFallsBackToTheOtherMemoryTier) {
  BlockManager m(tiered(6, 2, 0));  // DRAM holds one request's group-1 slots
  ASSERT_EQ(m.submit(1, one_block("A")), SubmitResult::admitted);
  ASSERT_EQ(m.submit(2, one_block("B")), SubmitResult::admitted);  // group 1 -> HBM
  auto g = m.slots_by_group(2);
  EXPECT_EQ(g[1][0], 2u);
  m.check_invariants();
}

// Note [Promoting DRAM hits]: every group's home in HBM, no overcommit cap.
namespace {
KvConfig hbm_homes(std::uint64_t device, std::uint64_t host, std::uint64_t ssd) {
  KvConfig c = tiered(device, host, ssd);
  c.home.assign(c.geometry.groups(), Tier::device);
  return c;
}
ServeRequest prompt_only(const std::string& id) {  // one cached block, no decode block
  return req({{id, 4}}, 0);
}
std::vector<Action> moves_of(const std::vector<Action>& acts) {
  std::vector<Action> out;
  for (const Action& x : acts)
    if (x.kind == Action::Kind::move) out.push_back(x);
  return out;
}
}  // namespace

TEST(KvTiers, DramHitIsPromotedIntoHbmWhenHbmHasRoom) {
  BlockManager m(hbm_homes(4, 8, 0));
  run_once(m, 1, one_block("A"));
  run_once(m, 2, one_block("B"));  // B's 4 slots push A's cached block down to DRAM
  ASSERT_EQ(m.use(Tier::host).used, 2u);
  m.take_actions();
  Admission a;
  ASSERT_EQ(m.submit(3, one_block("A"), &a), SubmitResult::admitted);
  EXPECT_EQ(a.hit_blocks, 1u);
  EXPECT_EQ(a.hit_blocks_by_tier[1], 1u);  // found in DRAM...
  EXPECT_EQ(a.promoted_host_slots, 2u);    // ...and both groups moved up
  EXPECT_EQ(a.promoted_slots, 0u);
  for (std::uint32_t g = 0; g < 2; ++g) EXPECT_EQ(m.slot_tier(m.table(3)[0], g), Tier::device);
  const auto by_group = m.slots_by_group(3);
  for (std::uint32_t g = 0; g < 2; ++g) EXPECT_EQ(by_group[g][0], 2u) << "group " << g;
  int promotions = 0;
  for (const Action& x : m.take_actions())
    if (x.reason == Action::Reason::promote) {
      ++promotions;
      EXPECT_EQ(x.from, Tier::host);
      EXPECT_EQ(x.to, Tier::device);
    }
  EXPECT_EQ(promotions, 2);
  EXPECT_EQ(m.stats().promoted_host_slots, 2u);
  m.check_invariants();
  // The private block evicted B's cold cached block to DRAM, not A's.
  EXPECT_EQ(m.use(Tier::host).used, 2u);
  drain(m, m.finish(3));
  m.check_invariants();
}

TEST(KvTiers, DramHitStaysInDramWhenHbmHoldsOnlyReferencedSlots) {
  BlockManager m(hbm_homes(4, 8, 0));
  run_once(m, 1, one_block("A"));
  run_once(m, 2, one_block("B"));                                  // A in DRAM, B cached in HBM
  ASSERT_EQ(m.submit(3, one_block("C")), SubmitResult::admitted);  // C fills HBM, B goes down
  ASSERT_EQ(m.use(Tier::device).locked, 4u);
  m.take_actions();
  Admission a;
  ASSERT_EQ(m.submit(4, one_block("A"), &a), SubmitResult::admitted);
  EXPECT_EQ(a.hit_blocks_by_tier[1], 1u);
  EXPECT_EQ(a.promoted_host_slots, 0u);
  for (std::uint32_t g = 0; g < 2; ++g) EXPECT_EQ(m.slot_tier(m.table(4)[0], g), Tier::host);
  for (const Action& x : m.take_actions()) {
    EXPECT_NE(x.reason, Action::Reason::promote);
    EXPECT_FALSE(x.kind == Action::Kind::move && x.from == Tier::device)
        << "a referenced HBM slot was displaced";
  }
  for (std::uint32_t g = 0; g < 2; ++g) EXPECT_EQ(m.slot_tier(m.table(3)[0], g), Tier::device);
  m.check_invariants();
  drain(m, m.finish(3));
  drain(m, m.finish(4));
  m.check_invariants();
}

TEST(KvTiers, HomeInDramIsNotPromoted) {
  BlockManager m(tiered(2, 8, 0));  // the design's homes: group 0 HBM, group 1 DRAM
  run_once(m, 1, prompt_only("A"));
  run_once(m, 2, prompt_only("B"));
  run_once(m, 3, prompt_only("C"));  // A's group 0 slot pushed down to DRAM
  ASSERT_EQ(m.use(Tier::host).used, 4u);
  Admission a;
  ASSERT_EQ(m.submit(4, prompt_only("A"), &a), SubmitResult::admitted);
  EXPECT_EQ(a.promoted_host_slots, 1u);  // group 0 only
  EXPECT_EQ(m.slot_tier(m.table(4)[0], 0), Tier::device);
  EXPECT_EQ(m.slot_tier(m.table(4)[0], 1), Tier::host);
  m.check_invariants();
}

TEST(KvTiers, PromotionCascadesHbmToDramToSsd) {
  BlockManager m(hbm_homes(2, 4, 8));  // HBM holds one token block, DRAM two
  run_once(m, 1, prompt_only("A"));
  run_once(m, 2, prompt_only("B"));
  run_once(m, 3, prompt_only("C"));  // HBM {C}, DRAM {A, B}: both full of cold cached blocks
  ASSERT_EQ(m.use(Tier::device).used, 2u);
  ASSERT_EQ(m.use(Tier::host).used, 4u);
  ASSERT_EQ(m.use(Tier::ssd).used, 0u);
  const KvStats before = m.stats();
  m.take_actions();
  Admission a;
  ASSERT_EQ(m.submit(4, prompt_only("A"), &a), SubmitResult::admitted);
  EXPECT_EQ(a.promoted_host_slots, 2u);
  // Group 0: B's slot (the LRU DRAM victim) down to SSD, C's down to DRAM, A's
  // up to HBM. That frees a DRAM slot, so group 1 needs no SSD write.
  const std::vector<Action> mv = moves_of(m.take_actions());
  ASSERT_EQ(mv.size(), 5u);
  struct Want {
    Action::Reason why;
    Tier from, to;
  };
  const Want want[] = {{Action::Reason::evict, Tier::host, Tier::ssd},
                       {Action::Reason::evict, Tier::device, Tier::host},
                       {Action::Reason::promote, Tier::host, Tier::device},
                       {Action::Reason::evict, Tier::device, Tier::host},
                       {Action::Reason::promote, Tier::host, Tier::device}};
  for (std::size_t i = 0; i < mv.size(); ++i) {
    EXPECT_EQ(mv[i].reason, want[i].why) << i;
    EXPECT_EQ(mv[i].from, want[i].from) << i;
    EXPECT_EQ(mv[i].to, want[i].to) << i;
  }
  const TokenBlockId a_tb = m.table(4)[0];
  EXPECT_EQ(mv[2].block, block_id(a_tb, 0));
  EXPECT_EQ(mv[4].block, block_id(a_tb, 1));
  EXPECT_EQ(mv[1].block / kMaxGroups, mv[3].block / kMaxGroups);  // C, both groups
  EXPECT_NE(mv[0].block / kMaxGroups, mv[1].block / kMaxGroups);  // B, not C
  EXPECT_EQ(m.stats().demoted_slots[0] - before.demoted_slots[0], 2u);
  EXPECT_EQ(m.stats().demoted_slots[1] - before.demoted_slots[1], 1u);
  EXPECT_EQ(m.use(Tier::device).used, 2u);
  EXPECT_EQ(m.use(Tier::host).used, 3u);
  EXPECT_EQ(m.use(Tier::ssd).used, 1u);
  m.check_invariants();
  drain(m, m.finish(4));
  for (const char* k : {"A", "B", "C"}) EXPECT_EQ(m.cached_prefix_blocks(prompt_only(k)), 1u) << k;
  m.check_invariants();
}

// Note [Promoting DRAM hits]: off, a DRAM hit is used where it rests.
TEST(KvTiers, PromotionCanBeTurnedOff) {
  KvConfig c = hbm_homes(4, 8, 0);
  c.promote_host_hits = false;
  BlockManager m(c);
  run_once(m, 1, one_block("A"));
  run_once(m, 2, one_block("B"));
  Admission a;
  ASSERT_EQ(m.submit(3, one_block("A"), &a), SubmitResult::admitted);
  EXPECT_EQ(a.promoted_host_slots, 0u);
  EXPECT_EQ(m.slot_tier(m.table(3)[0], 0), Tier::host);
  m.check_invariants();
}

// ---------------------------------------------------------------- overcommit and queue

// ---------------------------------------------------------------- segment reuse, SSD admission

TEST(KvBlend, PassageAfterAnotherContextIsCopiedFromItsSourceAndSourcesAreReleased) {
  KvConfig c = hbm_only(64);
  c.reuse = Reuse::blend;
  BlockManager m(c);
  // 1 caches sys, p1, p2; 2 has p2 before p1: sys hits exactly, p2 and p1 blend.
  run_once(m, 1, req({{"sys", 4}, {"p1", 4}, {"p2", 6}, {"q1", 2}}, 2));
  Admission a;
  ASSERT_EQ(m.submit(2, req({{"sys", 4}, {"p2", 6}, {"p1", 4}, {"q2", 2}}, 2), &a),
            SubmitResult::admitted);
  EXPECT_EQ(a.hit_blocks, 1u);
  EXPECT_EQ(a.hit_tokens, 4u);
  ASSERT_EQ(a.blends.size(), 3u);  // p2's two blocks and p1's
  EXPECT_EQ(a.blend_tokens, 10u);
  EXPECT_EQ(a.new_blocks, 3u);  // each blend is a block of its own, cached under its chain
  const auto& t = m.table(2);
  for (const auto& b : a.blends) EXPECT_NE(t[b.index], b.source);
  EXPECT_EQ(m.blend_sources(2).size(), 3u);
  m.check_invariants();
  // A source is referenced while the prefill reads it: not a victim.
  EXPECT_EQ(m.referenced_slots(), (1u + 3u + 1u + 3u) * 2u);  // sys, blends, q2 + out, sources
  m.prefilled(2);
  EXPECT_TRUE(m.blend_sources(2).empty());
  EXPECT_EQ(m.referenced_slots(), (1u + 3u + 1u) * 2u);
  m.check_invariants();
  m.finish(2);
  // A repeat of 2's prompt now hits all of it exactly: the blends were cached.
  const Admission again = run_once(m, 3, req({{"sys", 4}, {"p2", 6}, {"p1", 4}, {"q2", 2}}, 2));
  EXPECT_EQ(again.hit_blocks, 4u);
  EXPECT_EQ(again.hit_tokens, 14u);
  EXPECT_TRUE(again.blends.empty());
  EXPECT_EQ(m.stats().blend_blocks, 3u);
  EXPECT_EQ(m.stats().blend_tokens, 10u);
  // Exact reuse sees none of this: p2 first breaks the chain after sys.
  BlockManager e(hbm_only(64));
  run_once(e, 1, req({{"sys", 4}, {"p1", 4}, {"p2", 6}, {"q1", 2}}, 2));
  const Admission ex = run_once(e, 2, req({{"sys", 4}, {"p2", 6}, {"p1", 4}, {"q2", 2}}, 2));
  EXPECT_EQ(ex.hit_tokens, 4u);
  EXPECT_TRUE(ex.blends.empty());
}

// Note [Never lost] under blend: a prompt that fits only without its blends' sources and
// copies is admitted without them, not queued for ever.
TEST(KvBlend, RequestThatFitsOnlyWithoutItsBlendsIsAdmittedPlain) {
  KvConfig c = hbm_only(6);  // three token blocks of 2 groups
  c.reuse = Reuse::blend;
  BlockManager m(c);
  run_once(m, 1, req({{"p1", 4}, {"p2", 4}}, 0));  // p1, p2 cached
  Admission a;
  // x, p2, p1: with blends 3 new blocks + 2 sources (10 slots); plain, 3 blocks (6).
  ASSERT_EQ(m.submit(2, req({{"x", 4}, {"p2", 4}, {"p1", 4}}, 0), &a), SubmitResult::admitted);
  EXPECT_TRUE(a.blends.empty());
  EXPECT_EQ(a.new_blocks, 3u);
  m.check_invariants();
  drain(m, m.finish(2));
  m.check_invariants();
}

TEST(KvBlend, SourceOnSsdIsPromotedForTheCopy) {
  KvConfig c = hbm_homes(6, 0, 8);  // HBM: three token blocks of 2 groups; SSD behind
  c.reuse = Reuse::blend;
  BlockManager m(c);
  run_once(m, 1, prompt_only("p1"));
  run_once(m, 2, req({{"a", 4}, {"b", 4}, {"c", 4}}, 0));  // p1 goes down to SSD
  ASSERT_EQ(m.stats().demoted_slots[0], 2u);
  Admission a;
  ASSERT_EQ(m.submit(3, req({{"x", 4}, {"p1", 4}}, 0), &a), SubmitResult::admitted);
  ASSERT_EQ(a.blends.size(), 1u);
  EXPECT_EQ(a.promoted_slots, 2u);  // the source comes up: a copy reads memory
  m.take_actions();
  for (std::uint32_t g = 0; g < 2; ++g) EXPECT_EQ(m.slot_tier(a.blends[0].source, g), Tier::device);
  m.check_invariants();
  drain(m, m.finish(3));
  m.check_invariants();
}

TEST(KvSsdAdmission, VictimsSeenFewerTimesThanTheThresholdAreDroppedNotWritten) {
  for (std::uint32_t after : {0u, 2u}) {
    KvConfig c = hbm_homes(2, 0, 8);  // HBM holds one token block; SSD behind it
    c.ssd_admit_after = after;
    BlockManager m(c);
    run_once(m, 1, prompt_only("once"));
    run_once(m, 2, prompt_only("twice"));
    run_once(m, 3, prompt_only("twice"));  // "once" leaves HBM
    run_once(m, 4, prompt_only("other"));  // "twice" leaves HBM
    std::uint64_t written = 0;
    for (const Action& a : m.take_actions())
      written += a.kind == Action::Kind::move && a.to == Tier::ssd;
    if (after == 0) {
      EXPECT_EQ(written, 4u) << "every victim is written, both groups";
      EXPECT_EQ(m.stats().ssd_declined_slots, 0u);
    } else {
      EXPECT_EQ(written, 2u) << "only `twice` was seen twice";
      EXPECT_EQ(m.stats().ssd_declined_slots, 2u);
      EXPECT_EQ(m.cached_prefix_blocks(prompt_only("once")), 0u);
      EXPECT_EQ(m.cached_prefix_blocks(prompt_only("twice")), 1u);
    }
    m.check_invariants();
  }
}

// Note [Cache-aware admission]: requests whose prompt is cached go first, but nobody is passed
// over more than max_bypass times.
TEST(KvAdmission, CacheAwareQueueLetsHotRequestsPassAtMostMaxBypassTimes) {
  for (std::uint32_t max_bypass : {0u, 2u}) {
    KvConfig c = hbm_only(12);  // six token blocks
    c.max_bypass = max_bypass;
    c.min_queue = 8;  // room to wait for all four
    BlockManager m(c);
    ASSERT_EQ(m.submit(1, req({{"hot", 4}}, 16)), SubmitResult::admitted);  // 5 blocks
    ASSERT_EQ(m.submit(2, req({{"cold", 4}}, 4)), SubmitResult::queued);    // needs 2 new
    for (RequestId id = 3; id <= 5; ++id)  // `hot` cached: each needs one new block
      ASSERT_EQ(m.submit(id, req({{"hot", 4}}, 4)), SubmitResult::queued);
    std::vector<RequestId> order;
    auto note = [&](const std::vector<Admission>& adm) {
      for (const Admission& a : adm) order.push_back(a.id);
    };
    note(m.admit_waiting());
    if (max_bypass == 0) {
      EXPECT_TRUE(order.empty()) << "FIFO: the cold request blocks the queue";
      note(m.finish(1));
      ASSERT_GE(order.size(), 1u);
      EXPECT_EQ(order[0], 2u);
      continue;
    }
    ASSERT_EQ(order, (std::vector<RequestId>{3}));  // passes the cold request once
    note(m.finish(3));
    ASSERT_EQ(order, (std::vector<RequestId>{3, 4}));  // twice
    note(m.finish(4));
    EXPECT_EQ(order, (std::vector<RequestId>{3, 4})) << "a third pass would exceed the bound";
    note(m.finish(1));
    ASSERT_GE(order.size(), 3u);
    EXPECT_EQ(order[2], 2u) << "the cold request goes before the hot one behind it";
    m.check_invariants();
  }
}

TEST(KvAdmission, OvercommitCapsReferencedKvAtOneAndAHalfHbm) {
  KvConfig c = tiered(8, 100, 0);
  c.overcommit = 1.5;  // 12 referenced slots
  BlockManager m(c);
  EXPECT_EQ(m.overcommit_limit_slots(), 12u);
  for (RequestId id = 1; id <= 3; ++id)
    ASSERT_EQ(m.submit(id, one_block("r" + std::to_string(id))), SubmitResult::admitted);
  EXPECT_EQ(m.referenced_slots(), 12u);
  EXPECT_EQ(m.submit(4, one_block("r4")), SubmitResult::queued);  // DRAM has room; the cap binds
  auto adm = m.finish(1);
  ASSERT_EQ(adm.size(), 1u);
  EXPECT_EQ(adm[0].id, 4u);
  m.check_invariants();
  // Without the cap all fit in DRAM.
  c.overcommit = 0;
  BlockManager n(c);
  for (RequestId id = 1; id <= 10; ++id)
    EXPECT_EQ(n.submit(id, one_block("r" + std::to_string(id))), SubmitResult::admitted);
}

TEST(KvAdmission, BoundedQueueAdmitsInOrderAndRefusesWhenFull) {
  KvConfig c = tiered(4, 8, 0);
  c.overcommit = 0;
  c.expected_request_tokens = 8;  // 2 blocks x 2 groups = 4 slots per request
  BlockManager m(c);
  // Memory holds 12 slots: three 2-block requests.
  for (RequestId id = 1; id <= 3; ++id)
    ASSERT_EQ(m.submit(id, one_block("r" + std::to_string(id))), SubmitResult::admitted);
  // Group 1 takes 6 DRAM slots and group 0's overflow from HBM 2 more: DRAM
  // has no free slot, so the limit is the minimum, 1.
  EXPECT_EQ(m.use(Tier::host).locked, 8u);
  const std::uint64_t limit = m.queue_limit();
  EXPECT_EQ(limit, 1u);
  RequestId id = 4;
  for (std::uint64_t i = 0; i < limit; ++i, ++id)
    EXPECT_EQ(m.submit(id, one_block("r" + std::to_string(id))), SubmitResult::queued);
  EXPECT_EQ(m.submit(id, one_block("late")), SubmitResult::refused_queue_full);
  EXPECT_EQ(m.stats().refused_queue_full, 1u);
  // Finishing admits the queue in order.
  std::vector<RequestId> admitted;
  for (RequestId f = 1; f <= 3; ++f)
    for (const Admission& a : m.finish(f)) admitted.push_back(a.id);
  std::vector<RequestId> want;
  for (RequestId q = 4; q < id; ++q) want.push_back(q);
  EXPECT_EQ(admitted, want);
  EXPECT_EQ(m.queue_length(), 0u);
  // The refused request was not lost: the caller still has it and resubmits.
  EXPECT_EQ(m.submit(id, one_block("late")), SubmitResult::admitted);
  EXPECT_EQ(m.submit(1000, req({{"huge", 100}}, 1)), SubmitResult::too_large);
  m.check_invariants();
}

TEST(KvAdmission, QueueLimitIsFreeDramOverPerRequestKv) {
  KvConfig c = tiered(4, 40, 0);
  c.expected_request_tokens = 8;  // 4 slots
  BlockManager m(c);
  EXPECT_EQ(m.queue_limit(), 10u);                                      // 40 free DRAM slots / 4
  ASSERT_EQ(m.submit(1, req({{"a", 16}}, 4)), SubmitResult::admitted);  // 5 blocks: 10 slots
  // Mean of admitted requests: 10 slots; DRAM has 40 - 5 locked.
  EXPECT_EQ(m.queue_limit(), (40u - 5u) / 10u);
}

// ---------------------------------------------------------------- DRAM emergency

TEST(KvEmergency, AlertAndThrottledSpillToSsd) {
  KvConfig c = tiered(20, 40, 40);
  c.home.assign(2, Tier::host);  // everything in DRAM, so DRAM fills
  BlockManager m(c);
  std::vector<KvAlert> alerts;
  m.on_alert([&](const KvAlert& a) { alerts.push_back(a); });
  // Each request leaves 3 cached token blocks (6 DRAM slots) and needs 8 slots
  // while it runs. 40 slots: the 7th fills DRAM, and after it 38 stay (> 90%).
  RequestId id = 1;
  for (; !m.emergency() && id < 100; ++id)
    run_once(m, id, req({{"p" + std::to_string(id), 12}}, 1));
  ASSERT_TRUE(m.emergency());
  EXPECT_EQ(id, 8u);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_TRUE(alerts[0].emergency);
  EXPECT_GT(alerts[0].used * 100, alerts[0].capacity * 95);
  EXPECT_EQ(m.stats().alerts, 1u);
  m.take_actions();
  const std::uint64_t slot = c.geometry.group_bytes(0);
  EXPECT_EQ(m.spill(slot - 1), 0u);  // below one slot: nothing moves
  EXPECT_EQ(m.spill(slot), slot);    // exactly one slot
  auto acts = m.take_actions();
  ASSERT_EQ(acts.size(), 1u);
  EXPECT_EQ(acts[0].reason, Action::Reason::spill);
  EXPECT_EQ(acts[0].from, Tier::host);
  EXPECT_EQ(acts[0].to, Tier::ssd);
  // A large budget spills down to the 90% mark and no further; the alert clears.
  const std::uint64_t before = m.use(Tier::host).used;
  const std::uint64_t moved = m.spill(1ull << 30);
  const std::uint64_t after = m.use(Tier::host).used;
  EXPECT_FALSE(m.emergency());
  EXPECT_EQ(moved, (before - after) * slot);
  EXPECT_LE(after * 100, 40u * 90u);
  EXPECT_GT((after + 1) * 100, 40u * 90u);  // it stopped as soon as it reached 90%
  ASSERT_EQ(alerts.size(), 2u);
  EXPECT_FALSE(alerts[1].emergency);
  EXPECT_EQ(m.stats().spilled_bytes, slot + moved);
  EXPECT_EQ(m.spill(1ull << 30), 0u);  // no emergency, no spill
  m.check_invariants();
}

// ---------------------------------------------------------------- randomized

// Random submits and finishes through every policy; after each step every
// invariant holds, the driver's replay of the actions matches the manager's
// tiers, and at the end every request ran exactly once: none was lost.
TEST(KvProperty, RandomWorkloadLosesNoRequestAndKeepsEveryInvariant) {
  int lru_runs = 0;
  for (auto policy : {EvictionPolicy::lru, EvictionPolicy::lfu, EvictionPolicy::pgdsf,
                      EvictionPolicy::lru, EvictionPolicy::lru}) {
    KvConfig c = tiered(12, 24, 30);
    // The second lru run has every home in HBM: DRAM hits are promoted. The third also
    // blends segments and filters SSD writes (Note [Segment reuse], Note [SSD admission]).
    const int lru_run = policy == EvictionPolicy::lru ? ++lru_runs : 0;
    const bool hbm_home = lru_run >= 2, blend = lru_run == 3;
    if (hbm_home) c.home.assign(c.geometry.groups(), Tier::device);
    if (blend) {
      c.reuse = Reuse::blend;
      c.ssd_admit_after = 2;
    }
    c.policy = policy;
    c.overcommit = 1.5;
    c.pin_budget_slots = 2;
    c.lfu_half_life = 8;
    BlockManager m(c);
    ASSERT_TRUE(m.pin_prefix({{"sys", 4}}));
    std::mt19937_64 rng(7 + static_cast<int>(policy));
    auto pick = [&](std::uint64_t n) {
      return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng);
    };
    std::map<BlockId, Tier> model;  // the driver's view, from the actions alone
    std::set<RequestId> running, finished, waiting_caller;
    std::map<RequestId, ServeRequest> reqs;
    auto make = [&](RequestId id) {
      std::vector<PromptSegment> p;
      if (pick(2)) p.push_back({"sys", 4});
      const int n = 1 + static_cast<int>(pick(3));
      for (int i = 0; i < n; ++i) p.push_back({"d" + std::to_string(pick(6)), 3});
      if (pick(2)) p.push_back({"q" + std::to_string(id), 1 + static_cast<std::uint32_t>(pick(4))});
      return req(p, 1 + static_cast<std::uint32_t>(pick(6)));
    };
    auto apply = [&](const std::vector<Action>& acts) {
      for (const Action& a : acts) {
        switch (a.kind) {
          case Action::Kind::allocate:
            ASSERT_FALSE(model.contains(a.block));
            model[a.block] = a.to;
            break;
          case Action::Kind::move:
            ASSERT_EQ(model.at(a.block), a.from);
            model[a.block] = a.to;
            break;
          case Action::Kind::free:
            ASSERT_EQ(model.at(a.block), a.from);
            model.erase(a.block);
            break;
        }
      }
    };
    auto check = [&] {
      m.check_invariants();
      apply(m.take_actions());
      std::array<std::uint64_t, kTiers> per{};
      for (const auto& [b, t] : model) ++per[static_cast<int>(t)];
      for (int t = 0; t < kTiers; ++t) ASSERT_EQ(per[t], m.use(static_cast<Tier>(t)).used);
      for (RequestId r : running) {
        for (TokenBlockId tb : m.table(r))
          for (std::uint32_t g = 0; g < 2; ++g)
            ASSERT_EQ(model.at(block_id(tb, g)), m.slot_tier(tb, g));
        for (TokenBlockId tb : m.blend_sources(r))  // a source is read: in memory
          for (std::uint32_t g = 0; g < 2; ++g) {
            ASSERT_EQ(model.at(block_id(tb, g)), m.slot_tier(tb, g));
            ASSERT_NE(m.slot_tier(tb, g), Tier::ssd);
          }
      }
    };
    auto admitted = [&](const std::vector<Admission>& adm) {
      for (const Admission& a : adm) ASSERT_TRUE(running.insert(a.id).second);
    };
    RequestId next = 1;
    std::uint64_t too_large = 0;
    for (int step = 0; step < 1500; ++step) {
      const bool submit = running.empty() || pick(100) < 55;
      if (submit) {
        RequestId id;
        if (!waiting_caller.empty() && pick(2)) {
          id = *waiting_caller.begin();  // the caller retries a refused request
          waiting_caller.erase(id);
        } else {
          id = next++;
          reqs[id] = make(id);
        }
        Admission a;
        switch (m.submit(id, reqs[id], &a)) {
          case SubmitResult::admitted:
            admitted({a});
            break;
          case SubmitResult::queued:
            break;
          case SubmitResult::refused_queue_full:
            waiting_caller.insert(id);
            break;
          case SubmitResult::too_large:
            ++too_large;
            reqs.erase(id);
            break;
          case SubmitResult::aborted:
            ADD_FAILURE() << "request " << id << " aborted, with every action completed ok";
            break;
        }
      } else {
        auto it = running.begin();
        std::advance(it, static_cast<long>(pick(running.size())));
        const RequestId id = *it;
        if (blend && pick(2)) {
          m.prefilled(id);  // its prefill is done; it runs on
          EXPECT_TRUE(m.blend_sources(id).empty());
        } else {
          running.erase(it);
          finished.insert(id);
          admitted(m.finish(id));
        }
      }
      if (m.emergency()) m.spill(c.geometry.slot_bytes() * 2);
      check();
    }
    // Drain: finish everything, retry every refused request.
    while (!running.empty() || !waiting_caller.empty() || m.queue_length() > 0) {
      if (!running.empty()) {
        const RequestId id = *running.begin();
        running.erase(running.begin());
        finished.insert(id);
        admitted(m.finish(id));
      } else {
        const RequestId id = *waiting_caller.begin();
        waiting_caller.erase(waiting_caller.begin());
        Admission a;
        const SubmitResult s = m.submit(id, reqs[id], &a);
        ASSERT_NE(s, SubmitResult::too_large);
        if (s == SubmitResult::admitted) admitted({a});
        if (s == SubmitResult::refused_queue_full) waiting_caller.insert(id);
      }
      check();
    }
    EXPECT_EQ(finished.size(), reqs.size()) << to_string(policy);
    EXPECT_EQ(m.stats().finished, reqs.size());
    EXPECT_EQ(too_large, 0u);
    EXPECT_GT(m.stats().queued, 0u) << "the run never exercised the queue";
    EXPECT_GT(m.stats().hit_blocks, 0u);
    EXPECT_GT(m.stats().dropped_blocks + m.stats().demoted_slots[0], 0u);
    EXPECT_EQ(m.referenced_slots(), 0u);
    if (blend) {
      EXPECT_GT(m.stats().blend_blocks, 0u) << "no segment was blended";
      EXPECT_GT(m.stats().ssd_declined_slots, 0u) << "the SSD filter never declined a victim";
    }
    if (hbm_home) {
      EXPECT_GT(m.stats().promoted_host_slots, 0u) << "no DRAM hit was promoted";
    }
  }
}

// ---------------------------------------------------------------- two-phase actions

namespace {

// A driver of the two-phase protocol (Note [Two-phase actions]): it starts prepared actions
// in a random order that `after` allows, completes them later, fails a share of them, and
// keeps a physical model of the slots. A take occupies its destination from its start, a
// leave frees its source at completion: the model must never hold more than a tier has.
struct TwoPhaseDriver {
  TwoPhaseDriver(BlockManager& manager, std::uint64_t seed, double p)
      : m(manager), rng(seed), fail_p(p) {}
  BlockManager& m;
  std::mt19937_64 rng;
  double fail_p;
  std::map<std::uint64_t, Action> pending;  // prepared, by seq
  std::set<std::uint64_t> started;
  std::map<BlockId, Tier> phys;  // where each slot's data is
  std::array<std::uint64_t, kTiers> occ{};
  std::uint64_t failed = 0, lost = 0, cancelled = 0, max_pending = 0;

  std::uint64_t pick(std::uint64_t n) {
    return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng);
  }
  void take() {
    for (const Action& a : m.take_prepared()) pending.emplace(a.seq, a);
    max_pending = std::max<std::uint64_t>(max_pending, pending.size());
  }
  bool ready(const Action& a) const {
    return std::none_of(a.after.begin(), a.after.end(),
                        [&](std::uint64_t d) { return d && pending.contains(d); });
  }
  bool pending_on(BlockId b) const {
    return std::any_of(pending.begin(), pending.end(),
                       [&](const auto& p) { return p.second.block == b; });
  }
  // One random start or completion; false if nothing could move.
  bool step() {
    std::vector<std::uint64_t> can_start, can_finish(started.begin(), started.end());
    for (const auto& [seq, a] : pending)
      if (!started.contains(seq) && ready(a)) can_start.push_back(seq);
    if (can_start.empty() && can_finish.empty()) return false;
    const bool do_start = !can_start.empty() && (can_finish.empty() || pick(2));
    if (do_start) {
      const std::uint64_t seq = can_start[pick(can_start.size())];
      const Action& a = pending.at(seq);
      if (a.kind == Action::Kind::move) {
        EXPECT_EQ(phys.at(a.block), a.from) << "seq " << seq;
      }
      if (a.kind != Action::Kind::free) {
        const int t = static_cast<int>(a.to);
        EXPECT_LT(occ[t], m.use(a.to).capacity) << "a take started into a full tier " << t;
        ++occ[t];
      }
      started.insert(seq);
      return true;
    }
    const std::uint64_t seq = can_finish[pick(can_finish.size())];
    const Action a = pending.at(seq);
    started.erase(seq);
    pending.erase(seq);
    Outcome o = Outcome::ok;
    if (a.kind != Action::Kind::free && pick(1000) < fail_p * 1000)
      o = a.kind == Action::Kind::move && a.from == Tier::ssd && pick(2) ? Outcome::lost
                                                                          : Outcome::failed;
    if (o == Outcome::ok) {
      if (a.kind == Action::Kind::free) {
        if (phys.contains(a.block)) {
          --occ[static_cast<int>(phys.at(a.block))];
          phys.erase(a.block);
        }
      } else {
        if (a.kind == Action::Kind::move) --occ[static_cast<int>(a.from)];
        phys[a.block] = a.to;
      }
    } else {
      ++(o == Outcome::lost ? lost : failed);
      --occ[static_cast<int>(a.to)];
    }
    for (std::uint64_t c : m.complete(seq, o)) {
      EXPECT_FALSE(started.contains(c)) << "cancelled after it started: " << c;
      EXPECT_TRUE(pending.erase(c)) << "cancelled twice or unknown: " << c;
      ++cancelled;
    }
    m.check_invariants();
    return true;
  }
  void run_until(const std::function<bool()>& done) {
    while (!done()) ASSERT_TRUE(step()) << "stuck with " << pending.size() << " pending";
  }
  // After every manager call: the admission-critical actions complete, then settle().
  std::vector<RequestId> settle(bool drain_all) {
    take();
    run_until([&] {
      return std::none_of(pending.begin(), pending.end(),
                          [](const auto& p) { return admission_critical(p.second); });
    });
    std::vector<RequestId> refused = m.settle();
    take();
    if (drain_all)
      run_until([&] { return pending.empty(); });
    else
      for (std::uint64_t n = pick(8); n > 0 && step(); --n) {
      }
    check();
    return refused;
  }
  // Every settled slot is where the manager says; with nothing pending, the counts agree.
  void check() {
    m.check_invariants();
    for (const auto& [b, t] : phys)
      if (!pending_on(b)) {
        ASSERT_EQ(m.slot_tier(b / kMaxGroups, b % kMaxGroups), t) << b;
      }
    if (!pending.empty()) return;
    for (int t = 0; t < kTiers; ++t) ASSERT_EQ(occ[t], m.use(static_cast<Tier>(t)).used) << t;
  }
};

}  // namespace

// Note [Two-phase actions]: random submits, finishes and spills; the driver fails 4% or 12%
// of the allocations and moves (half of the failed promotions from SSD as lost data) and
// completes the rest in random orders, leaving background work pending across calls in half
// the runs. Every invariant holds after every completion, no take ever finds its tier full,
// the manager and the driver agree on every settled slot, and every request runs exactly once:
// aborted ones are submitted again, rolled-back queued ones admitted later.
TEST(KvTwoPhase, RandomFailuresRollBackAndLoseNoRequest) {
  for (int seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    KvConfig c = tiered(10, 14, 24);
    c.policy = seed % 3 == 0 ? EvictionPolicy::pgdsf : EvictionPolicy::lru;
    if (seed % 2) c.home.assign(c.geometry.groups(), Tier::device);  // DRAM hits promoted
    c.overcommit = 1.5;
    c.pin_budget_slots = 2;
    BlockManager m(c);
    ASSERT_TRUE(m.pin_prefix({{"sys", 4}}));
    TwoPhaseDriver d(m, static_cast<std::uint64_t>(seed), seed % 2 ? 0.04 : 0.12);
    const bool drain_all = seed > 3;
    std::set<RequestId> running, retry;
    std::map<RequestId, int> runs;
    std::map<RequestId, ServeRequest> reqs;
    auto admitted = [&](const std::vector<Admission>& adm) {
      for (const Admission& a : adm)
        if (m.running(a.id)) {
          ASSERT_TRUE(running.insert(a.id).second);
        }
    };
    RequestId next = 1;
    const RequestId total = 250;
    for (int guard = 0; next <= total || !running.empty() || !retry.empty() || m.queue_length();
         ++guard) {
      ASSERT_LT(guard, 20'000);
      const std::uint64_t r = d.pick(100);
      if (r < 45 && (next <= total || !retry.empty())) {
        RequestId id;
        if (!retry.empty() && (next > total || d.pick(2))) {
          id = *retry.begin();
          retry.erase(retry.begin());
        } else {
          id = next++;
          std::vector<PromptSegment> p;
          if (d.pick(2)) p.push_back({"sys", 4});
          for (int i = 0, n = 1 + static_cast<int>(d.pick(3)); i < n; ++i)
            p.push_back({"d" + std::to_string(d.pick(8)), 4});
          p.push_back({"q" + std::to_string(id), 1 + static_cast<std::uint32_t>(d.pick(4))});
          reqs[id] = req(p, 1 + static_cast<std::uint32_t>(d.pick(6)));
        }
        Admission a;
        const SubmitResult s = m.submit(id, reqs.at(id), &a);
        ASSERT_NE(s, SubmitResult::too_large);
        const std::vector<RequestId> refused = d.settle(drain_all);
        if (s == SubmitResult::admitted && m.running(id)) admitted({a});
        if (s == SubmitResult::refused_queue_full || std::count(refused.begin(), refused.end(), id))
          retry.insert(id);
      } else if (r < 85 && !running.empty()) {
        auto it = running.begin();
        std::advance(it, static_cast<long>(d.pick(running.size())));
        const RequestId id = *it;
        running.erase(it);
        ++runs[id];
        const std::vector<Admission> adm = m.finish(id);
        ASSERT_TRUE(d.settle(drain_all).empty()) << "queued admissions are requeued, not refused";
        admitted(adm);
      } else if (r < 92 && m.emergency()) {
        m.spill(c.geometry.slot_bytes() * (1 + d.pick(3)));
        d.settle(drain_all);
      } else if (running.empty() && m.queue_length()) {
        const std::vector<Admission> adm = m.admit_waiting();
        d.settle(drain_all);
        admitted(adm);
      }
      for (RequestId id : running)  // an admitted request holds all its slots in memory
        for (TokenBlockId tb : m.table(id))
          for (std::uint32_t g = 0; g < 2; ++g) ASSERT_NE(m.slot_tier(tb, g), Tier::ssd);
      if (::testing::Test::HasFatalFailure()) return;
    }
    d.run_until([&] { return d.pending.empty(); });
    d.check();
    ASSERT_EQ(runs.size(), reqs.size());
    for (const auto& [id, n] : runs) ASSERT_EQ(n, 1) << "request " << id;
    const KvStats& s = m.stats();
    EXPECT_EQ(s.admitted, s.finished) << "the admission counters were not taken back";
    EXPECT_EQ(s.failed_actions, d.failed + d.lost);
    EXPECT_GT(d.failed, 50u);
    EXPECT_GT(d.cancelled, 0u);
    EXPECT_GT(s.aborted_admissions, 0u);
    EXPECT_GT(s.damaged_blocks, 0u);
    EXPECT_GT(d.max_pending, 4u);
    EXPECT_EQ(m.referenced_slots(), 0u);
  }
}
