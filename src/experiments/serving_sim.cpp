// serve::ServingSim (issue 6): continuous batching over the tiered KV block manager, costs
// from the hardware profile. docs/serving.md.
#include "u3m/experiments/serving_sim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "u3m/engine/run_observer.hpp"
#include "u3m/kv/recompute.hpp"
#include "u3m/sim/cost.hpp"
#include "u3m/util/error.hpp"
#include "u3m/workload/analytic.hpp"

namespace u3m::experiments {

// Note [KV streaming]
// Compute reads KV in HBM directly and KV in DRAM over the host link, layer
// group by layer group: group g's fetch overlaps group g-1's compute, so an
// iteration ends at max(compute start + compute, last fetch done + one
// group's compute). The fetch is booked on the simulated stack's h2d link
// (SimTransport::book), behind the engine's transfers queued there.
//
// Note [Tensor-parallel group]
// The cards serve as one tensor-parallel group (Megatron-style): weights,
// FLOPs, HBM traffic and KV are split evenly across them (KV by heads), so
// the group is one device with N times the FLOP rate and HBM bandwidth, and
// every KV transfer uses all N host links (or N drives) at once. Each layer
// adds two all-reduces of the iteration's activations (tokens x d_model x 2
// bytes) on the peer mesh: reduce-scatter then all-gather, each card sending
// 1/N of the message to every peer in parallel, 2 * (latency + msg / (N *
// peer bandwidth)). The all-reduces are not overlapped with compute.
//
// Note [Continuous batching]
// Iteration-level scheduling as vLLM with chunked prefill: every iteration
// runs one token for each request that is decoding, then fills the rest of a
// token budget (max_batch_tokens, default 2048) with prefill chunks of
// admitted requests in admission order. A request's first token comes at the
// end of the iteration that finishes its prefill; each later iteration adds
// one token. A request's prefill chunk may span several of its ranges left to
// compute (recomputed blocks, blended blocks' recomputed tokens, the uncached
// tail): one forward pass takes them all, as far as the budget goes. Admission is the block
// manager's: a request reserves all its KV (prompt + output) when admitted and is never preempted,
// so both policies admit under the same rule; hbm-only simply has less room.
//
// Note [Write-behind]
// Demoting a victim copies it out before its slot is reused: HBM -> DRAM
// over d2h, DRAM -> SSD over h2s, HBM -> SSD through host. The store carries
// the moves out on the simulated stack; the take that reuses a slot waits for
// the move that vacates it (Note [Two-phase actions]), so the request whose
// admission made room waits for the HBM copy-out. SSD writes drain from a
// staging buffer in DRAM, as a write-back cache does (the store's write-back
// slots, Note [Write-behind staging] in src/kv/tiered_store.cpp): a move to
// SSD is done for the manager once its data is in the buffer, and waits for
// the SSD only when the buffer is full. `u3m` keeps no KV in DRAM, so its
// buffer is the DRAM share given to KV (dram_kv_fraction of host DRAM);
// policies that keep KV in DRAM get one second of SSD writes (~14 GB for
// 4 x 3.5 GB/s). Spills (Note [DRAM emergency]) go the same way.
//
// Note [Iteration cost]
// One iteration is one roofline op over the group (sim::op_cost): FLOPs =
// 2 * layer params * tokens + attention 4 * heads * head_dim * context per
// token and layer + lm_head for each sequence that emits a token; bytes =
// weights once + the HBM-resident KV the batch reads + the KV it writes.
// Launch overhead is charged for 8 kernels per layer (norm, qkv, attention,
// o, norm, gate/up, activation, down). Plus the all-reduces and the KV
// streaming above.

namespace {

constexpr int kKernelsPerLayer = 8;

double per_token_linear_flops(const workload::ModelShape& m) {
  return 2.0 * static_cast<double>(workload::analytic::layer_param_count(m)) * m.layers;
}
double attn_flops_per_ctx(const workload::ModelShape& m) {
  return 4.0 * m.heads * m.head_dim() * m.layers;
}
double lm_head_flops(const workload::ModelShape& m) {
  return 2.0 * static_cast<double>(m.vocab) * m.d_model;
}
double weight_bytes(const workload::ModelShape& m) {
  return 2.0 * static_cast<double>(workload::analytic::param_count(m));
}

// The work of one iteration.
struct Work {
  double tokens = 0, flops = 0, hbm_bytes = 0, host_kv_bytes = 0;
  std::uint32_t seqs = 0;
};

// Seconds of compute for one iteration (Note [Iteration cost]), all-reduces included.
double iteration_compute_s(const ServeScenario& s, const Work& w) {
  const double n = s.cards;
  const double bytes = weight_bytes(s.shape) + w.hbm_bytes;
  double t = sim::op_cost(s.hw, w.flops / n, bytes / n).total_s +
             (kKernelsPerLayer * s.shape.layers - 1) * s.hw.device.launch_overhead.si;
  if (s.cards > 1) {
    // Two all-reduces per layer (Note [Peer-link cost] in sim/cost.hpp).
    const double msg = w.tokens * s.shape.d_model * 2.0;
    t += 2.0 * s.shape.layers * sim::all_reduce_s(s.hw, msg, s.cards);
  }
  return t;
}

// Adds `tokens` tokens at positions [begin, begin + tokens) to the work.
void add_tokens(const ServeScenario& s, Work& w, double begin, double tokens, bool emits) {
  const double kv_tok = static_cast<double>(workload::analytic::kv_bytes_per_token(s.shape));
  w.tokens += tokens;
  const double ctx_sum = tokens * (2 * begin + tokens - 1) / 2;  // attention over the prefix
  w.flops += tokens * per_token_linear_flops(s.shape) + ctx_sum * attn_flops_per_ctx(s.shape);
  if (emits) {
    w.flops += lm_head_flops(s.shape);
    ++w.seqs;
  }
  w.hbm_bytes += kv_tok * (begin + tokens);  // read the context once, write the new tokens
}

}  // namespace
double prefill_seconds(const ServeScenario& s, std::uint64_t prompt_tokens) {
  double t = 0;
  for (std::uint64_t b = 0; b < prompt_tokens; b += s.max_batch_tokens) {
    const std::uint64_t n = std::min<std::uint64_t>(s.max_batch_tokens, prompt_tokens - b);
    Work w;
    add_tokens(s, w, static_cast<double>(b), static_cast<double>(n), b + n == prompt_tokens);
    t += iteration_compute_s(s, w);
  }
  return t;
}

// Note [Serving bound]
// Whatever a policy reuses, each output token after the first is a decode step that reads the
// KV of its whole context, each iteration reads the weights once, and every segment's first
// occurrence in the trace must be computed once (no cache holds it yet). On a group of N cards
// with HBM bandwidth BW and achievable FLOP rate R (peak x matmul efficiency) each:
//   M = (sum_r sum_{j=1..o_r-1} (p_r + j) * kv  +  I * W) / (N * BW)     decode's memory reads
//   C = (U + sum_r (o_r - 1)) * L / (N * R)                               FLOPs that must run
//   T = max(M, C) + I * F,   I = ceil(sum_r (o_r - 1) / max_running)
// with p_r and o_r a request's prompt and output tokens, kv the KV bytes of one token (all
// layers), W the 16-bit weights, U the tokens of segments seen for the first time (at least one
// per request: its last prompt token), L a token's linear FLOPs (attention and lm_head left
// out), F an iteration's fixed costs: its kernel launches (8 per layer, Note [Iteration
// cost], as iteration_compute_s charges them) and the latency of its 2 all-reduces per layer.
// An iteration costs max(its compute, its memory) + its fixed costs, and a sum of maxima is at
// least the maximum of the sums, so busy time >= T; makespan >= busy, so no policy's goodput
// (met / makespan) exceeds requests / T. With several instances the work splits at best evenly.
// Everything else is free: reused prefill, KV moves, all-reduce bytes, attention.
ServeBound serving_bound(const ServeScenario& s) {
  const double kv = double(workload::analytic::kv_bytes_per_token(s.shape));
  const double w = weight_bytes(s.shape);
  ServeBound b;
  double steps = 0;
  std::unordered_set<std::string> seen;
  for (const workload::ServeRequest& r : s.requests) {
    const double p = double(r.prompt_tokens()), o = std::max(1.0, double(r.output_tokens));
    b.kv_read_bytes += ((o - 1) * p + (o - 1) * o / 2) * kv;
    steps += o - 1;
    std::uint64_t fresh = 0;
    for (const workload::PromptSegment& seg : r.prompt)
      if (seen.insert(seg.id).second) fresh += seg.tokens;
    b.unique_tokens += std::max<std::uint64_t>(fresh, 1);
  }
  const double iterations = std::ceil(steps / s.max_running);
  b.weight_read_bytes = iterations * w;
  const double n = s.cards;
  b.memory_s = (b.kv_read_bytes + b.weight_read_bytes) / (n * s.hw.device.hbm_bandwidth.si);
  b.compute_s = (double(b.unique_tokens) + steps) * per_token_linear_flops(s.shape) /
                (n * s.hw.device.peak_flops.si * s.hw.device.matmul_efficiency.si);
  double fixed = (kKernelsPerLayer * s.shape.layers - 1) * s.hw.device.launch_overhead.si;
  if (s.cards > 1) fixed += 2.0 * s.shape.layers * sim::all_reduce_s(s.hw, 0, s.cards);
  b.fixed_s = iterations * fixed;
  b.busy_s = (std::max(b.memory_s, b.compute_s) + b.fixed_s) / s.instances;
  b.goodput_rps = b.busy_s > 0 ? double(s.requests.size()) / b.busy_s : 0;
  return b;
}

double decode_step_seconds(const ServeScenario& s, std::uint64_t context_tokens) {
  Work w;
  add_tokens(s, w, static_cast<double>(context_tokens), 1, true);
  return iteration_compute_s(s, w);
}

}  // namespace u3m::experiments

