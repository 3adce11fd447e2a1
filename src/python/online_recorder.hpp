// The online recorder of the PyTorch path (issue 16 item 5): what
// u3m.torch.offload does to its tensors, recorded in C++ as it happens, and
// the trace a tiering policy reads, built from it with no file in between.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "u3m/trace/model.hpp"

namespace u3m::python {

// Note [Online recording]
// The offload's hooks sit at module boundaries (a unit's gather, a saved
// tensor's pack and unpack, a gradient's arrival, each parameter's optimizer
// step): every engine access the offload makes is one call into this
// recorder, which appends (tensor, read or write, phase, time) to the current
// training step. A tensor is known by its engine id, the stable_id of a name
// that is the same in every step ("param.<name>", "grad.<name>", "act.<n>"),
// so identity holds across steps. The Python TorchDispatchMode recorder
// (python/u3m_capture) stays as the offline capture tool: it sees every aten
// op; this one sees only the tensors the offload manages, which are the ones
// a tiering policy decides about, at one call per access instead of one
// Python hook per op.
//
// The policy's trace is the last complete step repeated (`repeats`
// iterations), one op per access: a training step repeats, so this is what
// the next steps will do as far as anything can know. Policies that read the
// future (lookahead, belady) read it from there; the u3m policy's predictor
// sees each step's events only when the driver reaches it
// (Note [Predictor contract]), so its decisions use what happened.
class OnlineRecorder {
 public:
  struct Record {
    std::uint32_t tensor;  // index into tensors()
    bool write;
    bool free;  // the tensor was removed (after its last access of the step)
    trace::Phase phase;
    std::uint64_t time_ns;  // since the step began
  };
  struct Known {
    std::uint64_t id;
    std::string name;
    std::uint64_t bytes;
    trace::Role role;
  };

  // A tensor the program registers (again, after a removal: same index).
  std::uint32_t tensor(std::uint64_t id, std::string_view name, std::uint64_t bytes,
                       trace::Role role);
  // Index of a known id, or -1.
  std::int64_t index_of(std::uint64_t id) const;
  void access(std::uint32_t tensor, bool write, trace::Phase phase, std::uint64_t now_ns);
  void free(std::uint32_t tensor, std::uint64_t now_ns);
  // Closes the step being recorded; its records become last_step().
  void end_step(std::uint64_t now_ns);

  const std::vector<Known>& tensors() const { return tensors_; }
  const std::vector<Record>& last_step() const { return last_; }
  const std::vector<Record>& current() const { return cur_; }
  std::uint64_t recorded() const { return recorded_; }  // accesses, all steps
  // Whether the step just closed made the same accesses as the one before.
  bool repeated() const { return repeated_; }

  // The last step `repeats` times (Note [Online recording]); the tensors it
  // names are those of tensors(), in that order. Empty without a last step.
  trace::Trace build(unsigned repeats) const;

 private:
  std::vector<Known> tensors_;
  std::unordered_map<std::uint64_t, std::uint32_t> index_;
  std::vector<Record> cur_, last_;
  std::uint64_t step_start_ns_ = 0, last_len_ns_ = 0, recorded_ = 0;
  bool repeated_ = false;
};

}  // namespace u3m::python
