// The simulator's memory stack: the real engine::Engine over a DevicePool on
// fake addresses (mem::VirtualSegmentSource), SimHost and SimTransport's
// modelled links, on a VirtualTime. Built from the same engine::StackSpec as
// the real stack (engine/real_stack.hpp): budgets, pool, engine config and
// links. Nothing is ever dereferenced.
#pragma once

#include "u3m/engine/engine.hpp"
#include "u3m/engine/stack_spec.hpp"
#include "u3m/mem/pool.hpp"
#include "u3m/sim/sim_host.hpp"
#include "u3m/sim/sim_transport.hpp"
#include "u3m/sim/virtual_time.hpp"

namespace u3m::sim {

// The links of a stack spec as the simulated transport takes them.
SimTransportConfig transport_config(const engine::StackSpec& spec, bool ssd_shared = true);

// Members in construction order (each refers to those above). `clock` and
// `shared` (SharedLinks for the SSD of several cards, or null) must outlive
// the stack. InputError for a spec that does not work.
struct SimStack {
  SimStack(const engine::StackSpec& spec, VirtualTime& clock, SharedLinks* shared = nullptr,
           bool ssd_shared = true);
  SimTransport transport;
  mem::VirtualSegmentSource source;
  mem::DevicePool pool;
  SimHost host;
  engine::Engine engine;
};

}  // namespace u3m::sim
