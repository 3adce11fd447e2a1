#include "online_recorder.hpp"

#include <algorithm>

namespace u3m::python {

std::uint32_t OnlineRecorder::tensor(std::uint64_t id, std::string_view name, std::uint64_t bytes,
                                     trace::Role role) {
  const auto [it, fresh] = index_.try_emplace(id, static_cast<std::uint32_t>(tensors_.size()));
  if (fresh) {
    tensors_.push_back({id, std::string(name), bytes, role});
  } else {
    Known& k = tensors_[it->second];  // the same name again: its size may differ
    k.bytes = std::max(k.bytes, bytes);
  }
  return it->second;
}

std::int64_t OnlineRecorder::index_of(std::uint64_t id) const {
  const auto it = index_.find(id);
  return it == index_.end() ? -1 : static_cast<std::int64_t>(it->second);
}

void OnlineRecorder::access(std::uint32_t tensor, bool write, trace::Phase phase,
                            std::uint64_t now_ns) {
  cur_.push_back({tensor, write, false, phase, now_ns - std::min(now_ns, step_start_ns_)});
  ++recorded_;
}

void OnlineRecorder::free(std::uint32_t tensor, std::uint64_t now_ns) {
  cur_.push_back({tensor, false, true, trace::Phase::other,
                  now_ns - std::min(now_ns, step_start_ns_)});
}

void OnlineRecorder::end_step(std::uint64_t now_ns) {
  repeated_ = cur_.size() == last_.size() &&
              std::equal(cur_.begin(), cur_.end(), last_.begin(), [](const Record& a, const Record& b) {
                return a.tensor == b.tensor && a.write == b.write && a.free == b.free;
              });
  last_.swap(cur_);
  cur_.clear();
  last_len_ns_ = now_ns - std::min(now_ns, step_start_ns_);
  step_start_ns_ = now_ns;
}

trace::Trace OnlineRecorder::build(unsigned repeats) const {
  trace::Trace t;
  t.meta("source", "u3m.torch.offload online recorder");
  t.job("train-0");
  for (const Known& k : tensors_)
    t.tensor(trace::make_tensor(k.name, std::max<std::uint64_t>(k.bytes, 1), trace::DType::other,
                                k.role));
  bool any = false;
  for (const Record& r : last_) any |= !r.free;
  if (!any) return t;
  const std::uint64_t len = std::max<std::uint64_t>(last_len_ns_, 1);
  for (unsigned it = 0; it < repeats; ++it) {
    const std::uint64_t base = it * len;
    std::uint32_t op = 0;
    bool have_op = false;
    for (const Record& r : last_) {
      if (r.free) {
        // A free belongs to the op before it; one before any access has none.
        if (have_op) t.event({base + r.time_ns, op, r.tensor, trace::EventKind::free});
        continue;
      }
      trace::Op o;
      o.name = (r.write ? "write " : "read ") + tensors_[r.tensor].name;
      o.cls = r.phase == trace::Phase::optimizer ? trace::OpClass::optimizer : trace::OpClass::other;
      o.phase = r.phase;
      o.iteration = it;
      op = static_cast<std::uint32_t>(t.ops.size());
      have_op = true;
      t.op(o);
      t.event({base + r.time_ns, op, r.tensor,
               r.write ? trace::EventKind::write : trace::EventKind::read});
    }
  }
  return t;
}

}  // namespace u3m::python
