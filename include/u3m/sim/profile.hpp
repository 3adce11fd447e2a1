// Hardware profiles for the simulator: one accelerator card and its share of
// a node (HBM, host link, card-to-card link, host DRAM, NVMe), every number
// with its unit and source. Built-in profiles are the TOML files under
// data/hw/, compiled into the binary; a user file works the same way.
// docs/hardware.md lists every number and why it was chosen.
//
// Note [Profile numbers]
// A Param keeps the number as written (value, unit) for display and for
// writing the file back, and the same number in base units (`si`: bytes,
// bytes/s, FLOP/s, seconds, or a plain number) for the models. Bandwidths are
// per direction. Memory bandwidths (HBM, DRAM) count all traffic, reads plus
// writes, as datasheets do; link bandwidths count the bytes carried. An op
// that moves B bytes (trace::Op::bytes, reads + writes) therefore needs
// B / hbm_bandwidth seconds of HBM time.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "u3m/mem/link.hpp"

namespace u3m::sim {

// What a Param measures; decides the units it accepts.
enum class Dim : unsigned char { bytes, bandwidth, flop_rate, time, fraction, count };

struct Param {
  double value = 0;    // as written, in `unit`
  std::string unit;    // e.g. "GB/s"
  std::string source;  // datasheet, paper, "measured on ...", or "assumption: ..."
  double si = 0;       // value in base units (Note [Profile numbers])
  int line = 0;        // line in the profile's text; 0 when built in code
};

struct LinkSpec {
  std::string kind;             // "PCIe 4.0 x16", "HCCS", ...
  Param bandwidth_theoretical;  // per direction, wire rate
  Param bandwidth_practical;    // per direction, what copies achieve
  Param latency;                // fixed cost of one transfer
  // The link as the one link model: practical bandwidth, latency.
  mem::LinkModel model() const { return {bandwidth_practical.si, latency.si}; }
};

struct HwProfile {
  std::string name;         // "ascend-910b-32g"
  std::string description;  // one line
  std::string origin;       // "built-in" or the file it was read from

  struct Device {
    std::string model;
    Param hbm_capacity;       // bytes
    Param hbm_bandwidth;      // bytes/s, reads + writes
    Param peak_flops;         // dense 16-bit FLOP/s
    Param matmul_efficiency;  // achieved / peak for large GEMMs, (0, 1]
    Param launch_overhead;    // seconds per op
  } device;
  LinkSpec host_link;  // card <-> host DRAM
  LinkSpec peer_link;  // card <-> one peer card
  struct Host {
    Param dram_capacity;   // bytes per card
    Param dram_bandwidth;  // bytes/s per card
  } host;
  struct Ssd {
    std::string model;
    Param read_bandwidth, write_bandwidth;  // bytes/s, sequential, one drive
    Param read_latency, write_latency;      // seconds, small I/O at queue depth 1
    Param capacity;                         // bytes, one drive
    Param endurance;                        // bytes the drive is rated to take (TBW)
    Param warranty;                         // seconds the rating spans
    Param drives_per_node;
    // Drive writes per day the rating allows: endurance / capacity / warranty days.
    double rated_dwpd() const {
      return capacity.si > 0 && warranty.si > 0 ? endurance.si / capacity.si / (warranty.si / 86400)
                                                : 0;
    }
  } ssd;
  struct Node {
    Param cards_per_node;
  } node;
  // The inter-node network (issue 21): the RDMA NICs a node's cards reach other nodes and the
  // shared KV pool through. `network` is one NIC, per direction; each card gets
  // nics_per_node / cards_per_node of them (Note [Pooled KV] in serving_sim.cpp).
  LinkSpec network;
  Param nics_per_node;
  struct Pool {
    // Bytes of each node's DRAM given to a shared KV pool (a Mooncake-Store-like tier), on top
    // of the KV the node's own instances keep in DRAM.
    Param capacity_per_node;
  } pool;
};

// The table every reader, writer and printer walks, so a new field is added
// in one place (profile.cpp).
struct ParamField {
  std::string_view section;  // "device", "host_link", ...
  std::string_view key;      // "hbm_bandwidth"
  Dim dim;
  Param& (*get)(HwProfile&);
  const Param& at(const HwProfile& p) const { return get(const_cast<HwProfile&>(p)); }
};
struct TextField {
  std::string_view section;  // "" for top-level keys
  std::string_view key;
  std::string& (*get)(HwProfile&);
  const std::string& at(const HwProfile& p) const { return get(const_cast<HwProfile&>(p)); }
};
std::span<const ParamField> param_fields();
std::span<const TextField> text_fields();

// Units a dimension accepts, and the factor to base units (nullopt-like 0 if
// unknown).
std::span<const std::string_view> units_for(Dim d);
double unit_factor(Dim d, std::string_view unit);  // 0 when not accepted

// Parses and validates a profile. `where` names the text in errors (a file
// path, or "built-in NAME"). Throws InputError naming where:line and the field
// for TOML syntax errors, missing or unknown fields, a non-positive or
// non-finite value, an unknown unit, a blank source, or a practical bandwidth
// above the theoretical one.
HwProfile parse_profile(std::string_view text, std::string_view where);

// Names of the profiles compiled in from data/hw/, sorted.
std::vector<std::string> builtin_profile_names();
// The TOML text of a built-in profile; empty if there is none by that name.
std::string_view builtin_profile_text(std::string_view name);
// A built-in name, else a file path. Throws InputError if neither.
HwProfile load_profile(std::string_view name_or_path);

// TOML text that parse_profile reads back to the same profile.
std::string to_toml(const HwProfile& p);

// Dotted field name for messages and JSON: "device.hbm_bandwidth".
std::string field_name(std::string_view section, std::string_view key);

}  // namespace u3m::sim
