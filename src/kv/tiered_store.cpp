#include "u3m/kv/tiered_store.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::kv {

// Note [Capacities agree]
// The engine's device capacity is exactly the manager's device slots times slot_bytes, its
// host capacity the manager's host slots plus the staging and write-back slots (below, and
// Note [Write-behind staging]), and its victim order is `owner`, so the engine never evicts on
// its own: the manager decides every move, and the KV path has one eviction engine. Why:
//  - a smaller cap, or the engine's own LRU eviction, would move blocks behind the manager's
//    back (ignoring prefix priority, pins and PGDSF) and the block tables would point at the
//    wrong tier. That is not hypothetical: with watermark eviction on (even at 100%), during
//    a promotion from SSD the engine's load estimate for HBM, which counts bytes queued to
//    land there, went over the cap, and the engine wrote the pinned system prompt's block
//    out to DRAM (caught by check_agreement in the random test);
//  - a larger device cap would make the budget a lie: the engine's measured device peak is
//    the figure we report (peak_kv_device_bytes in the Python KV cache), and it is bounded by
//    the budget only because the engine's cap is the manager's;
//  - the extra host slots (staging_slots) are the staging copies of promotions from SSD to
//    HBM, which the engine routes through host (s2h, then h2d) while the manager counts the
//    block in HBM only; at most that many run at once, and each clean host copy is dropped as
//    soon as its block lands in HBM.
// A take starts only once the slot it takes is physically free (Note [Two-phase actions] in
// block_manager.cpp), so the engine never holds more than the manager's slots. With nothing
// pending, its use of each tier equals slot_bytes times the manager's slots there (every
// allocation is a real one: a write lease at once, so a block reserved for decode tokens
// holds its bytes as the manager counts it); check_agreement() verifies it. An accounting error
// would show as an engine out_of_memory error, never as a silent migration. The SSD store
// holds at most one copy per live block, and live blocks never exceed the three tiers' slots,
// so it is sized for all of them and never has to evict (an SSD copy may outlive a
// promotion, clean, until the block is written or freed).
//
// Note [Pending transfers]
// The store carries out the manager's prepared actions asynchronously, each tracked per block
// until the manager is told its outcome (TensorRT-LLM's KV transfer manager keeps pending
// reads and writes per block and syncs a block before reusing it; vLLM's offloading worker
// reports each transfer job's success when it finishes). An action starts once the actions
// it waits for (Action::after) are completed, with non-blocking engine calls:
//   allocate         add, then a write try_acquire in its tier (allocated at once)
//   move to memory   a read try_acquire in the target tier (the engine fetches it, from SSD
//                    through host), then a clean evict of the other memory copy
//   move to SSD      evict from host; done when only the SSD copy is left, failed when the
//                    eviction ended with the host copy still there (Note [Upper copy until
//                    the lower is confirmed] in engine.cpp), tried again up to `attempts`
//   free             remove; busy is tried again
// and is polled after each engine change (epoch / wait_for_change, never a timeout). A failed
// try_acquire, a write-back that failed every attempt, or an injected fault completes it as
// failed (lost if the engine says no copy is left), and the manager rolls it back with what
// waited for it. Each call of the store first waits until nothing is pending (the manager
// decides on settled state), then submits its actions and waits only for the admission-
// critical ones (allocations, promotions from SSD) and what they wait for: admissions are
// final when the call returns, and settle() rolls back those that failed. Demotions, spills,
// frees and promotions from DRAM to HBM go on while the caller reads and writes other blocks;
// a read or write of a block waits for that block's pending actions only. The manager's
// eviction decides every move: the engine never evicts on its own (Note [Capacities agree]).

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
bool staged(const Action& a) {
  return a.kind == Action::Kind::move && a.from == Tier::ssd && a.to == Tier::device;
}

}  // namespace

// ---------------------------------------------------------------- TieredStore

