#include "u3m/mem/backend.hpp"

namespace u3m::mem {

std::string_view to_string(CopyKind k) {
  switch (k) {
    case CopyKind::h2h:
      return "h2h";
    case CopyKind::h2d:
      return "h2d";
    case CopyKind::d2h:
      return "d2h";
    case CopyKind::d2d:
      return "d2d";
  }
  return "?";
}

}  // namespace u3m::mem
