// The two kinds of job a generator runs: a training job (one rank of a
// LLaMA-shape training run) and a serving job (continuous batching with a
// paged KV cache). Internal to src/workload.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "emitter.hpp"
#include "u3m/workload/analytic.hpp"
#include "u3m/workload/requests.hpp"

namespace u3m::workload::detail {

class TrainJob {
 public:
  // Declares the job and all its tensors, and builds the step program.
  TrainJob(Emitter& e, const ModelShape& s, const TrainConfig& c, std::string job_name);
  // Emits the op that allocates weights and optimizer state (phase other).
  void init();
  // Emits one training step; calls on_boundary() after every layer unit.
  template <typename F>
  void run_step(F&& on_boundary) {
    for (const POp& o : prog_.ops) {
      e_.emit(prog_, o, job_, step_);
      if (o.boundary) on_boundary();
    }
    ++step_;
  }
  void run_step() {
    run_step([] {});
  }
  std::uint32_t steps_done() const { return step_; }
  // What one run_step() emits: {ops, events}.
  std::pair<std::size_t, std::size_t> step_size() const { return prog_.emitted_size(); }

 private:
  struct Param {
    ParamSpec spec;
    std::uint32_t w;         // the resident weight (the shard under ZeRO-3)
    std::uint32_t gathered;  // ZeRO-3 full-size buffer, else == w
    std::uint32_t grad = kNone, grad_full = kNone, master = kNone, m = kNone, v = kNone;
  };
  struct LayerParams {
    std::uint32_t attn_norm, ffn_norm;
    std::uint32_t proj[kNumProj], lora_a[kNumProj], lora_b[kNumProj];
  };
  struct LayerActs {
    std::uint32_t attn_norm, q, k, v, rope_q, rope_k, core, lse, o, h, ffn_norm, gate, up, swiglu,
        down, out;
    std::uint32_t lora[kNumProj];
    // gradients of activations
    std::uint32_t g_out, g_swiglu, g_gate, g_up, g_ffn_norm, g_h, g_core, g_rope_q, g_rope_k, g_q,
        g_k, g_v, g_attn_norm;
    std::uint32_t g_lora[kNumProj];
  };
  static constexpr std::uint32_t kNone = UINT32_MAX;

  std::uint32_t act(const std::string& name, std::uint64_t elems, DType dt, std::int32_t layer);
  std::uint32_t use(std::uint32_t p) const { return params_[p].gathered; }
  std::uint32_t layer_input(std::uint32_t l) const;
  std::uint32_t layer_input_grad(std::uint32_t l) const;
  void grad_access(std::uint32_t p);
  void accumulate(std::uint32_t dx, bool& started);

  void build_step();
  void gather(const std::vector<std::uint32_t>& group, std::int32_t layer, const std::string& name);
  void reduce_scatter(const std::vector<std::uint32_t>& group, std::int32_t layer,
                      const std::string& name);
  void norm_fwd(std::int32_t l, const std::string& name, std::uint32_t x, std::uint32_t w,
                std::uint32_t y, Phase ph, const char* sfx);
  void norm_bwd(std::int32_t l, const std::string& name, std::uint32_t dy, std::uint32_t x,
                std::uint32_t w, std::uint32_t dx);
  void proj_fwd(std::uint32_t l, Proj p, std::uint32_t x, std::uint32_t y, Phase ph,
                const char* sfx);
  void proj_bwd(std::uint32_t l, Proj p, std::uint32_t dy, std::uint32_t x, std::uint32_t dx,
                bool& dx_started, bool need_dx);
  void layer_fwd(std::uint32_t l, bool recompute);
  void layer_bwd(std::uint32_t l);
  std::vector<std::uint32_t> layer_group(std::uint32_t l) const;

  Emitter& e_;
  ModelShape s_;
  TrainConfig c_;
  std::string name_;
  std::uint32_t job_;
  std::uint32_t step_ = 0;
  DType wdt_, adt_;
  std::uint64_t T_;
  std::vector<Param> params_;
  std::vector<LayerParams> lp_;
  std::vector<LayerActs> la_;
  std::vector<std::string> lnames_;  // "train-0.layer_3."
  std::uint32_t embed_, final_norm_, lm_head_;
  std::uint32_t ids_, embed_out_, g_embed_out_, fn_out_, g_fn_out_, logits_, g_logits_, loss_;
  std::vector<std::uint8_t> started_;  // per tensor: gradient produced in this step already
  Program prog_;
};

class InferJob {
 public:
  InferJob(Emitter& e, const ModelShape& s, const InferConfig& c, std::string job_name,
           RequestSource& src);
  void init();
  // True when an iteration can run now: requests running, or arrived and waiting.
  bool has_work();
  // True when every request has finished and the source is exhausted.
  bool done();
  std::optional<std::uint64_t> next_arrival();
  // Takes the next n requests from the source as arriving now, output capped.
  std::uint32_t take_batch(std::uint32_t n, std::uint32_t output_cap);
  void iterate();  // one serving iteration: a prefill or a decode
  std::uint32_t iterations() const { return iter_; }
  std::uint32_t completed() const { return completed_; }
  std::uint32_t peak_running() const { return peak_running_; }

 private:
  struct Live {
    Request r;
    std::uint32_t ctx = 0, generated = 0;
    std::vector<std::vector<std::uint32_t>> blocks;  // [layer][block] tensor index
  };
  struct Slot {
    std::string name;
    DType dtype;
    Role role;
    std::int32_t layer;
    std::unordered_map<std::uint64_t, std::uint32_t> by_bytes;
  };
  enum LayerSlot {
    kAttnNorm,
    kQ,
    kK,
    kV,
    kRopeQ,
    kRopeK,
    kCore,
    kO,
    kH,
    kFfnNorm,
    kGate,
    kUp,
    kSwiglu,
    kDown,
    kOut,
    kLayerSlots
  };
  enum GlobalSlot { kIds, kEmbedOut, kFinalNorm, kLogits, kNext, kGlobalSlots };

  std::uint32_t slot(std::uint32_t index, std::uint64_t elems);
  std::uint32_t lslot(std::uint32_t l, LayerSlot k, std::uint64_t elems) {
    return slot(kGlobalSlots + l * kLayerSlots + k, elems);
  }
  bool fetch();  // fills lookahead_ from the source (validated); false when exhausted
  void pull_arrivals();
  std::uint32_t new_block(Live& r, std::uint32_t l);

  Emitter& e_;
  ModelShape s_;
  InferConfig c_;
  std::string name_;
  std::uint32_t job_;
  RequestSource& src_;
  std::optional<Request> lookahead_;
  bool src_done_ = false;
  std::uint64_t last_arrival_ = 0;
  std::unordered_set<std::uint64_t> seen_ids_;
  std::deque<Request> waiting_;
  std::vector<Live> running_;
  std::uint32_t iter_ = 0, completed_ = 0, peak_running_ = 0;
  std::uint64_t block_bytes_;
  std::vector<Slot> slots_;
  std::vector<std::string> op_names_;  // per layer prefix "infer-0.layer_3."
  std::uint32_t embed_, final_norm_, lm_head_;
  std::vector<std::uint32_t> weights_;                       // all, for init
  std::vector<std::array<std::uint32_t, 2 + kNumProj>> lw_;  // attn_norm, ffn_norm, projections
  Program prog_;
  std::vector<std::uint8_t> scratch_;
};

}  // namespace u3m::workload::detail
