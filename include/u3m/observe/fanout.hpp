// One RunObserver that passes every call on to several (metrics and a
// timeline on one run: an engine and a driver take one observer each).
#pragma once

#include <vector>

#include "u3m/engine/run_observer.hpp"

namespace u3m::observe {

class Fanout final : public engine::RunObserver {
 public:
  void add(engine::RunObserver* o) { to_.push_back(o); }  // before the run starts
  bool empty() const { return to_.empty(); }

  void op(int card, std::int64_t step, std::size_t index, std::string_view name,
          engine::OpWork work, double t0_s, double t1_s) override {
    for (auto* o : to_) o->op(card, step, index, name, work, t0_s, t1_s);
  }
  void stall(int card, std::int64_t step, std::size_t index, double t0_s, double t1_s) override {
    for (auto* o : to_) o->stall(card, step, index, t0_s, t1_s);
  }
  void step_end(int card, std::int64_t step, double t_s) override {
    for (auto* o : to_) o->step_end(card, step, t_s);
  }
  void transfer(const engine::TransferRecord& t) override {
    for (auto* o : to_) o->transfer(t);
  }
  void occupancy(int card, mem::Tier tier, std::uint64_t used, double t_s) override {
    for (auto* o : to_) o->occupancy(card, tier, used, t_s);
  }
  void attached(int card, const engine::Engine& e) override {
    for (auto* o : to_) o->attached(card, e);
  }
  void detached(int card, const engine::Engine& e) override {
    for (auto* o : to_) o->detached(card, e);
  }

 private:
  std::vector<engine::RunObserver*> to_;
};

}  // namespace u3m::observe
