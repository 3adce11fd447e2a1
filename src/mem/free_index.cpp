// The pool's free-block index: best fit by (size, address) over size-class
// bins (Note [Free index]).
#include <algorithm>
#include <cassert>
#include <cstdint>

#include "pool_block.hpp"
#include "u3m/mem/pool.hpp"

namespace u3m::mem {

// Note [Free index]
// Best fit is "the smallest free block that fits, the lowest address among
// equal sizes". A std::set ordered by (size, address) gives it in one
// lower_bound, but every insert and erase pays a node allocation and a
// pointer-chasing rebalance, and the simulator frees and allocates millions
// of blocks (the set was 13-21% of a bench_sim profile). So, as jemalloc and
// TLSF do, the free blocks sit in size-class bins: 8 classes per power of two
// (class_of below; a class covers a size range, and classes grow with size),
// each bin a flat array sorted by (size, address), and a bitmap of non-empty
// bins. Best fit searches the request's own bin (it may hold smaller blocks),
// then takes the first entry of the next non-empty bin (a bitmap scan): every
// block there is larger than any in lower bins, and its first entry is the
// smallest, lowest-addressed one. So the choice is exactly the set's, and
// placement (and every simulator figure) is unchanged. An insert or erase
// moves the entries after it in its bin: O(bin) where the set was O(log n).
// A bin spans 1/8 of its power of two, so the bins stay short when free
// sizes vary, as in the simulator's traces; many free blocks of one size
// class (fixed-size KV slots freed out of order) would fill one bin, and
// that case is not measured.
int DevicePool::FreeIndex::class_of(std::uint64_t size) {
  if (size < 16) return static_cast<int>(size);                  // 0..15: one class per size
  const int e = 63 - __builtin_clzll(size);                      // 4..63
  return 8 * (e - 2) + static_cast<int>((size >> (e - 3)) & 7);  // 16..495
}

int DevicePool::FreeIndex::next_nonempty(int from) const {
  for (int w = from / 64; w < kClasses / 64; ++w) {
    std::uint64_t bits = bitmap_[w];
    if (w == from / 64) bits &= ~std::uint64_t{0} << (from % 64);
    if (bits) return w * 64 + __builtin_ctzll(bits);
  }
  return -1;
}

namespace {
template <typename E>
bool entry_less(const E& e, std::uint64_t size, std::uintptr_t ptr) {
  return e.size != size ? e.size < size : e.ptr < ptr;
}
}  // namespace

void DevicePool::FreeIndex::insert(PoolBlock* b) {
  const int c = class_of(b->size);
  auto& bin = bins_[c];
  auto it = std::lower_bound(bin.begin(), bin.end(), b, [](const Entry& e, const PoolBlock* x) {
    return entry_less(e, x->size, x->ptr);
  });
  bin.insert(it, Entry{b->size, b->ptr, b});
  bitmap_[c / 64] |= std::uint64_t{1} << (c % 64);
  ++count_;
}

bool DevicePool::FreeIndex::erase(PoolBlock* b) {
  const int c = class_of(b->size);
  auto& bin = bins_[c];
  auto it = std::lower_bound(bin.begin(), bin.end(), b, [](const Entry& e, const PoolBlock* x) {
    return entry_less(e, x->size, x->ptr);
  });
  assert(it != bin.end() && it->block == b);
  if (it == bin.end() || it->block != b) return false;  // not indexed: nothing to take out
  bin.erase(it);
  if (bin.empty()) bitmap_[c / 64] &= ~(std::uint64_t{1} << (c % 64));
  --count_;
  return true;
}

PoolBlock* DevicePool::FreeIndex::best_fit(std::uint64_t size) const {
  const int c = class_of(size);
  const auto& bin = bins_[c];
  auto it = std::lower_bound(bin.begin(), bin.end(), size,
                             [](const Entry& e, std::uint64_t s) { return e.size < s; });
  if (it != bin.end()) return it->block;
  if (c + 1 >= kClasses) return nullptr;
  const int n = next_nonempty(c + 1);
  return n < 0 ? nullptr : bins_[n].front().block;
}

PoolBlock* DevicePool::FreeIndex::largest() const {
  for (int w = kClasses / 64; w-- > 0;) {
    if (bitmap_[w]) return bins_[w * 64 + 63 - __builtin_clzll(bitmap_[w])].back().block;
  }
  return nullptr;
}

}  // namespace u3m::mem
