#include "u3m/kv/block_manager.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "u3m/util/error.hpp"
#include "u3m/workload/analytic.hpp"

namespace u3m::kv {

// Note [Block = layer group x token block]
// A physical block holds the K and V of `block_tokens` tokens for one group of
// `layers_per_group` consecutive layers (default 4), not for all layers. The
// design's default placement ("the first 4 layers' KV in HBM, the rest in
// DRAM") is then just a home tier per group, layer-wise prefetch moves one
// group ahead of compute, and a request can sit partly in HBM and partly in
// DRAM. All slots have one size (a full group), so each tier is a pool of
// interchangeable slots counted in blocks, as in vLLM; a smaller last group
// wastes the rest of its slot (none for the presets: 40 and 32 layers). A
// token block is shared, cached, pinned and dropped as a whole (a prefix hit
// needs every layer); its group slots are placed and moved one by one.
//
// Note [Block keys]
// Full block i covers prompt tokens [i*B, (i+1)*B). Its content id lists the
// pieces of segments covering it: (segment id, offset in the segment, length).
// key(i) = xxh64(content id, seed = key(i-1)), key(-1) = 0. Equal ids mean
// equal content (docs/requests.md), so two prompts get the same key for block
// i exactly when their first (i+1)*B tokens come from the same segment chain:
// sharing follows the chain, like workload::chain_keys, at block granularity.
// Only full blocks are shareable; the partial last block and decode blocks are
// private to the request and freed when it finishes.
//
// Note [Block-granular vs segment-granular hits]
// With nothing evicted, a request's block hit tokens are exactly
// B * floor(H / B), where H is the hit tokens of workload::PrefixCache
// (unbounded) on the same requests in the same order. Proof sketch: H covers
// segments 0..j; an earlier prompt held those segments, so every block inside
// [0, H) was full in it and has our key: hit >= B*floor(H/B). A block hit on
// [a, a+B) means an earlier prompt had the segments covering [0, a+B), so
// segment j' holding token a+B-1 had a resident chain key and H >= a+B: hit
// <= H, and hits are multiples of B. Tested on RAG and Mooncake requests.
//
// Note [Eviction order]
// Only cached blocks that no running request references and that are not
// pinned are victims; each tier keeps its own ordered set of such slots.
// Each policy gives a priority when a request touches a block (at admission);
// lower goes first:
//   lru    the admission tick;
//   lfu    LFU with exponential aging (LRFU, Lee et al. 2001): each use adds
//          1 to a count that halves every `lfu_half_life` admissions; the
//          priority log2(count) + tick / half_life orders blocks by their
//          decayed counts and never needs re-sorting. A block used f times
//          outlives one-off scan blocks for log2(f) half-lives after its last
//          use: scan-resistant, yet old favourites age out;
//   pgdsf  RAGCache's PGDSF: clock + frequency * cost / size, cost = FLOPs to
//          recompute the block (attention grows with its position), size =
//          the token block's bytes.
// A prefix then takes the highest priority of the extensions touched with it
// (a block never ranks below its suffix) and ties go deepest first, so a
// prefix always outlives its extensions: dropping a prefix would strand its
// children, which no lookup reaches. This is RAGCache's "evict leaves only",
// without a tree: an expensive deep chain also protects its cheap prefix.
// PGDSF's clock advances only when a block leaves the cache (a drop), not on
// a demotion, so with one tier it is exactly GDSF.
//
// Note [Tiers and moves]
// Victims leave a tier downwards: HBM -> DRAM -> SSD -> dropped (a tier with
// no capacity is skipped). Making room below may cascade, at most two levels.
// Blocks a running request references never rest on SSD: an SSD hit is
// promoted to a memory tier at admission (compute reads HBM or DRAM, with
// DRAM blocks streamed layer group by layer group). New slots go to the
// group's home tier, else to the other memory tier (HBM first).
//
// Note [Overcommit]
// "Logical KV up to 1.5x HBM" is, precisely: the slots of token blocks that
// running requests reference (prompt and every decode block they will write,
// reserved at admission; a shared block counted once; cached unreferenced and
// pinned-only blocks excluded, being reclaimable or bounded separately) stay
// <= overcommit * HBM capacity in slots. Physically they must also fit HBM +
// DRAM. With overcommit = 1 and no DRAM this is the HBM-only baseline.
//
// Note [Admission queue]
// A request is admitted when nothing is queued ahead of it and both bounds
// hold after it: locked slots (referenced or pinned) in HBM + DRAM <= their
// capacity, and Note [Overcommit]. Admission reserves all its blocks (prompt
// + output_tokens), so an admitted request always finishes and is never
// preempted. Otherwise it waits in a FIFO queue whose limit is
// max(min_queue, free DRAM slots / mean slots per request), free = capacity
// minus locked slots (cached blocks count as free: they are evicted on
// demand); with no DRAM tier, HBM's. The mean is over admitted requests
// (expected_request_tokens before the first).
//
// Note [Never lost]
// submit() always answers: admitted, queued, refused_queue_full (the caller
// still holds the request and may retry) or too_large (its slots plus the pin
// budget exceed HBM + DRAM, or its slots exceed the overcommit cap: it could
// not run even alone). A queued request is not too large, so once the running
// requests finish it fits (locked slots are then at most the pin budget) and
// is admitted; finish() returns those admissions in queue order.
//
// Note [Pinned prefixes]
// pin_prefix marks chain keys: their blocks are never victims (never demoted
// or dropped), now or when created later. Pinned keys times groups may not
// exceed pin_budget_slots, which too_large reserves, so pins never strand a
// queued request.
//
// Note [DRAM emergency]
// DRAM use (all occupied slots, cached included) above emergency_high (95%)
// raises the emergency flag and calls the alert; at or below emergency_low it
// clears (alert again). While raised, spill(budget) moves the coldest DRAM
// victims to SSD, at most budget bytes: the driver passes rate * elapsed time
// (~1 GB/s, MISSION.md), so serving I/O is not starved. Spills are moves with
// reason `spill`; the driver may also cap its h2s link (Engine::set_link_rate).
//
// Note [Promoting DRAM hits]
// A cached slot found in DRAM whose group's home is HBM is moved into HBM at
// admission (a `move` with reason `promote`, like an SSD hit's) when HBM has
// a free slot or an evictable one; the evicted HBM victim goes down to DRAM
// and, if DRAM is full, a DRAM victim goes down to SSD (Note [Tiers and
// moves]), so DRAM works as a cache tier between HBM and SSD. Why: a
// referenced slot never moves while its request runs, and compute reads a
// DRAM slot over the host link on every iteration (prefill chunks and each
// decode step), ~64x slower than HBM; one copy up at admission costs one
// read of it. Promotion never displaces a referenced or pinned slot: when
// HBM holds only those (an overcommitted batch), the hit stays in DRAM and
// is streamed. It keeps the admission bounds of fits(): the slot stays
// locked and in HBM + DRAM, only its tier changes, and what it displaces was
// unlocked. The hit's own blocks are referenced before any promotion, so
// making room never evicts a block of the same request. Promotion goes in
// prompt order, before the private blocks are created, so under overcommit
// the shared prefix gets HBM first. Homes in DRAM (the design's default
// placement) are left where they are: that is their placement.
//
// Note [Adopted blocks]
// A cached block after a prompt's first miss (its prefix was dropped before
// it) holds valid KV: the request references it rather than storing a twin,
// but it is not counted as a hit (the prefix before it is recomputed).
//
// Note [Segment reuse]
// On RAG traffic the same passages recur at different positions and in different orders, so
// an exact prefix reaches only the first differing passage (the real RAG trace:
// 31.5% of prompt tokens reusable by exact prefix, 72% by segment at any position). With
// Reuse::blend the prompt is laid out segment by segment: every segment starts a new token
// block (its last block may be partial, a slot is wasted on the rest), so block j of a
// segment holds the same tokens wherever the segment sits. Each block has two keys: its chain
// key (xxh64 of its content key seeded with the previous block's chain key: equal exactly when
// all the content before it is the same, as in Note [Block keys]) and its content key (the
// segment id, offset and length alone). Lookup:
//   - chain key cached: the exact case, unchanged (a hit in the leading run, else adopted);
//   - else, content key cached after any other context (blend only): a blend. The request
//     gets a new cached block under its own chain key, and the cached one is its source,
//     referenced (so kept in memory: an SSD source is promoted like a hit) until the driver
//     says prefilled() or the request finishes. The driver copies the source's slots into
//     the new block, re-rotates the keys to their new positions and recomputes a share of
//     the tokens (CacheBlend, Yao et al., EuroSys 2025: the tokens whose KV deviates most),
//     kv::blend_recompute_tokens; the serving simulator charges exactly that.
//   - else a miss.
// Why a copy and not a shared block: the recomputed tokens differ per context, so a blended
// block is not the source's KV; sharing it in place would need a kernel that reads two block
// tables. The copy is cached under the new chain key, so a follow-up turn that repeats the
// whole prompt hits it exactly, as an exact cache would.
// The layout costs slots (on average half a block per segment) and, with exact reuse only,
// blend's layout hits no more than the packed one; so exact mode keeps the packed layout.
//
// Note [SSD admission]
// Every victim written to SSD wears the drives (Note [SSD wear] in src/experiments/serve.cpp),
// and most RAG passages and conversation prefixes are seen once: writing them buys no hit. A
// frequency filter, as vLLM's offloading store threshold and Dynamo's KV-block frequency
// filter do: each admission counts the content keys it looks up; a victim leaving memory is
// written to SSD only if its content was looked up by at least ssd_admit_after admissions,
// else it is dropped (and a spill drops it instead of moving it). The counts are bounded: past
// kMaxSeen keys every count halves and zeros go, so old popularity decays.
// A count alone cannot promise a wear rate, and it costs hits: the second use of a block can
// never be an SSD hit. So a write budget bounds the rate itself: with ssd_write_budget every
// write to SSD spends credit the driver grants at the drives' rated pace (rated drive writes
// per day x capacity / 86,400 s, Note [SSD wear]), and a victim that finds too little credit
// is dropped. The drives then wear at most at their rating, plus the credit's cap.

namespace {
constexpr Tier kTierOf[kTiers] = {Tier::device, Tier::host, Tier::ssd};
constexpr std::size_t kMaxSeen = std::size_t{1} << 22;         // Note [SSD admission]
constexpr std::uint64_t kContentSeed = 0x75336d2d626c656eULL;  // content keys' own hash space

void append_u32(std::string& buf, std::uint32_t v) {
  buf.append(reinterpret_cast<const char*>(&v), sizeof v);
}
}  // namespace

// ---------------------------------------------------------------- geometry

std::uint32_t KvGeometry::groups() const {
  return layers_per_group ? (layers + layers_per_group - 1) / layers_per_group : 0;
}
std::uint32_t KvGeometry::group_layers(std::uint32_t g) const {
  return std::min(layers_per_group, layers - g * layers_per_group);
}
std::uint64_t KvGeometry::group_bytes(std::uint32_t g) const {
  return std::uint64_t{group_layers(g)} * bytes_per_token_layer * block_tokens;
}
std::uint64_t KvGeometry::slot_bytes() const {
  return std::uint64_t{layers_per_group} * bytes_per_token_layer * block_tokens;
}
std::uint64_t KvGeometry::token_block_bytes() const {
  return std::uint64_t{layers} * bytes_per_token_layer * block_tokens;
}
double KvGeometry::recompute_flops(std::uint32_t index) const {
  const double ctx = static_cast<double>(index) * block_tokens + (block_tokens - 1) / 2.0;
  return static_cast<double>(block_tokens) * layers * (linear_flops + attn_flops_per_ctx * ctx);
}
void KvGeometry::validate() const {
  if (block_tokens == 0) input_error("kv geometry", "field 'block_tokens': must be >= 1");
  if (layers == 0) input_error("kv geometry", "field 'layers': must be >= 1");
  if (layers_per_group == 0 || layers_per_group > layers)
    input_error("kv geometry", "field 'layers_per_group': {} not in 1..{}", layers_per_group,
                layers);
  if (groups() > kMaxGroups)
    input_error("kv geometry", "field 'layers_per_group': {} groups, at most {}", groups(),
                kMaxGroups);
  if (bytes_per_token_layer == 0)
    input_error("kv geometry", "field 'bytes_per_token_layer': must be >= 1");
}

KvGeometry KvGeometry::of(const workload::ModelShape& m, std::uint32_t block_tokens,
                          std::uint32_t layers_per_group, std::uint32_t dtype_bytes) {
  KvGeometry g;
  g.block_tokens = block_tokens;
  g.layers = m.layers;
  g.layers_per_group = std::min(layers_per_group, m.layers);
  g.bytes_per_token_layer =
      m.layers ? workload::analytic::kv_bytes_per_token(m, dtype_bytes) / m.layers : 0;
  g.linear_flops = 2.0 * static_cast<double>(workload::analytic::layer_param_count(m));
  g.attn_flops_per_ctx = 4.0 * m.heads * m.head_dim();  // QK^T and AV, 2 FLOPs per MAC
  g.validate();
  return g;
}

// ---------------------------------------------------------------- names

std::string_view to_string(Action::Kind k) {
  switch (k) {
    case Action::Kind::allocate:
      return "allocate";
    case Action::Kind::move:
      return "move";
    case Action::Kind::free:
      return "free";
  }
  return "?";
}
std::string_view to_string(Action::Reason r) {
  switch (r) {
    case Action::Reason::admit:
      return "admit";
    case Action::Reason::evict:
      return "evict";
    case Action::Reason::promote:
      return "promote";
    case Action::Reason::spill:
      return "spill";
    case Action::Reason::finish:
      return "finish";
    case Action::Reason::abort:
      return "abort";
  }
  return "?";
}

bool admission_critical(const Action& a) {
  return a.kind == Action::Kind::allocate || (a.kind == Action::Kind::move && a.from == Tier::ssd);
}
std::string_view to_string(Reuse r) {
  return r == Reuse::blend ? "blend" : "exact";
}

std::string_view to_string(SubmitResult r) {
  switch (r) {
    case SubmitResult::admitted:
      return "admitted";
    case SubmitResult::queued:
      return "queued";
    case SubmitResult::refused_queue_full:
      return "refused_queue_full";
    case SubmitResult::too_large:
      return "too_large";
    case SubmitResult::aborted:
      return "aborted";
  }
  return "?";
}

// ---------------------------------------------------------------- config

std::vector<Tier> KvConfig::default_homes(const KvGeometry& g, std::uint32_t hbm_layers) {
  std::vector<Tier> h(g.groups(), Tier::host);
  for (std::uint32_t i = 0; i < g.groups(); ++i)
    if (i * g.layers_per_group < hbm_layers) h[i] = Tier::device;
  return h;
}

std::vector<Tier> KvConfig::homes() const {
  return home.empty() ? default_homes(geometry) : home;
}

void KvConfig::validate() const {
  geometry.validate();
  if (capacity_slots[0] == 0)
    input_error("kv config", "field 'capacity_slots[device]': must be >= 1");
  if (!home.empty() && home.size() != geometry.groups())
    input_error("kv config", "field 'home': {} entries for {} layer groups", home.size(),
                geometry.groups());
  const std::vector<Tier> h = homes();
  for (std::size_t g = 0; g < h.size(); ++g) {
    if (h[g] == Tier::ssd)
      input_error("kv config", "field 'home[{}]': KV in use lives in HBM or DRAM, not SSD", g);
    if (capacity_slots[static_cast<int>(h[g])] == 0)
      input_error("kv config", "field 'home[{}]': tier {} has no capacity", g,
                  mem::to_string(h[g]));
  }
  if (!(overcommit >= 0) || !std::isfinite(overcommit))
    input_error("kv config", "field 'overcommit': {} must be finite and >= 0", overcommit);
  if (!(emergency_low > 0 && emergency_low <= emergency_high && emergency_high <= 1))
    input_error("kv config",
                "fields 'emergency_low' {} / 'emergency_high' {}: need 0 < low <= high <= 1",
                emergency_low, emergency_high);
  if (!(lfu_half_life > 0) || !std::isfinite(lfu_half_life))
    input_error("kv config", "field 'lfu_half_life': {} must be finite and > 0", lfu_half_life);
  if (expected_request_tokens == 0)
    input_error("kv config", "field 'expected_request_tokens': must be >= 1");
}

// ---------------------------------------------------------------- keys

std::vector<std::uint64_t> block_keys(const std::vector<workload::PromptSegment>& prompt,
                                      std::uint32_t block_tokens) {
  std::vector<std::uint64_t> keys;
  std::string buf;
  std::uint64_t parent = 0;
  std::uint32_t filled = 0;  // tokens of the current block so far
  for (const workload::PromptSegment& s : prompt) {
    std::uint32_t off = 0;
    while (off < s.tokens) {
      const std::uint32_t take = std::min(s.tokens - off, block_tokens - filled);
      append_u32(buf, static_cast<std::uint32_t>(s.id.size()));
      buf += s.id;
      append_u32(buf, off);
      append_u32(buf, take);
      off += take;
      filled += take;
      if (filled == block_tokens) {
        parent = XXH64(buf.data(), buf.size(), parent);
        keys.push_back(parent);
        buf.clear();
        filled = 0;
      }
    }
  }
  return keys;
}

std::uint64_t PromptBlocks::blocks(std::uint64_t output_tokens, std::uint32_t block_tokens) const {
  return keys.size() + (tail + output_tokens + block_tokens - 1) / block_tokens;
}

PromptBlocks prompt_blocks(const std::vector<workload::PromptSegment>& prompt,
                           std::uint32_t block_tokens, Reuse reuse) {
  PromptBlocks pb;
  std::uint64_t total = 0;
  for (const workload::PromptSegment& s : prompt) total += s.tokens;
  if (reuse == Reuse::exact) {
    pb.keys = block_keys(prompt, block_tokens);
    pb.content = pb.keys;
    for (std::size_t i = 0; i < pb.keys.size(); ++i) {
      pb.start.push_back(static_cast<std::uint32_t>(i * block_tokens));
      pb.tokens.push_back(block_tokens);
    }
    pb.tail = static_cast<std::uint32_t>(total - pb.keys.size() * block_tokens);
    return pb;
  }
  // Note [Segment reuse]
  std::string buf;
  std::uint64_t parent = 0;
  std::uint32_t pos = 0;
  for (const workload::PromptSegment& s : prompt) {
    for (std::uint32_t off = 0; off < s.tokens; off += block_tokens) {
      const std::uint32_t take = std::min(s.tokens - off, block_tokens);
      buf.clear();
      append_u32(buf, static_cast<std::uint32_t>(s.id.size()));
      buf += s.id;
      append_u32(buf, off);
      append_u32(buf, take);
      const std::uint64_t content = XXH64(buf.data(), buf.size(), kContentSeed);
      parent = XXH64(&content, sizeof content, parent);
      pb.keys.push_back(parent);
      pb.content.push_back(content);
      pb.start.push_back(pos);
      pb.tokens.push_back(take);
      pos += take;
    }
  }
  if (!pb.keys.empty() && pb.tokens.back() < block_tokens) {  // decode writes on into it
    pb.tail = pb.tokens.back();
    pb.keys.pop_back();
    pb.content.pop_back();
    pb.start.pop_back();
    pb.tokens.pop_back();
  }
  return pb;
}

// ---------------------------------------------------------------- manager

bool BlockManager::Victim::operator<(const Victim& o) const {
  if (prio != o.prio) return prio < o.prio;
  if (index != o.index) return index > o.index;  // deepest first
  if (tb != o.tb) return tb < o.tb;              // then the older
  return group < o.group;
}

BlockManager::BlockManager(KvConfig config) : cfg_(std::move(config)) {
  cfg_.validate();
  groups_ = cfg_.geometry.groups();
  homes_ = cfg_.homes();
  cap_ = cfg_.capacity_slots;
  eviction_ = make_eviction(cfg_.policy, cfg_.geometry, cfg_.lfu_half_life);
}

BlockManager::Pending BlockManager::make_pending(RequestId id,
                                                 const workload::ServeRequest& r) const {
  Pending p;
  p.id = id;
  PromptBlocks pb = prompt_blocks(r.prompt, cfg_.geometry.block_tokens, cfg_.reuse);
  p.prompt_tokens = r.prompt_tokens();
  const std::uint64_t blocks = pb.blocks(r.output_tokens, cfg_.geometry.block_tokens);
  p.keys = std::move(pb.keys);
  p.content = std::move(pb.content);
  p.tokens = std::move(pb.tokens);
  if (blocks > std::numeric_limits<std::uint32_t>::max())
    throw std::invalid_argument(fmt::format("kv: request {} needs {} blocks", id, blocks));
  p.blocks = static_cast<std::uint32_t>(blocks);
  return p;
}

std::uint64_t BlockManager::overcommit_limit_slots() const {
  if (cfg_.overcommit <= 0) return 0;
  return static_cast<std::uint64_t>(cfg_.overcommit * static_cast<double>(cap_[0]));
}

bool BlockManager::too_large(const Pending& p) const {
  const std::uint64_t slots = std::uint64_t{p.blocks} * groups_;
  const std::uint64_t limit = overcommit_limit_slots();
  return slots + cfg_.pin_budget_slots > mem_capacity() || (limit && slots > limit);
}

BlockManager::Need BlockManager::need_of(const Pending& p) const {
  Need n;
  auto held = [&](TokenBlockId id) {  // a cached block this admission references
    const TokenBlock& b = blocks_.at(id);
    for (Tier t : b.tier)
      if (t == Tier::ssd || !locked(b)) ++n.mem_slots;  // promoted, or newly locked in place
    if (b.refs == 0) n.new_refs += groups_;
  };
  for (std::size_t i = 0; i < p.keys.size(); ++i) {
    auto it = cache_.find(p.keys[i]);
    if (it != cache_.end()) {
      held(it->second);
      continue;
    }
    n.mem_slots += groups_;
    n.new_refs += groups_;
    if (TokenBlockId src = p.blend ? blend_source(p.content[i]) : 0) held(src);
  }
  const std::uint64_t priv = std::uint64_t{p.blocks - p.keys.size()} * groups_;
  n.mem_slots += priv;
  n.new_refs += priv;
  return n;
}

// Blending is optional: its sources and copies cost slots a plain admission of the same
// prompt does not, and too_large() promises only the plain one. So a request that fits only
// without its blends is admitted without them, and Note [Never lost] still holds.
bool BlockManager::fits(Pending& p) const {
  p.blend = cfg_.reuse == Reuse::blend;
  if (fits_as_is(p)) return true;
  if (!p.blend) return false;
  p.blend = false;
  return fits_as_is(p);
}

bool BlockManager::fits_as_is(const Pending& p) const {
  const Need n = need_of(p);
  const std::uint64_t limit = overcommit_limit_slots();
  if (locked_[0] + locked_[1] + n.mem_slots > mem_capacity()) return false;
  return !limit || referenced_slots_ + n.new_refs <= limit;
}

std::uint64_t BlockManager::per_request_slots() const {
  if (st_.admitted) return std::max<std::uint64_t>(1, admitted_slots_ / st_.admitted);
  const std::uint64_t bt = cfg_.geometry.block_tokens;
  return (cfg_.expected_request_tokens + bt - 1) / bt * groups_;
}

std::uint64_t BlockManager::queue_limit() const {
  const int q = cap_[1] > 0 ? 1 : 0;
  const std::uint64_t free = cap_[q] - std::min(cap_[q], locked_[q]);
  return std::max(cfg_.min_queue, free / per_request_slots());
}

SubmitResult BlockManager::submit(RequestId id, const workload::ServeRequest& r, Admission* out) {
  if (requests_.contains(id) ||
      std::any_of(queue_.begin(), queue_.end(), [&](const Pending& p) { return p.id == id; }))
    throw std::invalid_argument(fmt::format("kv: request {} submitted twice", id));
  ++st_.submitted;
  Pending p = make_pending(id, r);
  if (too_large(p)) {
    ++st_.refused_too_large;
    return SubmitResult::too_large;
  }
  if (queue_.empty() && fits(p)) {
    Admission a = admit(p, false);
    if (out) *out = a;
    return SubmitResult::admitted;
  }
  if (queue_.size() >= queue_limit()) {
    ++st_.refused_queue_full;
    return SubmitResult::refused_queue_full;
  }
  queue_.push_back(std::move(p));
  ++st_.queued;
  st_.peak_queue = std::max<std::uint64_t>(st_.peak_queue, queue_.size());
  return SubmitResult::queued;
}

std::vector<Admission> BlockManager::finish(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    throw std::invalid_argument(fmt::format("kv: finish of request {}, which is not running", id));
  const std::vector<TokenBlockId> table = std::move(it->second);
  requests_.erase(it);
  release_sources(id);
  for (TokenBlockId tb : table) {
    TokenBlock& b = blocks_.at(tb);
    unref(b, tb);
    if (!b.cached || (b.damaged && b.refs == 0)) drop(tb, Action::Reason::finish);
  }
  ++st_.finished;
  std::vector<Admission> out;
  admit_queued(out);
  check_emergency();
  return out;
}

void BlockManager::prefilled(RequestId id) {
  release_sources(id);
}

void BlockManager::release_sources(RequestId id) {
  auto it = sources_.find(id);
  if (it == sources_.end()) return;
  const std::vector<TokenBlockId> held = std::move(it->second);
  sources_.erase(it);
  for (TokenBlockId tb : held) {
    TokenBlock& b = blocks_.at(tb);
    unref(b, tb);
    if (b.damaged && b.refs == 0) drop(tb, Action::Reason::finish);
  }
}

const std::vector<TokenBlockId>& BlockManager::blend_sources(RequestId id) const {
  static const std::vector<TokenBlockId> none;
  auto it = sources_.find(id);
  return it == sources_.end() ? none : it->second;
}

TokenBlockId BlockManager::blend_source(std::uint64_t content) const {
  if (cfg_.reuse != Reuse::blend) return 0;
  auto it = by_content_.find(content);
  if (it == by_content_.end()) return 0;
  // A hot passage may be cached after many contexts: the newest few are enough to find one
  // in a high tier, and the lookup stays cheap for the cache-aware queue's scans.
  constexpr int kLook = 16;
  TokenBlockId best = 0;
  int best_tier = kTiers, looked = 0;
  for (auto c = it->second.rbegin(); c != it->second.rend() && looked++ < kLook; ++c) {
    const TokenBlock& b = blocks_.at(*c);
    if (b.damaged) continue;
    int lowest = 0;
    for (Tier t : b.tier) lowest = std::max(lowest, idx(t));
    if (lowest < best_tier) {
      best = *c;
      best_tier = lowest;
    }
  }
  return best;
}

bool BlockManager::ssd_admits(const TokenBlock& b, std::uint32_t g) const {
  if (cfg_.ssd_write_budget && ssd_credit_ < cfg_.geometry.group_bytes(g)) return false;
  if (cfg_.ssd_admit_after <= 1) return true;
  auto it = seen_.find(b.content);
  return it != seen_.end() && it->second >= cfg_.ssd_admit_after;
}

void BlockManager::add_ssd_credit(std::uint64_t bytes, std::uint64_t cap) {
  ssd_credit_ = std::min(cap, ssd_credit_ + std::min(bytes, cap));
}

// Note [Cache-aware admission]
// A FIFO queue admits requests in arrival order, so a request whose passages are hot now may
// wait behind ones that share nothing, and by its turn they are gone. As SGLang's
// longest-prefix-match scheduling does, the queue is reordered by cached length: among the
// first kWindow queued requests that fit, the one with the most prompt tokens an admission
// would now reuse (exact hits, and blends under Reuse::blend) goes first, ties in arrival
// order. The extra wait is bounded in admissions, not time (the manager reads no clock): each
// pass over a request counts against it, and no request may be passed over more than
// max_bypass times; the scan stops at the first one that has, so from then on it is the only
// candidate before those behind it. So Note [Never lost] still holds: a request waits at most
// max_bypass admissions more than under FIFO.
void BlockManager::admit_queued(std::vector<Admission>& out) {
  constexpr std::size_t kWindow = 64;
  while (!queue_.empty()) {
    std::size_t pick = 0;
    if (cfg_.max_bypass == 0) {
      if (!fits(queue_.front())) return;
    } else {
      std::int64_t best = -1;
      for (std::size_t j = 0; j < std::min(queue_.size(), kWindow); ++j) {
        Pending& p = queue_[j];
        if (fits(p)) {
          const auto c = static_cast<std::int64_t>(cached_tokens(p));
          if (c > best) {
            best = c;
            pick = j;
          }
        }
        if (p.bypassed >= cfg_.max_bypass) break;  // nobody behind it may go first
      }
      if (best < 0) return;
    }
    for (std::size_t k = 0; k < pick; ++k) ++queue_[k].bypassed;
    out.push_back(admit(queue_[pick], true));
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(pick));
  }
}