namespace u3m::serve {

using namespace experiments;
using engine::Link;
using kv::Tier;

namespace {
const ServeScenario& validated(const ServeScenario& s) {
  s.validate();
  return s;
}
int li(Link l) {
  return static_cast<int>(l);
}
}  // namespace

// Note [Serving on the store]
// The simulator decides nothing about KV placement and moves no bytes itself: the block
// manager decides, and kv::TieredStore carries its actions out on the engine over a
// simulated stack (sim::SimStack: the engine on fake addresses, SimTransport's links, this
// run's VirtualTime), the same store and engine the real runtime uses (Note [Either stack]
// in src/kv/tiered_store.cpp). The store runs non-blocking (Note [Non-blocking calls]):
// admissions come back at once, the loop polls the store after every clock event, and a
// request's prefill starts once its blocks are in place (TieredStore::ready). The links are
// the profile's, times the cards (Note [Tensor-parallel group]): host link x N each way, the
// drives of N cards for the SSD, reads and writes on their own schedules (Note [SSD queues]).
// Every transfer books its link when the engine starts it, and the engine starts every one at
// once (link_slots unbounded), so each link is one FIFO of the one link model (Note [Link
// model] in mem/link.hpp), which is what recompute-or-fetch reads as backlog.
//
// Note [SSD queues]
// Reads (s2h) and writes (h2s) of the SSD have their own schedules here (ssd_shared =
// false), unlike SimTransport's default shared one: almost every write is write-behind (Note
// [Write-behind]), and a serving system lets a read that a request waits for go ahead of
// them; NVMe drives serve both directions at once.
ServingSim::ServingSim(const ServeScenario& s, std::uint64_t stop_after, Fleet& fleet)
    : s_(validated(s)), pol_(serve_policy(s.policy)), stop_after_(stop_after), fleet_(fleet) {
  res_.policy = s.policy;
  res_.slo = s.effective_slo();
  const auto& hw = s.hw;
  const double n = s.cards;
  // Note [Pooled KV]: each card has nics_per_node / cards_per_node of the node's NICs.
  net_rx_.model = {hw.network.bandwidth_practical.si * hw.nics_per_node.si /
                       hw.node.cards_per_node.si * n,
                   hw.network.latency.si};
  net_tx_.model = net_rx_.model;
  block_bytes_ = workload::analytic::kv_bytes_per_token(s.shape) * block_tokens();
  eff_flops_ = hw.device.peak_flops.si * hw.device.matmul_efficiency.si * n;
  const kv::KvConfig c = make_config();
  const double slot = double(geo_.slot_bytes());
  sim::SimTransportConfig links = sim::links_from_profile(hw, 0, s.cards);
  for (Link l : {Link::d2h, Link::h2d}) links.links[li(l)].bandwidth *= n;
  kv::TieredStoreOptions o;
  o.blocking = false;
  // Promotions from SSD to HBM stage through host: enough at once that the links, not the
  // staging slots, set their pace.
  o.staging_slots = 64;
  if (pol_.ssd) {
    // Note [Write-behind]: one second of SSD writes, or all of the DRAM share without a DRAM tier.
    const double staging = pol_.dram ? links.links[li(Link::h2s)].bandwidth * 1.0
                                     : n * hw.host.dram_capacity.si * s.dram_kv_fraction;
    o.writeback_slots = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(staging / slot));
  }
  engine::StackSpec spec = kv::TieredStore::stack_spec(c, o);
  spec.links = links.links;
  spec.engine.link_slots.fill(std::numeric_limits<unsigned>::max());
  stack_ = std::make_unique<sim::SimStack>(spec, clock_, nullptr, /*ssd_shared=*/false);
  auto wait = [this](std::uint64_t seen) {
    while (stack_->engine.epoch() == seen)
      if (!clock_.run_next()) return mem::Status::out_of_memory;
    return mem::Status::ok;
  };
  store_ = std::make_unique<kv::TieredStore>(c, kv::StoreStack{stack_->engine, wait, false}, o);
  bm().on_alert([this](const kv::KvAlert& a) {
    if (a.emergency && res_.first_alert_s < 0) res_.first_alert_s = now_;
  });
  if (s_.observer) stack_->engine.set_observer(s_.observer, 0);
}

