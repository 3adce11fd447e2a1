// `u3m hw calibrate`'s measurements (Note [What calibrate measures] in
// include/u3m/sim/calibrate.hpp).
#include "u3m/sim/calibrate.hpp"
#include "u3m/util/aligned.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <memory>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "u3m/mem/device_emu.hpp"
#include "u3m/mem/ssd_store.hpp"
#include "u3m/util/error.hpp"

namespace u3m::sim {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  // Never 0: a rate divides by it.
  return std::max(1e-9, std::chrono::duration<double>(Clock::now() - t0).count());
}

// Calls `once` (which returns one sample) until `budget` seconds have passed
// and at least `min_reps` samples exist; the median resists a stray slow run
// on a shared machine.
template <typename F>
double median_of(double budget, int min_reps, F once) {
  std::vector<double> samples;
  const auto t0 = Clock::now();
  while (static_cast<int>(samples.size()) < min_reps || since(t0) < budget) {
    samples.push_back(once());
    if (samples.size() >= 1'000'000) break;
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

void check(mem::Status s, std::string_view what) {
  if (!mem::ok(s))
    throw std::runtime_error(fmt::format("calibrate: {} failed: {}", what, mem::to_string(s)));
}

using Buf = AlignedBuffer;
Buf aligned_buf(std::size_t n) {  // block-aligned for O_DIRECT, with defined contents
  Buf b = aligned_buffer(mem::SsdStore::kBlock, n);
  std::memset(b.get(), 0x5a, n);
  return b;
}

double measure_memcpy(std::size_t bytes, double budget) {
  std::vector<unsigned char> src(bytes, 1), dst(bytes, 0);
  volatile unsigned char sink = 0;  // keeps the copies observable
  std::uint64_t rep = 0;
  return median_of(budget, 3, [&] {
    src[rep % bytes] = static_cast<unsigned char>(rep);
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const double t = since(t0);
    sink = dst[rep++ % bytes];
    return static_cast<double>(bytes) / t;
  });
}

double measure_gemm(double budget) {
  constexpr int n = 256;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>(i % 7) * 0.25f;
    b[i] = static_cast<float>(i % 5) * 0.5f;
  }
  volatile float sink = 0;
  return median_of(budget, 3, [&] {
    const auto t0 = Clock::now();
    sgemm_blocked(n, a.data(), b.data(), c.data());
    const double t = since(t0);
    sink = c[n + 1];
    return 2.0 * n * n * n / t;
  });
}

struct LinkFigures {
  double bytes_per_s, latency_s, overhead_s;
};

LinkFigures measure_link(std::size_t bytes, double budget) {
  mem::DeviceEmuOptions opt;
  opt.capacity = bytes + (4u << 20);
  mem::DeviceEmuBackend dev(opt);
  void* d = nullptr;
  check(dev.allocate(bytes, &d), "device-emu allocate");
  std::vector<unsigned char> host(bytes, 3);
  LinkFigures f{};
  f.bytes_per_s = median_of(budget * 0.75, 3, [&] {
    const auto t0 = Clock::now();
    check(dev.memcpy_async(d, bytes, host.data(), bytes, mem::CopyKind::h2d, mem::kDefaultStream),
          "device-emu memcpy_async");
    check(dev.synchronize_stream(mem::kDefaultStream), "device-emu synchronize_stream");
    return static_cast<double>(bytes) / since(t0);
  });
  constexpr std::size_t kSmall = 4096;
  f.latency_s = median_of(budget * 0.125, 50, [&] {
    const auto t0 = Clock::now();
    check(dev.memcpy_async(d, bytes, host.data(), kSmall, mem::CopyKind::h2d, mem::kDefaultStream),
          "device-emu memcpy_async");
    check(dev.synchronize_stream(mem::kDefaultStream), "device-emu synchronize_stream");
    return since(t0);
  });
  mem::Event ev;
  check(dev.create_event(&ev), "device-emu create_event");
  f.overhead_s = median_of(budget * 0.125, 50, [&] {
    const auto t0 = Clock::now();
    check(dev.record_event(ev, mem::kDefaultStream), "device-emu record_event");
    check(dev.synchronize_event(ev), "device-emu synchronize_event");
    return since(t0);
  });
  check(dev.destroy_event(ev), "device-emu destroy_event");
  check(dev.free(d), "device-emu free");
  return f;
}

struct SsdFigures {
  double read_bps, write_bps, read_latency_s, write_latency_s;
  bool direct_io;
};

SsdFigures measure_ssd(const std::string& dir, std::uint64_t capacity, double budget) {
  constexpr std::size_t kBlob = 4u << 20;
  constexpr unsigned kWindow = 4;
  mem::SsdStoreOptions opt;
  opt.path = fmt::format("{}/u3m-calibrate-{}.bin", dir, ::getpid());
  opt.capacity = capacity;
  std::unique_ptr<mem::SsdStore> store;
  std::string why;
  if (mem::Status s = mem::SsdStore::open(opt, store, &why); !mem::ok(s))
    input_error("--dir", "cannot create the SSD test file {}: {} {}", opt.path, mem::to_string(s),
                why);
  std::vector<Buf> bufs;
  for (unsigned w = 0; w < kWindow; ++w) bufs.push_back(aligned_buf(kBlob));

  // Sequential puts, kWindow in flight, until the budget or the store is full.
  const std::uint64_t max_blobs = capacity / kBlob - 1;
  std::deque<std::future<mem::Status>> inflight;
  auto drain = [&] {
    check(inflight.front().get(), "SSD store I/O");
    inflight.pop_front();
  };
  std::uint64_t written = 0;
  auto t0 = Clock::now();
  while (written < max_blobs && (written < 2 || since(t0) < budget * 0.4)) {
    if (inflight.size() == kWindow) drain();
    unsigned char* b = bufs[written % kWindow].get();
    std::memcpy(b, &written, sizeof written);  // distinct content: no write is skipped
    inflight.push_back(store->put_async(written, b, kBlob, false));
    ++written;
  }
  while (!inflight.empty()) drain();
  SsdFigures f{};
  f.write_bps = static_cast<double>(written * kBlob) / since(t0);

  std::uint64_t read = 0;
  t0 = Clock::now();
  while (read < 2 || since(t0) < budget * 0.4) {
    if (inflight.size() == kWindow) drain();
    inflight.push_back(store->get_async(read % written, bufs[read % kWindow].get(), kBlob));
    ++read;
  }
  while (!inflight.empty()) drain();
  f.read_bps = static_cast<double>(read * kBlob) / since(t0);

  constexpr std::uint64_t kLatencyKey = ~0ull;
  constexpr std::size_t kSmall = mem::SsdStore::kBlock;
  std::uint64_t rep = 0;
  f.write_latency_s = median_of(budget * 0.1, 10, [&] {
    ++rep;
    std::memcpy(bufs[0].get(), &rep, sizeof rep);
    const auto t = Clock::now();
    check(store->put(kLatencyKey, bufs[0].get(), kSmall, false), "SSD store put");
    return since(t);
  });
  f.read_latency_s = median_of(budget * 0.1, 10, [&] {
    const auto t = Clock::now();
    check(store->get(kLatencyKey, bufs[1].get(), kSmall), "SSD store get");
    return since(t);
  });
  f.direct_io = store->capabilities().direct_io;
  return f;
}

double sig4(double v) {
  return std::stod(fmt::format("{:.4g}", v));
}

}  // namespace