engine::StackSpec TieredStore::stack_spec(const KvConfig& c, const TieredStoreOptions& o) {
  if (c.capacity_slots[idx(Tier::ssd)] && c.capacity_slots[idx(Tier::host)] == 0 &&
      o.writeback_slots == 0)
    input_error("kv store",
                "capacity_slots[host] or writeback_slots must be > 0 with an SSD tier: the "
                "engine stages SSD moves through host memory");
  if (o.staging_slots == 0) input_error("kv store", "staging_slots must be >= 1");
  if (o.attempts == 0) input_error("kv store", "attempts must be >= 1");
  const std::uint64_t slot = c.geometry.slot_bytes();
  engine::StackSpec r;
  r.ssd_file = "u3m-kv.ssd";
  r.device_bytes = c.capacity_slots[idx(Tier::device)] * slot;  // Note [Capacities agree]
  // Staging slots: promotions from SSD to HBM pass through host (Note [Capacities agree]).
  // Write-back slots: moves to SSD drain from host (Note [Write-behind staging]).
  r.host_bytes = (c.capacity_slots[idx(Tier::host)] + o.staging_slots + o.writeback_slots) * slot;
  if (c.capacity_slots[idx(Tier::ssd)]) {
    const std::uint64_t all = c.capacity_slots[0] + c.capacity_slots[1] + c.capacity_slots[2];
    const std::uint64_t per =
        (slot + mem::SsdStore::kBlock - 1) / mem::SsdStore::kBlock * mem::SsdStore::kBlock;
    r.ssd_bytes = all * per + mem::MiB;
  }
  r.ssd_dir = o.ssd_dir;
  r.ssd_faults = o.ssd_faults;
  r.backend = o.backend;
  r.device_ordinal = o.device;
  for (engine::TierLimits* t : {&r.engine.device, &r.engine.host}) {
    t->high_watermark = 1.0;  // the manager decides every eviction
    t->low_watermark = 1.0;
  }
  return r;
}

// Note [Either stack]
// The store carries out the manager's actions through the engine's non-blocking calls
// (try_acquire, evict, remove) and, when none of them can move on, waits for the engine's next
// change. Those two things are all it needs of a stack, so it runs over the real one (its own
// RealStack: the engine's wait_for_change blocks until a copy lands) or over the serving
// simulator's SimStack (the wait runs the virtual clock's next event, so transfers take the
// modelled links' time). Either stack is built from stack_spec(), so capacities agree the same
// way (Note [Capacities agree]). A simulated engine's addresses are fake: read() and write()
// refuse there, and a driver over it carries no bytes.
TieredStore::TieredStore(KvConfig config, TieredStoreOptions options)
    : bm_(std::move(config)),
      slot_bytes_(bm_.config().geometry.slot_bytes()),
      opt_(std::move(options)),
      real_(std::make_unique<engine::RealStack>(stack_spec(bm_.config(), opt_))),
      engine_(real_->engine()),
      wait_([e = &real_->engine()](std::uint64_t seen) { return e->wait_for_change(seen); }),
      has_bytes_(true) {
  // Note [Capacities agree]: the engine never picks a victim itself.
  engine_.set_victim_order(engine::Engine::VictimOrder::owner);
}

TieredStore::TieredStore(KvConfig config, StoreStack stack, TieredStoreOptions options)
    : bm_(std::move(config)),
      slot_bytes_(bm_.config().geometry.slot_bytes()),
      opt_(std::move(options)),
      engine_(stack.engine),
      wait_(std::move(stack.wait)),
      has_bytes_(stack.has_bytes) {
  const engine::StackSpec spec = stack_spec(bm_.config(), opt_);
  const engine::EngineConfig& c = engine_.config();
  if (c.device.capacity != spec.device_bytes || c.host.capacity != spec.host_bytes)
    throw std::invalid_argument(fmt::format(
        "kv store: the engine's capacities are {} B device, {} B host; the config needs {} and {}",
        c.device.capacity, c.host.capacity, spec.device_bytes, spec.host_bytes));
  if (!wait_) throw std::invalid_argument("kv store: no wait for the engine's stack");
  engine_.set_victim_order(engine::Engine::VictimOrder::owner);
}