ServingSim::~ServingSim() {
  store_.reset();     // drains what is pending
  clock_.run_all();   // the transport must outlive the events it scheduled
}

kv::KvConfig ServingSim::make_config() {
  geo_ = kv::KvGeometry::of(s_.shape, block_tokens(), s_.layers_per_group);
  kv::KvConfig c;
  c.geometry = geo_;
  c.reuse = pol_.reuse;
  if (pol_.ssd_admission) {
    c.ssd_admit_after = s_.ssd_admit_after;
    c.ssd_write_budget = pol_.ssd;
  }
  if (pol_.cache_aware) c.max_bypass = s_.sched_bypass;
  const double slot = static_cast<double>(geo_.slot_bytes());
  const double n = s_.cards;
  const double kv_hbm =
      n * s_.hw.device.hbm_capacity.si * s_.hbm_utilization - weight_bytes(s_.shape);
  if (kv_hbm <= 0)
    input_error("--model", "{} ({:.1f} GB of 16-bit weights) leaves no HBM for KV on {} x {}",
                s_.shape.name, weight_bytes(s_.shape) / 1e9, s_.cards, s_.hw.name);
  if (kv_hbm < slot)  // the weights fit; one block of this many tokens does not
    input_error("--block-tokens",
                "{} tokens make a KV slot of {:.1f} GB, more than the {:.1f} GB of HBM the "
                "weights leave on {} x {}",
                block_tokens(), slot / 1e9, kv_hbm / 1e9, s_.cards, s_.hw.name);
  c.capacity_slots[0] = static_cast<std::uint64_t>(kv_hbm / slot);
  if (pol_.dram)
    c.capacity_slots[1] =
        static_cast<std::uint64_t>(n * s_.hw.host.dram_capacity.si * s_.dram_kv_fraction / slot);
  if (pol_.ssd) c.capacity_slots[2] = static_cast<std::uint64_t>(n * s_.ssd_bytes() / slot);
  c.home = pol_.design_homes ? kv::KvConfig::default_homes(geo_)
                             : std::vector<Tier>(geo_.groups(), Tier::device);
  c.overcommit = pol_.overcommit;
  c.policy = pol_.eviction;
  c.expected_request_tokens = 2048;
  return c;
}

void ServingSim::advance(double t) {
  const std::uint64_t to = std::max(clock_.now_ns(), mem::seconds_to_ns(t));
  for (auto next = clock_.next_time(); next && *next <= to; next = clock_.next_time()) {
    clock_.run_next();
    poll();
  }
  clock_.run_until(to);
}

void ServingSim::poll() {
  // The simulated stack injects no faults, so no admission can be rolled back.
  if (!store_->poll().empty())
    throw std::logic_error("serve: an admission was rolled back on a stack without faults");
  planned_ = {};  // what was chosen is on the links now
}

double ServingSim::fetch_s(Tier from, Tier to, std::uint64_t bytes) const {
  const sim::SimTransport& tr = stack_->transport;
  double t = 0;
  auto hop = [&](Link l) {
    t = std::max(t, tr.ahead_s(l) + planned_[li(l)]) + tr.config().links[li(l)].seconds(bytes);
  };
  if (from == Tier::ssd) hop(Link::s2h);
  if (to == Tier::device) hop(Link::h2d);
  return t;
}

