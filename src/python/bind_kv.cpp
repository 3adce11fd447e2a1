// Bindings of the tiered KV store (issue 6/7): the block manager's configuration and
// statistics, and TieredStore, whose blocks are engine tensors on the real runtime
// (docs/kv.md, "The data path"; python/u3m/kv_cache.py builds the PyTorch KV cache on it).
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <string>

#include "bindings.hpp"
#include "u3m/kv/remote_tier.hpp"
#include "u3m/kv/tiered_store.hpp"
#include "u3m/util/error.hpp"

namespace py = pybind11;

namespace u3m::python {
namespace {

using namespace u3m::kv;

// A C-contiguous buffer's bytes (numpy arrays, bytes, bytearray, memoryview).
struct Bytes {
  py::buffer_info info;
  std::uint64_t len;
};
Bytes bytes_of(const py::buffer& b, bool writable, const char* what) {
  py::buffer_info info = b.request(writable);
  std::int64_t expect = info.itemsize;
  for (auto i = info.ndim; i-- > 0;) {
    if (info.shape[i] > 1 && info.strides[i] != expect)
      throw py::value_error(std::string(what) + ": the buffer must be C-contiguous");
    expect *= info.shape[i];
  }
  if (writable && info.readonly) throw py::value_error(std::string(what) + ": buffer is read-only");
  const auto len = static_cast<std::uint64_t>(info.size * info.itemsize);
  return {std::move(info), len};
}

py::dict stats_dict(const TieredStore& s) {
  const KvStats& k = s.manager().stats();
  const TieredStoreStats& t = s.stats();
  const engine::EngineStats e = s.engine_stats();
  py::dict d;
  d["submitted"] = k.submitted;
  d["admitted"] = k.admitted;
  d["queued"] = k.queued;
  d["refused_queue_full"] = k.refused_queue_full;
  d["refused_too_large"] = k.refused_too_large;
  d["finished"] = k.finished;
  d["lookup_blocks"] = k.lookup_blocks;
  d["hit_blocks"] = k.hit_blocks;
  d["hit_tokens"] = k.hit_tokens;
  d["new_blocks"] = k.new_blocks;
  d["private_blocks"] = k.private_blocks;
  d["promoted_slots"] = k.promoted_slots;
  d["promoted_host_slots"] = k.promoted_host_slots;
  d["demoted_slots"] = std::vector<std::uint64_t>(k.demoted_slots, k.demoted_slots + kTiers);
  d["spilled_slots"] = k.spilled_slots;
  d["alerts"] = k.alerts;
  d["slot_bytes"] = s.slot_bytes();
  // Slots per tier as the manager counts them, and the engine's measured bytes.
  std::vector<std::uint64_t> used, peak, cap;
  for (Tier tier : {Tier::device, Tier::host, Tier::ssd}) {
    const TierUse u = s.manager().use(tier);
    used.push_back(u.used);
    peak.push_back(u.peak);
    cap.push_back(u.capacity);
  }
  d["slots_used"] = used;
  d["slots_peak"] = peak;
  d["slots_capacity"] = cap;
  d["engine_used_bytes"] = std::vector<std::uint64_t>(e.used, e.used + 2);
  d["engine_peak_bytes"] = std::vector<std::uint64_t>(e.peak, e.peak + 2);
  d["engine_lost_tensors"] = e.lost_tensors;
  d["allocated"] = t.allocated;
  d["moved"] = t.moved;
  d["moved_bytes"] = t.moved_bytes;
  d["freed"] = t.freed;
  d["reads"] = t.reads;
  d["writes"] = t.writes;
  d["bytes_read"] = t.bytes_read;
  d["bytes_written"] = t.bytes_written;
  d["reads_by_tier"] = std::vector<std::uint64_t>(t.reads_by_tier, t.reads_by_tier + kTiers);
  // Note [Two-phase actions]: actions that failed (or lost their data) and were rolled back,
  // those cancelled with them, admissions rolled back, blocks lost at rest and dropped.
  d["failed_actions"] = t.failed + t.lost;
  d["cancelled_actions"] = t.cancelled;
  d["aborted_admissions"] = k.aborted_admissions;
  d["lost_at_rest"] = t.lost_at_rest;
  return d;
}

// Tiers are strings in the Python API, as in bind_runtime.cpp.
Tier parse_home(const std::string& s) {
  if (s == "device") return Tier::device;
  if (s == "host") return Tier::host;
  input_error("KvConfig.home", "a layer group's home is \"device\" or \"host\", got \"{}\"", s);
}

std::vector<workload::PromptSegment> segments_of(
    const std::vector<std::pair<std::string, std::uint32_t>>& prompt) {
  std::vector<workload::PromptSegment> out;
  for (const auto& [seg, n] : prompt) out.push_back({seg, n});
  return out;
}

py::dict remote_dict(const RemoteKv& r) {
  const RemoteStats& s = r.stats();
  py::dict d;
  d["lookups"] = s.lookups;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["index_drops"] = s.index_drops;
  d["puts"] = s.puts;
  d["put_skipped"] = s.put_skipped;
  d["put_bytes"] = s.put_bytes;
  d["get_bytes"] = s.get_bytes;
  d["corrupt"] = s.corrupt;
  d["errors"] = s.errors;
  d["index_size"] = r.index_size();
  return d;
}

}  // namespace

void bind_kv(py::module_& m) {
  // Bad input (a config field, a policy name) raises u3m._core.InputError, a ValueError.
  // Guarded: another bind_* may have registered it first.
  if (!py::hasattr(m, "InputError"))
    py::register_exception<InputError>(m, "InputError", PyExc_ValueError);

  py::class_<KvGeometry>(m, "KvGeometry",
                         "One physical KV block = block_tokens tokens x layers_per_group layers")
      .def(py::init([](std::uint32_t block_tokens, std::uint32_t layers,
                       std::uint32_t layers_per_group, std::uint64_t bytes_per_token_layer) {
             KvGeometry g;
             g.block_tokens = block_tokens;
             g.layers = layers;
             g.layers_per_group = layers_per_group;
             g.bytes_per_token_layer = bytes_per_token_layer;
             g.validate();
             return g;
           }),
           py::kw_only(), py::arg("block_tokens"), py::arg("layers"), py::arg("layers_per_group"),
           py::arg("bytes_per_token_layer"))
      .def_readwrite("block_tokens", &KvGeometry::block_tokens)
      .def_readwrite("layers", &KvGeometry::layers)
      .def_readwrite("layers_per_group", &KvGeometry::layers_per_group)
      .def_readwrite("bytes_per_token_layer", &KvGeometry::bytes_per_token_layer)
      .def_readwrite("linear_flops", &KvGeometry::linear_flops)
      .def_readwrite("attn_flops_per_ctx", &KvGeometry::attn_flops_per_ctx)
      .def("groups", &KvGeometry::groups)
      .def("group_layers", &KvGeometry::group_layers)
      .def("group_bytes", &KvGeometry::group_bytes)
      .def("slot_bytes", &KvGeometry::slot_bytes);

  py::class_<KvConfig>(m, "KvConfig", "The block manager's configuration (docs/kv.md)")
      .def(py::init([](const KvGeometry& g, std::array<std::uint64_t, kTiers> capacity_slots,
                       const std::string& policy, double overcommit,
                       const std::vector<std::string>& home) {
             KvConfig c;
             c.geometry = g;
             c.capacity_slots = capacity_slots;
             c.policy = parse_eviction_policy(policy, "KvConfig.policy");
             c.overcommit = overcommit;
             for (const std::string& h : home) c.home.push_back(parse_home(h));
             c.validate();
             return c;
           }),
           py::arg("geometry"), py::kw_only(), py::arg("capacity_slots"), py::arg("policy") = "lru",
           py::arg("overcommit") = 1.5, py::arg("home") = std::vector<std::string>{})
      .def_readwrite("geometry", &KvConfig::geometry)
      .def_readwrite("capacity_slots", &KvConfig::capacity_slots)
      .def_readwrite("overcommit", &KvConfig::overcommit)
      .def_readwrite("min_queue", &KvConfig::min_queue)
      .def_readwrite("expected_request_tokens", &KvConfig::expected_request_tokens)
      .def_property(
          "policy", [](const KvConfig& c) { return std::string(to_string(c.policy)); },
          [](KvConfig& c, const std::string& p) {
            c.policy = parse_eviction_policy(p, "KvConfig.policy");
          });

  py::class_<Admission>(m, "Admission")
      .def_readonly("id", &Admission::id)
      .def_readonly("blocks", &Admission::blocks)
      .def_readonly("prompt_full_blocks", &Admission::prompt_full_blocks)
      .def_readonly("hit_blocks", &Admission::hit_blocks)
      .def_readonly("hit_tokens", &Admission::hit_tokens)
      .def_readonly("adopted_blocks", &Admission::adopted_blocks)
      .def_readonly("new_blocks", &Admission::new_blocks)
      .def_readonly("private_blocks", &Admission::private_blocks)
      .def_readonly("promoted_slots", &Admission::promoted_slots)
      .def_readonly("promoted_host_slots", &Admission::promoted_host_slots);

  // The remote tier below DRAM (docs/kv.md, "Remote tier on Redis"). Not thread-safe: one
  // per store, used under the GIL like the store.
  py::class_<RemoteKv>(m, "RemoteKv", "Prefix KV blocks shared through a Redis server")
      .def(py::init([](const std::string& url, const KvGeometry& g, std::uint32_t ttl_s,
                       std::uint32_t timeout_ms) {
             RedisOptions o = RedisOptions::parse_url(url, "remote");
             o.timeout = std::chrono::milliseconds(timeout_ms);
             return std::make_unique<RemoteKv>(std::make_unique<RedisTier>(o),
                                               remote_namespace(g), ttl_s);
           }),
           py::arg("url"), py::kw_only(), py::arg("geometry"), py::arg("ttl_s") = 3600,
           py::arg("timeout_ms") = 250)
      .def_property_readonly("url", [](RemoteKv& r) { return r.tier().describe(); })
      .def("stats", &remote_dict);

  py::class_<TieredStore>(m, "TieredKvStore",
                          "KV blocks as engine tensors on the real runtime: HBM (device-emu, or "
                          "backend='cuda'/'acl'), pinned host DRAM, an SSD store (docs/kv.md, "
                          "'The data path')")
      .def(py::init(
               [](const KvConfig& c, const std::string& ssd_dir, const std::string& ssd_faults,
                  const std::string& backend, int device) {
                 TieredStoreOptions o;
                 o.ssd_dir = ssd_dir;
                 o.backend = backend;
                 o.device = device;
                 if (!ssd_faults.empty())
                   o.ssd_faults = mem::FaultSpec::parse(ssd_faults, "ssd_faults");
                 return std::make_unique<TieredStore>(c, o);
               }),
           py::arg("config"), py::kw_only(), py::arg("ssd_dir") = "", py::arg("ssd_faults") = "",
           py::arg("backend") = "device-emu", py::arg("device") = 0)
      .def_property_readonly(
          "backend", [](const TieredStore& s) { return s.stack().backend_name(); },
          "The device tier's backend (HBM on cuda/acl, device-emu's arena otherwise).")
      .def(
          "ssd_stats", [](const TieredStore& s) { return ssd_dict(s.stack()); },
          "The SSD tier's checks and the faults injected under it (Runtime.stats()['ssd']).")
      // prompt: [(segment id, tokens), ...]. Returns (result, Admission or None): result is
      // "admitted", "queued", "refused_queue_full", "too_large" or "aborted" (an action of
      // its admission failed and was rolled back: it may be submitted again).
      .def(
          "submit",
          [](TieredStore& s, RequestId id,
             const std::vector<std::pair<std::string, std::uint32_t>>& prompt,
             std::uint32_t output_tokens) {
            workload::ServeRequest r;
            r.output_tokens = output_tokens;
            r.prompt = segments_of(prompt);
            Admission a;
            const SubmitResult res = s.submit(id, r, &a);
            py::object adm = py::none();
            if (res == SubmitResult::admitted) adm = py::cast(a);
            return py::make_tuple(std::string(to_string(res)), adm);
          },
          py::arg("id"), py::arg("prompt"), py::arg("output_tokens"))
      // The remote tier (Note [Remote consistency]): fills the request's blocks after its
      // local hits from the remote; returns its hit blocks, local and remote.
      .def(
          "fetch_remote",
          [](TieredStore& s, RemoteKv& r, RequestId id,
             const std::vector<std::pair<std::string, std::uint32_t>>& prompt,
             std::uint32_t local_hits) {
            const auto keys = block_keys(segments_of(prompt), s.manager().config().geometry.block_tokens);
            return fetch_prefix(s, r, id, keys, local_hits);
          },
          py::arg("remote"), py::arg("id"), py::arg("prompt"), py::arg("local_hits"))
      // Puts the requests' full prompt blocks the remote's index lacks, in one batch; after
      // prefill. requests: [(id, prompt), ...].
      .def(
          "publish_remote",
          [](TieredStore& s, RemoteKv& r,
             const std::vector<std::pair<RequestId, std::vector<std::pair<std::string, std::uint32_t>>>>&
                 requests) {
            std::vector<std::pair<RequestId, std::vector<std::uint64_t>>> keyed;
            for (const auto& [id, prompt] : requests)
              keyed.emplace_back(id, block_keys(segments_of(prompt),
                                                s.manager().config().geometry.block_tokens));
            publish_prefix(s, r, keyed);
          },
          py::arg("remote"), py::arg("requests"))
      .def("finish", &TieredStore::finish, py::arg("id"),
           "Frees the request's private blocks; returns the admissions of queued requests")
      .def("spill", &TieredStore::spill, py::arg("budget_bytes"))
      .def(
          "write",
          [](TieredStore& s, RequestId id, std::uint32_t block, std::uint32_t group,
             std::uint64_t offset, const py::buffer& data) {
            Bytes b = bytes_of(data, false, "TieredKvStore.write");
            // The GIL stays held: TieredStore is single-threaded, and holding
            // it serialises Python threads that share a store.
            s.write(id, block, group, offset, b.info.ptr, b.len);
          },
          py::arg("id"), py::arg("block"), py::arg("group"), py::arg("offset"), py::arg("data"))
      .def(
          "read_into",
          [](TieredStore& s, RequestId id, std::uint32_t block, std::uint32_t group,
             std::uint64_t offset, const py::buffer& out) {
            Bytes b = bytes_of(out, true, "TieredKvStore.read_into");
            s.read(id, block, group, offset, b.info.ptr, b.len);
          },
          py::arg("id"), py::arg("block"), py::arg("group"), py::arg("offset"), py::arg("out"))
      .def("table", [](const TieredStore& s, RequestId id) { return s.manager().table(id); })
      .def(
          "slot_tier",
          [](const TieredStore& s, RequestId id, std::uint32_t block, std::uint32_t group) {
            return std::string(
                mem::to_string(s.manager().slot_tier(s.manager().table(id).at(block), group)));
          },
          py::arg("id"), py::arg("block"), py::arg("group"))
      .def("running", [](const TieredStore& s, RequestId id) { return s.manager().running(id); })
      .def("check_agreement", &TieredStore::check_agreement)
      .def_property_readonly("slot_bytes", &TieredStore::slot_bytes)
      .def_property_readonly("geometry",
                             [](const TieredStore& s) { return s.manager().config().geometry; })
      .def("stats", &stats_dict);
}

}  // namespace u3m::python
