// `u3m bench ssd`: sequential write and read bandwidth of the SSD store
// (src/mem/ssd_store.cpp) for 64 KiB..64 MiB blobs, each shown next to fio's
// bandwidth with O_DIRECT on the same file system, measured in the same run.
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "u3m/mem/ssd_store.hpp"
#include "u3m/util/error.hpp"

namespace u3m::cli {
namespace {

using mem::Status;

struct BenchSsdArgs {
  bool json = false;
  std::string dir;
  std::string sizes = "64K,1M,4M,16M,64M";
  std::uint64_t total_mb = 128;
  unsigned queue_depth = 16;
  unsigned repeat = 3;
  std::uint32_t chunk_kb = 1024;
  bool no_fio = false;
};

// O_DIRECT needs whole 4 KiB blocks.
std::vector<std::uint64_t> parse_sizes(const std::string& list) {
  std::vector<std::uint64_t> out = parse_size_list(list, "--sizes", 64ull << 30);
  for (std::uint64_t bytes : out)
    if (bytes % mem::SsdStore::kBlock != 0)
      input_error("--sizes", "'{}' is not a multiple of 4 KiB (O_DIRECT needs whole blocks)",
                  human_bytes(bytes));
  return out;
}

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

struct AlignedFree {
  void operator()(unsigned char* p) const { std::free(p); }
};
using Buf = std::unique_ptr<unsigned char, AlignedFree>;
Buf aligned_buf(std::size_t n) {
  void* p = nullptr;
  if (posix_memalign(&p, mem::SsdStore::kBlock, n) != 0) throw std::bad_alloc();
  return Buf(static_cast<unsigned char*>(p));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Blobs in flight at once: enough that `queue_depth` chunk-sized I/Os are
// outstanding, and at least 2 so the next blob's checksum overlaps I/O.
unsigned window_for(std::uint64_t size, std::uint32_t chunk, unsigned queue_depth) {
  std::uint64_t per_blob = (size + chunk - 1) / chunk;
  return static_cast<unsigned>(std::max<std::uint64_t>(2, (queue_depth + per_blob - 1) / per_blob));
}

struct Measured {
  double write_gbps = 0, read_gbps = 0;
};

// Writes `count` blobs of `size` with `window` in flight, then reads them back
// in the same order; the store verifies every extent's checksum on the way.
Measured bench_store(mem::SsdStore& store, std::uint64_t size, std::uint64_t count, unsigned window,
                     std::uint64_t key_base) {
  std::vector<Buf> bufs;
  std::mt19937_64 rng(size);
  for (unsigned w = 0; w < window; ++w) {
    bufs.push_back(aligned_buf(size));
    auto* p = reinterpret_cast<std::uint64_t*>(bufs.back().get());
    for (std::uint64_t i = 0; i < size / 8; ++i) p[i] = rng();
  }
  auto run = [&](bool write) {
    std::deque<std::future<Status>> inflight;
    auto drain_one = [&] {
      Status s = inflight.front().get();
      inflight.pop_front();
      if (!ok(s))
        throw std::runtime_error(fmt::format("ssd store {} of a {} blob failed: {}",
                                             write ? "put" : "get", human_bytes(size),
                                             to_string(s)));
    };
    auto t0 = std::chrono::steady_clock::now();
    for (std::uint64_t i = 0; i < count; ++i) {
      if (inflight.size() == window) drain_one();
      unsigned char* b = bufs[i % window].get();
      if (write) {
        std::memcpy(b, &i, sizeof i);  // distinct content per blob, as real data would be
        inflight.push_back(store.put_async(key_base + i, b, size, false));
      } else {
        inflight.push_back(store.get_async(key_base + i, b, size));
      }
    }
    while (!inflight.empty()) drain_one();
    return static_cast<double>(size * count) / seconds_since(t0) / 1e9;
  };
  Measured m;
  m.write_gbps = run(true);
  m.read_gbps = run(false);
  for (std::uint64_t i = 0; i < count; ++i) store.erase(key_base + i);
  return m;
}

// fio with O_DIRECT and io_uring on the same directory; GB/s or nullopt with a reason.
std::optional<double> run_fio(const std::string& file, const char* rw, std::uint64_t bs,
                              std::uint64_t bytes, unsigned iodepth, std::string& why) {
  std::string cmd = fmt::format(
      "fio --name=u3m-ref --filename='{}' --rw={} --bs={} --size={} --direct=1 "
      "--ioengine=io_uring --iodepth={} --output-format=json 2>&1",
      file, rw, bs, bytes, iodepth);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    why = "cannot start fio";
    return std::nullopt;
  }
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  int rc = pclose(p);
  auto open = out.find('{'), close = out.rfind('}');
  if (rc != 0 || open == std::string::npos || close == std::string::npos) {
    why = fmt::format("fio failed (exit {}): {}", rc, out.substr(0, 300));
    return std::nullopt;
  }
  try {
    auto j = nlohmann::json::parse(out.substr(open, close - open + 1));
    const auto& job = j.at("jobs").at(0);
    if (job.value("error", 0) != 0) {
      why = fmt::format("fio job error {}", job.value("error", 0));
      return std::nullopt;
    }
    return job.at(rw == std::string("write") ? "write" : "read").at("bw_bytes").get<double>() / 1e9;
  } catch (const std::exception& e) {
    why = fmt::format("cannot read fio's JSON: {}", e.what());
    return std::nullopt;
  }
}

bool have_fio() {
  return std::system("command -v fio >/dev/null 2>&1") == 0;
}

void run_bench_ssd(const BenchSsdArgs& a) {
  auto sizes = parse_sizes(a.sizes);
  if (a.total_mb == 0) input_error("--total-mb", "must be at least 1");
  if (a.queue_depth == 0) input_error("--qd", "must be at least 1");
  if (a.repeat == 0) input_error("--repeat", "must be at least 1");
  const std::uint32_t chunk = a.chunk_kb * 1024;
  if (chunk == 0 || chunk % mem::SsdStore::kBlock != 0)
    input_error("--chunk-kb", "{} is not a positive multiple of 4", a.chunk_kb);
  std::string dir = a.dir.empty() ? "/tmp" : a.dir;
  if (access(dir.c_str(), W_OK) != 0) input_error("--dir", "{}: not a writable directory", dir);

  const std::uint64_t total = a.total_mb << 20;
  const std::uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  const std::string tag = fmt::format("{}", getpid());

  mem::SsdStoreOptions o;
  o.path = fmt::format("{}/u3m-bench-ssd.{}.dat", dir, tag);
  o.capacity = std::max(total, max_size) + chunk;
  o.chunk_bytes = chunk;
  o.queue_depth = std::max(64u, a.queue_depth * 2);
  std::unique_ptr<mem::SsdStore> store;
  std::string why;
  Status s = mem::SsdStore::open(o, store, &why);
  if (!ok(s)) throw std::runtime_error(fmt::format("cannot open the SSD store: {}", why));

  bool fio = !a.no_fio && have_fio();
  std::string fio_note = a.no_fio ? "skipped (--no-fio)" : fio ? "" : "fio not found on PATH";
  const std::string fio_file = fmt::format("{}/u3m-bench-fio.{}.dat", dir, tag);
  struct RemoveOnExit {
    const std::string& path;
    ~RemoveOnExit() { std::remove(path.c_str()); }
  } remove_fio_file{fio_file};

  // Note [Fair first touch]
  // Writing into freshly fallocated blocks makes ext4 convert unwritten
  // extents, which costs more than rewriting. Both files are written once
  // before anything is timed, so neither side pays it and the other not.
  const std::uint64_t warm_count = std::max<std::uint64_t>(1, o.capacity / chunk - 1);
  bench_store(*store, chunk, warm_count, window_for(chunk, chunk, a.queue_depth), 0);
  if (fio) {
    std::string warm_why;
    if (!run_fio(fio_file, "write", chunk, warm_count * chunk, a.queue_depth, warm_why)) {
      fio = false;
      fio_note = warm_why;
    }
  }

  // Each figure is the best of `repeat` runs, store and fio alternating, so a
  // burst of load from elsewhere on the machine hits both sides alike.
  nlohmann::json results = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  std::uint64_t key_base = warm_count;
  for (std::uint64_t size : sizes) {
    std::uint64_t count = std::max<std::uint64_t>(1, total / size);
    unsigned window = window_for(size, chunk, a.queue_depth);
    Measured m;
    std::optional<double> ref_w, ref_r;
    for (unsigned rep = 0; rep < a.repeat; ++rep) {
      Measured one = bench_store(*store, size, count, window, key_base);
      key_base += count;
      m.write_gbps = std::max(m.write_gbps, one.write_gbps);
      m.read_gbps = std::max(m.read_gbps, one.read_gbps);
      if (!fio) continue;
      std::string why_now;
      auto w = run_fio(fio_file, "write", size, size * count, window, why_now);
      auto r = w ? run_fio(fio_file, "read", size, size * count, window, why_now) : std::nullopt;
      if (!w || !r) {
        fio = false;
        fio_note = why_now;
        ref_w = ref_r = std::nullopt;
        continue;
      }
      ref_w = std::max(ref_w.value_or(0), *w);
      ref_r = std::max(ref_r.value_or(0), *r);
    }
    for (auto [op, got, ref] :
         {std::tuple{"write", m.write_gbps, ref_w}, std::tuple{"read", m.read_gbps, ref_r}}) {
      nlohmann::json r = {{"op", op},
                          {"size", size},
                          {"bandwidth_gbps", got},
                          {"reference_gbps", nullptr},
                          {"ratio", nullptr},
                          {"blobs", count},
                          {"blobs_in_flight", window}};
      if (ref) {
        r["reference_gbps"] = *ref;
        r["ratio"] = got / *ref;
      }
      results.push_back(r);
      rows.push_back({op, human_bytes(size), fmt::format("{:.3f}", got),
                      ref ? fmt::format("{:.3f}", *ref) : "n/a",
                      ref ? fmt::format("{:.2f}", got / *ref) : "n/a",
                      fmt::format("{} x {}", window, human_bytes(size))});
    }
  }

  const auto st = store->stats();
  const std::string method = fmt::format(
      "per size: {} MiB written as sequential puts of distinct keys, then read back in order, "
      "best of {} runs (store and fio alternating, both files written once before timing); "
      "blobs split into {} I/Os, enough blobs in flight for {} I/Os (at least 2); checksums "
      "computed on put and verified on every get. Reference: fio --rw=write then --rw=read, "
      "--direct=1 --ioengine=io_uring, same block size, iodepth = blobs in flight, same directory",
      a.total_mb, a.repeat, human_bytes(chunk), a.queue_depth);
  if (a.json) {
    nlohmann::json j = {
        {"machine", machine()},
        {"measured", true},
        {"units", "GB/s (1e9 bytes per second)"},
        {"dir", dir},
        {"filesystem", fs_type(dir)},
        {"direct_io", store->capabilities().direct_io},
        {"engine", std::string(store->engine().name())},
        {"method", method},
        {"reference", fio ? "fio (O_DIRECT, io_uring)" : nullptr},
        {"reference_note", fio_note.empty() ? nlohmann::json(nullptr) : nlohmann::json(fio_note)},
        {"config",
         {{"sizes", a.sizes},
          {"total_mb", a.total_mb},
          {"queue_depth", a.queue_depth},
          {"chunk_bytes", chunk},
          {"repeat", a.repeat}}},
        {"checksum_failures", st.checksum_failures},
        {"io_errors", st.io_errors},
        {"results", results}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("SSD store vs fio, measured on {}; dir {} ({}), {} engine, direct I/O {}\n", machine(),
             dir, fs_type(dir), store->engine().name(),
             store->capabilities().direct_io ? "on" : "OFF (file system refused O_DIRECT)");
  fmt::print("{}\n", method);
  if (!fio_note.empty()) fmt::print("reference: n/a ({})\n", fio_note);
  fmt::print("\n{:<6} {:>6} {:>12} {:>10} {:>7}  {}\n", "op", "size", "store GB/s", "fio GB/s",
             "ratio", "in flight");
  for (const auto& r : rows)
    fmt::print("{:<6} {:>6} {:>12} {:>10} {:>7}  {}\n", r[0], r[1], r[2], r[3], r[4], r[5]);
  fmt::print("\nstore checks: {} checksum failures, {} I/O errors\n", st.checksum_failures,
             st.io_errors);
}

}  // namespace

void add_bench_ssd_command(CLI::App& bench) {
  auto args = std::make_shared<BenchSsdArgs>();
  auto* cmd = bench.add_subcommand(
      "ssd",
      "Sequential bandwidth of the SSD store next to fio (O_DIRECT) on the same file system");
  cmd->add_flag("--json", args->json, "Print JSON instead of a table");
  cmd->add_option("--dir", args->dir, "Directory on the file system to measure (default /tmp)");
  cmd->add_option("--sizes", args->sizes, "Comma-separated blob sizes, e.g. 64K,1M,4M,16M,64M")
      ->capture_default_str();
  cmd->add_option("--total-mb", args->total_mb, "MiB written and read per size")
      ->capture_default_str();
  cmd->add_option("--qd", args->queue_depth, "I/Os to keep in flight (both store and fio)")
      ->capture_default_str();
  cmd->add_option("--chunk-kb", args->chunk_kb, "Largest single I/O of the store, KiB")
      ->capture_default_str();
  cmd->add_option("--repeat", args->repeat, "Runs per figure; the best is reported")
      ->capture_default_str();
  cmd->add_flag("--no-fio", args->no_fio, "Skip the fio reference");
  cmd->callback([args] { run_bench_ssd(*args); });
}

}  // namespace u3m::cli