std::uint64_t BlockManager::cached_tokens(const Pending& p) const {
  std::uint64_t n = 0;
  bool run = true;
  for (std::size_t i = 0; i < p.keys.size(); ++i) {
    if (run && cache_.contains(p.keys[i])) {
      n += p.tokens[i];
      continue;
    }
    run = false;
    if (cfg_.reuse != Reuse::blend) break;
    if (!cache_.contains(p.keys[i]) && blend_source(p.content[i])) n += p.tokens[i];
  }
  return n;
}

Admission BlockManager::admit(const Pending& p, bool from_queue) {
  Admission a;
  a.id = p.id;
  a.blocks = p.blocks;
  a.prompt_full_blocks = static_cast<std::uint32_t>(p.keys.size());
  std::vector<TokenBlockId> table(p.blocks, 0);
  std::vector<TokenBlockId> created;
  std::vector<TokenBlockId> sources(p.keys.size(), 0);  // Note [Segment reuse]
  // Lock every cached block first, so making room for new ones cannot evict them.
  bool run = true;
  for (std::size_t i = 0; i < p.keys.size(); ++i) {
    if (cfg_.ssd_admit_after > 1) ++seen_[p.content[i]];
    auto it = cache_.find(p.keys[i]);
    if (it == cache_.end()) {
      run = false;
      if (TokenBlockId src = p.blend ? blend_source(p.content[i]) : 0) {
        ref(blocks_.at(src), src);
        sources[i] = src;
      }
      continue;
    }
    TokenBlock& b = blocks_.at(it->second);
    ref(b, it->second);
    table[i] = it->second;
    if (run) {
      ++a.hit_blocks;
      a.hit_tokens += p.tokens[i];
      int lowest = 0;
      for (Tier t : b.tier) lowest = std::max(lowest, idx(t));
      ++a.hit_blocks_by_tier[lowest];
    } else {
      ++a.adopted_blocks;
    }
  }
  for (std::size_t i = 0; i < p.keys.size(); ++i) {
    if (table[i] != 0) {
      for (std::uint32_t g = 0; g < groups_; ++g) {
        const Tier t = blocks_.at(table[i]).tier[g];
        if (t == Tier::ssd) {
          place(table[i], g, Action::Reason::promote);
          ++a.promoted_slots;
        } else if (t == Tier::host && promote_host(table[i], g)) {
          ++a.promoted_host_slots;
        }
      }
      continue;
    }
    // A key repeated inside one prompt can only be a hash collision: keep it private.
    const bool share = !cache_.contains(p.keys[i]);
    table[i] = create(static_cast<std::uint32_t>(i), share, p.keys[i], p.content[i]);
    share ? ++a.new_blocks : ++a.private_blocks;
    if (share) created.push_back(table[i]);
    if (const TokenBlockId src = sources[i]) {
      // Its data is copied from memory: an SSD source comes up like a hit.
      for (std::uint32_t g = 0; g < groups_; ++g)
        if (blocks_.at(src).tier[g] == Tier::ssd) {
          place(src, g, Action::Reason::promote);
          ++a.promoted_slots;
        }
      a.blends.push_back({static_cast<std::uint32_t>(i), src});
      a.blend_tokens += p.tokens[i];
    }
  }
  for (std::uint32_t i = static_cast<std::uint32_t>(p.keys.size()); i < p.blocks; ++i) {
    table[i] = create(i, false, 0);
    ++a.private_blocks;
  }
  std::vector<TokenBlockId> chain;
  for (std::size_t i = 0; i < p.keys.size(); ++i)
    if (blocks_.at(table[i]).cached) chain.push_back(table[i]);
  touch(chain);
  std::vector<TokenBlockId> held;
  for (TokenBlockId src : sources)
    if (src) {
      touch({src}, false);  // a use at this admission's tick, not a chain of its own
      held.push_back(src);
    }
  if (!held.empty()) sources_.emplace(p.id, std::move(held));
  if (seen_.size() > kMaxSeen)  // Note [SSD admission]: counts halve, zeros go
    for (auto it = seen_.begin(); it != seen_.end();)
      it = (it->second /= 2) == 0 ? seen_.erase(it) : std::next(it);

  requests_.emplace(p.id, std::move(table));
  account(p, a, true);
  fresh_.push_back({p, a, from_queue, std::move(created)});
  st_.peak_running = std::max<std::uint64_t>(st_.peak_running, requests_.size());
  st_.peak_referenced_slots = std::max(st_.peak_referenced_slots, referenced_slots_);
  check_emergency();
  return a;
}