const engine::RealStack& TieredStore::stack() const {
  if (!real_) throw std::logic_error("kv store: runs over the caller's stack, not a real one");
  return *real_;
}

TieredStore::~TieredStore() {
  try {
    drain();
  } catch (...) {  // the engine's destructor waits for its transfers anyway
  }
}

SubmitResult TieredStore::submit(RequestId id, const workload::ServeRequest& r, Admission* out) {
  if (opt_.blocking) drain();
  SubmitResult s = bm_.submit(id, r, out);
  const std::vector<RequestId> refused = execute();
  if (s == SubmitResult::admitted && std::find(refused.begin(), refused.end(), id) != refused.end())
    s = SubmitResult::aborted;
  return s;
}

std::vector<Admission> TieredStore::finish(RequestId id) {
  if (opt_.blocking) drain();
  return decided(bm_.finish(id));
}

void TieredStore::prefilled(RequestId id) {
  if (opt_.blocking) drain();
  bm_.prefilled(id);
  execute();  // a damaged source nobody reads any more is freed
}

std::vector<Admission> TieredStore::admit_waiting() {
  if (opt_.blocking) drain();
  return decided(bm_.admit_waiting());
}

std::vector<Admission> TieredStore::decided(std::vector<Admission> a) {
  execute();
  // Not settled yet without blocking: poll() reports those rolled back.
  return opt_.blocking ? settled(std::move(a)) : a;
}

std::vector<Admission> TieredStore::settled(std::vector<Admission> adm) {
  std::erase_if(adm, [&](const Admission& a) { return !bm_.running(a.id); });
  return adm;
}

std::uint64_t TieredStore::spill(std::uint64_t budget_bytes) {
  if (opt_.blocking) drain();
  const std::uint64_t b = bm_.spill(budget_bytes);
  execute();
  return b;
}

bool TieredStore::pin_prefix(const std::vector<workload::PromptSegment>& prefix) {
  if (opt_.blocking) drain();
  const bool ok = bm_.pin_prefix(prefix);
  execute();
  return ok;
}

void TieredStore::enqueue() {
  for (const Action& a : bm_.take_prepared()) {
    pending_.emplace(a.seq, Exec{a});
    ++block_pending_[a.block];
    last_seq_ = std::max(last_seq_, a.seq);
  }
  st_.peak_pending = std::max<std::uint64_t>(st_.peak_pending, pending_.size());
}

std::vector<RequestId> TieredStore::execute() {
  enqueue();
  if (!opt_.blocking) return {};  // poll() starts them (Note [Non-blocking calls])
  wait_until([&] {
    return std::none_of(pending_.begin(), pending_.end(),
                        [](const auto& p) { return admission_critical(p.second.a); });
  });
  const std::vector<RequestId> refused = bm_.settle();
  st_.aborted += refused.size();
  enqueue();  // the frees of rolled-back admissions and damaged blocks
  pump();
  if (opt_.check_every_step) check_agreement();
  return refused;
}

void TieredStore::drain() {
  wait_until([&] { return pending_.empty() && trailing_.empty(); });
  reap_lost();
}

// Note [Non-blocking calls]
// A serving loop on one thread cannot wait in submit() for an SSD hit's fetch: every decode
// of the batch would stall behind it. With blocking = false (the serving simulator) the
// manager's calls decide at once, on the planned state (the manager's decisions hold with
// actions pending: Note [Two-phase actions], `after` orders them), enqueue what they emit and
// return; nothing starts until poll(), so the driver can first turn promotions into
// recomputes. poll() is one pass of the blocking loop without the wait: the driver calls it
// after every change of the engine (over a simulated stack, after every clock event), so an
// action starts at the instant what it waits for completed. Admissions are settled once no
// admission-critical action is pending, and ready(id) tells the driver when a request's
// blocks are in place (its prefill waits for that). The decisions are the manager's either
// way; what changes is only when the actions run.
std::vector<RequestId> TieredStore::poll() {
  pump();
  reap_lost();
  std::vector<RequestId> refused;
  if (std::none_of(pending_.begin(), pending_.end(),
                   [](const auto& p) { return admission_critical(p.second.a); })) {
    refused = bm_.settle();
    st_.aborted += refused.size();
    enqueue();
    pump();
  }
  polled_seq_ = last_seq_;
  if (opt_.check_every_step) check_agreement();
  return refused;
}

