// The two SegmentSources of pool.hpp: VirtualSegmentSource (fake addresses
// for the simulator, the static-plan comparison and tests) and
// CpuSegmentSource (real host memory: mmap segments, memfd-backed VMM).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "pool_block.hpp"
#include "u3m/mem/mapping.hpp"
#include "u3m/mem/pool.hpp"

namespace u3m::mem {

using pool_detail::as_ptr;

namespace {

// Books `bytes` of physical memory against `capacity` (0 = unbounded).
Status take_physical(SourceCounters& c, std::uint64_t capacity, std::uint64_t bytes) {
  if (capacity && bytes > capacity - c.physical_bytes) {
    ++c.failures;
    return Status::out_of_memory;
  }
  c.physical_bytes += bytes;
  return Status::ok;
}

}  // namespace

// ---- VirtualSegmentSource --------------------------------------------------

VirtualSegmentSource::VirtualSegmentSource(std::uint64_t granularity,
                                           std::uint64_t physical_capacity, bool vmm)
    : granularity_(granularity ? granularity : 1),
      capacity_(physical_capacity),
      vmm_(vmm),
      // Far from anything real, so a stray dereference faults at once.
      next_address_(std::uintptr_t{1} << 44) {}

void VirtualSegmentSource::fail_after(std::uint64_t calls) {
  std::lock_guard lock(mu_);
  fail_countdown_ = static_cast<std::int64_t>(calls);
}

bool VirtualSegmentSource::inject_failure() {
  if (fail_countdown_ < 0) return false;
  if (fail_countdown_-- > 0) return false;
  ++counters_.failures;
  return true;
}

Status VirtualSegmentSource::allocate_segment(std::uint64_t bytes, void** base) {
  std::lock_guard lock(mu_);
  ++counters_.allocate_segment;
  if (!base || bytes == 0 || bytes % granularity_) return Status::invalid_argument;
  if (inject_failure()) return Status::out_of_memory;
  if (Status s = take_physical(counters_, capacity_, bytes); !ok(s)) return s;
  std::uintptr_t a = next_address_;
  next_address_ += bytes + granularity_;  // a guard gap: segments never touch
  ranges_[a] = bytes;
  *base = as_ptr(a);
  return Status::ok;
}

Status VirtualSegmentSource::free_segment(void* base, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.free_segment;
  auto it = ranges_.find(reinterpret_cast<std::uintptr_t>(base));
  if (it == ranges_.end() || it->second != bytes) return Status::invalid_argument;
  ranges_.erase(it);
  counters_.physical_bytes -= bytes;
  return Status::ok;
}

Status VirtualSegmentSource::reserve(std::uint64_t bytes, void** base) {
  std::lock_guard lock(mu_);
  ++counters_.reserve;
  if (!vmm_) return Status::unsupported;
  if (!base || bytes == 0 || bytes % granularity_) return Status::invalid_argument;
  if (inject_failure()) return Status::out_of_memory;
  std::uintptr_t a = next_address_;
  next_address_ += bytes + granularity_;
  ranges_[a] = bytes;
  *base = as_ptr(a);
  return Status::ok;
}

Status VirtualSegmentSource::map(void* addr, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.map;
  auto a = reinterpret_cast<std::uintptr_t>(addr);
  if (!vmm_) return Status::unsupported;
  if (bytes == 0 || a % granularity_ || bytes % granularity_) return Status::invalid_argument;
  if (inject_failure()) return Status::out_of_memory;
  return take_physical(counters_, capacity_, bytes);
}

Status VirtualSegmentSource::unmap(void* addr, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.unmap;
  auto a = reinterpret_cast<std::uintptr_t>(addr);
  if (!vmm_) return Status::unsupported;
  if (a % granularity_ || bytes % granularity_ || bytes > counters_.physical_bytes) {
    return Status::invalid_argument;
  }
  counters_.physical_bytes -= bytes;
  return Status::ok;
}

Status VirtualSegmentSource::release(void* base, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.release;
  auto it = ranges_.find(reinterpret_cast<std::uintptr_t>(base));
  if (it == ranges_.end() || it->second != bytes) return Status::invalid_argument;
  ranges_.erase(it);
  return Status::ok;
}

// ---- CpuSegmentSource ------------------------------------------------------

CpuSegmentSource::CpuSegmentSource(std::uint64_t granularity, std::uint64_t physical_capacity)
    : granularity_(std::max<std::uint64_t>(granularity,
                                           static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)))),
      capacity_(physical_capacity) {}