void BlockManager::account(const Pending& p, const Admission& a, bool add) {
  auto f = [add](std::uint64_t& x, std::uint64_t v) { x = add ? x + v : x - v; };
  f(st_.admitted, 1);
  f(admitted_slots_, std::uint64_t{p.blocks} * groups_);
  f(st_.prompt_tokens, p.prompt_tokens);
  f(st_.lookup_blocks, p.keys.size());
  f(st_.hit_blocks, a.hit_blocks);
  f(st_.hit_tokens, a.hit_tokens);
  f(st_.adopted_blocks, a.adopted_blocks);
  f(st_.blend_blocks, a.blends.size());
  f(st_.blend_tokens, a.blend_tokens);
  for (int t = 0; t < kTiers; ++t) f(st_.hit_blocks_by_tier[t], a.hit_blocks_by_tier[t]);
  f(st_.new_blocks, a.new_blocks);
  f(st_.private_blocks, a.private_blocks);
  f(st_.promoted_slots, a.promoted_slots);
  f(st_.promoted_host_slots, a.promoted_host_slots);
}

void BlockManager::touch(const std::vector<TokenBlockId>& chain, bool tick) {
  if (tick) ++tick_;
  double floor = -std::numeric_limits<double>::infinity();
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {  // last block first
    TokenBlock& b = blocks_.at(*it);  // referenced, so not listed: prio may change
    ++b.use.freq;
    const double raw = eviction_->priority(b.use, b.index, tick_);
    b.prio = std::max(raw, floor);  // Note [Eviction order]: a prefix never ranks below
    floor = b.prio;
  }
}

