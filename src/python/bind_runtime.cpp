// Bindings of the runtime (issue 7): an Engine on the real backends (emulated
// device, host, optional SSD store) with a device budget, and leases that
// Python sees as buffers (torch.frombuffer maps them without a copy).
#include <chrono>
#include <cstdint>
#include <ctime>
#include <memory>
#include <vector>
#include <string>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "bindings.hpp"
#include "policy_driver.hpp"
#include "u3m/engine/engine.hpp"
#include "u3m/engine/real_stack.hpp"
#include "u3m/util/error.hpp"

namespace py = pybind11;

namespace u3m::python {
namespace {

using engine::Access;
using engine::TensorId;
using mem::Tier;

struct RuntimeOptions {
  std::uint64_t device_budget = 0;  // bytes of the emulated device tier the engine may use
  std::uint64_t host_budget = 0;
  std::string ssd_dir;  // "" = no SSD tier
  std::uint64_t ssd_capacity = 0;
  double h2d_gbps = 0, d2h_gbps = 0;  // emulated link throttle, 0 = memcpy speed
  std::string ssd_faults;             // mem::FaultSpec text; "" = none
  // Eviction watermarks, fractions of each budget (EngineConfig's defaults).
  double device_high = 0.90, device_low = 0.80, host_high = 0.90, host_low = 0.80;
  // The device tier's backend (mem::open_backend's names or "auto") and device ordinal.
  std::string backend = "device-emu";
  int device = 0;
};

const RuntimeOptions& validated(const RuntimeOptions& o) {
  if (o.device_budget == 0) input_error("Runtime", "device_budget must be > 0 bytes");
  if (o.host_budget == 0) input_error("Runtime", "host_budget must be > 0 bytes");
  if (!o.ssd_dir.empty() && o.ssd_capacity == 0)
    input_error("Runtime", "ssd_capacity must be > 0 bytes with ssd_dir '{}'", o.ssd_dir);
  if (!(o.h2d_gbps >= 0) || !(o.d2h_gbps >= 0))
    input_error("Runtime", "h2d_gbps and d2h_gbps must be >= 0, got {} and {}", o.h2d_gbps,
                o.d2h_gbps);
  return o;
}

engine::StackSpec stack_options(const RuntimeOptions& o) {
  engine::StackSpec so;
  so.device_bytes = o.device_budget;
  so.host_bytes = o.host_budget;
  so.ssd_dir = o.ssd_dir;
  so.ssd_bytes = o.ssd_dir.empty() ? 0 : o.ssd_capacity;
  so.ssd_file = "u3m-python.ssd";
  so.links[static_cast<int>(engine::Link::h2d)].bandwidth = o.h2d_gbps * 1e9;
  so.links[static_cast<int>(engine::Link::d2h)].bandwidth = o.d2h_gbps * 1e9;
  if (!o.ssd_faults.empty()) so.ssd_faults = mem::FaultSpec::parse(o.ssd_faults, "ssd_faults");
  so.engine.device.high_watermark = o.device_high;
  so.engine.device.low_watermark = o.device_low;
  so.engine.host.high_watermark = o.host_high;
  so.engine.host.low_watermark = o.host_low;
  so.backend = o.backend;
  so.device_ordinal = o.device;
  so.validate("Runtime");
  return so;
}

// The whole stack (engine::RealStack) and the options it was made with.
class Runtime {
 public:
  explicit Runtime(const RuntimeOptions& o) : opt_(validated(o)), stack_(stack_options(opt_)) {}

  engine::Engine& engine() { return stack_.engine(); }
  const engine::RealStack& stack() const { return stack_; }
  const RuntimeOptions& options() const { return opt_; }
  bool has_ssd() const { return stack_.has_ssd(); }
  // Device leases are in CUDA (or ACL) device memory: no buffer protocol on them.
  bool device_is_cuda() const { return stack_.backend_name() == "cuda"; }
  bool device_is_host_memory() const { return stack_.accel() == nullptr; }

