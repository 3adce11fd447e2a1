// The tiered KV cache's data path (issue 6 item 5, issue 7's KV cache; docs/kv.md, "The data
// path"). A TieredStore owns a BlockManager (the decisions) and a real Engine (the bytes): it
// carries out every Action the manager emits on the engine, so each physical block (token
// block x layer group) is one engine tensor of slot_bytes that really lives in the tier the
// manager says. Requests read and write their KV by (request, logical token block, group,
// byte offset, length) through acquire/release, so compute never sees a block in flight.
// Note [...] blocks in src/kv/tiered_store.cpp give the reasons.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "u3m/engine/engine.hpp"
#include "u3m/engine/real_stack.hpp"
#include "u3m/kv/block_manager.hpp"
#include "u3m/mem/ssd_store.hpp"

namespace u3m::kv {

struct TieredStoreStats {
  std::uint64_t allocated = 0, moved = 0, freed = 0;  // actions carried out
  std::uint64_t moved_bytes = 0;                      // bytes of moves with data
  std::uint64_t writes = 0, reads = 0;                // write()/read() calls
  std::uint64_t bytes_written = 0, bytes_read = 0;
  std::uint64_t reads_by_tier[kTiers] = {};  // tier the read was served from
};

struct TieredStoreOptions {
  std::string ssd_dir;  // see engine::RealStackOptions::ssd_dir
  mem::FaultSpec ssd_faults;  // injected under the SSD tier (tests); empty = none
  // After every batch of actions, check that the engine holds each live block in exactly
  // the tier the manager says (check_agreement). For tests: it walks every live block.
  bool check_every_step = false;
};

class TieredStore {
 public:
  // Validates `config` (InputError naming the field) and builds the engine with capacities
  // equal to the manager's: Note [Capacities agree]. Needs a host tier (capacity_slots[host]
  // > 0): the engine stages every SSD move through host memory.
  explicit TieredStore(KvConfig config, TieredStoreOptions options = {});
  ~TieredStore();
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // The BlockManager's calls, each followed by carrying out the actions it emitted.
  SubmitResult submit(RequestId id, const workload::ServeRequest& r, Admission* out = nullptr);
  std::vector<Admission> finish(RequestId id);
  std::uint64_t spill(std::uint64_t budget_bytes);
  bool pin_prefix(const std::vector<workload::PromptSegment>& prefix);

  // Copies `len` bytes into / out of layer group `group` of the request's logical token block
  // `block`, at byte `offset` of the group's slot, through an engine lease in the tier the
  // block rests in. Throws std::out_of_range for an id, block, group or range outside the
  // request's table, std::runtime_error naming the engine status if the engine refuses.
  // Writing a block shared with other requests (a prefix hit) changes it for all of them:
  // callers write only the blocks their admission did not hit (Admission::hit_blocks).
  void write(RequestId id, std::uint32_t block, std::uint32_t group, std::uint64_t offset,
             const void* src, std::uint64_t len);
  void read(RequestId id, std::uint32_t block, std::uint32_t group, std::uint64_t offset, void* dst,
            std::uint64_t len);

  // Throws std::logic_error if a live block's engine copies are not where the manager says
  // (memory copy in another tier, two memory copies, or a referenced block not in memory).
  void check_agreement() const;

  const BlockManager& manager() const { return bm_; }
  BlockManager& manager() { return bm_; }
  engine::EngineStats engine_stats() const { return stack_.engine().stats(); }
  const engine::RealStack& stack() const { return stack_; }
  const TieredStoreStats& stats() const { return st_; }
  std::uint64_t slot_bytes() const { return slot_bytes_; }
  std::size_t live_blocks() const { return live_.size(); }

 private:
  static engine::RealStackOptions stack_options(const KvConfig& c, const TieredStoreOptions& o);
  void apply();  // carries out bm_.take_actions() in order
  void apply(const Action& a);
  void move_to_memory(engine::TensorId id, Tier to);
  void move_to_ssd(engine::TensorId id, Tier from);
  engine::TensorId locate(RequestId id, std::uint32_t block, std::uint32_t group,
                          std::uint64_t offset, std::uint64_t len, Tier* tier) const;

  BlockManager bm_;
  std::uint64_t slot_bytes_;
  engine::RealStack stack_;
  TieredStoreOptions opt_;
  std::unordered_map<engine::TensorId, Tier> live_;  // every allocated block, by the actions
  TieredStoreStats st_;
};

}  // namespace u3m::kv