TokenBlockId BlockManager::create(std::uint32_t index, bool cached, std::uint64_t key,
                                  std::uint64_t content) {
  const TokenBlockId id = next_tb_++;
  TokenBlock& b = blocks_[id];
  b.key = key;
  b.content = content;
  if (cached && cfg_.reuse == Reuse::blend) by_content_[content].push_back(id);
  b.cached = cached;
  b.index = index;
  b.refs = 1;
  b.tier.assign(groups_, Tier::ssd);  // placeholder until placed; not counted anywhere yet
  b.absent.assign(groups_, 0);
  referenced_slots_ += groups_;
  if (cached) {
    cache_.emplace(key, id);
    b.pinned = pins_.contains(key);
  }
  for (std::uint32_t g = 0; g < groups_; ++g) {
    const Tier t = take_slot(g);
    blocks_.at(id).tier[g] = t;
    ++used_[idx(t)];
    ++locked_[idx(t)];
    peak_[idx(t)] = std::max(peak_[idx(t)], used_[idx(t)]);
    emit({Action::Kind::allocate, Action::Reason::admit, block_id(id, g), t, t,
          cfg_.geometry.group_bytes(g)},
         id, g);
  }
  return id;
}

Tier BlockManager::take_slot(std::uint32_t g) {
  // Home first, then the other memory tier (HBM first): Note [Tiers and moves].
  for (Tier t : {homes_[g], Tier::device, Tier::host})
    if (cap_[idx(t)] > 0 && (free_slots(t) > 0 || make_room(t, 1))) return t;
  throw std::logic_error("kv: no memory slot after the admission check said it fits");
}

