// Shared vocabulary of the memory layer (src/mem): tiers, status codes and
// capability structs. Backends mirror Ascend ACL semantics (see
// docs/architecture.md) and never throw across their boundary: every call
// returns a Status, and out-of-memory is its own recoverable code.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace u3m::mem {

enum class Tier : std::uint8_t { device, host, ssd };

// Codes are grouped by cause, in the spirit of Mooncake's transport errors:
// 0 ok; 1-9 caller errors; 10-19 capacity; 20-29 I/O and data integrity;
// 30-39 the device or backend itself.
enum class Status : std::int32_t {
  ok = 0,
  invalid_argument = 1,
  unsupported = 2,
  not_found = 3,
  busy = 4,  // e.g. a block still has pending copies
  out_of_memory = 10,
  no_space = 11,  // a bounded store is full of data it may not evict
  io_error = 20,
  short_io = 21,
  corrupt = 22,  // checksum mismatch
  device_failed = 30,
};

constexpr bool ok(Status s) { return s == Status::ok; }
std::string_view to_string(Status s);
std::string_view to_string(Tier t);

// What a backend can do, probed at start so callers degrade gracefully.
struct Capabilities {
  std::string name;                    // "device-emu", "host", "ssd", later "cuda", "acl"
  Tier tier = Tier::host;
  bool vmm = false;                    // reserve/map/unmap (expandable segments)
  std::uint64_t granularity = 4096;    // allocation / mapping granularity in bytes
  bool pinned = false;                 // page-locked host memory (mlock succeeded)
  bool direct_io = false;              // O_DIRECT file I/O
  double read_gbps = 0, write_gbps = 0;  // configured throttle or nominal; 0 = unthrottled/unknown
  std::uint64_t capacity = 0;          // bytes this backend may hand out; 0 = unbounded
};

}  // namespace u3m::mem
