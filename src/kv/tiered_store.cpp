#include "u3m/kv/tiered_store.hpp"

#include <cstring>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::kv {

// Note [Capacities agree]
// The engine's device capacity is exactly the manager's device slots times slot_bytes, its
// host capacity the manager's host slots plus one, and its victim score is +inf for every
// copy, so the engine never evicts on its own: the manager decides every move. Why:
//  - a smaller cap, or the engine's own LRU eviction, would move blocks behind the manager's
//    back (ignoring prefix priority, pins and PGDSF) and the block tables would point at the
//    wrong tier. That is not hypothetical: with watermark eviction on (even at 100%), during
//    a promotion from SSD the engine's load estimate for HBM, which counts bytes queued to
//    land there, went over the cap, and the engine wrote the pinned system prompt's block
//    out to DRAM (caught by check_agreement in the random test);
//  - a larger device cap would make the budget a lie: the engine's measured device peak is
//    the figure we report (peak_kv_device_bytes in the Python KV cache), and it is bounded by
//    the budget only because the engine's cap is the manager's;
//  - the one extra host slot is the staging copy of a promotion from SSD to HBM, which the
//    engine routes through host (s2h, then h2d) while the manager has already counted the
//    block in HBM. Moves run one at a time (Note [Actions in order]), so one slot suffices;
//    the clean host copy is dropped as soon as the block lands in HBM.
// With that, the engine's use of each tier equals slot_bytes times the written blocks the
// manager has there, between actions; check_agreement() verifies it. An accounting error
// would show as an engine out_of_memory error, never as a silent migration. The SSD store
// holds at most one copy per live block, and live blocks never exceed the three tiers' slots,
// so it is sized for all of them and never has to evict (an SSD copy may outlive a
// promotion, clean, until the block is written or freed).
//
// Note [Actions in order]
// The manager emits actions in an order that is safe when each finishes before the next
// starts: a victim leaves a tier before a block takes its slot. The driver therefore waits
// for each move: a move to a memory tier is a prefetch followed by a read acquire (which
// waits for the prefetch to land) and a clean drop of the other memory copy; a move to SSD
// is an evict followed by drain(). Only one memory copy of a block ever exists, so compute
// can read a block where it rests (HBM, or DRAM streamed) without either tier exceeding its
// budget. Batching the moves would overlap them but needs the engine to accept a destination
// that frees up only when an earlier transfer lands; left for the layer-wise prefetch.
//
// Note [Lazy allocation]
// `allocate` only registers the tensor (Engine::add): its first lease allocates it in the
// tier the block rests in then. A block that was never written has no engine copy to move,
// so its moves are bookkeeping only; the engine's use counts written blocks.

namespace {

void check(mem::Status s, std::string_view what, engine::TensorId id) {
  if (mem::ok(s)) return;
  // No progress (Note [No progress] in engine.cpp): say why, not just the code.
  const bool stuck = s == mem::Status::out_of_memory || s == mem::Status::busy;
  throw std::runtime_error(fmt::format("kv store: {} of block {} failed: {}{}{}", what, id,
                                       mem::to_string(s), stuck ? ": " : "",
                                       stuck ? engine::Engine::last_failure() : std::string()));
}

Tier other_memory(Tier t) {
  return t == Tier::device ? Tier::host : Tier::device;
}
int idx(Tier t) {
  return static_cast<int>(t);
}

}  // namespace

// ---------------------------------------------------------------- TieredStore

engine::RealStackOptions TieredStore::stack_options(const KvConfig& c,
                                                    const TieredStoreOptions& o) {
  if (c.capacity_slots[idx(Tier::host)] == 0)
    input_error("kv store",
                "capacity_slots[host] must be > 0: the engine stages SSD moves "
                "through host memory");
  const std::uint64_t slot = c.geometry.slot_bytes();
  engine::RealStackOptions r;
  r.ssd_file = "u3m-kv.ssd";
  r.device_bytes = c.capacity_slots[idx(Tier::device)] * slot;  // Note [Capacities agree]
  // One more host slot: a promotion from SSD to HBM passes through host (Note [Capacities agree]).
  r.host_bytes = (c.capacity_slots[idx(Tier::host)] + 1) * slot;
  if (c.capacity_slots[idx(Tier::ssd)]) {
    const std::uint64_t all = c.capacity_slots[0] + c.capacity_slots[1] + c.capacity_slots[2];
    const std::uint64_t per =
        (slot + mem::SsdStore::kBlock - 1) / mem::SsdStore::kBlock * mem::SsdStore::kBlock;
    r.ssd_bytes = all * per + mem::MiB;
  }
  r.ssd_dir = o.ssd_dir;
  r.ssd_faults = o.ssd_faults;
  for (engine::TierLimits* t : {&r.engine.device, &r.engine.host}) {
    t->high_watermark = 1.0;  // the manager decides every eviction
    t->low_watermark = 1.0;
  }
  return r;
}