void BlockManager::place(TokenBlockId tb, std::uint32_t g, Action::Reason why) {
  move_slot(tb, g, take_slot(g), why);
}

bool BlockManager::promote_host(TokenBlockId tb, std::uint32_t g) {
  // Note [Promoting DRAM hits]
  if (!cfg_.promote_host_hits || homes_[g] != Tier::device) return false;
  if (free_slots(Tier::device) == 0 && !make_room(Tier::device, 1)) return false;
  move_slot(tb, g, Tier::device, Action::Reason::promote);
  return true;
}

bool BlockManager::make_room(Tier t, std::uint64_t n) {
  while (free_slots(t) < n) {
    auto& set = victims_[idx(t)];
    if (set.empty()) return false;
    evict_slot(*set.begin(), t);
  }
  return true;
}

void BlockManager::evict_slot(const Victim& victim, Tier t) {
  const Victim v = victim;  // the set entry goes away below
  for (int lower = idx(t) + 1; lower < kTiers; ++lower) {
    if (cap_[lower] == 0) continue;
    const Tier to = kTierOf[lower];
    if (to == Tier::ssd && !ssd_admits(blocks_.at(v.tb), v.group)) {  // Note [SSD admission]
      st_.ssd_declined_slots += groups_;
      break;
    }
    if (free_slots(to) == 0) make_room(to, 1);  // may drop v's own block
    auto it = blocks_.find(v.tb);
    if (it == blocks_.end()) return;
    if (free_slots(to) > 0) {
      move_slot(v.tb, v.group, to, Action::Reason::evict);
      ++st_.demoted_slots[idx(t)];
      return;
    }
    break;
  }
  if (blocks_.contains(v.tb)) drop(v.tb, Action::Reason::evict);
}

void BlockManager::move_slot(TokenBlockId tb, std::uint32_t g, Tier to, Action::Reason why) {
  TokenBlock& b = blocks_.at(tb);
  const Tier from = b.tier[g];
  if (evictable(b)) victims_[idx(from)].erase({b.prio, b.index, tb, g});
  --used_[idx(from)];
  ++used_[idx(to)];
  peak_[idx(to)] = std::max(peak_[idx(to)], used_[idx(to)]);
  if (locked(b)) {
    --locked_[idx(from)];
    ++locked_[idx(to)];
  }
  b.tier[g] = to;
  if (to == Tier::ssd && cfg_.ssd_write_budget)  // Note [SSD admission]: the write is paid
    ssd_credit_ -= std::min(ssd_credit_, cfg_.geometry.group_bytes(g));
  if (evictable(b)) victims_[idx(to)].insert({b.prio, b.index, tb, g});
  emit({Action::Kind::move, why, block_id(tb, g), from, to, cfg_.geometry.group_bytes(g)}, tb, g);
}

