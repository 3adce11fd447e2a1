// Online index structures shared by the predictors.
//
// StepWheel: a timing wheel over op steps: each tensor has at most one scheduled
// predicted access step `at`, kept predictable until step `until`. Lets the
// time-estimating predictors (u3m EMA, markov-reuse) answer "what is due in
// the next H steps" in O(H + answer) without scanning every tensor.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace u3m::predict {

class StepWheel {
 public:
  // The ring covers `1 << ring_bits` steps starting `back` steps in the past;
  // overdue entries stay visible for at most `back` steps.
  explicit StepWheel(std::uint32_t ring_bits = 13, std::uint32_t back = 64)
      : size_(1u << ring_bits), back_(back), ring_(size_) {}

  // (Re)schedules t; replaces any earlier schedule of t.
  void schedule(std::uint32_t t, std::uint64_t at, std::uint64_t until) {
    if (t >= cur_.size()) cur_.resize(t + 1);
    Cur& c = cur_[t];
    ++c.ver;
    until = std::min(until, at + back_);
    if (until < now_) return;  // already expired: nothing to keep
    c.at = at;
    c.until = until;
    c.live = true;
    if (at < lo()) at = c.at = lo();
    if (at >= lo() + size_) {
      far_.push_back({at, {t, c.ver}});
      std::push_heap(far_.begin(), far_.end(), FarCmp{});
    } else {
      ring_[at & (size_ - 1)].push_back({t, c.ver});
    }
  }
  void cancel(std::uint32_t t) {
    if (t < cur_.size()) {
      ++cur_[t].ver;
      cur_[t].live = false;
    }
  }
  // Moves the wheel forward to step `now` (monotonic).
  void advance(std::uint64_t now) {
    if (now <= now_) return;
    std::uint64_t old_lo = lo();
    now_ = now;
    std::uint64_t new_lo = lo();
    for (std::uint64_t s = old_lo; s < new_lo && s < old_lo + size_; ++s)
      ring_[s & (size_ - 1)].clear();
    while (!far_.empty() && far_.front().first < new_lo + size_) {
      std::pop_heap(far_.begin(), far_.end(), FarCmp{});
      auto [at, e] = far_.back();
      far_.pop_back();
      if (e.t < cur_.size() && cur_[e.t].ver == e.ver) {
        if (at < new_lo) at = cur_[e.t].at = new_lo;
        ring_[at & (size_ - 1)].push_back(e);
      }
    }
  }
  // Calls fn(t, at) for every live entry with at < now + horizon that has not
  // expired (until >= now).
  template <typename F>
  void for_each(std::uint32_t horizon, F&& fn) const {
    std::uint64_t end = now_ + horizon;
    std::uint64_t ring_end = std::min(end, lo() + size_);
    for (std::uint64_t s = lo(); s < ring_end; ++s)
      for (const Entry& e : ring_[s & (size_ - 1)]) visit(e, s, fn);
    if (end > lo() + size_)  // rare: horizon beyond the ring (one-iteration horizons)
      for (const auto& [at, e] : far_)
        if (at < end) visit(e, at, fn);
  }
  std::uint64_t now() const { return now_; }

 private:
  struct Entry {
    std::uint32_t t, ver;
  };
  struct Cur {
    std::uint64_t at = 0, until = 0;
    std::uint32_t ver = 0;
    bool live = false;
  };
  struct FarCmp {
    bool operator()(const std::pair<std::uint64_t, Entry>& a,
                    const std::pair<std::uint64_t, Entry>& b) const {
      return a.first > b.first;
    }
  };
  template <typename F>
  void visit(const Entry& e, std::uint64_t at, F& fn) const {
    const Cur& c = cur_[e.t];
    if (c.ver == e.ver && c.live && c.at == at && c.until >= now_) fn(e.t, at);
  }
  std::uint64_t lo() const { return now_ > back_ ? now_ - back_ : 0; }

  std::uint32_t size_, back_;
  std::uint64_t now_ = 0;
  std::vector<std::vector<Entry>> ring_;
  std::vector<std::pair<std::uint64_t, Entry>> far_;  // min-heap on at
  std::vector<Cur> cur_;
};

// An intrusive most-recently-used list over dense tensor indices: O(1) touch
// and remove. Used by lru and by the u3m EMA predictor's LRU fallback.
class RecencyList {
 public:
  void touch(std::uint32_t t, std::uint64_t step) {
    if (t >= nodes_.size()) nodes_.resize(t + 1);
    remove(t);
    Node& n = nodes_[t];
    n.in = true;
    n.step = step;
    n.prev = kNone;
    n.next = head_;
    if (head_ != kNone) nodes_[head_].prev = t;
    head_ = t;
  }
  void remove(std::uint32_t t) {
    if (t >= nodes_.size() || !nodes_[t].in) return;
    Node& n = nodes_[t];
    if (n.prev != kNone)
      nodes_[n.prev].next = n.next;
    else
      head_ = n.next;
    if (n.next != kNone) nodes_[n.next].prev = n.prev;
    n.in = false;
  }
  // Calls fn(t, step) from the most recent while fn returns true.
  template <typename F>
  void walk(F&& fn) const {
    for (std::uint32_t t = head_; t != kNone; t = nodes_[t].next)
      if (!fn(t, nodes_[t].step)) return;
  }

 private:
  static constexpr std::uint32_t kNone = UINT32_MAX;
  struct Node {
    std::uint32_t prev = kNone, next = kNone;
    std::uint64_t step = 0;
    bool in = false;
  };
  std::vector<Node> nodes_;
  std::uint32_t head_ = kNone;
};

}  // namespace u3m::predict
