// host: pinned DRAM; see include/u3m/mem/host.hpp.
#include "u3m/mem/host.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "u3m/mem/mapping.hpp"

namespace u3m::mem {

// Note [Huge-page host buffers]
// Host buffers are what the SSD store reads into and writes from with
// O_DIRECT, and what device copies stage through. A buffer of 4 KiB pages
// scattered in physical memory costs one DMA segment per page: on a virtio
// disk without indirect descriptors (this dev VM: max_segments 254) a 1 MiB
// I/O then splits, and the kernel pins 256 pages per I/O; `u3m bench ssd`
// measured reads at half speed in such runs (docs/memory.md, "Same kind of
// buffers"). So buffers of at least 2 MiB are mapped 2 MiB-aligned and
// advised MADV_HUGEPAGE before they are locked (locking faults them in, as
// huge pages where the kernel has them). Best effort: with transparent huge
// pages off, or none free, they are ordinary pages and nothing else changes.
namespace {
// n bytes of anonymous memory; 2 MiB-aligned and advised huge when n >= 2 MiB.
void* map_buffer(std::uint64_t n) {
  if (n < kHugePage)
    return mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* p = map_aligned(n, kHugePage);
  if (p == nullptr) return MAP_FAILED;
  madvise(p, n, MADV_HUGEPAGE);  // advice only: failure leaves ordinary pages
  return p;
}
}  // namespace

struct HostBackend::Impl {
  HostOptions opt;
  std::uint64_t page = 4096;
  std::uint64_t capacity = 0;
  std::atomic<bool> pinned{false};

  mutable std::mutex mu;
  struct Block {
    std::uint64_t bytes;  // mapped length (page-rounded)
    bool locked;
  };
  std::unordered_map<void*, Block> blocks;
  std::uint64_t used = 0;
  std::uint64_t locked_bytes = 0;
};

HostBackend::HostBackend(HostOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = options;
  if (m.opt.lock == nullptr) m.opt.lock = ::mlock;
  m.page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  m.capacity = m.opt.capacity != 0 ? m.opt.capacity
                                   : static_cast<std::uint64_t>(sysconf(_SC_PHYS_PAGES)) * m.page;
  // Probe once, so capabilities() is honest before the first allocation.
  if (m.opt.pin) {
    void* p = mmap(nullptr, m.page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      m.pinned = m.opt.lock(p, m.page) == 0;
      munmap(p, m.page);  // also drops the lock
    }
  }
}

HostBackend::~HostBackend() {
  for (auto& [p, b] : impl_->blocks) munmap(p, b.bytes);
}

Capabilities HostBackend::capabilities() const {
  Capabilities c;
  c.name = "host";
  c.tier = Tier::host;
  c.vmm = false;
  c.granularity = impl_->page;
  c.pinned = impl_->pinned;
  c.capacity = impl_->capacity;
  return c;
}

Status HostBackend::allocate(std::uint64_t bytes, void** ptr) {
  Impl& m = *impl_;
  if (bytes == 0 || ptr == nullptr) return Status::invalid_argument;
  if (bytes > m.capacity) return Status::out_of_memory;
  std::uint64_t n = (bytes + m.page - 1) / m.page * m.page;
  {
    std::lock_guard g(m.mu);
    if (n > m.capacity - m.used) return Status::out_of_memory;
    m.used += n;  // claimed now; given back below if the mapping fails
  }
  void* p = map_buffer(n);  // Note [Huge-page host buffers]
  if (p == MAP_FAILED) {
    std::lock_guard g(m.mu);
    m.used -= n;
    return Status::out_of_memory;
  }
  bool locked = false;
  if (m.pinned) {
    locked = m.opt.lock(p, n) == 0;
    if (!locked) m.pinned = false;  // degrade for good: later allocations are pageable
  }
  std::lock_guard g(m.mu);
  m.blocks.emplace(p, Impl::Block{n, locked});
  if (locked) m.locked_bytes += n;
  *ptr = p;
  return Status::ok;
}

Status HostBackend::free(void* ptr) {
  Impl& m = *impl_;
  Impl::Block b;
  {
    std::lock_guard g(m.mu);
    auto it = m.blocks.find(ptr);
    if (it == m.blocks.end()) return Status::invalid_argument;
    b = it->second;
    m.blocks.erase(it);
    m.used -= b.bytes;
    if (b.locked) m.locked_bytes -= b.bytes;
  }
  munmap(ptr, b.bytes);  // drops the lock with the pages
  return Status::ok;
}

Status HostBackend::mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) const {
  if (free_bytes == nullptr || total_bytes == nullptr) return Status::invalid_argument;
  std::lock_guard g(impl_->mu);
  *free_bytes = impl_->capacity - impl_->used;
  *total_bytes = impl_->capacity;
  return Status::ok;
}

std::uint64_t HostBackend::pinned_bytes() const {
  std::lock_guard g(impl_->mu);
  return impl_->locked_bytes;
}

}  // namespace u3m::mem