void BlockManager::drop(TokenBlockId tb, Action::Reason why) {
  TokenBlock& b = blocks_.at(tb);
  // A damaged pinned block goes too (its data is gone); its key stays pinned.
  if (b.refs > 0 || (b.pinned && !b.damaged)) throw std::logic_error("kv: dropping a locked block");
  if (b.cached) {
    if (evictable(b)) unlist(b, tb);
    cache_.erase(b.key);
    if (auto c = by_content_.find(b.content); c != by_content_.end()) {
      std::erase(c->second, tb);
      if (c->second.empty()) by_content_.erase(c);
    }
    if (!b.damaged) eviction_->dropped(b.prio);  // Note [Eviction order]: aging
    ++st_.dropped_blocks;
  }
  for (std::uint32_t g = 0; g < groups_; ++g) {
    if (b.absent[g]) continue;  // never allocated: nothing to free
    --used_[idx(b.tier[g])];
    if (b.pinned) --locked_[idx(b.tier[g])];
    emit({Action::Kind::free, why, block_id(tb, g), b.tier[g], b.tier[g],
          cfg_.geometry.group_bytes(g)},
         tb, g);
  }
  blocks_.erase(tb);
}

void BlockManager::lock_delta(const TokenBlock& b, int delta) {
  for (std::uint32_t g = 0; g < groups_; ++g)
    if (!b.absent[g]) locked_[idx(b.tier[g])] += static_cast<std::uint64_t>(delta);
}

void BlockManager::ref(TokenBlock& b, TokenBlockId id) {
  if (!locked(b)) lock_delta(b, +1);
  if (evictable(b)) unlist(b, id);
  if (b.refs++ == 0) referenced_slots_ += groups_;
}

void BlockManager::unref(TokenBlock& b, TokenBlockId id) {
  if (--b.refs > 0) return;
  referenced_slots_ -= groups_;
  if (!b.pinned) lock_delta(b, -1);
  if (evictable(b)) list(b, id);
}

void BlockManager::list(const TokenBlock& b, TokenBlockId id) {
  for (std::uint32_t g = 0; g < groups_; ++g)
    if (!b.absent[g]) victims_[idx(b.tier[g])].insert({b.prio, b.index, id, g});
}

void BlockManager::unlist(const TokenBlock& b, TokenBlockId id) {
  for (std::uint32_t g = 0; g < groups_; ++g)
    if (!b.absent[g]) victims_[idx(b.tier[g])].erase({b.prio, b.index, id, g});
}

void BlockManager::check_emergency() {
  if (cap_[1] == 0) return;
  const double frac = static_cast<double>(used_[1]) / static_cast<double>(cap_[1]);
  bool change = false;
  if (!emergency_ && frac > cfg_.emergency_high) {
    emergency_ = change = true;
    ++st_.alerts;
  } else if (emergency_ && frac <= cfg_.emergency_low) {
    emergency_ = false;
    change = true;
  }
  if (change && alert_) alert_({emergency_, used_[1], cap_[1]});
}

std::uint64_t BlockManager::spill(std::uint64_t budget_bytes) {
  std::uint64_t moved = 0;
  if (cap_[2] == 0) return 0;
  while (emergency_ && !victims_[1].empty()) {
    const Victim v = *victims_[1].begin();
    const std::uint64_t bytes = cfg_.geometry.group_bytes(v.group);
    if (moved + bytes > budget_bytes) break;
    if (free_slots(Tier::ssd) == 0 && !make_room(Tier::ssd, 1)) break;
    if (!blocks_.contains(v.tb) || blocks_.at(v.tb).tier[v.group] != Tier::host) continue;
    if (!ssd_admits(blocks_.at(v.tb), v.group)) {  // Note [SSD admission]: freed, not written
      st_.ssd_declined_slots += groups_;
      drop(v.tb, Action::Reason::spill);
      check_emergency();
      continue;
    }
    move_slot(v.tb, v.group, Tier::ssd, Action::Reason::spill);
    moved += bytes;
    ++st_.spilled_slots;
    st_.spilled_bytes += bytes;
    check_emergency();
  }
  return moved;
}

bool BlockManager::pin_prefix(const std::vector<workload::PromptSegment>& prefix) {
  const std::vector<std::uint64_t> keys =
      prompt_blocks(prefix, cfg_.geometry.block_tokens, cfg_.reuse).keys;
  std::uint64_t fresh = 0;
  for (std::uint64_t k : keys) fresh += !pins_.contains(k);
  if ((pins_.size() + fresh) * groups_ > cfg_.pin_budget_slots) return false;
  for (std::uint64_t k : keys) {
    if (!pins_.insert(k).second) continue;
    auto it = cache_.find(k);
    if (it == cache_.end()) continue;
    TokenBlock& b = blocks_.at(it->second);
    if (!locked(b)) lock_delta(b, +1);
    if (evictable(b)) unlist(b, it->second);
    b.pinned = true;
  }
  return true;
}

std::uint32_t BlockManager::cached_prefix_blocks(const workload::ServeRequest& r) const {
  std::uint32_t n = 0;
  for (std::uint64_t k : prompt_blocks(r.prompt, cfg_.geometry.block_tokens, cfg_.reuse).keys) {
    if (!cache_.contains(k)) break;
    ++n;
  }
  return n;
}

const std::vector<TokenBlockId>& BlockManager::table(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end())
    throw std::invalid_argument(fmt::format("kv: request {} is not running", id));
  return it->second;
}

Tier BlockManager::slot_tier(TokenBlockId tb, std::uint32_t group) const {
  auto it = blocks_.find(tb);
  if (it == blocks_.end() || group >= groups_)
    throw std::invalid_argument(fmt::format("kv: no block {} group {}", tb, group));
  return it->second.tier[group];
}

std::vector<std::array<std::uint32_t, kTiers>> BlockManager::slots_by_group(RequestId id) const {
  std::vector<std::array<std::uint32_t, kTiers>> out(groups_, {0, 0, 0});
  for (TokenBlockId tb : table(id)) {
    const TokenBlock& b = blocks_.at(tb);
    for (std::uint32_t g = 0; g < groups_; ++g) ++out[g][idx(b.tier[g])];
  }
  return out;
}

std::vector<Action> BlockManager::take_prepared() {
  std::vector<Action> out;
  out.swap(actions_);
  return out;
}

std::vector<Action> BlockManager::take_actions() {
  std::vector<Action> out = take_prepared();
  for (const Action& a : out) complete(a.seq, Outcome::ok);
  settle();
  return out;
}

std::vector<Admission> BlockManager::admit_waiting() {
  std::vector<Admission> out;
  admit_queued(out);
  check_emergency();
  return out;
}

std::vector<RequestId> BlockManager::queued_ids() const {
  std::vector<RequestId> ids;
  for (const Pending& p : queue_) ids.push_back(p.id);
  return ids;
}

TierUse BlockManager::use(Tier t) const {
  return {cap_[idx(t)], used_[idx(t)], locked_[idx(t)], peak_[idx(t)]};
}

// ---------------------------------------------------------------- two-phase actions

