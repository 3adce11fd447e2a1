// The device backend registry (include/u3m/mem/backend_registry.hpp).
#include "u3m/mem/backend_registry.hpp"

#include <fmt/format.h>

#include "u3m/mem/backend_acl.hpp"
#include "u3m/mem/backend_cuda.hpp"
#include "u3m/mem/host.hpp"

namespace u3m::mem {
namespace {

Status open_accel(std::string_view name, int device, std::unique_ptr<AccelBackend>* out,
                  std::string* why) {
  if (name == "cuda") {
    CudaOptions o;
    o.device = device;
    return open_cuda_backend(o, out, why);
  }
  AclOptions o;
  o.device = device;
  return open_acl_backend(o, out, why);
}

std::string describe(const AccelInfo& i) {
  std::string s = i.device_name;
  if (!i.runtime_version.empty()) s += ", runtime " + i.runtime_version;
  if (!i.driver_version.empty()) s += ", driver " + i.driver_version;
  s += fmt::format(", {:.1f} GiB", double(i.total_bytes) / double(1ull << 30));
  s += i.vmm ? ", VMM" : ", no VMM (" + i.vmm_note + ")";
  s += ", " + i.library;
  if (i.test_double) s += " [u3m test double over host memory, not hardware]";
  return s;
}

}  // namespace

const std::vector<std::string>& device_backend_names() {
  static const std::vector<std::string> names = {"device-emu", "cuda", "acl"};
  return names;
}

bool is_backend_choice(std::string_view name) {
  if (name == "auto") return true;
  for (const auto& n : device_backend_names())
    if (n == name) return true;
  return false;
}

std::string backend_choices_text() {
  return "auto, " + fmt::format("{}", fmt::join(device_backend_names(), ", "));
}

std::vector<BackendProbe> probe_backends() {
  std::vector<BackendProbe> out;
  out.push_back({.name = "device-emu",
                 .available = true,
                 .detail = "emulated accelerator in host memory (always available)",
                 .info = std::nullopt});
  for (std::string_view name : {"cuda", "acl"}) {
    BackendProbe p{.name = std::string(name), .available = false, .detail = {}, .info = {}};
    std::unique_ptr<AccelBackend> b;
    if (ok(open_accel(name, 0, &b, &p.detail))) {
      p.available = true;
      p.info = b->info();
      p.detail = describe(b->info());
    }
    out.push_back(std::move(p));
  }
  return out;
}

Status open_backend(std::string_view name, const OpenOptions& o, OpenedBackend* out,
                    std::string* why) {
  if (!is_backend_choice(name)) {
    if (why != nullptr)
      *why = fmt::format("unknown backend '{}' (choose {})", name, backend_choices_text());
    return Status::invalid_argument;
  }
  OpenedBackend r;
  // cuda or acl, once opened: its pinned host allocator is the host tier.
  auto adopt = [&](std::string_view n, std::unique_ptr<AccelBackend> b) {
    r.name = std::string(n);
    r.accel = b.get();
    r.host = b->make_host_backend(o.host_capacity);
    r.device = std::move(b);
    *out = std::move(r);
    return Status::ok;
  };
  if (name == "auto") {
    for (std::string_view n : {"acl", "cuda"}) {
      std::unique_ptr<AccelBackend> b;
      std::string reason;
      if (ok(open_accel(n, o.device, &b, &reason))) return adopt(n, std::move(b));
      r.passed_over.push_back(reason);
    }
    name = "device-emu";
  }
  if (name == "device-emu") {
    r.name = "device-emu";
    r.device = std::make_unique<DeviceEmuBackend>(o.emu);
    r.host = std::make_unique<HostBackend>(HostOptions{.capacity = o.host_capacity});
    *out = std::move(r);
    return Status::ok;
  }
  std::unique_ptr<AccelBackend> b;
  if (Status s = open_accel(name, o.device, &b, why); !ok(s)) return s;
  return adopt(name, std::move(b));
}

}  // namespace u3m::mem