 private:
  RuntimeOptions opt_;
  engine::RealStack stack_;
};

// A lease as Python holds it. It keeps the runtime alive, so a buffer (and a
// tensor made from it) never outlives the arena; the data is only valid until
// release(), which the buffer protocol enforces for new views (existing views
// cannot be revoked: the caller must drop them, u3m.torch does).
struct PyLease {
  std::shared_ptr<Runtime> rt;
  engine::Lease lease;
  bool released = false;
};

// Engine statuses that are not ok become u3m.EngineError naming the call.
class EngineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(std::string_view call, TensorId id, mem::Status s) {
  // No progress (Note [No progress] in engine.cpp): the engine says why.
  if (s == mem::Status::out_of_memory || s == mem::Status::busy)
    throw EngineError(fmt::format("{}(tensor {}): {}: {}", call, id, mem::to_string(s),
                                  engine::Engine::last_failure()));
  throw EngineError(fmt::format("{}(tensor {}): {}", call, id, mem::to_string(s)));
}

// remove()'s answer: false while the tensor is busy (call again), else done or an EngineError.
bool removed(TensorId id, mem::Status s) {
  if (s == mem::Status::busy) return false;
  if (!mem::ok(s)) fail("remove", id, s);
  return true;
}

Tier parse_tier(const std::string& s, bool ssd_ok) {
  if (s == "device") return Tier::device;
  if (s == "host") return Tier::host;
  if (ssd_ok && s == "ssd") return Tier::ssd;
  input_error("tier", "expected {}, got '{}'", ssd_ok ? "device, host or ssd" : "device or host",
              s);
}

Access parse_access(const std::string& s) {
  if (s == "read") return Access::read;
  if (s == "write") return Access::write;
  input_error("access", "expected read or write, got '{}'", s);
}

std::uint64_t budget_arg(const py::object& o, const char* what) {
  const long long v = o.cast<long long>();
  if (v < 0) input_error("Runtime", "{} must be >= 0 bytes, got {}", what, v);
  return static_cast<std::uint64_t>(v);
}

py::dict tier_report(const mem::TierReport& r) {
  py::dict d;
  d["tier"] = std::string(mem::to_string(r.tier));
  d["used"] = r.used;
  d["capacity"] = r.capacity;
  d["peak"] = r.peak;
  d["fraction"] = r.fraction;
  d["warnings"] = r.warnings;
  d["criticals"] = r.criticals;
  d["time_to_oom_s"] = r.time_to_oom_s;
  return d;
}

py::dict stats_dict(const engine::EngineStats& s) {
  py::dict d;
  d["tensors"] = s.tensors;
  py::dict used, peak;
  for (int t = 0; t < mem::kNumTiers; ++t) {
    const std::string name(mem::to_string(static_cast<Tier>(t)));
    used[py::str(name)] = s.used[t];
    peak[py::str(name)] = s.peak[t];
  }
  d["used"] = used;
  d["peak"] = peak;
  py::dict links;
  for (int l = 0; l < engine::kNumLinks; ++l) {
    const engine::LinkStats& x = s.links[l];
    py::dict ld;
    ld["transfers"] = x.transfers;
    ld["bytes"] = x.bytes;
    ld["failures"] = x.failures;
    ld["busy_s"] = static_cast<double>(x.busy_ns) * 1e-9;
    links[py::str(std::string(engine::to_string(static_cast<engine::Link>(l))))] = ld;
  }
  d["links"] = links;
  d["acquires"] = s.acquires;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["prefetches"] = s.prefetches;
  d["prefetch_hits"] = s.prefetch_hits;
  d["evictions"] = s.evictions;
  d["clean_drops"] = s.clean_drops;
  d["stall_s"] = static_cast<double>(s.stall_ns) * 1e-9;
  d["io_errors"] = s.io_errors;
  d["corrupt_reads"] = s.corrupt_reads;
  d["no_space"] = s.no_space;
  d["short_io"] = s.short_io;
  d["lost_tensors"] = s.lost_tensors;
  d["lost_bytes"] = s.lost_bytes;
  d["ssd_verifies"] = s.ssd_verifies;
  d["ssd_verify_failures"] = s.ssd_verify_failures;
  d["ssd_copies_failed"] = s.ssd_copies_failed;
  d["oom"] = s.oom;
  return d;
}

extern "C" int lease_getbuffer(PyObject* obj, Py_buffer* view, int flags) {
  try {
    auto& l = py::cast<PyLease&>(py::handle(obj));
    if (l.released) {
      PyErr_SetString(PyExc_BufferError,
                      fmt::format("lease of tensor {} was released", l.lease.id).c_str());
      return -1;
    }
    // Note [Offload on CUDA] (python/u3m/torch.py): a real device's memory is
    // not host memory, so reading it through a buffer would crash.
    if (l.lease.tier == Tier::device && !l.rt->device_is_host_memory()) {
      PyErr_SetString(
          PyExc_BufferError,
          fmt::format("lease of tensor {} is in {} device memory, not host memory{}", l.lease.id,
                      l.rt->stack().backend_name(),
                      l.rt->device_is_cuda()
                          ? ": use its __cuda_array_interface__ (torch.as_tensor(lease, "
                            "device='cuda'))"
                          : "")
              .c_str());
      return -1;
    }
    // Fails with BufferError if a writable view of a read lease is asked for.
    return PyBuffer_FillInfo(view, obj, l.lease.ptr, static_cast<Py_ssize_t>(l.lease.bytes),
                             l.lease.access == Access::read ? 1 : 0, flags);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_BufferError, e.what());
    return -1;
  }
}

PyLease make_lease(const std::shared_ptr<Runtime>& rt, const engine::Lease& l) {
  return PyLease{rt, l, false};
}

// Note [Lease as a CUDA array]
// A device lease on the cuda backend is the CUDA Array Interface v3 (what
// torch.as_tensor, CuPy and Numba read): bytes as a 1-D uint8 array. "stream"
// is None, meaning no synchronisation is needed at consumption: the engine's
// acquire returns only after its copy onto the device completed on u3m's
// stream (BackendTransport synchronizes it). The consumer owes the other
// direction: work it queued that reads or writes the lease must finish before
// release() (u3m.torch synchronizes its stream first).
py::dict cuda_array_interface(const PyLease& l) {
  if (l.released) throw py::buffer_error(fmt::format("lease of tensor {} was released", l.lease.id));
  if (l.lease.tier != Tier::device || !l.rt->device_is_cuda())
    throw py::attribute_error(fmt::format(
        "lease of tensor {} is not in CUDA device memory (backend {}, tier {})", l.lease.id,
        l.rt->stack().backend_name(), mem::to_string(l.lease.tier)));
  py::dict d;
  d["shape"] = py::make_tuple(l.lease.bytes);
  d["typestr"] = "|u1";
  d["data"] = py::make_tuple(reinterpret_cast<std::uintptr_t>(l.lease.ptr),
                             l.lease.access == Access::read);
  d["strides"] = py::none();
  d["version"] = 3;
  d["stream"] = py::none();
  return d;
}

// What the Runtime's device tier is on, for labels: "device-emu (emulated
// device in host memory)", or the accelerator as the registry describes it.
std::string backend_detail(const engine::RealStack& st) {
  const mem::AccelBackend* a = st.accel();
  if (a == nullptr) return st.backend_name() + " (emulated device in host memory)";
  const mem::AccelInfo& i = a->info();
  std::string s = fmt::format("{}: {} (device {}), {}", i.name, i.device_name, i.device, i.library);
  if (!i.runtime_version.empty()) s += ", runtime " + i.runtime_version;
  if (i.test_double) s += " [u3m test double over host memory, not hardware]";
  return s;
}

// A PolicyDriver over a Runtime's engine (policy_driver.hpp); it keeps the
// runtime alive.
struct PyDriver {
  PyDriver(std::shared_ptr<Runtime> r, PolicyDriverOptions o)
      : rt(std::move(r)), drv(rt->engine(), std::move(o)) {}
  std::shared_ptr<Runtime> rt;
  PolicyDriver drv;
};

trace::Phase parse_phase_arg(const std::string& s) {
  const auto p = trace::parse_phase(s);
  if (!p) input_error("phase", "expected forward, backward, optimizer or other, got '{}'", s);
  return *p;
}

// What the online recorder costs per access, timed in C++ (bench/torch_offload_cost.py): what
// PolicyDriver::accessed does to record (the id's index, a clock read, the append), over
// `steps` steps of `tensors` accesses each, with end_step between them.
py::dict recorder_cost(std::uint64_t tensors, std::uint64_t steps) {
  if (tensors == 0 || steps == 0) input_error("recorder_cost", "tensors and steps must be > 0");
  using Clock = std::chrono::steady_clock;
  OnlineRecorder rec;
  std::vector<std::uint64_t> ids(tensors);
  for (std::uint64_t i = 0; i < tensors; ++i) {
    ids[i] = trace::stable_id(fmt::format("act.{}", i));
    rec.tensor(ids[i], fmt::format("act.{}", i), 4096, trace::Role::activation);
  }
  // Thread CPU time too: on a loaded machine the wall clock counts time the thread waited.
  auto cpu_ns = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
  };
  const double c0 = cpu_ns();
  const auto t0 = Clock::now();
  for (std::uint64_t s = 0; s < steps; ++s) {
    for (std::uint64_t i = 0; i < tensors; ++i) {
      const std::int64_t t = rec.index_of(ids[i]);
      const auto now = static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
      rec.access(static_cast<std::uint32_t>(t), (i & 1) != 0, trace::Phase::forward, now);
    }
    rec.end_step(static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()));
  }
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  const double cpu = cpu_ns() - c0;
  py::dict d;
  d["ns_per_access"] = ns / static_cast<double>(tensors * steps);
  d["cpu_ns_per_access"] = cpu / static_cast<double>(tensors * steps);
  d["accesses"] = rec.recorded();
  return d;
}

