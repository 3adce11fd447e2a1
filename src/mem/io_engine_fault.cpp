// The fault-injecting engine wrapper (include/u3m/mem/io_engine.hpp).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "u3m/mem/io_engine.hpp"

namespace u3m::mem {
namespace {

constexpr std::uint32_t kAlign = 4096;  // keeps shortened or moved O_DIRECT ops legal

bool is_write_fault(IoFault f) {
  return f == IoFault::eio_on_write || f == IoFault::enospc_on_write ||
         f == IoFault::short_write || is_silent(f);
}

// Half of len, rounded down to the O_DIRECT alignment (0 when len < 2 blocks).
std::uint32_t aligned_half(std::uint32_t len) {
  return (len / 2) / kAlign * kAlign;
}

bool overlaps(const FaultInjectionIoEngine::WrittenRange& r, int fd, std::uint64_t off,
              std::uint64_t len) {
  return r.fd == fd && r.offset < off + len && off < r.offset + r.len;
}

// Where a misdirected write of len bytes at `offset` lands instead: another
// block-aligned offset at which it still fits inside the file, or `offset`
// itself when there is none (the file holds only this op's range).
std::uint64_t misdirected_offset(int fd, std::uint64_t offset, std::uint32_t len,
                                 std::uint64_t draw) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 0) return offset;
  const std::uint64_t blocks = static_cast<std::uint64_t>(st.st_size) / kAlign;
  const std::uint64_t op_blocks = (len + kAlign - 1) / kAlign;
  if (blocks <= op_blocks) return offset;
  const std::uint64_t places = blocks - op_blocks + 1;
  std::uint64_t at = draw % places;
  if (at * kAlign == offset) at = (at + 1) % places;
  return at * kAlign;
}

using AlignedBytes = std::unique_ptr<unsigned char, decltype(&std::free)>;

// Reads the aligned span [start, start + span) of the file into a fresh
// aligned buffer (so an O_DIRECT fd takes it); `got` is the byte count read,
// or -1 on error (and a null buffer if none could be allocated).
AlignedBytes read_aligned(int fd, std::uint64_t start, std::uint64_t span, ssize_t& got) {
  void* p = nullptr;
  got = -1;
  if (posix_memalign(&p, kAlign, span) != 0) return {nullptr, &std::free};
  AlignedBytes buf(static_cast<unsigned char*>(p), &std::free);
  do {
    got = ::pread(fd, buf.get(), span, static_cast<off_t>(start));
  } while (got < 0 && errno == EINTR);
  return buf;
}

// Whether [off, off + len) of the file differs from `want`: a silent fault
// that leaves the bytes the write carried (a retry into the same place) did no
// harm and is not expected to be caught.
bool range_differs(int fd, std::uint64_t off, const void* want, std::uint32_t len) {
  if (len == 0) return false;
  std::uint64_t start = off / kAlign * kAlign;
  std::uint64_t span = (off + len - start + kAlign - 1) / kAlign * kAlign;
  ssize_t n;
  AlignedBytes buf = read_aligned(fd, start, span, n);
  if (n < 0 || static_cast<std::uint64_t>(n) < off + len - start) return true;
  return std::memcmp(buf.get() + (off - start), want, len) != 0;
}

}  // namespace

std::string_view to_string(IoFault f) {
  switch (f) {
    case IoFault::eio_on_write:
      return "EIO on write";
    case IoFault::enospc_on_write:
      return "ENOSPC on write";
    case IoFault::short_write:
      return "short write";
    case IoFault::bit_flip_on_read:
      return "bit flip on read";
    case IoFault::eio_on_read:
      return "EIO on read";
    case IoFault::lost_write:
      return "lost write";
    case IoFault::misdirected_write:
      return "misdirected write";
    case IoFault::torn_write:
      return "torn write";
  }
  return "?";
}

FaultInjectionIoEngine::FaultInjectionIoEngine(std::shared_ptr<IoEngine> inner)
    : inner_(std::move(inner)) {}

void FaultInjectionIoEngine::fail_nth(IoFault f, std::uint64_t n) {
  std::lock_guard lk(mu_);
  rules_.push_back(Rule{f, n == 0 ? 1 : n, 0, std::mt19937_64(0x0b17f11bULL + n), false});
}

void FaultInjectionIoEngine::fail_randomly(IoFault f, double p, std::uint64_t seed) {
  std::lock_guard lk(mu_);
  rules_.push_back(Rule{f, 0, p, std::mt19937_64(seed), false});
}

void FaultInjectionIoEngine::clear() {
  std::lock_guard lk(mu_);
  rules_.clear();
}

std::uint64_t FaultInjectionIoEngine::injected(IoFault f) const {
  std::lock_guard lk(mu_);
  return injected_[static_cast<int>(f)];
}

