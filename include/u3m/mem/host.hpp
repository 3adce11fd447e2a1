// host: pinned DRAM, the middle tier. mmap + mlock where allowed; if the
// kernel refuses to lock (RLIMIT_MEMLOCK, no CAP_IPC_LOCK) the backend keeps
// working with ordinary pageable memory and reports pinned = false.
#pragma once

#include <cstdint>
#include <memory>

#include "u3m/mem/backend.hpp"

namespace u3m::mem {

struct HostOptions {
  std::uint64_t capacity = 0;  // bytes this tier may hand out; 0 = physical RAM
  bool pin = true;             // try to mlock; false never tries
  // Test hook: the page-locking call (default ::mlock). Lets a test refuse it
  // deterministically, even as root where RLIMIT_MEMLOCK does not apply.
  int (*lock)(const void* addr, std::size_t len) = nullptr;
};

class HostBackend final : public MemoryBackend {
 public:
  explicit HostBackend(HostOptions options = {});
  ~HostBackend() override;
  HostBackend(const HostBackend&) = delete;
  HostBackend& operator=(const HostBackend&) = delete;

  // pinned is true while every allocation so far has been locked. After the
  // first refusal it becomes false for good and later allocations are not
  // locked (degrade, don't fail).
  Capabilities capabilities() const override;
  Status allocate(std::uint64_t bytes, void** ptr) override;
  Status free(void* ptr) override;
  Status mem_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) const override;

  std::uint64_t pinned_bytes() const;  // bytes currently locked

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace u3m::mem
