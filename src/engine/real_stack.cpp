#include "u3m/engine/real_stack.hpp"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>

#include "u3m/util/error.hpp"

namespace u3m::engine {
namespace {

mem::DeviceEmuOptions emu_options(const StackSpec& o) {
  o.validate("real stack");
  mem::DeviceEmuOptions d;
  d.capacity = o.arena_bytes();
  d.throttle_bytes_per_s[static_cast<int>(mem::CopyKind::h2d)] =
      o.links[static_cast<int>(Link::h2d)].bandwidth;
  d.throttle_bytes_per_s[static_cast<int>(mem::CopyKind::d2h)] =
      o.links[static_cast<int>(Link::d2h)].bandwidth;
  if (!o.copy_spin) d.spin_ns = d.sync_spin_ns = 0;
  return d;
}

mem::OpenedBackend open_tiers(const StackSpec& o) {
  mem::OpenOptions oo;
  oo.emu = emu_options(o);
  oo.device = o.device_ordinal;
  const bool emu = o.backend == "device-emu";
  if (!emu && (o.links[static_cast<int>(Link::h2d)].bandwidth > 0 ||
               o.links[static_cast<int>(Link::d2h)].bandwidth > 0))
    input_error("real stack", "an h2d/d2h bandwidth throttle emulates a link on device-emu only; "
                "backend '{}' copies over the hardware's own", o.backend);
  mem::OpenedBackend b;
  std::string why;
  if (!mem::ok(mem::open_backend(o.backend, oo, &b, &why)))
    input_error("real stack", "backend '{}' cannot open: {}", o.backend, why);
  return b;
}

std::string make_scratch_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/u3m-ssd-XXXXXX";
  if (!mkdtemp(tmpl.data()))
    input_error(tmpl, "cannot create a scratch directory for the SSD tier");
  return tmpl;
}

}  // namespace

RealStack::RealStack(const StackSpec& o)
    : backend_(open_tiers(o)),
      host_cache_(backend_.accel ? std::make_unique<mem::HostBlockCache>(*backend_.host, o.host_bytes)
                                 : nullptr),
      source_(*backend_.device),
      pool_(source_, o.pool_config(source_.supports_vmm())) {
  EngineConfig c = o.engine_config();
  if (!o.ssd_faults.empty() && !o.ssd_bytes)
    input_error("real stack", "SSD faults ({}) need an SSD tier", o.ssd_faults.describe());
  if (o.ssd_bytes) {
    std::string dir = o.ssd_dir;
    if (dir.empty()) dir = scratch_.path = make_scratch_dir();
    mem::SsdStoreOptions so;
    so.path = dir + "/" + o.ssd_file;
    so.capacity = o.ssd_bytes;
    if (!o.ssd_faults.empty()) {
      if (o.ssd_io) input_error("real stack", "ssd_faults and ssd_io cannot both be given");
      faults_ = mem::make_fault_engine(o.ssd_faults);
    }
    so.engine = faults_ ? faults_ : o.ssd_io;
    so.scrub_bytes_per_s = static_cast<std::uint64_t>(o.ssd_scrub_bytes_per_s);
    so.on_corrupt = [this](std::uint64_t key) {
      std::lock_guard g(corrupt_mu_);
      if (corrupt_sink_) corrupt_sink_->ssd_copy_failed(key);
    };
    std::string why;
    if (!mem::ok(mem::SsdStore::open(so, ssd_, &why)))
      input_error(dir, "cannot open the SSD tier there: {}", why);  // scratch_ removes its dir
  }
  // Note [Copies on u3m's streams]: on a real device, never the runtime's implicit stream.
  transport_ = std::make_unique<BackendTransport>(*backend_.device, ssd_.get(),
                                                  /*stream_copies=*/backend_.accel != nullptr);
  // The engine counts a completed write-back as a copy that checked out
  // (Note [Verified before dropped]); without the store's read-back it is not.
  if (ssd_ && !ssd_->options().verify_writes) c.ssd_verify_max_age_ns = 0;
  mem::MemoryBackend& host = host_cache_ ? *host_cache_ : *backend_.host;
  engine_ = std::make_unique<Engine>(c, pool_, host, *transport_, clock_);
  std::lock_guard g(corrupt_mu_);
  corrupt_sink_ = engine_.get();
}

std::string RealStack::ssd_notice() const {
  return ssd_ ? ssd_->open_notice() : std::string();
}

RealStack::Scratch::~Scratch() {
  if (path.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

RealStack::~RealStack() {
  {
    std::lock_guard g(corrupt_mu_);
    corrupt_sink_ = nullptr;
  }
  engine_.reset();  // Note [Real stack]
  transport_.reset();
  ssd_.reset();
}

std::uint64_t RealStack::arena_bytes() const {
  return pool_.config().capacity;
}

}  // namespace u3m::engine
