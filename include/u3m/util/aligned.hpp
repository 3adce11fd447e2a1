// Heap buffers with a given alignment (O_DIRECT I/O needs block-aligned
// memory), freed by their unique_ptr.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace u3m {

struct FreeDeleter {
  void operator()(unsigned char* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<unsigned char, FreeDeleter>;

// `bytes` of uninitialized memory aligned to `alignment` (a power of two,
// a multiple of sizeof(void*)); throws std::bad_alloc when out of memory.
inline AlignedBuffer aligned_buffer(std::size_t alignment, std::size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, alignment, bytes) != 0) throw std::bad_alloc();
  return AlignedBuffer(static_cast<unsigned char*>(p));
}

}  // namespace u3m
