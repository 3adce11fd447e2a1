// `u3m bench ssd`: write and read bandwidth of the SSD store
// (src/mem/ssd_store.cpp) for 64 KiB..64 MiB blobs over a region larger than
// the caches (Note [A region past the caches]), each shown next to fio's
// sequential and random bandwidth at the same queue depth with O_DIRECT on the
// same file system, measured in the same run in paired, interleaved rounds
// (Note [Paired rounds]).
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "u3m/mem/mapping.hpp"
#include "u3m/mem/ssd_store.hpp"
#include "u3m/mem/sys_probe.hpp"
#include "u3m/util/aligned.hpp"
#include "u3m/util/error.hpp"

namespace u3m::cli {
namespace {

using mem::Status;

struct BenchSsdArgs {
  bool json = false;
  std::string dir;
  std::string sizes = "64K,1M,4M,16M,64M";
  unsigned rounds = 5;
  double seconds = 0.2;
  std::string region = "8G";
  unsigned queue_depth = 16;
  std::uint32_t chunk_kb = 1024;
  bool no_fio = false;
  bool no_thp = false;
  bool no_verify_writes = false;
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

// "1.52 1.61 1.70" from /proc/loadavg: how busy the shared machine was.
std::string load_average() {
  std::ifstream f("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  if (!(f >> a >> b >> c)) return "unknown";
  return fmt::format("{:.2f} {:.2f} {:.2f}", a, b, c);
}

// Note [Huge-page buffers]
// On the VM this bench was tuned on (Firecracker, virtio-blk without indirect
// descriptors), every physically contiguous piece of an O_DIRECT buffer is one
// descriptor in a 256-entry virtqueue (max_segments 254). A 1 MiB I/O into
// 4 KiB pages is 1 to 256 segments depending on where the page allocator put
// them: past 254 the block layer splits it in two, and the more segments, the
// fewer requests the device holds at once and the more the kernel pins page by
// page. Bandwidth then follows the luck of each buffer's physical layout, not
// the code: with 4 KiB pages the same store binary read 64 MiB blobs at 1.0 or
// 1.8 GB/s from one process to the next, and beat fio by 1.7x or lost by 0.7x
// depending on whose buffers happened to be contiguous (block:block_split
// counts and request sizes in /sys/block/vda/stat showed it). With
// transparent huge pages every 1 MiB I/O lies in one 2 MiB page: one segment,
// no split, and adjacent I/Os merge. So both sides get THP-backed buffers:
// the store's here (2 MiB aligned, madvise), fio's through glibc's
// glibc.malloc.hugetlb=1 tunable (fio allocates its I/O buffers with malloc,
// which then madvises them). `--no-thp` turns both off, to see the difference.
using mem::kHugePage;

using Buf = AlignedBuffer;
Buf io_buf(std::size_t n, bool thp) {
  if (!thp) return aligned_buffer(mem::SsdStore::kBlock, n);
  n = (n + kHugePage - 1) / kHugePage * kHugePage;
  Buf b = aligned_buffer(kHugePage, n);
  // Advice only: where THP is off ("never") the pages stay 4 KiB, and
  // thp_bytes() below reports what was actually granted.
  (void)madvise(b.get(), n, MADV_HUGEPAGE);
  return b;
}

// Bytes of this process's anonymous memory in transparent huge pages
// (/proc/self/smaps_rollup), or -1 where the kernel does not say.
long long thp_bytes() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string key;
  long long kb = 0;
  while (f >> key) {
    if (key == "AnonHugePages:" && f >> kb) return kb * 1024;
    f.ignore(1 << 20, '\n');
  }
  return -1;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// User + system CPU seconds of this process, all threads (the engine's
// completion thread verifies checksums, so it must count).
double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

// One timed run of one side.
struct Sample {
  double gbps = 0;
  double cpu_s_per_gb = 0;
  double mean_depth = 0;  // ops in flight at the device, mean over completions (store only)
  double bytes = 0;       // moved in the run
};

// Note [A region past the caches]
// With O_DIRECT the page cache is out of the way, but the layers below are not:
// on the dev VM a 128 MiB region sat in the host's cache, and the store "beat"
// fio by 1.2-3.3x at 1.6-2.2 GB/s while fio on a 2 GiB file at queue depth 32
// wrote at 343 MB/s and read at 630 MB/s (issue 19). So the region defaults to
// 8 GiB (--region), and each side splits its region in two halves:
//   - writes cycle over the first half, from where the previous write run of
//     that size stopped;
//   - reads cycle over the second half, which was written once before timing
//     (the store: one blob per key; fio: the layout pass) and never since, so
//     a read finds data written long before, not what the write run just
//     left in a cache below.
// fio's sequential jobs continue the same way (--offset moves on each run,
// inside a quarter-region window of their half, so they never wrap within a
// run); its random jobs spread over the whole half (--randrepeat=0: new
// offsets each run). Before anything is written the free space of --dir is
// checked against what both files need.
//
// The workload for one blob size, shared by both sides: `keys` blobs of
// `size`, written in I/Os of `io_bytes` with `queue_depth` of them in flight
// at the device; keys [0, keys/2) are written, [keys/2, keys) read.
struct Workload {
  std::uint64_t size = 0, io_bytes = 0, keys = 0;
  unsigned blobs_in_flight = 0;
  std::uint64_t region() const { return size * keys; }
  std::uint64_t half_keys() const { return keys / 2; }
  std::uint64_t half_bytes() const { return half_keys() * size; }
};

// Note [Paired rounds]
// This is a 2-core VM shared with other people's builds: a load spike can halve
// either side's bandwidth for a second. A best-of-N per side (last session)
// compares the store's luckiest second with fio's, and one side's spike shows
// up as a large swing in the ratio (0.75..1.38). Instead each round measures
// store and fio back to back on the same size and op (their order alternating
// between rounds, so neither side always runs right after the other), the
// ratio is taken within each pair, and the median ratio over rounds is
// reported with its min..max. A spike longer than a pair hits both sides; a
// shorter one spoils one pair, which the median ignores.
//
// Both sides get the same file system, the same I/O size and the same queue
// depth at the device. The store splits blobs into `--chunk-kb` extents, one
// I/O each, so fio's --bs is min(blob, chunk); the store's io_uring engine
// starts at most `--qd` I/Os at once, fio's --iodepth is `--qd`. The store is
// also given enough blobs to keep that depth (Note [Refill before callbacks]
// in io_engine_uring.cpp); the mean depth it reached is measured and printed.
class StoreSide {
 public:
  StoreSide(mem::SsdStore& store, std::uint64_t max_size, unsigned max_window, bool thp)
      : store_(store) {
    std::mt19937_64 rng(42);
    for (unsigned w = 0; w < max_window; ++w) {
      bufs_.push_back(io_buf(max_size, thp));
      auto* p = reinterpret_cast<std::uint64_t*>(bufs_.back().get());
      for (std::uint64_t i = 0; i < max_size / 8; ++i) p[i] = rng();
    }
  }

  // Writes the workload's write half (or reads its read half) in key order
  // from where the last run of that kind stopped, cycling, for `seconds`.
  // The store verifies every extent's checksum on each get.
  Sample run(const Workload& w, bool write, double seconds) {
    if (write) return pass(w, true, 0, w.half_keys(), write_cursor_, seconds);
    return pass(w, false, w.half_keys(), w.keys - w.half_keys(), read_cursor_, seconds);
  }
  // Every key of `w` once, untimed: the first touch of the whole file (Note
  // [Fair first touch]).
  void write_all(const Workload& w) {
    std::uint64_t cursor = 0;
    pass(w, true, 0, w.keys, cursor, 0);
  }
  // Before a size's rounds: the previous size's blobs go, and the read half
  // is written once (Note [A region past the caches]).
  void fill(const Workload& w) {
    clear();
    write_cursor_ = read_cursor_ = 0;
    std::uint64_t cursor = 0;
    pass(w, true, w.half_keys(), w.keys - w.half_keys(), cursor, 0);
  }

  // Drops the previous size's blobs, so each size starts from one free run.
  void clear() {
    for (std::uint64_t k = 0; k < written_; ++k) store_.erase(k);
    written_ = 0;
  }

 private:
  // Keys [first, first+span) in order from `cursor` (which moves on),
  // cycling, for `seconds`; 0 seconds: exactly one pass.
  Sample pass(const Workload& w, bool write, std::uint64_t first, std::uint64_t span,
              std::uint64_t& cursor, double seconds) {
    std::deque<std::future<Status>> inflight;
    auto drain_one = [&] {
      Status s = inflight.front().get();
      inflight.pop_front();
      if (!ok(s))
        throw std::runtime_error(fmt::format("ssd store {} of a {} blob failed: {}",
                                             write ? "put" : "get", human_bytes(w.size),
                                             to_string(s)));
    };
    const auto e0 = store_.engine().stats();
    const double cpu0 = cpu_seconds();
    const auto t0 = Clock::now();
    std::uint64_t i = 0;
    for (;; ++i) {
      if (inflight.size() == w.blobs_in_flight) drain_one();
      if (seconds > 0 ? i >= w.blobs_in_flight && seconds_since(t0) >= seconds : i == span) break;
      unsigned char* b = bufs_[i % w.blobs_in_flight].get();
      const std::uint64_t key = first + (cursor + i) % span;
      if (write) {
        std::memcpy(b, &i, sizeof i);  // distinct content per put, as real data would be
        inflight.push_back(store_.put_async(key, b, w.size, false));
        written_ = std::max(written_, key + 1);
      } else {
        inflight.push_back(store_.get_async(key, b, w.size));
      }
    }
    while (!inflight.empty()) drain_one();
    cursor = (cursor + i) % span;
    const double secs = seconds_since(t0);
    const double gb = static_cast<double>(w.size * i) / 1e9;
    const auto e1 = store_.engine().stats();
    Sample s;
    s.gbps = gb / secs;
    s.bytes = gb * 1e9;
    s.cpu_s_per_gb = (cpu_seconds() - cpu0) / gb;
    if (e1.completions > e0.completions)
      s.mean_depth = static_cast<double>(e1.depth_sum - e0.depth_sum) /
                     static_cast<double>(e1.completions - e0.completions);
    return s;
  }

  mem::SsdStore& store_;
  std::vector<Buf> bufs_;
  std::uint64_t written_ = 0;
  std::uint64_t write_cursor_ = 0, read_cursor_ = 0;  // offsets into each half
};

// fio with O_DIRECT and io_uring on the same directory.
class FioSide {
 public:
  FioSide(std::string file, unsigned queue_depth, bool thp)
      : file_(std::move(file)), qd_(queue_depth), thp_(thp) {}
  ~FioSide() { std::remove(file_.c_str()); }

  // Writes the whole file once, untimed (Note [Fair first touch]).
  bool lay_out(std::uint64_t bytes, std::uint64_t io_bytes, std::string& why) {
    return run_jobs(fmt::format("--size={} --bs={} --name=layout --rw=write", bytes, io_bytes),
                    {"layout"}, why)
        .has_value();
  }

  // The four jobs of one pair, one after the other (--stonewall) in one fio
  // process, which pays fio's fixed start-up cost (about 0.3 s here) once:
  // sequential write and read continuing from the last pair's offsets in a
  // window of their half, then random write and read over each whole half
  // (Note [A region past the caches]).
  struct Pair {
    Sample write, read, randwrite, randread;
  };
  void start(const Workload& w) { write_off_ = read_off_ = 0, w_ = w; }
  std::optional<Pair> run(double seconds, std::string& why) {
    const std::uint64_t half = w_.half_bytes(), bs = w_.io_bytes;
    const std::uint64_t window = std::max(bs, half / 2 / bs * bs);
    const std::uint64_t room = half - window + bs;  // offsets [0, room) keep the window inside
    auto ms = static_cast<long>(seconds * 1000);
    auto r = run_jobs(
        fmt::format(
            "--bs={} --time_based --runtime={}ms "
            "--name=write --rw=write --offset={} --size={} "
            "--name=read --rw=read --offset={} --size={} --stonewall "
            "--name=randwrite --rw=randwrite --randrepeat=0 --offset=0 --size={} --stonewall "
            "--name=randread --rw=randread --randrepeat=0 --offset={} --size={} --stonewall",
            bs, ms, write_off_, window, half + read_off_, window, half, half, half),
        {"write", "read", "randwrite", "randread"}, why);
    if (!r) return std::nullopt;
    auto advance = [&](std::uint64_t& off, double bytes) {
      off = (off + static_cast<std::uint64_t>(bytes)) % room / bs * bs;
    };
    advance(write_off_, (*r)[0].bytes);
    advance(read_off_, (*r)[1].bytes);
    return Pair{(*r)[0], (*r)[1], (*r)[2], (*r)[3]};
  }

 private:
  std::optional<std::vector<Sample>> run_jobs(const std::string& jobs,
                                              const std::vector<std::string>& names,
                                              std::string& why) {
    // Note [Huge-page buffers]: fio's malloc'd buffers get THP like the store's
    // (glibc >= 2.35 honours the tunable; the user's own tunables are kept).
    std::string tunables;
    if (thp_) {
      const char* mine = std::getenv("GLIBC_TUNABLES");
      tunables = fmt::format("GLIBC_TUNABLES='{}{}glibc.malloc.hugetlb=1' ", mine ? mine : "",
                             mine && *mine ? ":" : "");
    }
    std::string cmd = fmt::format(
        "{}fio --filename='{}' --direct=1 --ioengine=io_uring --iodepth={} "
        "--output-format=json {} 2>&1",
        tunables, file_, qd_, jobs);
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
      std::vector<Sample> got;
      for (const std::string& name : names) {
        const nlohmann::json* job = nullptr;
        for (const auto& x : j.at("jobs"))
          if (x.at("jobname") == name) job = &x;
        if (!job) throw std::runtime_error("no job '" + name + "' in fio's output");
        if (job->value("error", 0) != 0) {
          why = fmt::format("fio job {} error {}", name, job->value("error", 0));
          return std::nullopt;
        }
        const auto& io = job->at(name.ends_with("read") ? "read" : "write");
        Sample s;
        double bytes = io.at("io_bytes").get<double>();
        s.bytes = bytes;
        s.gbps = io.at("bw_bytes").get<double>() / 1e9;
        double cpu_pct = job->at("usr_cpu").get<double>() + job->at("sys_cpu").get<double>();
        double secs = job->at("job_runtime").get<double>() / 1000;
        if (bytes > 0) s.cpu_s_per_gb = cpu_pct / 100 * secs / (bytes / 1e9);
        got.push_back(s);
      }
      return got;
    } catch (const std::exception& e) {
      why = fmt::format("cannot read fio's JSON: {}", e.what());
      return std::nullopt;
    }
  }

  std::string file_;
  unsigned qd_;
  bool thp_;
  Workload w_;
  std::uint64_t write_off_ = 0, read_off_ = 0;  // sequential jobs' offsets into each half
};

bool have_fio() {
  return std::system("command -v fio >/dev/null 2>&1") == 0;
}

double min_of(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}
double max_of(const std::vector<double>& v) {
  return *std::max_element(v.begin(), v.end());
}

// All pairs of one (size, op).
struct Series {
  std::vector<double> store, fio, ratio, rand_fio, rand_ratio, depth, store_cpu, fio_cpu;
};

void run_bench_ssd(const BenchSsdArgs& a) {
  auto sizes = parse_sizes(a.sizes);
  if (a.rounds == 0) input_error("--rounds", "must be at least 1");
  if (!(a.seconds >= 0.01 && a.seconds <= 600)) input_error("--seconds", "must be in 0.01..600");
  const std::uint64_t region = parse_size(a.region, "--region", 1ull << 50);
  if (a.queue_depth == 0 || a.queue_depth > 4096) input_error("--qd", "must be in 1..4096");
  const std::uint32_t chunk = a.chunk_kb * 1024;
  if (chunk == 0 || chunk % mem::SsdStore::kBlock != 0)
    input_error("--chunk-kb", "{} is not a positive multiple of 4", a.chunk_kb);
  std::string dir = a.dir.empty() ? "/tmp" : a.dir;
  if (access(dir.c_str(), W_OK) != 0) input_error("--dir", "{}: not a writable directory", dir);

  // Blobs in flight: enough for twice the device queue depth (at least 2), so
  // there is always a blob hashed and queued when a slot frees. Each half of
  // the keys holds at least one window of blobs.
  std::vector<Workload> work;
  std::uint64_t capacity = 0, max_region = 0, max_size = 0;
  unsigned max_window = 0;
  for (std::uint64_t size : sizes) {
    Workload w;
    w.size = size;
    w.io_bytes = std::min<std::uint64_t>(size, chunk);
    std::uint64_t per_blob = (size + chunk - 1) / chunk;
    w.blobs_in_flight = static_cast<unsigned>(
        std::max<std::uint64_t>(2, (2 * a.queue_depth + per_blob - 1) / per_blob));
    w.keys = std::max<std::uint64_t>(2ull * w.blobs_in_flight, region / size);
    // Installed blobs, new versions in flight while the keys cycle, and one
    // blob of slack for sizes that are not a multiple of the extent.
    capacity = std::max(capacity, (w.keys + w.blobs_in_flight + 1) * size);
    max_region = std::max(max_region, w.region());
    max_size = std::max(max_size, size);
    max_window = std::max(max_window, w.blobs_in_flight);
    work.push_back(w);
  }
  bool fio = !a.no_fio && have_fio();
  std::string fio_note = a.no_fio ? "skipped (--no-fio)" : fio ? "" : "fio not found on PATH";
  // Both files must fit, with 1% and 64 MiB to spare for the file system.
  const std::uint64_t need = capacity + (fio ? max_region : 0);
  std::string why;
  const auto free_now = mem::free_bytes(dir, &why);
  if (!free_now) input_error("--dir", "{}", why);
  if (need + need / 100 + (64ull << 20) > *free_now)
    input_error("--region",
                "{} needs {} free in {} ({}: the store's file{}), only {} is; pass a smaller "
                "--region or another --dir",
                human_bytes(region), approx_bytes(double(need + need / 100 + (64ull << 20))), dir,
                mem::fs_type(dir), fio ? " and fio's" : "", approx_bytes(double(*free_now)));
  const std::string tag = fmt::format("{}", getpid());
  const std::string load_before = load_average();
  if (region >= (1ull << 30))  // a fill that takes a while: say so first
    fmt::print(stderr, "bench ssd: writing {} for the store{} in {} before timing\n",
               approx_bytes(double(capacity)),
               fio ? fmt::format(" and {} for fio", approx_bytes(double(max_region))) : "", dir);

  mem::SsdStoreOptions o;
  o.path = fmt::format("{}/u3m-bench-ssd.{}.dat", dir, tag);
  o.capacity = capacity;
  o.chunk_bytes = chunk;
  o.queue_depth = a.queue_depth;  // the engine's cap on I/Os in flight
  o.verify_writes = !a.no_verify_writes;
  std::unique_ptr<mem::SsdStore> store;
  Status s = mem::SsdStore::open(o, store, &why);
  if (!ok(s)) throw std::runtime_error(fmt::format("cannot open the SSD store: {}", why));
  const bool thp = !a.no_thp;
  StoreSide store_side(*store, std::max<std::uint64_t>(max_size, chunk), max_window, thp);
  const long long store_thp = thp_bytes();  // after the buffers were filled (touched)
  const std::string buffers =
      thp ? fmt::format(
                "transparent huge pages (madvise; store: {} in huge pages; fio: requested "
                "through GLIBC_TUNABLES=glibc.malloc.hugetlb=1, not verified per run)",
                store_thp < 0 ? std::string("unknown")
                              : human_bytes(static_cast<std::uint64_t>(store_thp)))
          : std::string("4 KiB pages (--no-thp) on both sides");
  FioSide fio_side(fmt::format("{}/u3m-bench-fio.{}.dat", dir, tag), a.queue_depth, thp);

  // Note [Fair first touch]
  // Writing into freshly fallocated blocks makes ext4 convert unwritten
  // extents, which costs more than rewriting. Both files are written once
  // before anything is timed, so neither side pays it and the other not.
  {
    // One pass of distinct keys that exactly fills the file: no overwrites,
    // so it fits however small the capacity.
    Workload warm;
    warm.size = warm.io_bytes = std::min<std::uint64_t>(chunk, store->capabilities().capacity);
    warm.keys = store->capabilities().capacity / warm.size;
    warm.blobs_in_flight = static_cast<unsigned>(
        std::min<std::uint64_t>({max_window, 2ull * a.queue_depth, warm.keys}));
    store_side.write_all(warm);
  }
  if (fio && !fio_side.lay_out(max_region, chunk, why)) {
    fio = false;
    fio_note = why;
  }

  std::map<std::pair<std::uint64_t, int>, Series> series;  // (size, 0 write / 1 read)
  for (const Workload& w : work) {
    store_side.fill(w);  // also drops the previous size's blobs
    fio_side.start(w);
    for (unsigned round = 0; round < a.rounds; ++round) {
      // Even rounds: store first; odd rounds: fio first (Note [Paired rounds]).
      std::optional<FioSide::Pair> ref;
      auto run_fio = [&] {
        if (!fio) return;
        ref = fio_side.run(a.seconds, why);
        if (!ref) {
          fio = false;
          fio_note = why;
        }
      };
      if (round % 2 == 1) run_fio();
      Sample sw = store_side.run(w, true, a.seconds);
      Sample sr = store_side.run(w, false, a.seconds);
      if (round % 2 == 0) run_fio();
      for (int op = 0; op < 2; ++op) {
        Series& ser = series[{w.size, op}];
        const Sample& st = op == 0 ? sw : sr;
        ser.store.push_back(st.gbps);
        ser.depth.push_back(st.mean_depth);
        ser.store_cpu.push_back(st.cpu_s_per_gb);
        if (ref) {
          const Sample& f = op == 0 ? ref->write : ref->read;
          const Sample& r = op == 0 ? ref->randwrite : ref->randread;
          ser.fio.push_back(f.gbps);
          ser.fio_cpu.push_back(f.cpu_s_per_gb);
          ser.ratio.push_back(st.gbps / f.gbps);
          ser.rand_fio.push_back(r.gbps);
          ser.rand_ratio.push_back(st.gbps / r.gbps);
        }
      }
    }
  }
  store_side.clear();
  // fio failing midway leaves some sizes with fewer pairs; report none rather
  // than a ratio over a different set of rounds.
  if (!fio)
    for (auto& [k, ser] : series)
      ser.fio.clear(), ser.fio_cpu.clear(), ser.ratio.clear(), ser.rand_fio.clear(),
          ser.rand_ratio.clear();

  nlohmann::json results = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  for (const Workload& w : work) {
    for (int op = 0; op < 2; ++op) {
      const Series& ser = series.at({w.size, op});
      const bool has_ref = !ser.ratio.empty();
      nlohmann::json r = {{"op", op == 0 ? "write" : "read"},
                          {"size", w.size},
                          {"io_bytes", w.io_bytes},
                          {"queue_depth", a.queue_depth},
                          {"blobs_in_flight", w.blobs_in_flight},
                          {"region_bytes", w.region()},
                          {"bandwidth_gbps", median(ser.store)},
                          {"store_gbps_samples", ser.store},
                          {"store_mean_depth", median(ser.depth)},
                          {"store_cpu_s_per_gb", median(ser.store_cpu)},
                          {"reference_gbps", nullptr},
                          {"ratio", nullptr},
                          {"random_reference_gbps", nullptr},
                          {"random_ratio", nullptr}};
      if (has_ref) {
        r["reference_gbps"] = median(ser.fio);
        r["reference_gbps_samples"] = ser.fio;
        r["reference_cpu_s_per_gb"] = median(ser.fio_cpu);
        r["ratio"] = median(ser.ratio);
        r["ratio_samples"] = ser.ratio;
        r["ratio_min"] = min_of(ser.ratio);
        r["ratio_max"] = max_of(ser.ratio);
        r["random_reference_gbps"] = median(ser.rand_fio);
        r["random_reference_gbps_samples"] = ser.rand_fio;
        r["random_ratio"] = median(ser.rand_ratio);
        r["random_ratio_samples"] = ser.rand_ratio;
      }
      results.push_back(r);
      auto f3 = [](double x) { return fmt::format("{:.3f}", x); };
      const std::string na = "n/a";
      rows.push_back(
          {op == 0 ? "write" : "read", human_bytes(w.size), human_bytes(w.io_bytes),
           f3(median(ser.store)), (has_ref ? f3(median(ser.fio)) : na),
           (has_ref ? fmt::format("{:.2f}", median(ser.ratio)) : na),
           (has_ref ? fmt::format("{:.2f}-{:.2f}", min_of(ser.ratio), max_of(ser.ratio)) : na),
           (has_ref ? f3(median(ser.rand_fio)) : na),
           (has_ref ? fmt::format("{:.2f}", median(ser.rand_ratio)) : na),
           fmt::format("{:.1f}", median(ser.depth)),
           fmt::format("{:.2f}", median(ser.store_cpu)) + " / " +
               (has_ref ? fmt::format("{:.2f}", median(ser.fio_cpu)) : na)});
    }
  }

  const auto st = store->stats();
  const std::string load_after = load_average();
  const std::string method = fmt::format(
      "For each size, {} paired rounds; in each, the store writes then reads, and one fio "
      "process runs a sequential write, a sequential read, a random write and a random read "
      "job (store first in even rounds, fio first in odd ones). Region {} per side (Note [A "
      "region past the caches]): writes cycle over its first half from where the last write "
      "run stopped, reads over its second half, written once before timing and never since; "
      "fio's sequential jobs continue likewise in a quarter-region window of each half, its "
      "random jobs spread over each whole half (--randrepeat=0). Each run lasts at least {} s. "
      "Ratio = store/fio within each pair (sequential; random beside it); reported: median and "
      "min-max of the ratios, and the median bandwidth of each side. Same file system, same I/O "
      "size (the store splits blobs into {} extents, one I/O each; fio --bs=min(size, {})), "
      "same queue depth at the device ({}: the store's io_uring engine caps I/Os in flight at "
      "it; fio --iodepth={}); the store keeps enough blobs queued to fill it. fio: --direct=1 "
      "--ioengine=io_uring. Checksums are computed on every put and verified on every get; {}. "
      "Both files are written in full before timing. I/O buffers: {}.",
      a.rounds, human_bytes(region), a.seconds, human_bytes(chunk), human_bytes(chunk),
      a.queue_depth, a.queue_depth,
      a.no_verify_writes ? "puts are not read back (--no-verify-writes)"
                         : "every put is read back and checked before it completes (the store's "
                           "verify_writes, on by default), so the store's writes include a read",
      buffers);
  if (a.json) {
    nlohmann::json j = {
        {"machine", machine()},
        {"measured", true},
        {"load_average_before", load_before},
        {"load_average_after", load_after},
        {"units", "GB/s (1e9 bytes per second); CPU in seconds per GB moved"},
        {"dir", dir},
        {"filesystem", mem::fs_type(dir)},
        {"free_bytes_before", *free_now},
        {"direct_io", store->capabilities().direct_io},
        {"engine", std::string(store->engine().name())},
        {"huge_page_buffers", thp},
        {"verify_writes", !a.no_verify_writes},
        {"store_thp_bytes", store_thp < 0 ? nlohmann::json(nullptr) : nlohmann::json(store_thp)},
        {"method", method},
        {"reference",
         fio ? nlohmann::json("fio (O_DIRECT, io_uring): sequential, and random beside it")
             : nlohmann::json(nullptr)},
        {"reference_note", fio_note.empty() ? nlohmann::json(nullptr) : nlohmann::json(fio_note)},
        {"config",
         {{"sizes", a.sizes},
          {"rounds", a.rounds},
          {"seconds", a.seconds},
          {"region_bytes", region},
          {"queue_depth", a.queue_depth},
          {"chunk_bytes", chunk}}},
        {"checksum_failures", st.checksum_failures},
        {"io_errors", st.io_errors},
        {"results", results}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print(
      "SSD store vs fio, measured on {} (load average {} before, {} after); dir {} ({}), {} "
      "engine, direct I/O {}\n",
      machine(), load_before, load_after, dir, mem::fs_type(dir), store->engine().name(),
      store->capabilities().direct_io ? "on" : "OFF (file system refused O_DIRECT)");
  fmt::print("{}\n", method);
  if (!fio_note.empty()) fmt::print("reference: n/a ({})\n", fio_note);
  fmt::print("\n{:<6} {:>7} {:>7} {:>10} {:>9} {:>6} {:>10} {:>9} {:>6} {:>6}  {}\n", "op", "size",
             "I/O", "store GB/s", "fio seq", "ratio", "min-max", "fio rand", "ratio", "depth",
             "CPU s/GB store / fio");
  for (const auto& r : rows)
    fmt::print("{:<6} {:>7} {:>7} {:>10} {:>9} {:>6} {:>10} {:>9} {:>6} {:>6}  {}\n", r[0], r[1],
               r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10]);
  fmt::print(
      "\nGB/s: medians over {} rounds; ratio: median of per-round store/fio (sequential, then "
      "random), min-max across rounds of the sequential one; depth: the store's mean I/Os in "
      "flight at the device (fio: {}).\n",
      a.rounds, a.queue_depth);
  fmt::print("store checks: {} checksum failures, {} I/O errors\n", st.checksum_failures,
             st.io_errors);
}

}  // namespace

void add_bench_ssd_command(CLI::App& bench) {
  auto args = std::make_shared<BenchSsdArgs>();
  auto* cmd = bench.add_subcommand(
      "ssd",
      "SSD store bandwidth over a region past the caches, next to fio's sequential and random "
      "figures (O_DIRECT) at the same queue depth on the same file system");
  cmd->add_flag("--json", args->json, "Print JSON instead of a table");
  cmd->add_option("--dir", args->dir, "Directory on the file system to measure (default /tmp)");
  cmd->add_option("--sizes", args->sizes, "Comma-separated blob sizes, e.g. 64K,1M,4M,16M,64M")
      ->capture_default_str();
  cmd->add_option("--rounds", args->rounds,
                  "Paired rounds (store, fio) per size; the median ratio is reported")
      ->capture_default_str();
  cmd->add_option("--seconds", args->seconds, "Least duration of each timed run, per side")
      ->capture_default_str();
  cmd->add_option("--region", args->region,
                  "Bytes of blobs per side (K, M, G): larger than the caches below O_DIRECT; half "
                  "is written, half read")
      ->capture_default_str();
  cmd->add_option("--qd", args->queue_depth, "I/Os in flight at the device (both store and fio)")
      ->capture_default_str();
  cmd->add_option("--chunk-kb", args->chunk_kb, "Largest single I/O of the store, KiB")
      ->capture_default_str();
  cmd->add_flag("--no-fio", args->no_fio, "Skip the fio reference");
  cmd->add_flag("--no-verify-writes", args->no_verify_writes,
                "Store puts without reading them back (the store verifies every write by default)");
  cmd->add_flag("--no-thp", args->no_thp,
                "I/O buffers in 4 KiB pages on both sides (default: transparent huge pages)");
  cmd->callback([args] { run_bench_ssd(*args); });
}

}  // namespace u3m::cli