CpuSegmentSource::~CpuSegmentSource() {
  for (auto& [base, r] : reservations_) {
    ::munmap(as_ptr(base), r.bytes);
    ::close(r.fd);
  }
}

Status CpuSegmentSource::allocate_segment(std::uint64_t bytes, void** base) {
  std::lock_guard lock(mu_);
  ++counters_.allocate_segment;
  if (!base || bytes == 0 || bytes % granularity_) return Status::invalid_argument;
  if (Status s = take_physical(counters_, capacity_, bytes); !ok(s)) return s;
  void* p = map_aligned(bytes, granularity_);
  if (!p) {
    counters_.physical_bytes -= bytes;
    ++counters_.failures;
    return Status::out_of_memory;
  }
  *base = p;
  return Status::ok;
}

Status CpuSegmentSource::free_segment(void* base, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.free_segment;
  if (!base || bytes % granularity_ || ::munmap(base, bytes) != 0) return Status::invalid_argument;
  counters_.physical_bytes -= bytes;
  return Status::ok;
}

Status CpuSegmentSource::reserve(std::uint64_t bytes, void** base) {
  std::lock_guard lock(mu_);
  ++counters_.reserve;
  if (!base || bytes == 0 || bytes % granularity_) return Status::invalid_argument;
  int fd = ::memfd_create("u3m-pool", MFD_CLOEXEC);
  if (fd < 0) return Status::device_failed;
  // A sparse file as large as the range: chunk i of the range is chunk i of
  // the file, so a chunk keeps no data once unmapped and punched out.
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    ::close(fd);
    return Status::out_of_memory;
  }
  void* p =
      map_aligned(bytes, granularity_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE);
  if (!p) {
    ::close(fd);
    ++counters_.failures;
    return Status::out_of_memory;
  }
  reservations_[reinterpret_cast<std::uintptr_t>(p)] = Reservation{bytes, fd};
  *base = p;
  return Status::ok;
}

std::map<std::uintptr_t, CpuSegmentSource::Reservation>::iterator
CpuSegmentSource::find_reservation(std::uintptr_t addr, std::uint64_t bytes) {
  auto it = reservations_.upper_bound(addr);
  if (it == reservations_.begin()) return reservations_.end();
  --it;
  if (addr - it->first > it->second.bytes || bytes > it->second.bytes - (addr - it->first)) {
    return reservations_.end();
  }
  return it;
}

Status CpuSegmentSource::map(void* addr, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.map;
  auto a = reinterpret_cast<std::uintptr_t>(addr);
  if (bytes == 0 || a % granularity_ || bytes % granularity_) return Status::invalid_argument;
  auto it = find_reservation(a, bytes);
  if (it == reservations_.end()) return Status::invalid_argument;
  if (Status s = take_physical(counters_, capacity_, bytes); !ok(s)) return s;
  auto off = static_cast<off_t>(a - it->first);
  // fallocate commits the pages now (like cuMemCreate), so a full machine
  // answers out_of_memory here instead of SIGBUS on first touch.
  if (::fallocate(it->second.fd, 0, off, static_cast<off_t>(bytes)) != 0 ||
      ::mmap(addr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, it->second.fd, off) ==
          MAP_FAILED) {
    ::fallocate(it->second.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off,
                static_cast<off_t>(bytes));
    counters_.physical_bytes -= bytes;
    ++counters_.failures;
    return Status::out_of_memory;
  }
  return Status::ok;
}

Status CpuSegmentSource::unmap(void* addr, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.unmap;
  auto a = reinterpret_cast<std::uintptr_t>(addr);
  if (bytes == 0 || a % granularity_ || bytes % granularity_) return Status::invalid_argument;
  auto it = find_reservation(a, bytes);
  if (it == reservations_.end()) return Status::invalid_argument;
  // Back to reserved-only address space, then drop the pages from the file.
  if (::mmap(addr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
             0) == MAP_FAILED) {
    return Status::device_failed;
  }
  ::fallocate(it->second.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
              static_cast<off_t>(a - it->first), static_cast<off_t>(bytes));
  counters_.physical_bytes -= bytes;
  return Status::ok;
}

Status CpuSegmentSource::release(void* base, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.release;
  auto it = reservations_.find(reinterpret_cast<std::uintptr_t>(base));
  if (it == reservations_.end() || it->second.bytes != bytes) return Status::invalid_argument;
  ::munmap(base, bytes);
  ::close(it->second.fd);
  reservations_.erase(it);
  return Status::ok;
}

}  // namespace u3m::mem