std::uint64_t FaultInjectionIoEngine::injected_total() const {
  std::lock_guard lk(mu_);
  std::uint64_t t = 0;
  for (auto n : injected_) t += n;
  return t;
}

std::uint64_t FaultInjectionIoEngine::injected_at_rest() const {
  std::lock_guard lk(mu_);
  return injected_at_rest_;
}

std::uint64_t FaultInjectionIoEngine::silent_faults_read_back() const {
  std::lock_guard lk(mu_);
  return silent_read_back_;
}

std::vector<FaultInjectionIoEngine::WrittenRange> FaultInjectionIoEngine::recent_writes() const {
  std::lock_guard lk(mu_);
  std::vector<WrittenRange> out;
  out.reserve(write_log_.size());
  // The ring's oldest entry is at write_log_next_ once it has wrapped.
  for (std::size_t i = 0; i < write_log_.size(); ++i)
    out.push_back(write_log_[(write_log_next_ + i) % write_log_.size()]);
  return out;
}

IoEngineStats FaultInjectionIoEngine::stats() const {
  std::lock_guard lk(mu_);
  return asked_;
}

void FaultInjectionIoEngine::wrote_locked(int fd, std::uint64_t offset, std::uint32_t len) {
  if (len == 0) return;
  std::erase_if(silent_pending_, [&](const WrittenRange& r) { return overlaps(r, fd, offset, len); });
  WrittenRange w{fd, offset, len};
  if (write_log_.size() < kWriteLog) {
    write_log_.push_back(w);
    write_log_next_ = write_log_.size() % kWriteLog;
  } else {
    write_log_[write_log_next_] = w;
    write_log_next_ = (write_log_next_ + 1) % kWriteLog;
  }
}

void FaultInjectionIoEngine::read_back_locked(int fd, std::uint64_t offset, std::uint32_t len) {
  auto it = std::find_if(silent_pending_.begin(), silent_pending_.end(), [&](const WrittenRange& r) {
    return r.fd == fd && r.offset == offset && r.len == len;
  });
  if (it == silent_pending_.end()) return;
  silent_pending_.erase(it);
  ++silent_read_back_;
}

bool FaultInjectionIoEngine::choose(IoKind kind, IoFault& fault, std::uint64_t& draw) {
  bool hit = false;
  // Every rule of the op's kind advances (a countdown ticks, a die is rolled)
  // even after one fired, so rules stay independent of each other.
  for (Rule& r : rules_) {
    if (r.spent || is_write_fault(r.fault) != (kind == IoKind::write)) continue;
    bool fires;
    if (r.countdown > 0) {
      fires = --r.countdown == 0;
      r.spent = fires;
    } else {
      fires = std::uniform_real_distribution<double>(0, 1)(r.rng) < r.probability;
    }
    if (fires && !hit) {
      hit = true;
      fault = r.fault;
      draw = r.rng();
    }
  }
  if (hit) ++injected_[static_cast<int>(fault)];
  return hit;
}

