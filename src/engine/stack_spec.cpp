#include "u3m/engine/stack_spec.hpp"

#include "u3m/util/error.hpp"

namespace u3m::engine {

void StackSpec::validate(std::string_view where) const {
  if (device_bytes == 0 || host_bytes == 0)
    input_error(where, "device and host capacities must be > 0 bytes, got {} and {}",
                device_bytes, host_bytes);
  for (int l = 0; l < kNumLinks; ++l)
    links[l].validate(where, to_string(static_cast<Link>(l)), /*unbounded_ok=*/true);
  pool_config(true).validate(where);
  engine_config().validate();
}

std::uint64_t StackSpec::arena_bytes() const {
  return pool.capacity ? pool.capacity : 2 * device_bytes + 64 * mem::MiB;
}

mem::PoolConfig StackSpec::pool_config(bool source_supports_vmm) const {
  mem::PoolConfig p = pool;
  p.capacity = arena_bytes();
  p.expandable_segments = pool.expandable_segments && source_supports_vmm;
  return p;
}

EngineConfig StackSpec::engine_config() const {
  EngineConfig c = engine;
  c.device.capacity = device_bytes;
  c.host.capacity = host_bytes;
  return c;
}

}  // namespace u3m::engine
