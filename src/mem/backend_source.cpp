// BackendSegmentSource: a DevicePool's memory from a DeviceBackend
// (Note [Backend segment source] in the header).
#include "u3m/mem/backend_source.hpp"

#include <algorithm>

namespace u3m::mem {

namespace {

void* as_ptr(std::uintptr_t p) {
  return reinterpret_cast<void*>(p);
}
std::uintptr_t as_addr(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

}  // namespace

BackendSegmentSource::BackendSegmentSource(DeviceBackend& backend) : backend_(backend) {
  Capabilities caps = backend.capabilities();
  granularity_ = std::max<std::uint64_t>(caps.granularity, 1);
  vmm_ = caps.vmm;
}

BackendSegmentSource::~BackendSegmentSource() {
  std::lock_guard lock(mu_);
  while (!chunks_.empty()) {
    auto it = chunks_.begin();
    backend_.unmap(as_ptr(it->first));
    backend_.free_physical(it->second);
    chunks_.erase(it);
  }
  for (auto& [base, bytes] : reservations_) backend_.release(as_ptr(base));
  for (auto& [base, bytes] : segments_) backend_.free(as_ptr(base));
}

Status BackendSegmentSource::allocate_segment(std::uint64_t bytes, void** base) {
  std::lock_guard lock(mu_);
  ++counters_.allocate_segment;
  if (!base || bytes == 0 || bytes % granularity_) return Status::invalid_argument;
  void* p = nullptr;
  Status s = backend_.allocate(bytes, &p);
  if (!ok(s)) {
    ++counters_.failures;
    return s;
  }
  segments_[as_addr(p)] = bytes;
  counters_.physical_bytes += bytes;
  *base = p;
  return Status::ok;
}

Status BackendSegmentSource::free_segment(void* base, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.free_segment;
  auto it = segments_.find(as_addr(base));
  if (it == segments_.end() || it->second != bytes) return Status::invalid_argument;
  Status s = backend_.free(base);
  if (!ok(s)) return s;
  segments_.erase(it);
  counters_.physical_bytes -= bytes;
  return Status::ok;
}

Status BackendSegmentSource::reserve(std::uint64_t bytes, void** base) {
  std::lock_guard lock(mu_);
  ++counters_.reserve;
  if (!vmm_) return Status::unsupported;
  if (!base || bytes == 0 || bytes % granularity_) return Status::invalid_argument;
  void* p = nullptr;
  Status s = backend_.reserve(bytes, &p);
  if (!ok(s)) {
    ++counters_.failures;
    return s;
  }
  reservations_[as_addr(p)] = bytes;
  *base = p;
  return Status::ok;
}

Status BackendSegmentSource::unmap_chunks(std::uintptr_t addr, std::uint64_t bytes) {
  Status first = Status::ok;
  for (std::uint64_t off = 0; off < bytes; off += granularity_) {
    auto it = chunks_.find(addr + off);
    if (it == chunks_.end()) continue;
    Status s = backend_.unmap(as_ptr(it->first));
    if (ok(s)) s = backend_.free_physical(it->second);
    if (!ok(s)) {
      if (ok(first)) first = s;
      continue;  // still mapped or allocated: keep it, so the destructor retries
    }
    counters_.physical_bytes -= it->second.size;
    chunks_.erase(it);
  }
  return first;
}

Status BackendSegmentSource::map(void* addr, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.map;
  if (!vmm_) return Status::unsupported;
  std::uintptr_t a = as_addr(addr);
  if (bytes == 0 || a % granularity_ || bytes % granularity_) return Status::invalid_argument;
  for (std::uint64_t off = 0; off < bytes; off += granularity_) {
    PhysicalHandle h;
    Status s = backend_.create_physical(granularity_, &h);
    if (ok(s)) {
      s = backend_.map(as_ptr(a + off), h);
      if (!ok(s)) backend_.free_physical(h);
    }
    if (!ok(s)) {
      ++counters_.failures;
      unmap_chunks(a, off);  // take nothing
      return s;
    }
    chunks_[a + off] = h;
    counters_.physical_bytes += h.size;
  }
  return Status::ok;
}

Status BackendSegmentSource::unmap(void* addr, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.unmap;
  if (!vmm_) return Status::unsupported;
  std::uintptr_t a = as_addr(addr);
  if (bytes == 0 || a % granularity_ || bytes % granularity_) return Status::invalid_argument;
  for (std::uint64_t off = 0; off < bytes; off += granularity_) {
    if (!chunks_.count(a + off)) return Status::invalid_argument;  // not all ours: touch nothing
  }
  return unmap_chunks(a, bytes);
}

Status BackendSegmentSource::release(void* base, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.release;
  auto it = reservations_.find(as_addr(base));
  if (it == reservations_.end() || it->second != bytes) return Status::invalid_argument;
  Status s = backend_.release(base);  // busy while chunks are still mapped in it
  if (!ok(s)) return s;
  reservations_.erase(it);
  return Status::ok;
}

}  // namespace u3m::mem