bool TieredStore::ready(RequestId id) const {
  if (!bm_.running(id)) return false;
  const std::uint32_t groups = bm_.config().geometry.groups();
  for (const auto* blocks : {&bm_.table(id), &bm_.blend_sources(id)})
    for (TokenBlockId tb : *blocks)
      for (std::uint32_t g = 0; g < groups; ++g)
        if (block_pending_.contains(block_id(tb, g))) return false;
  return true;
}

std::vector<const Action*> TieredStore::emitted() const {
  std::vector<const Action*> r;
  for (auto it = pending_.upper_bound(polled_seq_); it != pending_.end(); ++it)
    r.push_back(&it->second.a);
  return r;
}

// Note [Recompute in place]
// A promoted block that recompute-or-fetch (kv/recompute.hpp) recomputes is written by
// compute in its target slot: nothing is read. The engine has no write that skips the fetch
// of a stale copy, so the action forgets the tensor (its old copies, the SSD one included,
// are dropped: the recomputed KV replaces them) and allocates it again with a write lease in
// the target tier, as an allocation does.
void TieredStore::recompute(RequestId id, std::uint32_t block) {
  const auto& table = bm_.table(id);
  if (block >= table.size())
    throw std::out_of_range(
        fmt::format("kv store: request {} has {} blocks, no block {}", id, table.size(), block));
  for (auto it = pending_.upper_bound(polled_seq_); it != pending_.end(); ++it) {
    Exec& x = it->second;
    if (!x.started && x.a.kind == Action::Kind::move && x.a.to != Tier::ssd &&
        x.a.block / kMaxGroups == table[block])
      x.rewrite = true;
  }
}

// An SSD copy the store's scrubber (or a failed read) found corrupt is gone, and the engine
// reports its tensor lost if that was the only copy (Note [Verified before dropped] in
// engine.cpp). Only unreferenced cached blocks rest on SSD, so that costs a recompute, never
// an admitted request's KV: the manager drops the block, and the next call frees it.
void TieredStore::reap_lost() {
  const std::uint64_t now = engine_.stats().lost_tensors;
  if (now == lost_seen_) return;
  lost_seen_ = now;
  for (const auto& [id, tier] : live_) {
    const auto r = engine_.residency(id);
    if (!r || !r->lost || block_pending_.contains(id)) continue;
    if (tier != Tier::ssd)
      throw std::runtime_error(
          fmt::format("kv store: block {} in {} lost by the engine", id, mem::to_string(tier)));
    bm_.lost(id);
    ++st_.lost_at_rest;
  }
}

bool TieredStore::ready(const Action& a) const {
  for (std::uint64_t d : a.after)
    if (d && pending_.contains(d)) return false;
  // Its SSD write drains first; a block whose write failed waits only for its free.
  if (auto t = trailing_.find(a.block);
      t != trailing_.end() && !(t->second.reported && a.kind == Action::Kind::free))
    return false;
  if (a.kind == Action::Kind::move && a.to == Tier::ssd && opt_.writeback_slots &&
      writeback_ >= opt_.writeback_slots)
    return false;
  return !staged(a) || staging_ < opt_.staging_slots;
}

