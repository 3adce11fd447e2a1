// One config file for the runtime and the policies (docs/config.md): tiers,
// budgets, watermarks, the SSD tier, links, the device pool, the tiering
// policy, prefetch, the predictor, the KV policy and the hardware profile.
// `--config FILE` on the commands and `u3m.load_config` in Python read it;
// a flag given on the command line wins over the file.
//
// Note [Strict config]
// Every key is known or the file is refused: an unknown key, a value of the
// wrong type or out of range is an InputError naming the file, the line and
// the key, so a misspelt `high_watermak` never leaves the default in force
// unnoticed. Names (policies, predictors, profiles) are checked against the
// same registries the flags use. A field the file leaves out is unset: each
// consumer keeps its own default, and the effective value it ran with is
// what it reports.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace u3m::config {

struct TierConfig {
  std::optional<std::uint64_t> budget;  // bytes
  std::optional<double> fraction;       // of the footprint (replay's device tier only)
  std::optional<double> high_watermark, low_watermark;
};

struct RunConfig {
  std::string source;  // the file it was read from ("" = none)

  std::optional<std::string> hw;  // [profile] hw: a built-in name or a TOML file
  TierConfig device, host;        // [tiers.device], [tiers.host]
  struct {
    std::optional<std::string> dir;  // "" = no SSD tier
    std::optional<std::uint64_t> size;
    std::optional<std::string> faults;  // mem::FaultSpec text (fault injection)
    std::optional<double> endurance_dwpd;  // the drives' rated writes per day (SSD wear)
  } ssd;                                // [tiers.ssd]
  struct {
    std::optional<double> h2d_gbps, d2h_gbps;
  } links;                          // [links]
  std::optional<std::string> pool;  // [pool] config: mem::PoolConfig text
  struct {
    std::optional<std::string> tiering;
    std::optional<bool> host_optimizer;
  } policy;  // [policy]
  struct {
    std::optional<unsigned> lookahead;
    std::optional<std::string> mode;  // u3m policy: fixed | link
  } prefetch;                         // [prefetch]
  struct {
    std::optional<std::string> name;
    std::optional<unsigned> horizon;
  } predictor;  // [predictor]
  struct {
    std::optional<std::string> policy;  // serving KV policy
  } kv;                                 // [kv]

  // The file's values in its own shape; unset fields are left out.
  nlohmann::json to_json() const;
};

// Parses config text read from `where`; InputError "where:LINE: ..." on any
// defect (Note [Strict config]).
RunConfig parse_run_config(std::string_view text, std::string_view where);
// Reads and parses a file; a missing or unreadable file is an InputError.
RunConfig load_run_config(const std::string& path);

// Applies a config to a command's options and reports what the run used.
// Each bind() names the config field, the flag that overrides it and the
// option it sets: the file's value goes in unless the flag was given; after
// the run, effective() reads every bound option back into the file's shape,
// so the report shows the values that ran, wherever they came from.
// The accessor a Binder takes, e.g. U3M_CONFIG_FIELD(policy.tiering).
#define U3M_CONFIG_FIELD(path) [](::u3m::config::RunConfig& c_) -> auto& { return c_.path; }

class Binder {
 public:
  using Given = std::function<bool(std::string_view flag)>;
  Binder(RunConfig file, Given given) : file_(std::move(file)), given_(std::move(given)) {}

  // field(RunConfig&) -> std::optional<T>&; T and the option's type match.
  template <typename Field, typename T>
  void bind(Field field, std::string_view flag, T& option) {
    bind(field, flag, option, [](const auto& v) { return v; }, [](const T& v) { return v; });
  }
  // With conversions: to_option(file value) -> option, to_file(option) -> file value.
  template <typename Field, typename T, typename ToOption, typename ToFile>
  void bind(Field field, std::string_view flag, T& option, ToOption to_option, ToFile to_file) {
    auto& v = field(file_);
    if (v && !given_(flag)) option = to_option(*v);
    readers_.push_back([field, &option, to_file](RunConfig& out) { field(out) = to_file(option); });
  }

  const RunConfig& file() const { return file_; }
  // {"file": path or null, "values": the bound options in the file's shape}.
  nlohmann::json effective() const;

 private:
  RunConfig file_;
  Given given_;
  std::vector<std::function<void(RunConfig&)>> readers_;
};

}  // namespace u3m::config