// Note [Two-phase actions]
// A decision prepares actions; the driver carries them out and completes each with ok,
// failed or lost (vLLM's offloading manager has the same shape: prepare_store/load, then
// complete_store/load with success or not; TensorRT-LLM's transfer manager keeps the
// pending transfers per block). The manager's state is the plan: where every slot rests once
// its actions are done (used_, tier, the victim sets, the admission bounds), so decisions
// are those of one-at-a-time execution. What is not done yet is kept beside it:
//  - a slot being left (a move out, a free) stays held until that action completes ok:
//    leaving_[t]. A take (an allocation, a move in) that finds its tier physically full
//    (used + leaving - claimed = capacity) claims the oldest unclaimed leave of that tier
//    and names it in after[1]: the driver starts it only once that leave is done;
//  - actions on one slot run in order: after[0] names the previous pending one;
//  - failed or lost: the slot stays where it was (a move), or holds no slot (an
//    allocation: the block is damaged). Every action that waited for it is cancelled first,
//    latest first: a take promised its vacancy, a later move of the same slot. A later free
//    of the same slot (its block was dropped meanwhile) is not cancelled but re-homed to the
//    tier the slot is really in. complete() returns the cancelled seqs; the driver drops
//    them unstarted (nothing starts before what it waits for is completed);
//  - settle(), once the admission-critical actions (allocations, promotions from SSD) are
//    completed, rolls back each admission left without all its slots in memory: its private
//    blocks are freed (reason abort), its shared ones unreferenced, the cached blocks it
//    created damaged (their KV will never be computed, so an admission that hit them in
//    the same batch is rolled back too), its counters taken back,
//    and the request goes back to the front of the queue, or to the caller of submit() as
//    aborted. Damaged blocks are dropped once nobody references them, so no later request
//    hits KV that is missing or lost. A promotion from DRAM to HBM is not critical: if it
//    fails, the slot stays in DRAM, which compute reads too.
// With every action completed ok in order (take_actions()), the state is exactly that of
// applying them one by one, so the simulator and the tests see the decisions they did.

void BlockManager::emit(Action a, TokenBlockId tb, std::uint32_t g) {
  a.seq = next_seq_++;
  Op op{a, tb, g};
  auto last = slot_last_.find(a.block);
  if (last != slot_last_.end()) {
    op.prev = last->second;
    ops_.at(op.prev).next = a.seq;
    last->second = a.seq;
  } else {
    slot_last_.emplace(a.block, a.seq);
  }
  op.a.after[0] = op.prev;
  if (a.kind != Action::Kind::free) {  // a take: is its slot physically free yet?
    const int t = idx(a.to);
    if (used_[t] + leaving_[t] - claimed_[t] > cap_[t]) {
      if (credits_[t].empty()) throw std::logic_error("kv: a take with no slot to wait for");
      op.claim = credits_[t].front();
      credits_[t].pop_front();
      ++claimed_[t];
      ops_.at(op.claim).claimer = a.seq;
      op.a.after[1] = op.claim;
    }
  }
  if (a.kind != Action::Kind::allocate) {  // a leave: held until it completes
    const int f = idx(a.from);
    ++leaving_[f];
    credits_[f].push_back(a.seq);
  }
  actions_.push_back(op.a);
  ops_.emplace(a.seq, std::move(op));
}

void BlockManager::uncredit(int t, std::uint64_t seq) {
  auto it = std::find(credits_[t].begin(), credits_[t].end(), seq);
  if (it == credits_[t].end()) throw std::logic_error("kv: a pending leave lost its credit");
  credits_[t].erase(it);
}

std::vector<std::uint64_t> BlockManager::complete(std::uint64_t seq, Outcome outcome) {
  auto it = ops_.find(seq);
  if (it == ops_.end())
    throw std::invalid_argument(fmt::format("kv: no pending action {}", seq));
  Op& op = it->second;
  if (op.prev || op.claim)
    throw std::logic_error(fmt::format("kv: action {} completed before action {}, which it waits for",
                                       seq, op.prev ? op.prev : op.claim));
  std::vector<std::uint64_t> cancelled;
  if (outcome == Outcome::ok) {
    if (op.a.kind != Action::Kind::allocate) {  // a leave: its slot is free now
      const int f = idx(op.a.from);
      --leaving_[f];
      if (op.claimer) {
        ops_.at(op.claimer).claim = 0;
        --claimed_[f];
      } else {
        uncredit(f, seq);
      }
    }
    if (op.next) ops_.at(op.next).prev = 0;
    auto last = slot_last_.find(op.a.block);
    if (last != slot_last_.end() && last->second == seq) slot_last_.erase(last);
    ops_.erase(it);
    return cancelled;
  }
  if (op.a.kind == Action::Kind::free)
    throw std::invalid_argument(
        fmt::format("kv: action {} is a free, which cannot fail: the driver retries it", seq));
  ++st_.failed_actions;
  if (outcome == Outcome::lost && blocks_.contains(op.tb)) damage(op.tb);
  revert(seq, cancelled);
  return cancelled;
}

void BlockManager::cancel(std::uint64_t seq, std::vector<std::uint64_t>& cancelled) {
  cancelled.push_back(seq);
  ++st_.cancelled_actions;
  revert(seq, cancelled);
}

void BlockManager::revert(std::uint64_t seq, std::vector<std::uint64_t>& cancelled) {
  // Later moves of the same slot first, latest first; a later free stays (its block is gone).
  for (;;) {
    const std::uint64_t nx = ops_.at(seq).next;
    if (!nx || ops_.at(nx).a.kind == Action::Kind::free) break;
    cancel(nx, cancelled);
  }
  const Op op = ops_.at(seq);
  const Action& a = op.a;
  const std::uint64_t free_next = op.next;
  if (op.prev) ops_.at(op.prev).next = free_next;
  if (free_next)
    ops_.at(free_next).prev = op.prev;
  else if (op.prev)
    slot_last_[a.block] = op.prev;
  else
    slot_last_.erase(a.block);
  const int t = idx(a.to);
  if (op.claim) {  // the vacancy it was promised goes back, still pending
    ops_.at(op.claim).claimer = 0;
    --claimed_[t];
    credits_[t].push_front(op.claim);
  }
  ops_.erase(seq);
  if (a.kind == Action::Kind::move) {
    const int f = idx(a.from);
    --leaving_[f];  // the slot it was leaving stays taken
    if (op.claimer) {
      ops_.at(op.claimer).claim = 0;
      --claimed_[f];
      cancel(op.claimer, cancelled);
    } else {
      uncredit(f, seq);
    }
    if (free_next)
      rehome_free(free_next, a.from, cancelled);
    else if (blocks_.contains(op.tb))
      retier(op.tb, op.g, a.from);
  } else if (!free_next && blocks_.contains(op.tb)) {  // an allocation: no slot after all
    damage(op.tb);
    TokenBlock& b = blocks_.at(op.tb);
    --used_[t];
    if (locked(b)) --locked_[t];
    b.absent[op.g] = 1;
  }
}

void BlockManager::rehome_free(std::uint64_t seq, Tier to,
                               std::vector<std::uint64_t>& cancelled) {
  const int was = idx(ops_.at(seq).a.from);
  --leaving_[was];
  if (const std::uint64_t p = ops_.at(seq).claimer) {
    ops_.at(seq).claimer = 0;
    ops_.at(p).claim = 0;
    --claimed_[was];
    cancel(p, cancelled);
  } else {
    uncredit(was, seq);
  }
  Op& z = ops_.at(seq);
  z.a.from = z.a.to = to;
  ++leaving_[idx(to)];
  credits_[idx(to)].push_back(seq);
}

void BlockManager::retier(TokenBlockId tb, std::uint32_t g, Tier to) {
  TokenBlock& b = blocks_.at(tb);
  const Tier from = b.tier[g];
  const bool listed = evictable(b);
  if (listed) victims_[idx(from)].erase({b.prio, b.index, tb, g});
  --used_[idx(from)];
  ++used_[idx(to)];
  if (locked(b)) {
    --locked_[idx(from)];
    ++locked_[idx(to)];
  }
  b.tier[g] = to;
  if (listed) victims_[idx(to)].insert({b.prio, b.index, tb, g});
}

void BlockManager::damage(TokenBlockId tb) {
  TokenBlock& b = blocks_.at(tb);
  if (b.damaged) return;
  if (evictable(b)) unlist(b, tb);
  b.damaged = true;
  ++st_.damaged_blocks;
  damaged_.push_back(tb);
}

void BlockManager::lost(BlockId block) {
  const TokenBlockId tb = block / kMaxGroups;
  auto it = blocks_.find(tb);
  if (it == blocks_.end()) return;
  damage(tb);
  if (it->second.refs == 0) drop(tb, Action::Reason::abort);
}