void TieredStore::wait_until(const std::function<bool()>& done) {
  engine::Engine& e = engine_;
  for (;;) {
    const std::uint64_t seen = e.epoch();
    const bool changed = pump();
    if (done()) return;
    if (changed) continue;
    if (trailing_.empty() &&
        std::none_of(pending_.begin(), pending_.end(), [](const auto& p) { return p.second.started; }))
      throw std::logic_error("kv store: waiting for actions none of which can start");
    if (wait_(seen) == mem::Status::out_of_memory) {
      // The engine can make no progress (Note [No progress] in engine.cpp): what is waiting
      // for room will not get it. Those actions fail and are rolled back.
      std::vector<std::uint64_t> stuck;
      for (const auto& [seq, x] : pending_)
        if (x.started && x.a.kind != Action::Kind::free &&
            !(x.a.kind == Action::Kind::move && x.a.to == Tier::ssd))
          stuck.push_back(seq);
      if (stuck.empty()) check(mem::Status::out_of_memory, "wait", 0);
      for (std::uint64_t seq : stuck)
        if (pending_.contains(seq)) resolve(seq, Outcome::failed);
    }
  }
}

bool TieredStore::pump() {
  bool changed = false;
  for (auto it = pending_.begin(); it != pending_.end();) {
    const std::uint64_t seq = it->first;
    const bool was_started = it->second.started;
    const unsigned attempts = it->second.attempts;
    const std::optional<Outcome> o = step(it->second);
    changed = changed || it->second.started != was_started || it->second.attempts != attempts;
    if (!o) {
      ++it;
      continue;
    }
    resolve(seq, *o);  // erases seq and what the manager cancelled (later seqs)
    changed = true;
    it = pending_.upper_bound(seq);
  }
  // Staged writes are released in the order they began (Note [Write-behind staging]): one
  // poll looks at the oldest only, not at every write still draining.
  while (!trail_order_.empty()) {
    const engine::TensorId id = trail_order_.front();
    auto it = trailing_.find(id);
    const unsigned attempts = it->second.attempts;
    if (!trail(id, it->second)) {
      changed = changed || it->second.attempts != attempts;
      break;
    }
    --writeback_;
    if (--block_pending_[id] == 0) block_pending_.erase(id);
    trailing_.erase(it);
    trail_order_.pop_front();
    changed = true;
  }
  return changed;
}

void TieredStore::resolve(std::uint64_t seq, Outcome o) {
  auto it = pending_.find(seq);
  const Exec x = it->second;
  pending_.erase(it);
  if (x.staged) --staging_;
  if (--block_pending_[x.a.block] == 0) block_pending_.erase(x.a.block);
  if (o == Outcome::ok) {
    switch (x.a.kind) {
      case Action::Kind::allocate:
        ++st_.allocated;
        break;
      case Action::Kind::move:
        ++st_.moved;
        st_.moved_bytes += slot_bytes_;
        break;
      case Action::Kind::free:
        ++st_.freed;
        break;
    }
  } else {
    ++(o == Outcome::lost ? st_.lost : st_.failed);
  }
  for (std::uint64_t c : bm_.complete(seq, o)) {
    auto ct = pending_.find(c);
    if (ct == pending_.end()) continue;
    if (ct->second.started)
      throw std::logic_error(fmt::format("kv store: the manager cancelled action {}, started", c));
    if (--block_pending_[ct->second.a.block] == 0) block_pending_.erase(ct->second.a.block);
    pending_.erase(ct);
    ++st_.cancelled;
  }
}

