// u3m_soak: the runtime's soak as a program (scripts/soak.sh runs it under
// TSan for minutes). Usage: u3m_soak [--minutes M] [--threads T] [--seed S]
//   [--fault-rate P] [--rot-per-s R]. Exit 0 if no byte was ever read back
// wrong without an error and nothing unexpected happened, 1 otherwise, 2 for
// bad flags.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "engine/soak.hpp"
#include "u3m/mem/fault_spec.hpp"
#include "u3m/util/error.hpp"

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "u3m_soak: %s\nusage: u3m_soak [--minutes M] [--threads T] [--seed S] "
               "[--fault-rate P] [--rot-per-s R] [--without SPEC]\n",
               why.c_str());
  std::exit(2);
}

double number(std::string_view flag, const char* text, double lo, double hi) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (!end || *end || !(v >= lo && v <= hi))
    usage(std::string(flag) + " must be a number in [" + std::to_string(lo) + ", " +
          std::to_string(hi) + "], got '" + text + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  u3m::engine::testing::SoakOptions o;
  o.seconds = 60;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "u3m_soak: threads acquire, release, prefetch and evict tensors on the real stack\n"
          "(emulated device, host, SSD store) with random faults of every class under the\n"
          "store and its scrubber on; every read is checked. Prints operations, faults\n"
          "injected and detected, and bytes lost.\n"
          "  --minutes M     how long (default 1)\n"
          "  --threads T     worker threads (default 4)\n"
          "  --seed S        random seed (default 1)\n"
          "  --fault-rate P  probability per I/O op of each fault class (default 0.002)\n"
          "  --rot-per-s R   corruptions at rest per second (default 20)\n"
          "  --without SPEC  fault classes not to inject, as kind=1,... (e.g.\n"
          "                  misdirected_write=1)\n");
      return 0;
    }
    if (i + 1 >= argc) usage(std::string(a) + " needs a value");
    const char* v = argv[++i];
    try {
      if (a == "--minutes")
        o.seconds = 60 * number(a, v, 0.001, 24 * 60);
      else if (a == "--threads")
        o.threads = static_cast<int>(number(a, v, 1, 64));
      else if (a == "--seed")
        o.seed = static_cast<std::uint64_t>(number(a, v, 0, 1e18));
      else if (a == "--fault-rate")
        o.fault_rate = number(a, v, 0, 0.5);
      else if (a == "--rot-per-s")
        o.rot_per_s = number(a, v, 0, 1e4);
      else if (a == "--without")
        for (const auto& [kind, p] : u3m::mem::FaultSpec::parse(std::string(v), "--without").rules)
          o.without.push_back(kind);
      else
        usage("unknown flag " + std::string(a));
    } catch (const u3m::InputError& e) {
      usage(e.what());
    }
  }
  std::printf(
      "soak: %.1f min, %d threads, seed %llu, fault rate %g per op and class, %g "
      "corruptions at rest/s (measured on this machine)\n",
      o.seconds / 60, o.threads, static_cast<unsigned long long>(o.seed), o.fault_rate,
      o.rot_per_s);
  std::fflush(stdout);
  u3m::engine::testing::SoakReport r;
  try {
    r = u3m::engine::testing::run_soak(o);
  } catch (const u3m::InputError& e) {
    usage(e.what());
  }
  auto u = [](std::uint64_t x) { return static_cast<unsigned long long>(x); };
  std::printf(
      "operations: %llu (%llu reads checked, %llu writes, %llu prefetches, %llu evicts, "
      "%llu refused for room)\n",
      u(r.ops), u(r.reads), u(r.writes), u(r.prefetches), u(r.evicts), u(r.refused));
  std::printf("faults injected: %llu on I/O ops + %llu at rest\n", u(r.injected),
              u(r.injected_at_rest));
  const char* names[] = {"eio_on_write", "enospc_on_write", "short_write",       "bit_flip_on_read",
                         "eio_on_read",  "lost_write",      "misdirected_write", "torn_write"};
  for (int i = 0; i < 8; ++i) std::printf("  %-18s %llu\n", names[i], u(r.injected_by_fault[i]));
  std::printf(
      "faults detected: store %llu (write read-back %llu, read checksum %llu, I/O errors %llu, "
      "short %llu), scrubbed %.1f MiB finding %llu; engine saw %llu (SSD copies dropped as "
      "corrupt %llu, verify failures %llu of %llu verifies)\n",
      u(r.detected_store), u(r.store.write_verify_failures), u(r.store.checksum_failures),
      u(r.store.io_errors), u(r.store.short_writes + r.store.short_reads),
      static_cast<double>(r.store.scrubbed_bytes) / (1 << 20), u(r.store.scrub_failures),
      u(r.detected_engine), u(r.engine.ssd_copies_failed), u(r.engine.ssd_verify_failures),
      u(r.engine.ssd_verifies));
  std::printf(
      "bytes lost: %llu in %llu tensors (reported lost: no good copy was left), "
      "bytes read back wrong without an error: %llu reads\n",
      u(r.lost_bytes), u(r.lost_tensors), u(r.silent_bad_reads));
  if (!r.first_unexpected.empty()) std::printf("unexpected: %s\n", r.first_unexpected.c_str());
  return r.silent_bad_reads == 0 && r.first_unexpected.empty() ? 0 : 1;
}