py::dict driver_stats(const PyDriver& d) {
  const PolicyDriverStats& s = d.drv.stats();
  py::dict out;
  out["policy"] = d.drv.options().record ? d.drv.options().policy : std::string("none");
  out["deciding"] = d.drv.policy() != nullptr;
  out["steps"] = s.steps;
  out["accesses"] = s.accesses;
  out["policy_steps"] = s.policy_steps;
  out["diverged"] = s.diverged;
  out["policies"] = s.policies;
  out["trace_ops"] = s.trace_ops;
  out["policy_s"] = s.policy_s;
  out["build_s"] = s.build_s;
  return out;
}

}  // namespace

// The SSD store's checks and the faults injected under it (issue 14).
py::dict ssd_dict(const engine::RealStack& stack) {
  py::dict d;
  if (const mem::SsdStore* ssd = stack.ssd()) {
    const mem::SsdStoreStats s = ssd->stats();
    d["write_verify_failures"] = s.write_verify_failures;
    d["checksum_failures"] = s.checksum_failures;
    d["io_errors"] = s.io_errors;
    d["corrupt_retired"] = s.corrupt_retired;
    d["scrubbed_bytes"] = s.scrubbed_bytes;
    d["revalidations"] = s.revalidations;
    d["notice"] = ssd->open_notice();
  }
  py::dict injected;
  if (const mem::FaultInjectionIoEngine* f = stack.faults()) {
    for (std::size_t k = 0; k < mem::kIoFaultKinds; ++k) {
      const auto kind = static_cast<mem::IoFault>(k);
      injected[py::str(std::string(mem::fault_name(kind)))] = f->injected(kind);
    }
    injected["at_rest"] = f->injected_at_rest();
  }
  d["faults_injected"] = injected;
  return d;
}