// Recompute or fetch (Note [Recompute or fetch] in src/kv/recompute.cpp): per promoted
// token block of the hit run, kv::RecomputeOrFetch picks; the simulator prices it from the
// profile and the stack's links. A recomputed block joins the request's prefill and the
// store writes it in place (Note [Recompute in place]), through the host link when its slot
// is in DRAM. Hits already in HBM, and DRAM hits that found no HBM room, are used in place
// (the latter streamed, Note [KV streaming]). The store starts the fetches at the next poll.
void ServingSim::admitted(const std::vector<kv::Admission>& adms) {
  std::unordered_map<kv::TokenBlockId, std::vector<const kv::Action*>> promos;
  if (!adms.empty())
    for (const kv::Action* a : store_->emitted())
      if (a->kind == kv::Action::Kind::move && a->reason == kv::Action::Reason::promote)
        promos[a->block / kv::kMaxGroups].push_back(a);
  const sim::SimTransport& tr = stack_->transport;
  auto link = [&](Link l) { return tr.config().links[li(l)]; };
  const kv::RecomputeCosts costs{
      .recompute_s = [&](std::uint32_t i) { return geo_.recompute_flops(i) / eff_flops_; },
      .fetch_s = [&](Tier f, Tier t, std::uint64_t b) { return fetch_s(f, t, b); },
      .hold_s = [&](Tier f, std::uint64_t b) {
        return link(f == Tier::ssd ? Link::s2h : Link::h2d).hold_s(b);
      }};
  for (const kv::Admission& a : adms) {
    Req& q = reqs_[a.id];
    q.running = true;
    running_.push_back(a.id);
    res_.max_concurrency = std::max<std::uint64_t>(res_.max_concurrency, running_.size());
    const auto& table = bm().table(a.id);
    const kv::PromptBlocks& lay = q.layout;
    const std::uint64_t hit = std::min<std::uint64_t>(a.hit_tokens, q.prompt - 1);
    res_.per_request[a.id].hit_tokens = a.hit_tokens;
    // Note [Pooled KV]: the blocks after the local hit run that the pool holds are fetched
    // over the NIC into the slots the manager gave them, and the prefill skips them (the last
    // prompt token is always computed, for the first output token).
    std::uint64_t pooled = 0;
    if (fleet_.pool && hit == a.hit_tokens) {
      std::size_t to = a.hit_blocks;  // blocks wholly before the last prompt token
      while (to < lay.keys.size() && lay.start[to] + lay.tokens[to] < q.prompt) ++to;
      const std::size_t got = fleet_.pool->lookup(lay.keys, a.hit_blocks, to, clock_.now_ns());
      if (got) {
        for (std::size_t k = a.hit_blocks; k < a.hit_blocks + got; ++k) pooled += lay.tokens[k];
        q.fetch_ready_ns = net_rx_.book(clock_.now_ns(),
                                        pooled * workload::analytic::kv_bytes_per_token(s_.shape));
        res_.pool_hit_blocks += got;
        res_.pool_hit_tokens += pooled;
        res_.per_request[a.id].hit_tokens += pooled;
      }
    }
    std::vector<std::pair<std::uint64_t, std::uint64_t>> recompute;
    kv::RecomputeOrFetch choice(costs, pol_.recompute_choice);
    for (std::uint32_t i = 0; i < a.prompt_full_blocks && i < table.size(); ++i) {
      auto it = promos.find(table[i]);
      if (it == promos.end()) continue;
      // A block past the hit run (adopted after a miss) is computed by the prefill anyway.
      const std::uint64_t b0 = lay.start[i];
      const bool in_prefill = b0 >= hit;
      if (in_prefill || choice.choose(i, it->second) == kv::KvSource::recompute) {
        if (!in_prefill) {
          recompute.push_back({b0, std::min<std::uint64_t>(b0 + lay.tokens[i], hit)});
          res_.per_request[a.id].recomputed_tokens += recompute.back().second - b0;
        }
        for (const kv::Action* m : it->second)
          if (m->to == Tier::host) stack_->transport.book(Link::d2h, m->bytes);
        store_->recompute(a.id, i);
      } else {
        for (const kv::Action* m : it->second) {
          if (m->from == Tier::ssd) planned_[li(Link::s2h)] += link(Link::s2h).hold_s(m->bytes);
          if (m->to == Tier::device) planned_[li(Link::h2d)] += link(Link::h2d).hold_s(m->bytes);
        }
      }
      promos.erase(it);
    }
    q.todo = std::move(recompute);
    // Note [Blend cost]: a blended block computes only its recomputed tokens (at its start);
    // the rest of it is copied from its source when the request is ready.
    std::uint64_t from = hit + pooled;
    q.blends.clear();
    for (const kv::Admission::Blend& b : a.blends) {
      const std::uint64_t b0 = lay.start[b.index], n = lay.tokens[b.index];
      if (b0 < from) continue;  // already fetched from the pool
      const std::uint64_t r = kv::blend_recompute_tokens(static_cast<std::uint32_t>(n),
                                                         s_.blend_fraction, s_.shape.layers);
      if (b0 + r > from) q.todo.push_back({from, b0 + r});
      from = b0 + n;
      q.blends.push_back(b);
      res_.per_request[a.id].blend_tokens += n;
      res_.per_request[a.id].recomputed_tokens += r;
    }
    if (from < q.prompt)
      q.todo.push_back({from, q.prompt});
    else if (q.todo.empty() || q.todo.back().second < q.prompt)  // the first token needs the last
      q.todo.push_back({q.prompt - 1, q.prompt});
    q.copied = q.blends.empty();
    // A running request's slots rest where the plan says once its actions are done (only
    // unreferenced blocks move after that).
    q.host_prefix.assign(table.size() + 1, 0.0);
    for (std::size_t i = 0; i < table.size(); ++i) {
      double h = 0;
      for (std::uint32_t g = 0; g < geo_.groups(); ++g)
        if (bm().slot_tier(table[i], g) == Tier::host) h += double(geo_.group_bytes(g));
      q.host_prefix[i + 1] = q.host_prefix[i] + h;
    }
  }
  poll();
}

// Note [Blend cost] (the rule is kv::blend_recompute_tokens): once the request's blocks and
// its sources are in place, each blended block's slots are copied from its source's where they
// rest: over the host link when the two are in different memory tiers, within HBM otherwise
// (read and write, charged to the request's first prefill iteration at HBM bandwidth); a copy
// within DRAM is not charged (a host memcpy, beside the host link's rate). Only the segment's
// real tokens are copied, not the rest of a partial block's slot. Then the copied keys are
// re-rotated to their new positions in place: K, half of the KV, read and written once. The
// request's prefill waits until the copies are through; its recomputed tokens are in its todo.
void ServingSim::copy_blends(Req& q, std::size_t i) {
  q.copied = true;
  const auto& table = bm().table(i);
  double h2d = 0, d2h = 0, hbm = 0;
  for (const kv::Admission::Blend& b : q.blends) {
    const double share = double(q.layout.tokens[b.index]) / block_tokens();
    for (std::uint32_t g = 0; g < geo_.groups(); ++g) {
      const Tier from = bm().slot_tier(b.source, g), to = bm().slot_tier(table[b.index], g);
      const double bytes = double(geo_.group_bytes(g)) * share;
      if (from == to)
        hbm += to == Tier::device ? 2 * bytes : 0;
      else
        (to == Tier::device ? h2d : d2h) += bytes;
    }
  }
  hbm += double(res_.per_request[i].blend_tokens) *
         double(workload::analytic::kv_bytes_per_token(s_.shape));  // re-rotation of K
  std::uint64_t done = 0;
  if (h2d > 0)
    done = std::max(done, stack_->transport.book(Link::h2d, static_cast<std::uint64_t>(h2d)));
  if (d2h > 0)
    done = std::max(done, stack_->transport.book(Link::d2h, static_cast<std::uint64_t>(d2h)));
  q.fetch_ready_ns = std::max(q.fetch_ready_ns, done);
  q.blend_hbm_bytes += hbm;
}