std::vector<RequestId> BlockManager::settle() {
  std::vector<RequestId> refused;
  std::vector<Pending> requeue;
  std::vector<Fresh> fresh;
  fresh.swap(fresh_);
  for (const Fresh& f : fresh) {
    auto rq = requests_.find(f.p.id);
    if (rq == requests_.end()) continue;  // already finished
    bool holds = true;
    std::vector<TokenBlockId> reads = rq->second;
    for (TokenBlockId tb : blend_sources(f.p.id)) reads.push_back(tb);
    for (TokenBlockId tb : reads) {
      const TokenBlock& b = blocks_.at(tb);
      holds = holds && !b.damaged;
      for (std::uint32_t g = 0; g < groups_; ++g) {
        auto last = slot_last_.find(block_id(tb, g));
        for (std::uint64_t s = last == slot_last_.end() ? 0 : last->second; s; s = ops_.at(s).prev)
          if (admission_critical(ops_.at(s).a))
            throw std::logic_error(
                fmt::format("kv: settle() before action {} of request {} completed", s, f.p.id));
        holds = holds && !b.absent[g] && b.tier[g] != Tier::ssd;
      }
    }
    if (holds) continue;
    // Its new cached blocks will never be computed: a later request must not hit them, and
    // one admitted with it that did is rolled back too (it comes later in fresh_).
    for (TokenBlockId tb : f.created) damage(tb);
    const std::vector<TokenBlockId> table = std::move(rq->second);
    requests_.erase(rq);
    release_sources(f.p.id);
    for (TokenBlockId tb : table) {
      TokenBlock& b = blocks_.at(tb);
      unref(b, tb);
      if (!b.cached) drop(tb, Action::Reason::abort);
    }
    account(f.p, f.a, false);
    ++st_.aborted_admissions;
    if (f.from_queue)
      requeue.push_back(f.p);
    else
      refused.push_back(f.p.id);
  }
  // Damaged blocks nobody references go now: no later request may hit them.
  std::vector<TokenBlockId> keep;
  for (TokenBlockId tb : damaged_) {
    auto it = blocks_.find(tb);
    if (it == blocks_.end()) continue;
    if (it->second.refs > 0)
      keep.push_back(tb);
    else
      drop(tb, Action::Reason::abort);
  }
  damaged_.swap(keep);
  for (auto it = requeue.rbegin(); it != requeue.rend(); ++it) queue_.push_front(*it);
  check_emergency();
  return refused;
}

void BlockManager::check_invariants() const {
  auto fail = [](const std::string& what) { throw std::logic_error("kv invariant: " + what); };
  std::array<std::uint64_t, kTiers> used{}, lockd{};
  std::array<std::size_t, kTiers> victims{};
  std::uint64_t referenced = 0;
  std::unordered_map<TokenBlockId, std::uint32_t> refs, settled_refs;
  std::unordered_set<RequestId> fresh;  // admitted, not settled: may lack slots until settle()
  for (const Fresh& f : fresh_) fresh.insert(f.p.id);
  for (const auto* map : {&requests_, &sources_})
    for (const auto& [rid, table] : *map)
      for (TokenBlockId tb : table) {
        ++refs[tb];
        if (!fresh.contains(rid)) ++settled_refs[tb];
      }
  for (const auto& [id, b] : blocks_) {
    if (b.tier.size() != groups_) fail("tier vector size");
    if (refs[id] != b.refs)
      fail(fmt::format("block {} refs {} but {} tables", id, b.refs, refs[id]));
    if (!b.cached && b.refs == 0) fail("a private block outlived its request");
    if (b.cached) {
      auto it = cache_.find(b.key);
      if (it == cache_.end() || it->second != id) fail("cached block missing from the key map");
    }
    if (b.pinned != (b.cached && pins_.contains(b.key))) fail("pin flag disagrees with pins");
    if (cfg_.reuse == Reuse::blend && b.cached) {
      auto c = by_content_.find(b.content);
      if (c == by_content_.end() || std::count(c->second.begin(), c->second.end(), id) != 1)
        fail(fmt::format("cached block {} missing from the content index", id));
    }
    if (b.refs > 0) referenced += groups_;
    if (b.absent.size() != groups_) fail("absent vector size");
    for (std::uint32_t g = 0; g < groups_; ++g) {
      if (b.absent[g]) {
        if (!b.damaged) fail(fmt::format("block {} group {} absent but not damaged", id, g));
        if (settled_refs[id]) fail(fmt::format("block {} of a running request has no slot", id));
        continue;
      }
      const int t = idx(b.tier[g]);
      ++used[t];
      if (locked(b)) ++lockd[t];
      if (settled_refs[id] && b.tier[g] == Tier::ssd) fail("a referenced block rests on SSD");
      const bool listed = victims_[t].contains({b.prio, b.index, id, g});
      if (listed != evictable(b)) fail(fmt::format("block {} group {} victim listing", id, g));
      victims[t] += listed;
    }
  }
  if (cache_.size() > blocks_.size()) fail("key map larger than the block map");
  std::size_t indexed = 0;
  for (const auto& [content, ids] : by_content_) indexed += ids.size();
  if (indexed > cache_.size()) fail("content index larger than the key map");
  for (int t = 0; t < kTiers; ++t) {
    if (used[t] != used_[t]) fail(fmt::format("tier {} used {} != {}", t, used_[t], used[t]));
    if (lockd[t] != locked_[t])
      fail(fmt::format("tier {} locked {} != {}", t, locked_[t], lockd[t]));
    if (used_[t] > cap_[t]) fail(fmt::format("tier {} over capacity", t));
    if (victims[t] != victims_[t].size()) fail(fmt::format("tier {} stray victims", t));
  }
  if (referenced != referenced_slots_) fail("referenced slots");
  // Note [Two-phase actions]: pending leaves, their claims, and the slots physically held.
  std::array<std::uint64_t, kTiers> leaving{}, claimed{};
  for (const auto& [seq, op] : ops_) {
    if (op.a.seq != seq) fail(fmt::format("action {} filed as {}", op.a.seq, seq));
    if (op.a.kind != Action::Kind::allocate) {
      ++leaving[idx(op.a.from)];
      if (op.claimer) {
        ++claimed[idx(op.a.from)];
        if (!ops_.contains(op.claimer) || ops_.at(op.claimer).claim != seq)
          fail(fmt::format("action {}: its claimer {} does not name it", seq, op.claimer));
      }
    }
    if (op.claim && (!ops_.contains(op.claim) || ops_.at(op.claim).claimer != seq))
      fail(fmt::format("action {}: the leave {} it claims does not name it", seq, op.claim));
    if (op.next && (!ops_.contains(op.next) || ops_.at(op.next).prev != seq))
      fail(fmt::format("action {}: broken slot chain", seq));
  }
  for (const auto& [block, seq] : slot_last_)
    if (!ops_.contains(seq) || ops_.at(seq).a.block != block || ops_.at(seq).next)
      fail(fmt::format("slot {}: last action {} is not pending or not last", block, seq));
  for (int t = 0; t < kTiers; ++t) {
    if (leaving[t] != leaving_[t] || claimed[t] != claimed_[t])
      fail(fmt::format("tier {} leaving {}/{} claimed {}/{}", t, leaving_[t], leaving[t],
                       claimed_[t], claimed[t]));
    if (credits_[t].size() != leaving_[t] - claimed_[t]) fail(fmt::format("tier {} credits", t));
    if (used_[t] + leaving_[t] - claimed_[t] > cap_[t])
      fail(fmt::format("tier {} physically over capacity", t));
  }
  const std::uint64_t limit = overcommit_limit_slots();
  if (limit && referenced_slots_ > limit) fail("overcommit cap exceeded");
  if (pins_.size() * groups_ > cfg_.pin_budget_slots) fail("pin budget exceeded");
}

}  // namespace u3m::kv
