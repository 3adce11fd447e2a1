// The one place that knows the device backends and finds them at run time:
// device-emu (always there), cuda and acl (present when their runtime loads
// and reports a device). Commands that pick a device backend take
// `--backend auto|device-emu|cuda|acl` and open it here; `u3m doctor` lists
// what probe_backends() found (docs/accelerators.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "u3m/mem/backend.hpp"
#include "u3m/mem/backend_accel.hpp"
#include "u3m/mem/device_emu.hpp"

namespace u3m::mem {

// "device-emu", "cuda", "acl": the device backends, in the order doctor lists them.
const std::vector<std::string>& device_backend_names();
// A device backend name or "auto".
bool is_backend_choice(std::string_view name);
// "auto, device-emu, cuda, acl", for messages.
std::string backend_choices_text();

struct BackendProbe {
  std::string name;
  bool available = false;
  // Available: what was found ("NVIDIA H200, runtime 13.0, driver 13.0,
  // /usr/local/cuda/lib64/libcudart.so.13"); else the one-line reason.
  std::string detail;
  std::optional<AccelInfo> info;  // cuda and acl, when available
};
// Opens and closes each backend once.
std::vector<BackendProbe> probe_backends();

struct OpenOptions {
  DeviceEmuOptions emu;             // device-emu's settings
  std::uint64_t host_capacity = 0;  // the host tier; 0 = physical RAM
  int device = 0;                   // cuda and acl: the device ordinal
};

struct OpenedBackend {
  std::string name;  // the backend opened ("auto" resolved)
  std::unique_ptr<DeviceBackend> device;
  // The host tier that pairs with it: HostBackend (mmap + mlock) for
  // device-emu, the runtime's pinned allocator for cuda and acl. Declared
  // after `device`, so it is destroyed first.
  std::unique_ptr<MemoryBackend> host;
  AccelBackend* accel = nullptr;  // `device` when it is cuda or acl
  // auto: why each backend tried before this one was passed over.
  std::vector<std::string> passed_over;
};

// Opens `name`: "device-emu", "cuda", "acl", or "auto", which tries acl, then
// cuda (the design's first target first), then device-emu, which always
// opens. invalid_argument for an unknown name; the named backend's failure
// (unsupported, ...) with a one-line `why` otherwise.
Status open_backend(std::string_view name, const OpenOptions& options, OpenedBackend* out,
                    std::string* why);

}  // namespace u3m::mem