// Note [Pooled KV]
// With a shared pool (ServeScenario::shared_pool), a remote KV tier sits below every
// instance's own HBM / DRAM / SSD: a Mooncake-Store-like pool of the nodes' DRAM
// (pool.capacity_per_node of each node the instances occupy), holding token blocks by content
// key (the chain keys of kv::prompt_blocks: equal prefixes give equal keys on every instance), LRU.
// It is written through: when an instance's prefill has computed a prompt, the prompt's full blocks
// the pool lacks go out as one transfer on the instance's NIC (tx); they are readable by every
// instance once it is through. At admission, the blocks after the instance's own hit run that
// the pool holds are a pool hit: they are fetched as one transfer on the instance's NIC (rx),
// by RDMA straight into the slots the block manager gave them (GPUDirect into HBM, or into
// DRAM), and the request's prefill starts after them and once they are in. To the block
// manager they are blocks it created, so they become local cache hits for later requests
// (promoted to the local tiers). A NIC link is the one link model (mem::LinkSchedule over a
// mem::LinkModel, as the stack's links): bandwidth = the instance's cards x nics_per_node /
// cards_per_node x network.bandwidth_practical, latency = network.latency, rx and tx
// independent. Not modelled: contention at the NIC of the node holding a block (a fetch is
// charged to the reader's NIC only), a pool lookup's metadata round trip beyond the transfer
// latency, recompute-or-fetch for pool blocks (they are always fetched), and the pool's DRAM
// being taken from the nodes' DRAM tier (the profile's assumption leaves room for both).
std::size_t KvPool::lookup(const std::vector<std::uint64_t>& keys, std::size_t from,
                           std::size_t to, std::uint64_t t_ns) {
  std::size_t got = 0;
  for (std::size_t i = from; i < std::min(to, keys.size()); ++i, ++got) {
    auto it = map_.find(keys[i]);
    if (it == map_.end() || it->second.visible_ns > t_ns) break;
    lru_.splice(lru_.end(), lru_, it->second.lru);
  }
  return got;
}

void KvPool::put(std::uint64_t key, std::uint64_t visible_ns) {
  if (map_.contains(key)) return;
  lru_.push_back(key);
  map_[key] = {visible_ns, std::prev(lru_.end())};
  while (map_.size() > capacity_) {
    map_.erase(lru_.front());
    lru_.pop_front();
    ++evicted_;
  }
  peak_ = std::max<std::uint64_t>(peak_, map_.size());
}

std::uint64_t ServingSim::NetLink::book(std::uint64_t now_ns, std::uint64_t bytes) {
  const mem::LinkSchedule::Slot slot = schedule.book(now_ns, bytes, model.bandwidth);
  stats.bytes += bytes;
  ++stats.transfers;
  stats.busy_s += double(slot.free_ns - slot.start_ns) / 1e9;
  return slot.free_ns + mem::seconds_to_ns(model.latency_s);
}

// Note [Pooled KV]: written through once the prefill has computed them, as one transfer.
void ServingSim::put_prompt(Req& q) {
  std::vector<std::uint64_t> fresh;
  for (std::uint64_t k : q.layout.keys)
    if (!fleet_.pool->holds(k)) fresh.push_back(k);
  if (fresh.empty()) return;
  const std::uint64_t done = net_tx_.book(clock_.now_ns(), fresh.size() * block_bytes_);
  for (std::uint64_t k : fresh) fleet_.pool->put(k, done);
  res_.pool_put_blocks += fresh.size();
}

void ServingSim::submit(std::size_t i) {
  kv::Admission a;
  switch (store_->submit(i, *reqs_[i].r, &a)) {
    case kv::SubmitResult::admitted:
      admitted({a});
      break;
    case kv::SubmitResult::queued:
      break;
    case kv::SubmitResult::refused_queue_full:
    case kv::SubmitResult::aborted:  // never here: the simulated stack injects no faults
      backlog_.push_back(i);
      ++res_.retried_submits;
      break;
    case kv::SubmitResult::too_large:
      reqs_[i].done = true;
      res_.per_request[i].too_large = true;
      ++res_.too_large;
      miss();
      break;
  }
}

void ServingSim::retry_backlog() {
  while (!backlog_.empty()) {
    const std::size_t i = backlog_.front();
    backlog_.pop_front();
    const std::size_t before = backlog_.size();
    submit(i);
    if (backlog_.size() > before) {  // refused again: it goes back to the front
      backlog_.pop_back();
      backlog_.push_front(i);
      --res_.retried_submits;  // counted once per request
      break;
    }
  }
}

void ServingSim::finish(std::size_t i) {
  Req& q = reqs_[i];
  q.done = true;
  q.running = false;
  ServeRequestResult& r = res_.per_request[i];
  r.finish_s = now_;
  const ServeSlo slo = res_.slo;
  const double ttft_ms = 1e3 * (r.first_token_s - r.arrival_s);
  const double tpot_ms = q.output > 1 ? 1e3 * (r.finish_s - r.first_token_s) / (q.output - 1) : 0.0;
  r.met = ttft_ms <= 1e3 * r.ttft_slo_s && tpot_ms <= slo.tpot_ms;
  if (!r.met && !q.missed) miss();
  ++res_.finished;
  admitted(store_->finish(i));
  retry_backlog();
}

void ServingSim::spill() {
  // Note [DRAM emergency]: the budget is spill_rate * elapsed time, no more.
  if (!bm().emergency()) {
    spill_credit_ = 0;
    last_spill_ = now_;
    return;
  }
  // Credit is capped at one second's worth, so a long wait for victims does not burst.
  spill_credit_ = std::min(spill_credit_ + s_.spill_rate * (now_ - last_spill_),
                           std::max(s_.spill_rate, double(geo_.slot_bytes())));
  last_spill_ = now_;
  const std::uint64_t moved = store_->spill(static_cast<std::uint64_t>(spill_credit_));
  spill_credit_ -= static_cast<double>(moved);
  poll();
}

// Note [SSD admission] in src/kv/block_manager.cpp: SSD writes are granted at the drives'
// rated pace, rated drive writes per day x the group's SSD bytes / 86,400 s, so the run wears
// them at most at their rating (Note [SSD wear]); unspent credit holds up to 10 s of it.
void ServingSim::grant_ssd_credit() {
  const double dt = now_ - last_credit_;
  last_credit_ = now_;
  if (!bm().config().ssd_write_budget || dt <= 0) return;
  const double rate = s_.rated_dwpd() * s_.ssd_bytes() * s_.cards / 86400.0;
  credit_carry_ += rate * dt;
  const double whole = std::floor(credit_carry_);
  credit_carry_ -= whole;
  bm().add_ssd_credit(static_cast<std::uint64_t>(whole),
                      static_cast<std::uint64_t>(std::max(10 * rate, double(geo_.slot_bytes()))));
}

