#include "u3m/observe/metrics.hpp"

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include "u3m/engine/engine.hpp"
#include "u3m/util/error.hpp"

namespace u3m::observe {
namespace {

using engine::EngineStats;
using engine::Link;
using mem::Tier;
using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr Tier kMemoryTiers[] = {Tier::device, Tier::host};
constexpr Tier kTiers[] = {Tier::device, Tier::host, Tier::ssd};

// The counters a detached engine leaves in the totals.
void accumulate(EngineStats& a, const EngineStats& b) {
  for (int t = 0; t < mem::kNumTiers; ++t) {
    a.hits_by_tier[t] += b.hits_by_tier[t];
    a.misses_by_tier[t] += b.misses_by_tier[t];
  }
  for (int l = 0; l < engine::kNumLinks; ++l) {
    a.links[l].transfers += b.links[l].transfers;
    a.links[l].bytes += b.links[l].bytes;
    a.links[l].failures += b.links[l].failures;
    a.links[l].busy_ns += b.links[l].busy_ns;
  }
  a.acquires += b.acquires;
  a.stall_ns += b.stall_ns;
  a.evictions += b.evictions;
  a.clean_drops += b.clean_drops;
  a.prefetches += b.prefetches;
  a.prefetch_hits += b.prefetch_hits;
  a.lost_tensors += b.lost_tensors;
  a.oom += b.oom;
}

// Families in the order first asked for, each metric under its labels.
class Families {
 public:
  void add(const std::string& name, const char* help, MetricType type,
           std::vector<ClientMetric::Label> labels, double value) {
    auto [it, fresh] = index_.try_emplace(name, out_.size());
    if (fresh) out_.push_back(MetricFamily{name, help, type, {}});
    ClientMetric m;
    m.label = std::move(labels);
    (type == MetricType::Counter ? m.counter.value : m.gauge.value) = value;
    out_[it->second].metric.push_back(std::move(m));
  }
  std::vector<MetricFamily> take() { return std::move(out_); }

 private:
  std::vector<MetricFamily> out_;
  std::map<std::string, std::size_t> index_;
};

std::string tier_name(Tier t) { return std::string(mem::to_string(t)); }

}  // namespace

struct Metrics::Impl final : prometheus::Collectable {
  struct Card {
    const engine::Engine* live = nullptr;
    EngineStats retired{};  // counters of the engines detached so far
    EngineStats last{};     // the last detached engine's figures (for the gauges)
    mem::TierReport last_tier[2]{};
    std::uint64_t ops = 0, stalls = 0, steps = 0;
    double op_s = 0, stall_s = 0;
    std::optional<KvSample> kv;
  };
  // Note [Metrics lock order]: mu is taken after the HTTP server's lock (a
  // scrape collects under it) and before an engine's lock (a scrape reads
  // stats() under mu, so a detaching engine cannot go away mid-read), never
  // the other way round: Metrics does not take the reporting calls that the
  // engine makes under its own lock (transfer, occupancy), and serve()
  // registers with the server outside mu.
  mutable std::mutex mu;
  std::map<int, Card> cards;
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string address;
  int port = 0;

