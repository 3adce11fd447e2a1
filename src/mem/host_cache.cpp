// Note [Pinned host cache] in include/u3m/mem/host_cache.hpp.
#include "u3m/mem/host_cache.hpp"

#include <algorithm>
#include <iterator>

namespace u3m::mem {

HostBlockCache::HostBlockCache(MemoryBackend& inner, std::uint64_t limit)
    : inner_(inner), limit_(limit ? limit : inner.capabilities().capacity) {}

HostBlockCache::~HostBlockCache() {
  std::lock_guard g(mu_);
  for (auto& [n, p] : order_) inner_.free(p);
}

Capabilities HostBlockCache::capabilities() const {
  Capabilities c = inner_.capabilities();
  if (limit_ && (c.capacity == 0 || limit_ < c.capacity)) c.capacity = limit_;
  return c;
}

void HostBlockCache::drop_oldest() {
  const auto [n, p] = order_.front();
  auto [lo, hi] = by_size_.equal_range(n);
  auto it = std::find_if(lo, hi, [&](const auto& e) { return e.second == order_.begin(); });
  by_size_.erase(it);  // every cached block has its entry
  order_.pop_front();
  st_.cached_bytes -= n;
  ++st_.dropped;
  inner_.free(p);
}

Status HostBlockCache::allocate(std::uint64_t bytes, void** ptr) {
  if (bytes == 0 || ptr == nullptr) return Status::invalid_argument;
  std::lock_guard g(mu_);
  if (auto it = by_size_.find(bytes); it != by_size_.end()) {
    *ptr = it->second->second;
    order_.erase(it->second);
    by_size_.erase(it);
    st_.cached_bytes -= bytes;
    st_.live_bytes += bytes;
    live_.emplace(*ptr, bytes);
    ++st_.hits;
    return Status::ok;
  }
  if (limit_ && bytes > limit_ - std::min(limit_, st_.live_bytes)) return Status::out_of_memory;
  while (limit_ && st_.cached_bytes > 0 && st_.live_bytes + st_.cached_bytes + bytes > limit_)
    drop_oldest();
  void* p = nullptr;
  Status s = inner_.allocate(bytes, &p);
  // The inner backend may be short of memory the cache holds: give it all back and try once more.
  if (s == Status::out_of_memory && st_.cached_bytes > 0) {
    while (st_.cached_bytes > 0) drop_oldest();
    s = inner_.allocate(bytes, &p);
  }
  if (!ok(s)) return s;
  ++st_.misses;
  live_.emplace(p, bytes);
  st_.live_bytes += bytes;
  *ptr = p;
  return Status::ok;
}

Status HostBlockCache::free(void* ptr) {
  std::lock_guard g(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return Status::invalid_argument;
  const std::uint64_t n = it->second;
  live_.erase(it);
  st_.live_bytes -= n;
  order_.emplace_back(n, ptr);
  by_size_.emplace(n, std::prev(order_.end()));
  st_.cached_bytes += n;
  return Status::ok;
}

Status HostBlockCache::mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) const {
  if (free_bytes == nullptr || total_bytes == nullptr) return Status::invalid_argument;
  std::lock_guard g(mu_);
  std::uint64_t f = 0, t = 0;
  if (Status s = inner_.mem_info(&f, &t); !ok(s)) return s;
  // Cached blocks count as free: they are the cache's to give.
  if (limit_ && limit_ < t) t = limit_;
  *total_bytes = t;
  *free_bytes = std::min(t - std::min(t, st_.live_bytes), f + st_.cached_bytes);
  return Status::ok;
}

HostBlockCache::Stats HostBlockCache::stats() const {
  std::lock_guard g(mu_);
  return st_;
}

}  // namespace u3m::mem
