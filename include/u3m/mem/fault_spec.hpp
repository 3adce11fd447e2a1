// Faults to inject under the SSD store, as users and tests write them:
// "lost_write=0.01,bit_flip_on_read=0.02,seed=7" (every I/O fault class of
// io_engine.hpp by its enumerator's name, with a probability per matching op).
// One parser for the CLI (run replay --ssd-faults) and Python
// (Runtime(ssd_faults=...), u3m.torch.offload, the tiered KV cache).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "u3m/mem/io_engine.hpp"

namespace u3m::mem {

// The spec's name of a fault class ("lost_write"): its enumerator, for keys
// in JSON and flags (to_string gives the words for messages).
std::string_view fault_name(IoFault f);

struct FaultSpec {
  std::vector<std::pair<IoFault, double>> rules;  // each kind at most once, 0 < p <= 1
  std::uint64_t seed = 1;
  bool empty() const { return rules.empty(); }
  std::string describe() const;  // the text parse() accepts
  // Throws InputError naming `where` and the item ("lost_write=2").
  static FaultSpec parse(std::string_view text, std::string_view where);
};

// A fault-injection engine over the default I/O engine with the spec's rules
// (each kind's generator seeded from seed and the kind).
std::shared_ptr<FaultInjectionIoEngine> make_fault_engine(const FaultSpec& spec,
                                                          unsigned queue_depth = 128);

}  // namespace u3m::mem
