// Anonymous memory mapped at an alignment: for segments (the CPU segment
// source) and huge-page buffers (the host tier, the SSD bench).
#pragma once

#include <sys/mman.h>

#include <cstdint>

namespace u3m::mem {

// The transparent huge page size on x86-64 and arm64 with 4 KiB pages.
inline constexpr std::uint64_t kHugePage = 2ull << 20;

// `bytes` of anonymous memory at an `align`-aligned address (a power of two,
// >= the page size), or nullptr; `prot` and `flags` as for mmap (e.g.
// PROT_NONE with MAP_NORESERVE to reserve address space). Over-maps by
// `align` and unmaps the ends, so munmap(p, bytes) frees exactly this.
void* map_aligned(std::uint64_t bytes, std::uint64_t align, int prot = PROT_READ | PROT_WRITE,
                  int flags = MAP_PRIVATE | MAP_ANONYMOUS);

}  // namespace u3m::mem