std::optional<Outcome> TieredStore::step(Exec& x) {
  engine::Engine& e = engine_;
  const Action& a = x.a;
  const engine::TensorId id = a.block;
  if (!x.started) {
    if (!ready(a)) return std::nullopt;
    x.started = true;
    ++x.attempts;
    if (opt_.inject && opt_.inject(a)) {
      ++st_.injected;
      if (a.kind != Action::Kind::free) {
        if (a.kind == Action::Kind::allocate) live_.erase(id);
        return Outcome::failed;
      }
      x.started = false;  // a free is tried again
      if (x.attempts >= opt_.attempts)
        throw std::runtime_error(
            fmt::format("kv store: free of block {} failed {} times", id, x.attempts));
      ++st_.retried;
      return std::nullopt;
    }
    if (staged(a)) {
      ++staging_;
      x.staged = true;
    }
    switch (a.kind) {
      case Action::Kind::allocate:
        check(e.add(id, slot_bytes_), "add", id);
        break;
      case Action::Kind::move:
        if (!live_.contains(id))
          throw std::logic_error(fmt::format("kv store: move of unknown block {}", id));
        if (a.to == Tier::ssd && opt_.writeback_slots) {
          ++writeback_;  // held until its SSD write is through (trail())
          return step_staged_write(x);
        }
        if (x.rewrite) {  // Note [Recompute in place]
          const mem::Status s = e.remove(id);
          if (s == mem::Status::busy) {
            x.started = false;
            return std::nullopt;
          }
          if (!mem::ok(s)) check(s, "drop for recompute", id);
          check(e.add(id, slot_bytes_), "add", id);
          break;
        }
        if (a.to == Tier::ssd) {
          const mem::Status s = e.evict(id, a.from);
          if (s == mem::Status::busy) x.started = false;  // moving: ask again
          else if (!mem::ok(s)) return Outcome::failed;
          return std::nullopt;
        }
        break;
      case Action::Kind::free:
        break;
    }
  }
  switch (a.kind) {
    case Action::Kind::allocate: {
      engine::Lease l;
      const mem::Status s = e.try_acquire(id, a.to, engine::Access::write, &l);
      if (s == mem::Status::busy) return std::nullopt;
      if (!mem::ok(s)) {
        e.remove(id);  // no slot for it: the manager forgets it too
        return Outcome::failed;
      }
      check(e.release(l), "release", id);
      live_[id] = a.to;
      return Outcome::ok;
    }
    case Action::Kind::move: {
      if (a.to == Tier::ssd && opt_.writeback_slots) return step_staged_write(x);
      if (x.rewrite) {
        engine::Lease l;
        const mem::Status s = e.try_acquire(id, a.to, engine::Access::write, &l);
        if (s == mem::Status::busy) return std::nullopt;
        if (!mem::ok(s)) {
          live_.erase(id);
          return Outcome::lost;  // its old copies are gone: nothing to roll back to
        }
        check(e.release(l), "release", id);
        live_[id] = a.to;
        return Outcome::ok;
      }
      if (a.to == Tier::ssd) {
        const auto r = e.residency(id);
        if (r->in_flight || r->leaving[idx(a.from)]) return std::nullopt;
        if (!r->valid[idx(a.from)] && r->valid[idx(Tier::ssd)]) {
          live_[id] = Tier::ssd;
          return Outcome::ok;
        }
        if (!r->valid[idx(a.from)]) return Outcome::lost;
        // The write-back failed and the upper copy stayed: try again, a few times.
        if (x.attempts >= opt_.attempts) return Outcome::failed;
        ++st_.retried;
        x.started = false;
        return std::nullopt;
      }
      if (!x.landed) {
        engine::Lease l;
        const mem::Status s = e.try_acquire(id, a.to, engine::Access::read, &l);
        if (s == mem::Status::busy) return std::nullopt;
        if (!mem::ok(s)) return e.residency(id)->lost ? Outcome::lost : Outcome::failed;
        check(e.release(l), "release", id);
        x.landed = true;
      }
      const Tier other = other_memory(a.to);
      if (e.residency(id)->valid[idx(other)]) {  // the clean copy it came from
        const mem::Status s = e.evict(id, other);
        if (s == mem::Status::busy) return std::nullopt;  // moving meanwhile: drop it later
        check(s, "drop", id);
        if (e.residency(id)->valid[idx(other)]) return std::nullopt;  // being verified
      }
      live_[id] = a.to;
      return Outcome::ok;
    }
    case Action::Kind::free: {
      const mem::Status s = e.remove(id);
      if (s == mem::Status::busy) return std::nullopt;
      if (!mem::ok(s) && s != mem::Status::not_found) check(s, "remove", id);
      live_.erase(id);
      return Outcome::ok;
    }
  }
  return std::nullopt;
}