void ServingSim::start() {
  const std::size_t n = s_.requests.size();
  reqs_.resize(n);
  res_.per_request.resize(n);
  res_.requests = n;
  const std::vector<double> arrival_ms = spread_arrivals(s_.requests, s_.spread_ties);
  for (std::size_t i = 0; i < n; ++i) {
    Req& q = reqs_[i];
    q.r = &s_.requests[i];
    q.arrival = arrival_ms[i] / 1e3 / s_.rate_scale;
    q.prompt = q.r->prompt_tokens();
    q.output = std::max<std::uint32_t>(1, q.r->output_tokens);
    q.layout = kv::prompt_blocks(q.r->prompt, block_tokens(), pol_.reuse);
    res_.per_request[i].arrival_s = q.arrival;
    res_.per_request[i].ttft_slo_s = std::max(
        res_.slo.ttft_ms / 1e3, res_.slo.ttft_prefill_factor > 0
                                    ? res_.slo.ttft_prefill_factor * prefill_seconds(s_, q.prompt)
                                    : 0.0);
  }
  now_ = n ? reqs_[0].arrival : 0;
  advance(now_);
  last_spill_ = last_credit_ = now_;
}

bool ServingSim::step() {
  if (stopped()) return false;
  const std::size_t n = reqs_.size();
  const double B = block_tokens();
  while (next_ < n && reqs_[next_].arrival <= now_) {
    if (backlog_.empty())
      submit(next_);
    else
      backlog_.push_back(next_);  // behind earlier refused requests
    ++next_;
  }
  grant_ssd_credit();
  spill();
  // Note [Continuous batching]: decodes first, then prefill chunks.
  Work w;
  batch_.clear();  // (request, prefill tokens taken; 0 = one decode token)
  std::uint64_t budget = s_.max_batch_tokens;
  bool waiting = false;  // a prefill waits for its blocks' actions
  std::uint64_t pool_wait = std::numeric_limits<std::uint64_t>::max();  // earliest pool fetch
  auto streamed = [&](const Req& q, double tokens) {  // DRAM KV under the first `tokens`
    const auto blocks = static_cast<std::size_t>(std::ceil(tokens / B));
    return q.host_prefix[std::min(q.host_prefix.size() - 1, blocks)];
  };
  for (std::size_t i : running_) {
    const Req& q = reqs_[i];
    if (!q.todo.empty() || batch_.size() >= s_.max_running || budget == 0) continue;
    const double ctx = double(q.prompt + q.generated - 1);
    add_tokens(s_, w, ctx, 1, true);
    w.host_kv_bytes += streamed(q, ctx + 1);
    batch_.push_back({i, 0});
    --budget;
  }
  for (std::size_t i : running_) {
    const Req& q = reqs_[i];
    if (q.todo.empty() || budget == 0 || batch_.size() >= s_.max_running) continue;
    if (!q.ready && !(reqs_[i].ready = store_->ready(i))) {
      waiting = true;
      continue;
    }
    if (!q.copied) copy_blends(reqs_[i], i);
    // Note [Pooled KV] / Note [Blend cost]: its pool fetch or blend copies are not through.
    if (q.fetch_ready_ns > clock_.now_ns()) {
      pool_wait = std::min(pool_wait, q.fetch_ready_ns);
      continue;
    }
    w.hbm_bytes += q.blend_hbm_bytes;  // copies within HBM and re-rotation, in its first chunk
    reqs_[i].blend_hbm_bytes = 0;
    // Its ranges left, in order, as far as the budget goes: one forward pass computes them
    // all (each range reads its context; the DRAM KV under the last is streamed once).
    std::uint64_t take = 0, reached = 0;
    for (std::size_t k = 0; k < q.todo.size() && budget > 0; ++k) {
      const auto [b, e] = q.todo[k];
      const std::uint64_t t = std::min<std::uint64_t>(budget, e - b);
      add_tokens(s_, w, double(b), double(t), k + 1 == q.todo.size() && b + t == e);
      budget -= t;
      take += t;
      reached = b + t;
    }
    w.host_kv_bytes += streamed(q, double(reached));
    batch_.push_back({i, take});
  }
  if (batch_.empty()) {
    double t = std::numeric_limits<double>::infinity();
    if (next_ < n) t = reqs_[next_].arrival;
    if (waiting)
      if (auto e = clock_.next_time()) t = std::min(t, double(*e) / 1e9);
    if (pool_wait != std::numeric_limits<std::uint64_t>::max())
      t = std::min(t, double(pool_wait) / 1e9);
    if (!std::isfinite(t)) {
      if (!running_.empty() || !backlog_.empty() || bm().queue_length())
        throw std::logic_error("serve: requests wait but nothing can run");
      return false;
    }
    if (waiting && s_.observer && t > now_)  // the next iteration waits for KV blocks
      s_.observer->stall(0, res_.iterations, res_.iterations, now_, t);
    now_ = std::max(now_, t);
    advance(now_);
    return true;
  }
  // HBM-resident KV is read at HBM speed; DRAM-resident KV is streamed.
  // Whole DRAM blocks against a per-token count: never below zero.
  w.hbm_bytes = std::max(0.0, w.hbm_bytes - w.host_kv_bytes);
  const double compute = iteration_compute_s(s_, w);
  double end = now_ + compute;
  if (w.host_kv_bytes > 0) {  // Note [KV streaming], on the stack's h2d link
    const std::uint64_t fetched =
        stack_->transport.book(Link::h2d, static_cast<std::uint64_t>(w.host_kv_bytes));
    end = std::max(end, double(fetched) / 1e9 + compute / geo_.groups());
  }
  if (s_.observer) {  // the iteration as one op of the group, its KV streaming as a stall
    bool prefill = false, decode = false;
    for (const auto& [i, take] : batch_) (take ? prefill : decode) = true;
    const double n = s_.cards;
    const engine::OpWork work{w.flops / n, (weight_bytes(s_.shape) + w.hbm_bytes) / n};
    s_.observer->op(0, res_.iterations, res_.iterations,
                    prefill && decode ? "prefill+decode"
                    : prefill         ? "prefill"
                                      : "decode",
                    work, now_, now_ + compute);
    if (end > now_ + compute)
      s_.observer->stall(0, res_.iterations, res_.iterations, now_ + compute, end);
  }
  res_.busy_s += end - now_;
  res_.kv_wait_s += std::max(0.0, end - now_ - compute);
  ++res_.iterations;
  if (s_.cards > 1) {
    const double msg = w.tokens * s_.shape.d_model * 2.0;
    res_.peer.bytes +=
        static_cast<std::uint64_t>(2.0 * s_.shape.layers * 2.0 * msg * (s_.cards - 1) / s_.cards);
    res_.peer.transfers += 4ull * s_.shape.layers * (s_.cards - 1);
  }
  now_ = end;
  advance(now_);
  // Apply the iteration's progress, then retire finished requests.
  std::vector<std::size_t> finished;
  for (const auto& [i, take] : batch_) {
    Req& q = reqs_[i];
    if (take == 0) {
      if (++q.generated >= q.output) finished.push_back(i);
      continue;
    }
    if (!q.blends.empty()) {  // Note [Segment reuse]: copied in this iteration, sources let go
      store_->prefilled(i);
      q.blends.clear();
    }
    for (std::uint64_t left = take; left > 0;) {
      auto& front = q.todo.front();
      const std::uint64_t t = std::min(left, front.second - front.first);
      front.first += t;
      left -= t;
      if (front.first == front.second) q.todo.erase(q.todo.begin());
    }
    if (q.todo.empty()) {  // prefill done: the first token
      ServeRequestResult& r = res_.per_request[i];
      r.first_token_s = now_;
      q.generated = 1;
      if (now_ - r.arrival_s > r.ttft_slo_s) {  // count it now: an earlier stop
        q.missed = true;
        miss();
      }
      if (fleet_.pool) put_prompt(q);
      if (q.generated >= q.output) finished.push_back(i);
    }
  }
  for (std::size_t i : finished) {
    running_.erase(std::find(running_.begin(), running_.end(), i));
    finish(i);
  }
  return !(next_ >= n && running_.empty() && backlog_.empty() && bm().queue_length() == 0);
}