  std::vector<MetricFamily> Collect() const override {
    std::lock_guard g(mu);
    Families f;
    for (const auto& [card, c] : cards) {
      const std::string cs = std::to_string(card);
      EngineStats now = c.live ? c.live->stats() : c.last;
      EngineStats total = c.retired;
      if (c.live) accumulate(total, now);
      mem::TierReport rep[2] = {c.last_tier[0], c.last_tier[1]};
      if (c.live)
        for (Tier t : kMemoryTiers) rep[static_cast<int>(t)] = c.live->monitor(t);
      for (Tier t : kTiers) {
        const int i = static_cast<int>(t);
        f.add("u3m_tier_used_bytes", "Bytes held in the tier now", MetricType::Gauge,
              {{"card", cs}, {"tier", tier_name(t)}}, double(now.used[i]));
        f.add("u3m_tier_peak_bytes", "Most bytes the tier held at once", MetricType::Gauge,
              {{"card", cs}, {"tier", tier_name(t)}}, double(now.peak[i]));
      }
      for (Tier t : kMemoryTiers) {
        const int i = static_cast<int>(t);
        const std::vector<ClientMetric::Label> l = {{"card", cs}, {"tier", tier_name(t)}};
        f.add("u3m_tier_capacity_bytes", "Bytes the engine may keep in the tier (its budget)",
              MetricType::Gauge, l, double(rep[i].capacity));
        f.add("u3m_tier_hits_total", "Acquires in the tier granted without waiting",
              MetricType::Counter, l, double(total.hits_by_tier[i]));
        f.add("u3m_tier_misses_total", "Acquires in the tier that waited for a fetch or room",
              MetricType::Counter, l, double(total.misses_by_tier[i]));
        f.add("u3m_monitor_level", "The monitor's level: 0 ok, 1 warning (85%), 2 critical (95%)",
              MetricType::Gauge, l, double(static_cast<int>(rep[i].level)));
        f.add("u3m_monitor_time_to_oom_seconds",
              "Headroom over growth (least squares over the last 10 s); +Inf when not growing",
              MetricType::Gauge, l, rep[i].time_to_oom_s);
        f.add("u3m_monitor_growth_bytes_per_second", "The tier's growth over the last 10 s",
              MetricType::Gauge, l, rep[i].growth_bytes_per_s);
      }
      for (int li = 0; li < engine::kNumLinks; ++li) {
        const Link link = static_cast<Link>(li);
        const std::vector<ClientMetric::Label> l = {{"card", cs},
                                                    {"link", std::string(engine::to_string(link))},
                                                    {"from", tier_name(engine::link_src(link))},
                                                    {"to", tier_name(engine::link_dst(link))}};
        const engine::LinkStats& s = total.links[li];
        f.add("u3m_link_bytes_total", "Bytes moved over the link (transfers that succeeded)",
              MetricType::Counter, l, double(s.bytes));
        f.add("u3m_link_transfers_total", "Transfers that succeeded on the link",
              MetricType::Counter, l, double(s.transfers));
        f.add("u3m_link_failures_total", "Transfers that failed on the link", MetricType::Counter,
              l, double(s.failures));
        f.add("u3m_link_transfer_seconds_total",
              "Summed transfer durations, start to completion (overlapping transfers add up)",
              MetricType::Counter, l, double(s.busy_ns) * 1e-9);
      }
      const std::vector<ClientMetric::Label> l = {{"card", cs}};
      f.add("u3m_ssd_written_bytes_total", "Bytes written to the SSD tier (host to SSD)",
            MetricType::Counter, l, double(total.links[static_cast<int>(Link::h2s)].bytes));
      f.add("u3m_acquires_total", "Leases granted", MetricType::Counter, l, double(total.acquires));
      f.add("u3m_acquire_stall_seconds_total", "Time acquires waited for data or room",
            MetricType::Counter, l, double(total.stall_ns) * 1e-9);
      f.add("u3m_evictions_total", "Copies dropped from device or host", MetricType::Counter, l,
            double(total.evictions));
      f.add("u3m_clean_drops_total", "Evictions that needed no write-back", MetricType::Counter, l,
            double(total.clean_drops));
      f.add("u3m_prefetches_total", "Prefetches asked for", MetricType::Counter, l,
            double(total.prefetches));
      f.add("u3m_prefetch_hits_total", "Acquires served by a copy a prefetch brought",
            MetricType::Counter, l, double(total.prefetch_hits));
      f.add("u3m_lost_tensors_total", "Tensors with no readable copy left", MetricType::Counter, l,
            double(total.lost_tensors));
      f.add("u3m_oom_total", "Acquires refused: nothing left to evict", MetricType::Counter, l,
            double(total.oom));
      f.add("u3m_ops_total", "Ops the driver ran", MetricType::Counter, l, double(c.ops));
      f.add("u3m_op_seconds_total", "Time ops ran on the compute track", MetricType::Counter, l,
            c.op_s);
      f.add("u3m_op_stalls_total", "Ops that waited for their operands", MetricType::Counter, l,
            double(c.stalls));
      f.add("u3m_op_stall_seconds_total", "Time ops waited for their operands",
            MetricType::Counter, l, c.stall_s);
      f.add("u3m_steps_total", "Steps the driver finished", MetricType::Counter, l,
            double(c.steps));
      if (c.kv) {
        // Named as vLLM names its own (vllm:kv_cache_usage_perc,
        // vllm:prefix_cache_queries, vllm:prefix_cache_hits; docs/operators.md).
        f.add("u3m:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = 100%)",
              MetricType::Gauge, l, c.kv->usage);
        f.add("u3m:prefix_cache_queries_total", "Prefix-cache queries, in tokens",
              MetricType::Counter, l, double(c.kv->query_tokens));
        f.add("u3m:prefix_cache_hits_total", "Prefix-cache hits, in tokens", MetricType::Counter,
              l, double(c.kv->hit_tokens));
      }
    }
    return f.take();
  }
};

Metrics::Metrics() : impl_(std::make_shared<Impl>()) {}

// Note [Stopping the metrics server]
// The HTTP server (civetweb, under prometheus-cpp's Exposer) notices a stop
// only when its accept poll returns, which it does every 2 s when idle, so
// every run that served metrics took up to 2 s longer to exit (measured on
// the 2-core VM: 2.0 s per server in the tests). While the server stops, a
// thread connects to it now and then: each connection wakes the poll, which
// then sees the stop at once.
Metrics::~Metrics() {
  if (!impl_->exposer) return;
  std::atomic<bool> stopped{false};
  std::thread wake([&] {
    while (!stopped.load()) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<std::uint16_t>(impl_->port));
      if (::inet_pton(AF_INET, impl_->address.c_str(), &a.sin_addr) != 1 ||
          a.sin_addr.s_addr == htonl(INADDR_ANY))
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (fd >= 0) {
        ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
        ::close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  impl_->exposer.reset();  // its threads stop before the state they read goes
  stopped = true;
  wake.join();
}

int Metrics::serve(int port, const std::string& address, const std::string& what) {
  if (port < 0 || port > 65535) input_error(what, "port must be in 0..65535, got {}", port);
  if (impl_->exposer) throw std::logic_error("Metrics::serve called twice");
  const std::string bind = fmt::format("{}:{}", address, port);
  // Not under impl_->mu: a scrape holds the server's lock while it collects
  // (which takes mu), so registering under mu would order the two locks both
  // ways (Note [Metrics lock order]).
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(bind, 1);
  } catch (const std::exception& e) {
    input_error(what, "cannot serve metrics on {}: {}", bind, e.what());
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  {
    std::lock_guard g(impl_->mu);
    impl_->port = ports.empty() ? port : ports.front();
    impl_->address = address;
  }
  exposer->RegisterCollectable(impl_);
  impl_->exposer = std::move(exposer);  // serve() and the destructor are the owner's calls
  return impl_->port;
}

int Metrics::port() const {
  std::lock_guard g(impl_->mu);
  return impl_->port;
}

std::string Metrics::text() const {
  return prometheus::TextSerializer().Serialize(impl_->Collect());
}

void Metrics::set_kv(int card, const KvSample& kv) {
  std::lock_guard g(impl_->mu);
  impl_->cards[card].kv = kv;
}

void Metrics::op(int card, std::int64_t, std::size_t, std::string_view, engine::OpWork, double t0_s,
                 double t1_s) {
  std::lock_guard g(impl_->mu);
  Impl::Card& c = impl_->cards[card];
  ++c.ops;
  c.op_s += t1_s - t0_s;
}

void Metrics::stall(int card, std::int64_t, std::size_t, double t0_s, double t1_s) {
  std::lock_guard g(impl_->mu);
  Impl::Card& c = impl_->cards[card];
  ++c.stalls;
  c.stall_s += t1_s - t0_s;
}

void Metrics::step_end(int card, std::int64_t, double) {
  std::lock_guard g(impl_->mu);
  ++impl_->cards[card].steps;
}

void Metrics::attached(int card, const engine::Engine& e) {
  std::lock_guard g(impl_->mu);
  Impl::Card& c = impl_->cards[card];
  if (c.live && c.live != &e)
    throw std::logic_error(fmt::format("Metrics: card {} has an engine attached already", card));
  c.live = &e;
}

void Metrics::detached(int card, const engine::Engine& e) {
  std::lock_guard g(impl_->mu);
  Impl::Card& c = impl_->cards[card];
  if (c.live != &e) return;
  c.last = e.stats();
  for (Tier t : kMemoryTiers) c.last_tier[static_cast<int>(t)] = e.monitor(t);
  accumulate(c.retired, c.last);
  c.live = nullptr;
}

}  // namespace u3m::observe
