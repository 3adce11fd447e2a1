#include "u3m/sim/sim_stack.hpp"

namespace u3m::sim {

SimTransportConfig transport_config(const engine::StackSpec& spec, bool ssd_shared) {
  SimTransportConfig c;
  c.links = spec.links;
  c.ssd_capacity = spec.ssd_bytes;
  c.ssd_shared = ssd_shared;
  return c;
}

namespace {
const engine::StackSpec& checked(const engine::StackSpec& s) {
  s.validate("simulated stack");
  return s;
}
}  // namespace

SimStack::SimStack(const engine::StackSpec& spec, VirtualTime& clock, SharedLinks* shared,
                   bool ssd_shared)
    : transport(clock, transport_config(checked(spec), ssd_shared), shared),
      source(2 * mem::MiB, 0, /*vmm=*/true),
      pool(source, spec.pool_config(source.supports_vmm())),
      host(spec.host_bytes),
      engine(spec.engine_config(), pool, host, transport, clock) {}

}  // namespace u3m::sim