ServeResult ServingSim::result() {
  res_.stopped_early = stopped();
  if (!res_.stopped_early) store_->drain();  // the write-behind still under way: its bytes count
  res_.kv = bm().stats();
  for (int t = 0; t < kv::kTiers; ++t) {
    const kv::TierUse u = bm().use(static_cast<Tier>(t));
    res_.capacity_bytes[t] = u.capacity * geo_.slot_bytes();
    res_.peak_bytes[t] = u.peak * geo_.slot_bytes();
  }
  for (Link l : {Link::d2h, Link::h2d, Link::h2s, Link::s2h}) {
    const sim::SimLinkStats& st = stack_->transport.link(l);
    res_.links[li(l)] = {st.bytes, st.transfers, double(st.busy_ns) / 1e9};
  }
  res_.net_rx = net_rx_.stats;
  res_.net_tx = net_tx_.stats;
  res_.spilled_bytes = res_.kv.spilled_bytes;
  res_.alerts = res_.kv.alerts;
  return res_;
}

}  // namespace u3m::serve

namespace u3m::experiments {

void summarize_serving(const ServeScenario& s, ServeResult& r) {
  const std::size_t n = r.per_request.size();
  std::vector<double> ttft, tpot;
  double first = n ? r.per_request[0].arrival_s : 0, last_arrival = first, last_finish = first;
  std::uint64_t recomputed = 0, reused = 0;
  r.met = 0;
  r.blend_tokens = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const ServeRequestResult& q = r.per_request[i];
    recomputed += q.recomputed_tokens;
    reused += q.hit_tokens + q.blend_tokens;
    r.blend_tokens += q.blend_tokens;
    last_arrival = std::max(last_arrival, q.arrival_s);
    if (q.finish_s < 0) continue;
    last_finish = std::max(last_finish, q.finish_s);
    ttft.push_back(1e3 * (q.first_token_s - q.arrival_s));
    const std::uint32_t output = std::max<std::uint32_t>(1, s.requests[i].output_tokens);
    if (output > 1) tpot.push_back(1e3 * (q.finish_s - q.first_token_s) / (output - 1));
    r.met += q.met;
  }
  r.ttft_ms = Percentiles::of(std::move(ttft));
  r.tpot_ms = Percentiles::of(std::move(tpot));
  r.span_s = last_arrival - first;
  r.makespan_s = last_finish - first;
  r.met_fraction = n ? double(r.met) / double(n) : 0;
  // Requests that met both SLOs per second of makespan (issue 18 item 7): over the arrival
  // span, a burst that finishes long after its last arrival would count as fast.
  r.goodput_rps = r.makespan_s > 0 ? double(r.met) / r.makespan_s : 0;
  r.throughput_rps = r.makespan_s > 0 ? double(r.finished) / r.makespan_s : 0;
  r.kv_hit_rate = r.kv.prompt_tokens
                      ? double(r.kv.hit_tokens + r.pool_hit_tokens) / double(r.kv.prompt_tokens)
                      : 0;
  r.prefill_tokens_saved = reused - std::min(reused, recomputed);
  r.recomputed_share = reused ? double(recomputed) / double(reused) : 0;
  r.reuse_rate =
      r.kv.prompt_tokens ? double(r.prefill_tokens_saved) / double(r.kv.prompt_tokens) : 0;
}