void sgemm_blocked(int n, const float* a, const float* b, float* c) {
  const std::size_t m = static_cast<std::size_t>(n);
  std::fill(c, c + m * m, 0.0f);
  constexpr std::size_t kb = 64;  // 3 blocks of 64x64 floats fit in L2
  for (std::size_t i0 = 0; i0 < m; i0 += kb)
    for (std::size_t k0 = 0; k0 < m; k0 += kb)
      for (std::size_t j0 = 0; j0 < m; j0 += kb) {
        const std::size_t i1 = std::min(i0 + kb, m), k1 = std::min(k0 + kb, m),
                          j1 = std::min(j0 + kb, m);
        for (std::size_t i = i0; i < i1; ++i)
          for (std::size_t k = k0; k < k1; ++k) {
            const float aik = a[i * m + k];
            float* __restrict ci = c + i * m;  // no aliasing: lets the loop vectorise
            const float* __restrict bk = b + k * m;
            for (std::size_t j = j0; j < j1; ++j) ci[j] += aik * bk[j];
          }
      }
}

Measurements measure_machine(const CalibrateOptions& o) {
  if (!(o.seconds > 0) || o.seconds > 3600)
    input_error(o.seconds_flag, "{} must be above 0 and at most 3600", o.seconds);
  std::error_code ec;
  if (!std::filesystem::is_directory(o.dir, ec))
    input_error("--dir", "'{}' is not a directory", o.dir);
  auto step = [&](std::string_view what) {
    if (o.progress) o.progress(what);
  };
  // Short runs (tests) use smaller buffers so they stay short; 64 MiB is well
  // past any last-level cache.
  const std::size_t buf = o.seconds >= 2 ? 64u << 20 : 16u << 20;
  Measurements m;
  step("memcpy bandwidth");
  m.memcpy_bytes_per_s = measure_memcpy(buf, o.seconds * 0.15);
  step("GEMM rate");
  m.gemm_flops = measure_gemm(o.seconds * 0.25);
  step("device-emu copies");
  const LinkFigures link = measure_link(buf, o.seconds * 0.2);
  m.link_bytes_per_s = link.bytes_per_s;
  m.link_latency_s = link.latency_s;
  m.op_overhead_s = link.overhead_s;
  step("SSD store");
  const auto space = std::filesystem::space(o.dir, ec);
  std::uint64_t cap = o.seconds >= 2 ? 256u << 20 : 32u << 20;
  if (!ec) cap = std::min<std::uint64_t>(cap, space.available / 4 / (4u << 20) * (4u << 20));
  if (cap < (16u << 20))
    input_error("--dir", "'{}' needs at least 64 MiB free for the SSD test file", o.dir);
  const SsdFigures ssd = measure_ssd(o.dir, cap, o.seconds * 0.4);
  m.ssd_read_bytes_per_s = ssd.read_bps;
  m.ssd_write_bytes_per_s = ssd.write_bps;
  m.ssd_read_latency_s = ssd.read_latency_s;
  m.ssd_write_latency_s = ssd.write_latency_s;
  m.ssd_direct_io = ssd.direct_io;
  if (!ec) m.ssd_fs_bytes = space.capacity;
  m.dram_bytes = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                 static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  return m;
}