TieredStore::TieredStore(KvConfig config, TieredStoreOptions options)
    : bm_(std::move(config)),
      slot_bytes_(bm_.config().geometry.slot_bytes()),
      stack_(stack_options(bm_.config(), options)),
      opt_(std::move(options)) {
  // Note [Capacities agree]: the engine never picks a victim itself.
  stack_.engine().set_victim_order(engine::Engine::VictimOrder::owner);
}

TieredStore::~TieredStore() = default;

SubmitResult TieredStore::submit(RequestId id, const workload::ServeRequest& r, Admission* out) {
  const SubmitResult s = bm_.submit(id, r, out);
  apply();
  return s;
}

std::vector<Admission> TieredStore::finish(RequestId id) {
  std::vector<Admission> a = bm_.finish(id);
  apply();
  return a;
}

std::uint64_t TieredStore::spill(std::uint64_t budget_bytes) {
  const std::uint64_t b = bm_.spill(budget_bytes);
  apply();
  return b;
}

bool TieredStore::pin_prefix(const std::vector<workload::PromptSegment>& prefix) {
  const bool ok = bm_.pin_prefix(prefix);
  apply();
  return ok;
}

void TieredStore::apply() {
  for (const Action& a : bm_.take_actions()) apply(a);
  if (opt_.check_every_step) check_agreement();
}

void TieredStore::apply(const Action& a) {
  engine::Engine& e = stack_.engine();
  const engine::TensorId id = a.block;
  switch (a.kind) {
    case Action::Kind::allocate:
      check(e.add(id, slot_bytes_), "add", id);  // Note [Lazy allocation]
      live_[id] = a.to;
      ++st_.allocated;
      return;
    case Action::Kind::move: {
      auto it = live_.find(id);
      if (it == live_.end())
        throw std::logic_error(fmt::format("kv store: move of unknown block {}", id));
      if (a.to == Tier::ssd)
        move_to_ssd(id, a.from);
      else
        move_to_memory(id, a.to);
      it->second = a.to;
      ++st_.moved;
      return;
    }
    case Action::Kind::free:
      check(e.remove(id), "remove", id);
      live_.erase(id);
      ++st_.freed;
      return;
  }
}

void TieredStore::move_to_memory(engine::TensorId id, Tier to) {
  engine::Engine& e = stack_.engine();
  auto r = e.residency(id);
  if (!r->valid[0] && !r->valid[1] && !r->valid[2]) return;  // never written
  check(e.prefetch(id, to), "prefetch", id);
  engine::Lease l;  // waits for the prefetch: Note [Actions in order]
  check(e.acquire(id, to, engine::Access::read, &l), "fetch", id);
  check(e.release(l), "release", id);
  const Tier other = other_memory(to);
  if (e.residency(id)->valid[idx(other)]) check(e.evict(id, other), "drop", id);  // clean
  st_.moved_bytes += slot_bytes_;
}

void TieredStore::move_to_ssd(engine::TensorId id, Tier from) {
  engine::Engine& e = stack_.engine();
  auto r = e.residency(id);
  if (!r->valid[idx(from)]) return;  // never written (or already clean on SSD)
  // A failed write-back (an I/O error, or a write the store's read-back
  // caught) leaves the upper copy valid (Note [Upper copy until the lower is
  // confirmed] in engine.cpp), so it is tried again; a disk that fails every
  // attempt is an error the caller sees.
  constexpr int kAttempts = 8;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    check(e.evict(id, from), "evict", id);
    e.drain();
    r = e.residency(id);
    if (!r->valid[0] && !r->valid[1] && r->valid[idx(Tier::ssd)]) {
      st_.moved_bytes += slot_bytes_;
      return;
    }
    if (!r->valid[idx(from)])
      throw std::logic_error(fmt::format("kv store: block {} lost its only copy", id));
  }
  throw std::runtime_error(
      fmt::format("kv store: write-back of block {} to SSD failed {} times; the block stays in {}",
                  id, kAttempts, mem::to_string(from)));
}