namespace {

void add_link(ServeLinkStats& a, const ServeLinkStats& b) {
  a.bytes += b.bytes;
  a.transfers += b.transfers;
  a.busy_s += b.busy_s;
}

// An instance's counters into the fleet's: sums, and the largest for peaks.
void add_counters(ServeResult& a, const ServeResult& b) {
  a.finished += b.finished;
  a.too_large += b.too_large;
  a.stopped_early = a.stopped_early || b.stopped_early;
  a.max_concurrency = std::max(a.max_concurrency, b.max_concurrency);
  a.iterations += b.iterations;
  a.busy_s += b.busy_s;
  a.kv_wait_s += b.kv_wait_s;
  for (int t = 0; t < kv::kTiers; ++t) {
    a.capacity_bytes[t] += b.capacity_bytes[t];
    a.peak_bytes[t] += b.peak_bytes[t];
  }
  for (std::size_t l = 0; l < a.links.size(); ++l) add_link(a.links[l], b.links[l]);
  add_link(a.peer, b.peer);
  add_link(a.net_rx, b.net_rx);
  add_link(a.net_tx, b.net_tx);
  a.pool_hit_blocks += b.pool_hit_blocks;
  a.pool_hit_tokens += b.pool_hit_tokens;
  a.pool_put_blocks += b.pool_put_blocks;
  a.retried_submits += b.retried_submits;
  a.spilled_bytes += b.spilled_bytes;
  a.alerts += b.alerts;
  if (b.first_alert_s >= 0 && (a.first_alert_s < 0 || b.first_alert_s < a.first_alert_s))
    a.first_alert_s = b.first_alert_s;
  kv::KvStats& k = a.kv;
  const kv::KvStats& o = b.kv;
  for (auto [x, y] : {std::pair{&k.submitted, o.submitted},
                      {&k.admitted, o.admitted},
                      {&k.queued, o.queued},
                      {&k.refused_queue_full, o.refused_queue_full},
                      {&k.refused_too_large, o.refused_too_large},
                      {&k.finished, o.finished},
                      {&k.prompt_tokens, o.prompt_tokens},
                      {&k.lookup_blocks, o.lookup_blocks},
                      {&k.hit_blocks, o.hit_blocks},
                      {&k.hit_tokens, o.hit_tokens},
                      {&k.adopted_blocks, o.adopted_blocks},
                      {&k.new_blocks, o.new_blocks},
                      {&k.private_blocks, o.private_blocks},
                      {&k.promoted_slots, o.promoted_slots},
                      {&k.promoted_host_slots, o.promoted_host_slots},
                      {&k.dropped_blocks, o.dropped_blocks},
                      {&k.spilled_slots, o.spilled_slots},
                      {&k.spilled_bytes, o.spilled_bytes},
                      {&k.alerts, o.alerts},
                      {&k.failed_actions, o.failed_actions},
                      {&k.cancelled_actions, o.cancelled_actions},
                      {&k.aborted_admissions, o.aborted_admissions},
                      {&k.damaged_blocks, o.damaged_blocks},
                      {&k.blend_blocks, o.blend_blocks},
                      {&k.blend_tokens, o.blend_tokens},
                      {&k.ssd_declined_slots, o.ssd_declined_slots}})
    *x += y;
  for (auto [x, y] : {std::pair{&k.peak_referenced_slots, o.peak_referenced_slots},
                      {&k.peak_running, o.peak_running}, {&k.peak_queue, o.peak_queue}})
    *x = std::max(*x, y);
  for (int t = 0; t < kv::kTiers; ++t) {
    k.hit_blocks_by_tier[t] += o.hit_blocks_by_tier[t];
    k.demoted_slots[t] += o.demoted_slots[t];
  }
}

}  // namespace

// Note [Instances and the pool]
// `instances` serving instances of `cards` cards each, on ceil(instances x cards /
// cards_per_node) nodes, split the trace by session affinity: a session's first request goes
// to the next instance in round-robin order and its later requests follow it (a conversation
// keeps its instance, as prefix- and session-aware routers do); a request with no session (the
// Mooncake trace has none) takes the next instance in turn. Arrival times are the whole
// trace's (Note [Coarse timestamps] is applied before the split). Each instance is the one
// ServingSim on its own clock and stack; they meet only in the pool. They advance in step:
// the instance whose clock is furthest behind runs its next iteration, so a pool lookup at t
// sees every put another instance finished by t, except puts made by an instance during an
// iteration it has begun and not yet finished (at most one iteration's worth, never a block
// from the future). Goodput, latencies and hit rates are over the whole trace, with the one
// definition of summarize_serving; counters are summed over the instances.
ServeResult simulate_serving(const ServeScenario& s, std::uint64_t stop_after_misses) {
  s.validate();
  const std::uint32_t n = s.instances;
  if (s.observer && n > 1)
    input_error("--timeline", "records one instance; run with --instances 1");
  std::vector<ServeScenario> subs(n, s);
  std::vector<std::vector<std::size_t>> which(n);  // trace index of each instance's requests
  const std::vector<double> arrival_ms = spread_arrivals(s.requests, s.spread_ties);
  std::unordered_map<std::string, std::uint32_t> session_of;
  std::uint32_t turn = 0;
  for (auto& sub : subs) {
    sub.requests.clear();
    sub.spread_ties = false;  // spread once, over the whole trace
    sub.instances = 1;
  }
  for (std::size_t i = 0; i < s.requests.size(); ++i) {
    const workload::ServeRequest& r = s.requests[i];
    std::uint32_t k = turn;
    if (r.session.empty() || !session_of.contains(r.session)) {
      turn = (turn + 1) % n;
      if (!r.session.empty()) session_of[r.session] = k;
    } else {
      k = session_of[r.session];
    }
    subs[k].requests.push_back(r);
    subs[k].requests.back().timestamp_ms = arrival_ms[i];
    which[k].push_back(i);
  }
  const double nodes = std::ceil(double(n) * s.cards / s.hw.node.cards_per_node.si);
  const std::uint64_t block_bytes =
      workload::analytic::kv_bytes_per_token(s.shape) * s.block_tokens;
  std::unique_ptr<serve::KvPool> pool;
  if (s.shared_pool)
    pool = std::make_unique<serve::KvPool>(static_cast<std::uint64_t>(
        nodes * s.hw.pool.capacity_per_node.si / static_cast<double>(block_bytes)));
  serve::Fleet fleet{pool.get(), 0};
  std::vector<std::unique_ptr<serve::ServingSim>> sims;
  for (std::uint32_t k = 0; k < n; ++k)
    if (!subs[k].requests.empty()) {
      sims.push_back(std::make_unique<serve::ServingSim>(subs[k], stop_after_misses, fleet));
      sims.back()->start();
    }
  std::vector<bool> active(sims.size(), true);
  for (;;) {
    std::size_t pick = sims.size();
    for (std::size_t k = 0; k < sims.size(); ++k)
      if (active[k] && (pick == sims.size() || sims[k]->now() < sims[pick]->now())) pick = k;
    if (pick == sims.size()) break;
    active[pick] = sims[pick]->step();
  }
  ServeResult out;
  out.per_request.resize(s.requests.size());
  out.requests = s.requests.size();
  out.instances = n;
  out.shared_pool = s.shared_pool;
  for (std::size_t k = 0, used = 0; k < n; ++k) {
    if (which[k].empty()) continue;
    const ServeResult r = sims[used++]->result();
    if (used == 1) {
      out.policy = r.policy;
      out.slo = r.slo;
    }
    add_counters(out, r);
    for (std::size_t j = 0; j < which[k].size(); ++j) out.per_request[which[k][j]] = r.per_request[j];
  }
  if (pool) {
    out.pool_capacity_bytes = pool->capacity_blocks() * block_bytes;
    out.pool_peak_bytes = pool->peak_blocks() * block_bytes;
    out.pool_evicted_blocks = pool->evicted();
  }
  summarize_serving(s, out);
  account_ssd_wear(s, out);
  return out;
}

}  // namespace u3m::experiments