// Note [Write-behind staging]
// With write-back slots (TieredStoreOptions::writeback_slots) a move to SSD is completed to
// the manager once its data sits in host memory in one of them: from DRAM at once, from HBM
// when the copy out (d2h) has landed. The manager may then reuse the slot it left (a DRAM
// slot, or the HBM slot of a move that skips a DRAM tier), while the SSD write drains behind
// it (trail()), as a write-back cache does. The block's next action waits for that write.
// The slots are released in the order the writes began, each once it and those before it are
// through: the SSD link is one queue, so that is the order they finish in, and a poll then
// looks at one write, not at all of them (a write done out of order holds its slot a little
// longer).
// The slots bound the staged bytes: with all of them draining, the next move to SSD waits,
// and so does whatever waits for the slot it frees. This is the staging of the serving model
// (docs/serving.md, Note [Write-behind] in serving_sim.cpp); without write-back slots a move to
// SSD is done when the SSD copy is.
std::optional<Outcome> TieredStore::step_staged_write(Exec& x) {
  engine::Engine& e = engine_;
  const engine::TensorId id = x.a.block;
  const auto r = e.residency(id);
  if (!r || r->lost) return Outcome::lost;
  if (x.a.from == Tier::device && r->valid[idx(Tier::device)]) {
    const mem::Status s = e.evict(id, Tier::device);  // the copy out; ok if already leaving
    if (!mem::ok(s) && s != mem::Status::busy) {
      --writeback_;
      return Outcome::failed;
    }
    return std::nullopt;
  }
  if (r->in_flight && !r->valid[idx(Tier::host)] && !r->valid[idx(Tier::ssd)])
    return std::nullopt;
  trailing_.emplace(id, Trail{Tier::host, false, 1});
  trail_order_.push_back(id);
  ++block_pending_[id];  // resolve() takes the action's count; the write keeps its own
  if (!r->valid[idx(Tier::ssd)] || r->valid[idx(Tier::host)]) e.evict(id, Tier::host);
  live_[id] = Tier::ssd;
  return Outcome::ok;
}

// A staged write to SSD after the manager was told: done once only the SSD copy is left. A
// write that fails every attempt leaves the block in host memory only: the manager drops it
// as lost (it is a cached block nobody references), and the slot is held until it is freed.
bool TieredStore::trail(engine::TensorId id, Trail& t) {
  engine::Engine& e = engine_;
  if (!live_.contains(id)) return true;  // freed meanwhile
  const auto r = e.residency(id);
  if (!r) return true;
  if (r->in_flight || r->leaving[idx(Tier::host)]) return false;
  if (!r->valid[idx(Tier::host)] && !r->valid[idx(Tier::device)]) return true;
  if (t.reported) return false;  // lost: waits for the manager's free
  if (t.attempts < opt_.attempts) {
    const mem::Status s = e.evict(id, Tier::host);
    if (s == mem::Status::busy) return false;
    ++t.attempts;
    ++st_.retried;
    return false;
  }
  t.reported = true;
  ++st_.lost;
  bm_.lost(id);
  return false;
}

engine::TensorId TieredStore::locate(RequestId id, std::uint32_t block, std::uint32_t group,
                                     std::uint64_t offset, std::uint64_t len, Tier* tier) {
  if (!has_bytes_)
    throw std::logic_error("kv store: a simulated stack holds no bytes to read or write");
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
  const engine::TensorId t = block_id(table[block], group);
  pump();  // background actions move on with every access
  if (block_pending_.contains(t)) {  // wait for this block only
    ++st_.block_waits;
    wait_until([&] { return !block_pending_.contains(t); });
  }
  *tier = bm_.slot_tier(table[block], group);
  if (*tier == Tier::ssd)  // the manager promotes every referenced block at admission
    throw std::logic_error(fmt::format("kv store: request {} block {} rests on SSD", id, block));
  return t;
}

