// What this machine offers the memory tiers, as facts `u3m doctor` reports
// and the benches check before they start: file systems and free space, io_uring,
// O_DIRECT, page locking, membarrier, huge pages. Every probe is cheap,
// touches nothing it does not clean up, and never throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace u3m::mem {

// A yes/no finding with what was seen ("io_uring_queue_init: Operation not
// permitted"; "4 KiB O_DIRECT write in /tmp worked").
struct ProbeResult {
  bool ok = false;
  std::string detail;
};

// "ext4", "xfs", "btrfs", "tmpfs", "overlayfs", "zfs", or the magic in hex;
// "unknown" if statfs fails.
std::string fs_type(const std::string& dir);
// Bytes an unprivileged writer may still use in dir's file system
// (statvfs: f_bavail * f_frsize); nullopt, with `why`, if statvfs fails.
std::optional<std::uint64_t> free_bytes(const std::string& dir, std::string* why = nullptr);

// io_uring usable by this process (the SSD store's engine starts).
ProbeResult probe_io_uring();
// A 4 KiB O_DIRECT write and read of a scratch file in dir (removed again).
ProbeResult probe_direct_io(const std::string& dir);

struct MemlockProbe {
  std::optional<std::uint64_t> soft, hard;  // RLIMIT_MEMLOCK; nullopt = unlimited
  bool can_lock = false;                    // mlock of one page succeeded
  std::string detail;
};
MemlockProbe probe_mlock();

// Private expedited membarrier (the pool's asymmetric fence): registered and usable.
ProbeResult probe_membarrier();

struct HugePageProbe {
  std::string thp_enabled;  // the [selected] word of .../transparent_hugepage/enabled, or "unknown"
  std::uint64_t hugetlb_total = 0, hugetlb_free = 0, hugetlb_page_bytes = 0;  // /proc/meminfo
};
HugePageProbe probe_huge_pages();

}  // namespace u3m::mem
