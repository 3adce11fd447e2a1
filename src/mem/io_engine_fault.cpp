// The fault-injecting engine wrapper (include/u3m/mem/io_engine.hpp).
#include <cerrno>
#include <cstring>
#include <utility>

#include "u3m/mem/io_engine.hpp"

namespace u3m::mem {
namespace {

constexpr std::uint32_t kAlign = 4096;  // keeps shortened O_DIRECT ops legal

bool is_write_fault(IoFault f) {
  return f == IoFault::eio_on_write || f == IoFault::enospc_on_write || f == IoFault::short_write;
}

// Half of len, rounded down to the O_DIRECT alignment (0 when len < 2 blocks).
std::uint32_t aligned_half(std::uint32_t len) {
  return (len / 2) / kAlign * kAlign;
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

IoEngineStats FaultInjectionIoEngine::stats() const {
  std::lock_guard lk(mu_);
  return asked_;
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
        forward.push_back(std::move(op));
        continue;
      }
      // Wrap the callback so the caller sees the injected outcome.
      auto done = std::move(op.done);
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
      if (res < 0) ++asked_.errors;
    }
    done(res);
  }
}

}  // namespace u3m::mem