void bind_runtime(py::module_& m) {
  py::register_exception<EngineError>(m, "EngineError", PyExc_RuntimeError);

  py::class_<PyLease> lease(
      m, "Lease", py::buffer_protocol(),
      "A pinned copy of a tensor's bytes; valid until Runtime.release(lease). "
      "Supports the buffer protocol (writable for write leases).");
  // Our own getbuffer slot: pybind11's cannot raise (an exception thrown in
  // a def_buffer callback terminates the process), and a released lease must
  // refuse new views with a BufferError that says why.
  auto* type = reinterpret_cast<PyTypeObject*>(lease.ptr());
  type->tp_as_buffer->bf_getbuffer = lease_getbuffer;
  type->tp_as_buffer->bf_releasebuffer = nullptr;
  PyType_Modified(type);
  lease.def_property_readonly("id", [](const PyLease& l) { return l.lease.id; })
      .def_property_readonly("nbytes", [](const PyLease& l) { return l.lease.bytes; })
      .def_property_readonly(
          "tier", [](const PyLease& l) { return std::string(mem::to_string(l.lease.tier)); })
      .def_property_readonly("writable",
                             [](const PyLease& l) { return l.lease.access == Access::write; })
      .def_property_readonly("released", [](const PyLease& l) { return l.released; })
      .def_property_readonly("__cuda_array_interface__", &cuda_array_interface,
                             "CUDA Array Interface v3 of a device lease on the cuda backend "
                             "(Note [Lease as a CUDA array]); AttributeError otherwise.")
      .def_property_readonly(
          "address", [](const PyLease& l) { return reinterpret_cast<std::uintptr_t>(l.lease.ptr); })
      .def("__repr__", [](const PyLease& l) {
        return fmt::format("<u3m.Lease tensor={} bytes={} tier={} {}{}>", l.lease.id, l.lease.bytes,
                           mem::to_string(l.lease.tier),
                           l.lease.access == Access::write ? "write" : "read",
                           l.released ? " released" : "");
      });

  py::class_<Runtime, std::shared_ptr<Runtime>>(
      m, "Runtime",
      "The u3m engine on a device tier (backend='device-emu': a capacity-limited arena in host "
      "memory; 'cuda'/'acl': the accelerator, with pinned host memory; 'auto'), host memory and "
      "an optional SSD store (docs/runtime.md, docs/pytorch.md, docs/accelerators.md).")
      .def(py::init([](const py::object& device_budget, const py::object& host_budget,
                       const std::string& ssd_dir, const py::object& ssd_capacity, double h2d_gbps,
                       double d2h_gbps, const std::string& ssd_faults,
                       const py::sequence& device_watermarks, const py::sequence& host_watermarks,
                       const std::string& backend, int device) {
             RuntimeOptions o;
             o.backend = backend;
             o.device = device;
             auto pair = [](const py::sequence& w, const char* name) {
               if (py::len(w) != 2)
                 input_error("Runtime", "{} must be (high, low), got {} values", name, py::len(w));
               return std::pair{w[0].cast<double>(), w[1].cast<double>()};
             };
             std::tie(o.device_high, o.device_low) = pair(device_watermarks, "device_watermarks");
             std::tie(o.host_high, o.host_low) = pair(host_watermarks, "host_watermarks");
             o.ssd_faults = ssd_faults;
             o.device_budget = budget_arg(device_budget, "device_budget");
             o.host_budget = budget_arg(host_budget, "host_budget");
             o.ssd_dir = ssd_dir;
             o.ssd_capacity = budget_arg(ssd_capacity, "ssd_capacity");
             o.h2d_gbps = h2d_gbps;
             o.d2h_gbps = d2h_gbps;
             return std::make_shared<Runtime>(o);
           }),
           py::arg("device_budget"), py::arg("host_budget") = py::int_(1ll << 30),
           py::arg("ssd_dir") = "", py::arg("ssd_capacity") = py::int_(0),
           py::arg("h2d_gbps") = 0.0, py::arg("d2h_gbps") = 0.0, py::arg("ssd_faults") = "",
           py::arg("device_watermarks") = py::make_tuple(0.90, 0.80),
           py::arg("host_watermarks") = py::make_tuple(0.90, 0.80),
           py::arg("backend") = "device-emu", py::arg("device") = 0)
      .def_property_readonly("backend",
                             [](const Runtime& r) { return r.stack().backend_name(); },
                             "The device tier's backend (\"auto\" resolved).")
      .def_property_readonly(
          "backend_detail", [](const Runtime& r) { return backend_detail(r.stack()); },
          "What the backend is on, for labels (a test double says so).")
      .def_property_readonly(
          "test_double",
          [](const Runtime& r) { return r.stack().accel() && r.stack().accel()->info().test_double; },
          "True when the cuda/acl runtime opened is u3m's test double over host memory.")
      .def_property_readonly(
          "passed_over", [](const Runtime& r) { return r.stack().passed_over(); },
          "backend='auto': why each backend tried before the one opened was passed over.")
      .def_property_readonly("device_budget",
                             [](const Runtime& r) { return r.options().device_budget; })
      .def_property_readonly("host_budget",
                             [](const Runtime& r) { return r.options().host_budget; })
      .def_property_readonly("has_ssd", &Runtime::has_ssd)
      .def(
          "add",
          [](Runtime& r, TensorId id, std::uint64_t bytes) {
            const mem::Status s = r.engine().add(id, bytes);
            if (!mem::ok(s)) fail("add", id, s);
          },
          py::arg("id"), py::arg("nbytes"), "Registers a tensor of nbytes (> 0) with no data yet.")
      .def(
          "remove",
          [](Runtime& r, TensorId id) { return removed(id, r.engine().remove(id)); },
          py::arg("id"), "Forgets a tensor; False (and nothing done) while it is leased or moving.")
      .def(
          "acquire",
          [](const std::shared_ptr<Runtime>& r, TensorId id, const std::string& tier,
             const std::string& access) {
            const Tier t = parse_tier(tier, false);
            const Access a = parse_access(access);
            engine::Lease l;
            mem::Status s;
            {
              py::gil_scoped_release nogil;  // may wait for a fetch or for room
              s = r->engine().acquire(id, t, a, &l);
            }
            if (!mem::ok(s)) fail("acquire", id, s);
            return make_lease(r, l);
          },
          py::arg("id"), py::arg("tier") = "device", py::arg("access") = "read",
          "Blocks until the tensor is in `tier` for `access`; returns a Lease.")
      .def(
          "try_acquire",
          [](const std::shared_ptr<Runtime>& r, TensorId id, const std::string& tier,
             const std::string& access) -> py::object {
            engine::Lease l;
            const mem::Status s =
                r->engine().try_acquire(id, parse_tier(tier, false), parse_access(access), &l);
            if (s == mem::Status::busy) return py::none();
            if (!mem::ok(s)) fail("try_acquire", id, s);
            return py::cast(make_lease(r, l));
          },
          py::arg("id"), py::arg("tier") = "device", py::arg("access") = "read",
          "A Lease if it can be granted now, else None (the fetch is scheduled).")
      .def(
          "release",
          [](Runtime& r, PyLease& l) {
            if (l.rt.get() != &r) input_error("release", "the lease belongs to another Runtime");
            if (l.released)
              throw EngineError(fmt::format("release(tensor {}): already released", l.lease.id));
            const mem::Status s = r.engine().release(l.lease);
            if (!mem::ok(s)) fail("release", l.lease.id, s);
            l.released = true;
          },
          py::arg("lease"))
      .def(
          "prefetch",
          [](Runtime& r, TensorId id, const std::string& tier) {
            const mem::Status s = r.engine().prefetch(id, parse_tier(tier, false));
            if (!mem::ok(s)) fail("prefetch", id, s);
          },
          py::arg("id"), py::arg("tier") = "device")
      .def(
          "evict",
          [](Runtime& r, TensorId id, const std::string& from) {
            const mem::Status s = r.engine().evict(id, parse_tier(from, false));
            if (!mem::ok(s)) fail("evict", id, s);
          },
          py::arg("id"), py::arg("tier") = "device",
          "Moves the tensor's data out of `tier` (asynchronously, write-back priority).")
      .def(
          "drain",
          [](Runtime& r) {
            py::gil_scoped_release nogil;
            r.engine().drain();
          },
          "Waits until no transfer is running.")
      .def(
          "residency",
          [](Runtime& r, TensorId id) -> py::object {
            const auto res = r.engine().residency(id);
            if (!res) return py::none();
            py::dict d;
            py::list valid;
            for (int t = 0; t < mem::kNumTiers; ++t)
              if (res->valid[t]) valid.append(std::string(mem::to_string(static_cast<Tier>(t))));
            d["valid"] = valid;
            d["in_flight"] = res->in_flight;
            d["readers"] = res->readers;
            d["writer"] = res->writer;
            d["lost"] = res->lost;
            return d;
          },
          py::arg("id"), "Where the tensor's latest data is, or None if not registered.")
      .def("set_observer", [](Runtime& r, engine::RunObserver* o, int card) { r.engine().set_observer(o, card); }, py::arg("observer"), py::arg("card") = 0, py::keep_alive<1, 2>(), "Reports transfers and tier use to a Metrics, Timeline or Observers (None: stop); bind_metrics.cpp")
      .def("stats",
           [](Runtime& r) {
             py::dict d = stats_dict(r.engine().stats());
             d["ssd"] = ssd_dict(r.stack());
             if (const mem::HostBlockCache* c = r.stack().host_cache()) {
               const mem::HostBlockCache::Stats hs = c->stats();
               py::dict h;  // Note [Pinned host cache]
               h["hits"] = hs.hits;
               h["misses"] = hs.misses;
               h["dropped"] = hs.dropped;
               h["cached_bytes"] = hs.cached_bytes;
               h["live_bytes"] = hs.live_bytes;
               d["host_cache"] = h;
             }
             return d;
           })
      .def(
          "corrupt_ssd_copy",
          [](Runtime& r, TensorId id, std::uint64_t seed) {
            mem::FaultInjectionIoEngine* f = r.stack().faults();
            const mem::SsdStore* ssd = r.stack().ssd();
            if (!f || !ssd) input_error("corrupt_ssd_copy", "the Runtime has no ssd_faults engine");
            const auto xs = ssd->extents(id);
            if (xs.empty()) return false;
            return mem::ok(f->corrupt_at_rest(ssd->file(), xs[0].first, xs[0].second, seed));
          },
          py::arg("id"), py::arg("seed") = 1,
          "Flips a bit of the tensor's SSD copy in the file (a test of corruption at rest; needs "
          "ssd_faults). False if the tensor has no SSD copy.")
      .def(
          "corrupt_ssd_at_rest",
          [](Runtime& r, std::uint64_t seed) {
            mem::FaultInjectionIoEngine* f = r.stack().faults();
            if (!f) input_error("corrupt_ssd_at_rest", "the Runtime has no ssd_faults engine");
            return f->corrupt_random_written(seed);
          },
          py::arg("seed"),
          "Flips a bit in a range the SSD tier wrote lately (a test of corruption at rest; "
          "needs ssd_faults). False if nothing was written yet.")
      .def(
          "monitor",
          [](Runtime& r, const std::string& tier) {
            return tier_report(r.engine().monitor(parse_tier(tier, true)));
          },
          py::arg("tier") = "device");

  py::class_<PyDriver>(
      m, "PolicyDriver",
      "Engine accesses of u3m.torch.offload, recorded online, with a tiering policy of "
      "tiering_policies() deciding prefetch, eviction order and op tiers (Note [Policy on a real "
      "run] in src/python/policy_driver.hpp).")
      .def(py::init([](const std::shared_ptr<Runtime>& rt, const std::string& policy,
                       unsigned lookahead, bool host_optimizer, unsigned repeats, bool record) {
             PolicyDriverOptions o;
             o.policy = policy;
             o.lookahead = lookahead;
             o.host_optimizer = host_optimizer;
             o.repeats = repeats;
             o.record = record;
             o.has_ssd = rt->has_ssd();
             return std::make_unique<PyDriver>(rt, o);
           }),
           py::arg("runtime"), py::arg("policy") = "u3m", py::arg("lookahead") = 4,
           py::arg("host_optimizer") = false, py::arg("repeats") = 0, py::arg("record") = true)
      .def(
          "add",
          [](PyDriver& d, TensorId id, std::uint64_t bytes, const std::string& name,
             const std::string& role) {
            const auto r = trace::parse_role(role);
            if (!r) input_error("role", "unknown tensor role '{}'", role);
            const mem::Status s = d.drv.add(id, bytes, name, *r);
            if (!mem::ok(s)) fail("add", id, s);
          },
          py::arg("id"), py::arg("nbytes"), py::arg("name"), py::arg("role"))
      .def(
          "remove",
          [](PyDriver& d, TensorId id) { return removed(id, d.drv.remove(id)); },
          py::arg("id"), "As Runtime.remove; the free is recorded once.")
      .def(
          "acquire",
          [](PyDriver& d, TensorId id, const std::string& access, const std::string& phase) {
            const Access a = parse_access(access);
            const trace::Phase ph = parse_phase_arg(phase);
            const Tier t = d.drv.tier(ph);
            const TensorId e = d.drv.engine_id(id);
            if (e == 0) fail("acquire", id, mem::Status::not_found);
            engine::Lease l;
            // Without blocking first, so the demand fetch is queued at once.
            mem::Status s = d.rt->engine().try_acquire(e, t, a, &l);
            if (s == mem::Status::busy) {
              py::gil_scoped_release nogil;
              s = d.rt->engine().acquire(e, t, a, &l);
            }
            if (!mem::ok(s)) fail("acquire", id, s);
            d.drv.accessed(id, a == Access::write, ph);
            return make_lease(d.rt, l);
          },
          py::arg("id"), py::arg("access") = "read", py::arg("phase") = "other",
          "Leases the tensor in the tier the policy runs `phase` in, then lets the policy decide.")
      .def("end_step", [](PyDriver& d) { d.drv.end_step(); }, "A training step ended.")
      .def(
          "engine_id",
          [](const PyDriver& d, TensorId id) {
            const TensorId e = d.drv.engine_id(id);
            if (e == 0) input_error("engine_id", "tensor {} was never added", id);
            return e;
          },
          py::arg("id"), "The id the Runtime knows an added tensor by (for Runtime calls).")
      .def_property_readonly("policy", [](const PyDriver& d) { return d.drv.options().policy; })
      .def("stats", &driver_stats);
  m.def("recorder_cost", &recorder_cost, py::arg("tensors") = 1000, py::arg("steps") = 1000,
        "ns per access of the online recorder, timed in C++ (a benchmark's figure).");
}

}  // namespace u3m::python
