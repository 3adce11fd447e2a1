#include "u3m/mem/mapping.hpp"

#include <sys/mman.h>

namespace u3m::mem {

void* map_aligned(std::uint64_t bytes, std::uint64_t align, int prot, int flags) {
  const std::uint64_t span = bytes + align;
  void* raw = ::mmap(nullptr, span, prot, flags, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (base + align - 1) & ~std::uintptr_t{align - 1};
  if (aligned > base) ::munmap(raw, aligned - base);
  const std::uintptr_t end = aligned + bytes;
  if (base + span > end) ::munmap(reinterpret_cast<void*>(end), base + span - end);
  return reinterpret_cast<void*>(aligned);
}

}  // namespace u3m::mem
