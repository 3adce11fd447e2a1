// System probes (include/u3m/mem/sys_probe.hpp).
#include "u3m/mem/sys_probe.hpp"

#include <fcntl.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include <fmt/format.h>

#include "u3m/mem/io_engine.hpp"

namespace u3m::mem {

std::string fs_type(const std::string& dir) {
  struct statfs sf {};
  if (statfs(dir.c_str(), &sf) != 0) return "unknown";
  switch (static_cast<unsigned long>(sf.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x794C7630:
      return "overlayfs";
    case 0x2FC12FC1:
      return "zfs";
    default:
      return fmt::format("0x{:x}", static_cast<unsigned long>(sf.f_type));
  }
}

std::optional<std::uint64_t> free_bytes(const std::string& dir, std::string* why) {
  struct statvfs sv {};
  if (statvfs(dir.c_str(), &sv) != 0) {
    if (why != nullptr) *why = fmt::format("statvfs({}): {}", dir, std::strerror(errno));
    return std::nullopt;
  }
  return static_cast<std::uint64_t>(sv.f_bavail) * sv.f_frsize;
}

ProbeResult probe_io_uring() {
  std::unique_ptr<IoEngine> engine;
  std::string why;
  if (ok(make_uring_engine(8, engine, &why))) return {true, "io_uring engine starts"};
  return {false, why.empty() ? "io_uring refused" : why};
}

ProbeResult probe_direct_io(const std::string& dir) {
  std::string path = fmt::format("{}/.u3m-probe-direct.{}", dir, getpid());
  int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    int e = errno;
    if (e == EINVAL)
      return {false, fmt::format("{} refuses O_DIRECT ({})", fs_type(dir), std::strerror(e))};
    return {false, fmt::format("cannot create a file in {}: {}", dir, std::strerror(e))};
  }
  unlink(path.c_str());  // gone when closed, whatever happens below
  void* buf = nullptr;
  ProbeResult r;
  if (posix_memalign(&buf, 4096, 4096) != 0) {
    r = {false, "no memory for a 4 KiB buffer"};
  } else {
    std::memset(buf, 0x5A, 4096);
    if (pwrite(fd, buf, 4096, 0) != 4096 || pread(fd, buf, 4096, 0) != 4096)
      r = {false, fmt::format("O_DIRECT I/O in {} failed: {}", dir, std::strerror(errno))};
    else
      r = {true, fmt::format("4 KiB O_DIRECT write and read in {} worked", dir)};
    std::free(buf);
  }
  close(fd);
  return r;
}

MemlockProbe probe_mlock() {
  MemlockProbe p;
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    if (rl.rlim_cur != RLIM_INFINITY) p.soft = rl.rlim_cur;
    if (rl.rlim_max != RLIM_INFINITY) p.hard = rl.rlim_max;
  }
  const long page = sysconf(_SC_PAGESIZE);
  void* m = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  int err = 0;
  if (m != MAP_FAILED) {
    p.can_lock = mlock(m, page) == 0;
    err = errno;
    munmap(m, page);
  }
  auto lim = [](const std::optional<std::uint64_t>& v) {
    return v ? fmt::format("{} KiB", *v / 1024) : std::string("unlimited");
  };
  p.detail =
      fmt::format("RLIMIT_MEMLOCK soft {}, hard {}; mlock of one page {}", lim(p.soft), lim(p.hard),
                  p.can_lock ? "works" : fmt::format("refused ({})", std::strerror(err)));
  return p;
}

ProbeResult probe_membarrier() {
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (cmds < 0) return {false, fmt::format("membarrier: {}", std::strerror(errno))};
  if ((cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
    return {false, "the kernel lacks MEMBARRIER_CMD_PRIVATE_EXPEDITED (Linux < 4.14)"};
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0 ||
      syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0)
    return {false, fmt::format("private expedited membarrier refused: {}", std::strerror(errno))};
  return {true, "private expedited membarrier works (the pool's asymmetric fence)"};
}

HugePageProbe probe_huge_pages() {
  HugePageProbe h;
  h.thp_enabled = "unknown";
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (std::getline(thp, line)) {
    auto a = line.find('['), b = line.find(']');
    if (a != std::string::npos && b != std::string::npos && b > a)
      h.thp_enabled = line.substr(a + 1, b - a - 1);
  }
  std::ifstream mi("/proc/meminfo");
  while (std::getline(mi, line)) {
    std::istringstream is(line);
    std::string key;
    std::uint64_t v = 0;
    if (!(is >> key >> v)) continue;
    if (key == "HugePages_Total:") h.hugetlb_total = v;
    if (key == "HugePages_Free:") h.hugetlb_free = v;
    if (key == "Hugepagesize:") h.hugetlb_page_bytes = v * 1024;
  }
  return h;
}

}  // namespace u3m::mem