void FaultInjectionIoEngine::submit(std::span<IoOp> ops) {
  std::vector<IoOp> forward;
  std::vector<std::pair<std::function<void(std::int64_t)>, std::int64_t>> immediate;
  forward.reserve(ops.size());
  {
    std::lock_guard lk(mu_);
    for (IoOp& op : ops) {
      (op.kind == IoKind::read ? asked_.reads : asked_.writes)++;
      IoFault fault{};
      std::uint64_t draw = 0;
      if (!choose(op.kind, fault, draw)) {
        if (op.kind == IoKind::write) {
          wrote_locked(op.fd, op.offset, op.len);
        } else {
          // Counted as read back only if every byte arrives.
          op.done = [this, done = std::move(op.done), fd = op.fd, off = op.offset,
                     len = op.len](std::int64_t res) {
            if (res == static_cast<std::int64_t>(len)) {
              std::lock_guard lk(mu_);
              read_back_locked(fd, off, len);
            }
            done(res);
          };
        }
        forward.push_back(std::move(op));
        continue;
      }
      // Wrap the callback so the caller sees the injected outcome.
      auto done = std::move(op.done);
      if (is_silent(fault)) {
        const WrittenRange target{op.fd, op.offset, op.len};
        std::uint32_t keep = op.len;  // bytes that really reach the file
        if (fault == IoFault::lost_write) keep = 0;
        if (fault == IoFault::torn_write) {
          std::uint64_t blocks = (op.len + kAlign - 1) / kAlign;
          keep = static_cast<std::uint32_t>(std::min<std::uint64_t>(op.len, draw % blocks * kAlign));
        }
        if (fault == IoFault::misdirected_write) {
          op.offset = misdirected_offset(op.fd, op.offset, op.len, draw);
          if (op.offset == target.offset) keep = 0;  // nowhere else to go: lost instead
        }
        // What the target range keeps of its old bytes: all of it, or the tail
        // after a torn prefix.
        const std::uint32_t stale_from = op.offset == target.offset ? keep : 0;
        const bool harmful =
            range_differs(target.fd, target.offset + stale_from,
                          static_cast<const unsigned char*>(op.buf) + stale_from,
                          target.len - stale_from);
        // This write supersedes any older fault pending on its target.
        std::erase_if(silent_pending_, [&](const WrittenRange& r) {
          return overlaps(r, target.fd, target.offset, target.len);
        });
        wrote_locked(op.fd, op.offset, keep);
        if (harmful) {
          if (silent_pending_.size() == kSilentPending)
            silent_pending_.erase(silent_pending_.begin());
          silent_pending_.push_back(target);
        }
        const std::int64_t reported = target.len;
        if (keep == 0) {
          immediate.emplace_back(std::move(done), reported);
          continue;
        }
        op.len = keep;
        op.done = [done = std::move(done), reported](std::int64_t res) {
          done(res < 0 ? res : reported);
        };
        forward.push_back(std::move(op));
        continue;
      }
      switch (fault) {
        case IoFault::enospc_on_write:
        case IoFault::eio_on_read:
          immediate.emplace_back(std::move(done),
                                 fault == IoFault::enospc_on_write ? -ENOSPC : -EIO);
          continue;
        case IoFault::eio_on_write:
        case IoFault::short_write: {
          std::uint32_t half = aligned_half(op.len);
          std::int64_t reported = fault == IoFault::eio_on_write ? -EIO : std::int64_t{half};
          if (half == 0) {
            immediate.emplace_back(std::move(done), reported);
            continue;
          }
          op.len = half;
          wrote_locked(op.fd, op.offset, half);
          op.done = [done = std::move(done), reported](std::int64_t res) {
            done(res < 0 ? res : (reported < 0 ? reported : res));
          };
          break;
        }
        case IoFault::bit_flip_on_read:
          op.done = [done = std::move(done), buf = op.buf, draw](std::int64_t res) {
            if (res > 0) {
              std::uint64_t bit = draw % (static_cast<std::uint64_t>(res) * 8);
              static_cast<unsigned char*>(buf)[bit / 8] ^=
                  static_cast<unsigned char>(1u << (bit % 8));
            }
            done(res);
          };
          break;
        default:
          break;  // the silent faults were handled above
      }
      forward.push_back(std::move(op));
    }
  }
  // Count what the caller is told, after any rewriting.
  for (IoOp& op : forward) {
    op.done = [this, kind = op.kind, done = std::move(op.done)](std::int64_t res) {
      {
        std::lock_guard lk(mu_);
        if (res < 0)
          ++asked_.errors;
        else
          (kind == IoKind::read ? asked_.bytes_read : asked_.bytes_written) += res;
      }
      done(res);
    };
  }
  if (!forward.empty()) inner_->submit(forward);
  for (auto& [done, res] : immediate) {
    {
      std::lock_guard lk(mu_);
      if (res < 0)
        ++asked_.errors;
      else
        asked_.bytes_written += res;  // a silent fault's reported (not real) bytes
    }
    done(res);
  }
}

// ---------------------------------------------------------- corruption at rest

Status FaultInjectionIoEngine::corrupt_at_rest(int fd, std::uint64_t offset, std::uint64_t len,
                                               std::uint64_t seed) {
  if (fd < 0 || len == 0) return Status::invalid_argument;
  std::mt19937_64 rng(seed);
  const std::uint64_t bit = rng() % (len * 8);
  const std::uint64_t byte = offset + bit / 8, block = byte / kAlign * kAlign;
  ssize_t n;
  AlignedBytes buf = read_aligned(fd, block, kAlign, n);
  if (!buf) return Status::out_of_memory;
  if (n < 0) return Status::io_error;
  if (static_cast<std::uint64_t>(n) <= byte - block) return Status::invalid_argument;  // past EOF
  buf.get()[byte - block] ^= static_cast<unsigned char>(1u << (bit % 8));
  ssize_t w;
  do {
    w = ::pwrite(fd, buf.get(), static_cast<std::size_t>(n), static_cast<off_t>(block));
  } while (w < 0 && errno == EINTR);
  if (w != n) return Status::io_error;
  std::lock_guard lk(mu_);
  ++injected_at_rest_;
  return Status::ok;
}

bool FaultInjectionIoEngine::corrupt_random_written(std::uint64_t seed) {
  WrittenRange target{};
  {
    std::lock_guard lk(mu_);
    if (write_log_.empty()) return false;
    target = write_log_[std::mt19937_64(seed)() % write_log_.size()];
  }
  return ok(corrupt_at_rest(target.fd, target.offset, target.len, seed ^ 0x5eedULL));
}

}  // namespace u3m::mem
