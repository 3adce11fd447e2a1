#include "u3m/mem/status.hpp"

namespace u3m::mem {

std::string_view to_string(Status s) {
  switch (s) {
    case Status::ok: return "ok";
    case Status::invalid_argument: return "invalid argument";
    case Status::unsupported: return "unsupported";
    case Status::not_found: return "not found";
    case Status::busy: return "busy";
    case Status::out_of_memory: return "out of memory";
    case Status::no_space: return "no space";
    case Status::io_error: return "I/O error";
    case Status::short_io: return "short I/O";
    case Status::corrupt: return "corrupt data (checksum mismatch)";
    case Status::device_failed: return "device failed";
  }
  return "unknown status";
}

std::string_view to_string(Tier t) {
  switch (t) {
    case Tier::device: return "device";
    case Tier::host: return "host";
    case Tier::ssd: return "ssd";
  }
  return "?";
}

}  // namespace u3m::mem