engine::TensorId TieredStore::locate(RequestId id, std::uint32_t block, std::uint32_t group,
                                     std::uint64_t offset, std::uint64_t len, Tier* tier) const {
  if (!bm_.running(id))
    throw std::out_of_range(fmt::format("kv store: request {} is not running", id));
  const auto& table = bm_.table(id);
  const KvGeometry& g = bm_.config().geometry;
  if (block >= table.size())
    throw std::out_of_range(
        fmt::format("kv store: request {} has {} blocks, no block {}", id, table.size(), block));
  if (group >= g.groups())
    throw std::out_of_range(
        fmt::format("kv store: {} layer groups, no group {}", g.groups(), group));
  if (offset > g.group_bytes(group) || len > g.group_bytes(group) - offset)
    throw std::out_of_range(fmt::format("kv store: bytes [{}, {}) past group {}'s {} bytes", offset,
                                        offset + len, group, g.group_bytes(group)));
  *tier = bm_.slot_tier(table[block], group);
  if (*tier == Tier::ssd)  // the manager promotes every referenced block at admission
    throw std::logic_error(fmt::format("kv store: request {} block {} rests on SSD", id, block));
  return block_id(table[block], group);
}

void TieredStore::write(RequestId id, std::uint32_t block, std::uint32_t group,
                        std::uint64_t offset, const void* src, std::uint64_t len) {
  Tier tier;
  const engine::TensorId t = locate(id, block, group, offset, len, &tier);
  engine::Engine& e = stack_.engine();
  engine::Lease l;
  check(e.acquire(t, tier, engine::Access::write, &l), "write lease", t);
  std::memcpy(static_cast<char*>(l.ptr) + offset, src, len);
  check(e.release(l), "release", t);
  ++st_.writes;
  st_.bytes_written += len;
}

void TieredStore::read(RequestId id, std::uint32_t block, std::uint32_t group, std::uint64_t offset,
                       void* dst, std::uint64_t len) {
  Tier tier;
  const engine::TensorId t = locate(id, block, group, offset, len, &tier);
  engine::Engine& e = stack_.engine();
  engine::Lease l;
  check(e.acquire(t, tier, engine::Access::read, &l), "read lease", t);
  std::memcpy(dst, static_cast<const char*>(l.ptr) + offset, len);
  check(e.release(l), "release", t);
  ++st_.reads;
  st_.bytes_read += len;
  ++st_.reads_by_tier[idx(tier)];
}

void TieredStore::check_agreement() const {
  const engine::Engine& e = stack_.engine();
  std::uint64_t in_memory[2] = {0, 0};
  for (const auto& entry : live_) {
    const engine::TensorId id = entry.first;  // not a structured binding: the lambda uses it
    const Tier tier = entry.second;
    const TokenBlockId tb = id / kMaxGroups;
    const auto g = static_cast<std::uint32_t>(id % kMaxGroups);
    const Tier says = bm_.slot_tier(tb, g);
    auto fail = [&](std::string_view why) {
      throw std::logic_error(fmt::format("kv store: block {} (manager: {}, driver: {}): {}", id,
                                         mem::to_string(says), mem::to_string(tier), why));
    };
    if (says != tier) fail("the driver missed a move");
    auto r = e.residency(id);
    if (!r) fail("not registered in the engine");
    if (r->lost) fail("lost by the engine");
    if (r->in_flight) fail("still moving after its action");
    if (r->valid[0] && r->valid[1]) fail("two memory copies");
    const bool written = r->valid[0] || r->valid[1] || r->valid[2];
    if (!written) continue;  // Note [Lazy allocation]
    if (!r->valid[idx(tier)]) fail("no copy in its tier");
    if (tier != Tier::ssd) ++in_memory[idx(tier)];
  }
  const engine::EngineStats s = e.stats();
  for (Tier t : {Tier::device, Tier::host}) {
    if (s.used[idx(t)] != in_memory[idx(t)] * slot_bytes_)
      throw std::logic_error(fmt::format("kv store: engine holds {} B in {}, the blocks {} B",
                                         s.used[idx(t)], mem::to_string(t),
                                         in_memory[idx(t)] * slot_bytes_));
  }
}

}  // namespace u3m::kv
