#include "u3m/sim/sim_host.hpp"

#include <algorithm>

namespace u3m::sim {

namespace {
// Fake addresses start high and far from VirtualSegmentSource's, so a stray
// host/device mix-up in a log is easy to spot; they are never dereferenced.
constexpr std::uintptr_t kBase = 0x6000'0000'0000ull;
constexpr std::uint64_t kAlign = 256;
}  // namespace

SimHost::SimHost(std::uint64_t capacity) : capacity_(capacity), next_(kBase) {}

mem::Capabilities SimHost::capabilities() const {
  mem::Capabilities c;
  c.name = "sim-host";
  c.tier = mem::Tier::host;
  c.granularity = kAlign;
  c.pinned = true;  // modelled as pinned: the links' rates are pinned-DMA rates
  c.capacity = capacity_;
  return c;
}

mem::Status SimHost::allocate(std::uint64_t bytes, void** ptr) {
  if (bytes == 0 || ptr == nullptr) return mem::Status::invalid_argument;
  if (capacity_ != 0 && bytes > capacity_ - used_) return mem::Status::out_of_memory;
  const std::uintptr_t p = next_;
  // Addresses are never reused: 2^64 bytes of fake space outlast any run.
  next_ += (bytes + kAlign - 1) / kAlign * kAlign;
  blocks_.push_back(Block{p, bytes});
  ++live_;
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  *ptr = reinterpret_cast<void*>(p);
  return mem::Status::ok;
}

mem::Status SimHost::free(void* ptr) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = std::lower_bound(blocks_.begin(), blocks_.end(), addr,
                             [](const Block& b, std::uintptr_t a) { return b.addr < a; });
  if (it == blocks_.end() || it->addr != addr || it->bytes == 0)
    return mem::Status::invalid_argument;  // never handed out, or freed already
  used_ -= it->bytes;
  it->bytes = 0;
  --live_;
  if (blocks_.size() > 64 && blocks_.size() - live_ > live_) {
    std::erase_if(blocks_, [](const Block& b) { return b.bytes == 0; });
  }
  return mem::Status::ok;
}

mem::Status SimHost::mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) const {
  if (!free_bytes || !total_bytes) return mem::Status::invalid_argument;
  *total_bytes = capacity_;
  *free_bytes = capacity_ == 0 ? ~std::uint64_t{0} - used_ : capacity_ - used_;
  return mem::Status::ok;
}

}  // namespace u3m::sim