// A device lease on cuda or acl is device memory the CPU cannot touch: the
// backend's synchronous copy moves it (Note [Offload on CUDA] in
// python/u3m/torch.py). Host leases, and device-emu's arena, are host memory.
void TieredStore::copy_lease(const engine::Lease& l, std::uint64_t offset, const void* src,
                             void* dst, std::uint64_t len) {
  const bool into = src != nullptr;  // else out of the lease into dst
  char* at = static_cast<char*>(l.ptr) + offset;
  if (l.tier != Tier::device || !real_ || real_->accel() == nullptr) {
    std::memcpy(into ? at : dst, into ? src : at, len);
    return;
  }
  const mem::Status s = into ? real_->device().memcpy_sync(at, len, src, len, mem::CopyKind::h2d)
                             : real_->device().memcpy_sync(dst, len, at, len, mem::CopyKind::d2h);
  if (!mem::ok(s))
    throw std::runtime_error(fmt::format("kv store: {} copy of tensor {} on {}: {}",
                                         into ? "h2d" : "d2h", l.id, real_->backend_name(),
                                         mem::to_string(s)));
}

void TieredStore::write(RequestId id, std::uint32_t block, std::uint32_t group,
                        std::uint64_t offset, const void* src, std::uint64_t len) {
  Tier tier;
  const engine::TensorId t = locate(id, block, group, offset, len, &tier);
  engine::Engine& e = engine_;
  engine::Lease l;
  check(e.acquire(t, tier, engine::Access::write, &l), "write lease", t);
  copy_lease(l, offset, src, nullptr, len);
  check(e.release(l), "release", t);
  ++st_.writes;
  st_.bytes_written += len;
}

void TieredStore::read(RequestId id, std::uint32_t block, std::uint32_t group, std::uint64_t offset,
                       void* dst, std::uint64_t len) {
  Tier tier;
  const engine::TensorId t = locate(id, block, group, offset, len, &tier);
  engine::Engine& e = engine_;
  engine::Lease l;
  check(e.acquire(t, tier, engine::Access::read, &l), "read lease", t);
  copy_lease(l, offset, nullptr, dst, len);
  check(e.release(l), "release", t);
  ++st_.reads;
  st_.bytes_read += len;
  ++st_.reads_by_tier[idx(tier)];
}

void TieredStore::check_agreement() const {
  const engine::Engine& e = engine_;
  std::uint64_t in_memory[2] = {0, 0};
  for (const auto& entry : live_) {
    const engine::TensorId id = entry.first;  // not a structured binding: the lambda uses it
    const Tier tier = entry.second;
    if (block_pending_.contains(id)) continue;  // its action is still under way
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
    // Lost at rest on SSD (the scrubber runs in the background): reaped at the next call.
    if (r->lost && tier == Tier::ssd) continue;
    if (r->lost) fail("lost by the engine");
    if (r->in_flight) fail("still moving after its action");
    if (r->valid[0] && r->valid[1]) fail("two memory copies");
    if (!r->valid[idx(tier)]) fail("no copy in its tier");
    if (tier != Tier::ssd) ++in_memory[idx(tier)];
  }
  if (!pending_.empty() || !trailing_.empty()) return;
  std::uint64_t slots = 0;
  for (Tier t : {Tier::device, Tier::host, Tier::ssd}) slots += bm_.use(t).used;
  if (slots != live_.size())
    throw std::logic_error(fmt::format("kv store: the manager holds {} slots, the engine {} blocks",
                                       slots, live_.size()));
  const engine::EngineStats s = e.stats();
  for (Tier t : {Tier::device, Tier::host}) {
    if (s.used[idx(t)] != in_memory[idx(t)] * slot_bytes_ ||
        bm_.use(t).used != in_memory[idx(t)])
      throw std::logic_error(fmt::format(
          "kv store: engine holds {} B in {}, the blocks {} B, the manager {} slots",
          s.used[idx(t)], mem::to_string(t), in_memory[idx(t)] * slot_bytes_, bm_.use(t).used));
  }
}

}  // namespace u3m::kv