HwProfile profile_from_measurements(const Measurements& m, const CalibrateOptions& o) {
  const std::string by = fmt::format("on {} by u3m hw calibrate, {}", o.host, o.date);
  auto param = [&](double si, Dim dim, std::string_view unit, std::string source) {
    Param p;
    p.unit = unit;
    p.value = sig4(si / unit_factor(dim, unit));
    p.si = p.value * unit_factor(dim, unit);
    p.source = std::move(source);
    return p;
  };
  auto measured = [&](std::string_view what) { return fmt::format("measured {}: {}", by, what); };
  auto not_measured = [&](std::string_view what) {
    return fmt::format("not measured {}: {}", by, what);
  };
  const double traffic = 2 * m.memcpy_bytes_per_s;
  const std::string ssd_mode =
      m.ssd_direct_io ? "O_DIRECT" : "buffered (no O_DIRECT here; reads may hit the page cache)";

  HwProfile p;
  p.name = "local";
  p.description =
      fmt::format("this machine ({}) as u3m's emulated device sees it, {}", o.host, o.date);
  p.device.model = "device-emu (host-memory arena)";
  p.device.hbm_capacity =
      param(static_cast<double>(o.hbm_capacity), Dim::bytes, "GiB",
            fmt::format("setting, not a measurement: --hbm-capacity, the emulated device's budget, "
                        "{}",
                        by));
  p.device.hbm_bandwidth =
      param(traffic, Dim::bandwidth, "GB/s",
            measured("memcpy of large buffers, one thread, counted as traffic (2 x bytes copied)"));
  p.device.peak_flops =
      param(m.gemm_flops, Dim::flop_rate, "GFLOPS",
            measured("blocked float32 GEMM, n=256, one thread (u3m::sim::sgemm_blocked)"));
  p.device.matmul_efficiency = param(1, Dim::fraction, "fraction",
                                     measured("1: peak_flops is already the achieved GEMM rate"));
  p.device.launch_overhead =
      param(m.op_overhead_s, Dim::time, "us",
            measured("median empty record_event + synchronize_event round trip on device-emu"));
  p.host_link.kind = "device-emu copy engine (memcpy)";
  p.host_link.bandwidth_practical =
      param(m.link_bytes_per_s, Dim::bandwidth, "GB/s",
            measured("median device-emu h2d memcpy_async + synchronize of a large buffer"));
  p.host_link.bandwidth_theoretical = p.host_link.bandwidth_practical;
  p.host_link.bandwidth_theoretical.source =
      measured("no physical link: taken equal to the measured practical bandwidth");
  p.host_link.latency = param(m.link_latency_s, Dim::time, "us",
                              measured("median 4 KiB device-emu h2d copy round trip"));
  p.peer_link = p.host_link;
  p.peer_link.kind = "none (one emulated device; modelled as a device-emu copy)";
  p.host.dram_capacity = param(static_cast<double>(m.dram_bytes), Dim::bytes, "GiB",
                               measured("physical memory reported by sysconf(_SC_PHYS_PAGES)"));
  p.host.dram_bandwidth = p.device.hbm_bandwidth;
  p.ssd.model = fmt::format("SSD store file in {}", o.dir);
  p.ssd.read_bandwidth =
      param(m.ssd_read_bytes_per_s, Dim::bandwidth, "GB/s",
            measured(fmt::format("SSD store, 4 MiB gets, 4 in flight, {}", ssd_mode)));
  p.ssd.write_bandwidth =
      param(m.ssd_write_bytes_per_s, Dim::bandwidth, "GB/s",
            measured(fmt::format("SSD store, 4 MiB puts, 4 in flight, {}", ssd_mode)));
  p.ssd.read_latency = param(m.ssd_read_latency_s, Dim::time, "us",
                             measured(fmt::format("median 4 KiB SSD store get, {}", ssd_mode)));
  p.ssd.write_latency = param(m.ssd_write_latency_s, Dim::time, "us",
                              measured(fmt::format("median 4 KiB SSD store put, {}", ssd_mode)));
  p.ssd.drives_per_node = param(1, Dim::count, "count", measured("one SSD store directory"));
  // A directory tells its file system's size, not the drive's rating.
  const double fs = m.ssd_fs_bytes ? double(m.ssd_fs_bytes) : 3.84e12;
  p.ssd.capacity =
      param(fs, Dim::bytes, "GB",
            m.ssd_fs_bytes ? measured(fmt::format("size of the file system of {}", o.dir))
                           : "assumption: the file system's size was not readable; "
                             "a 3.84 TB drive");
  p.ssd.endurance = param(fs * 365 * 5, Dim::bytes, "TB",
                          "assumption, not measured (a drive's rating cannot be read from a "
                          "directory): 1 drive write per day over 5 years, the usual rating of a "
                          "read-intensive datacenter drive");
  p.ssd.warranty =
      param(5 * 31536000.0, Dim::time, "year", "assumption, not measured: a 5-year rating span");
  p.node.cards_per_node = param(1, Dim::count, "count", measured("one emulated device"));
  // One machine has no inter-node network or shared pool: the host link and the machine's
  // memory stand in, and the sources say they were not measured as such.
  p.network = p.host_link;
  p.network.kind = "none (one machine; the device-emu copy link stands in)";
  for (Param* q : {&p.network.bandwidth_theoretical, &p.network.bandwidth_practical,
                   &p.network.latency})
    q->source = not_measured("one machine has no network; taken equal to the host link");
  p.nics_per_node = param(1, Dim::count, "count", not_measured("one machine, one link"));
  p.pool.capacity_per_node = p.host.dram_capacity;
  p.pool.capacity_per_node.source =
      not_measured("one machine has no shared pool; taken equal to its physical memory");
  p.origin = "u3m hw calibrate";
  return p;
}

}  // namespace u3m::sim
