#include "u3m/config/run_config.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "u3m/experiments/serve.hpp"
#include "u3m/mem/fault_spec.hpp"
#include "u3m/mem/pool.hpp"
#include "u3m/policy/tiering.hpp"
#include "u3m/predict/predictor.hpp"
#include "u3m/sim/profile.hpp"
#include "u3m/util/error.hpp"
#include "u3m/util/file.hpp"
#include "u3m/util/toml.hpp"
#include "u3m/util/units.hpp"

namespace u3m::config {

namespace {

constexpr std::uint64_t kMaxBytes = 1ull << 50;  // 1 PiB: past any tier of one server

// One table of the file and where it came from, for errors that name the key.
struct Table {
  const toml::table* t = nullptr;
  std::string where;  // the file
  std::string name;   // dotted table name

  std::string loc(const toml::node& n) const { return util::at_line(where, util::line_of(n)); }
  std::string key(std::string_view k) const { return fmt::format("{}.{}", name, k); }
  const toml::node* get(std::string_view k) const { return t ? t->get(k) : nullptr; }

  [[noreturn]] void bad(std::string_view k, const toml::node& n, std::string_view what) const {
    input_error(loc(n), "'{}' {}", key(k), what);
  }

  std::optional<std::string> text(std::string_view k) const {
    const toml::node* n = get(k);
    if (!n) return std::nullopt;
    if (!n->is_string()) bad(k, *n, "must be a string");
    return n->as_string()->get();
  }
  // A name that must not be empty.
  std::optional<std::string> name_of(std::string_view k) const {
    auto s = text(k);
    if (s && s->empty()) bad(k, *get(k), "must not be empty");
    return s;
  }
  std::optional<bool> flag(std::string_view k) const {
    const toml::node* n = get(k);
    if (!n) return std::nullopt;
    if (!n->is_boolean()) bad(k, *n, "must be true or false");
    return n->as_boolean()->get();
  }
  std::optional<double> number(std::string_view k, double lo, double hi, bool lo_open) const {
    const toml::node* n = get(k);
    if (!n) return std::nullopt;
    double v = 0;
    if (auto i = n->as_integer())
      v = static_cast<double>(i->get());
    else if (auto d = n->as_floating_point())
      v = d->get();
    else
      bad(k, *n, "must be a number");
    if (!std::isfinite(v) || v > hi || v < lo || (lo_open && v == lo))
      bad(k, *n, fmt::format("is {}; it must be in {}{}, {}]", v, lo_open ? "(" : "[", lo, hi));
    return v;
  }
  std::optional<unsigned> count(std::string_view k, unsigned lo, unsigned hi) const {
    const toml::node* n = get(k);
    if (!n) return std::nullopt;
    auto i = n->as_integer();
    if (!i) bad(k, *n, "must be a whole number");
    if (i->get() < lo || i->get() > hi)
      bad(k, *n, fmt::format("is {}; it must be between {} and {}", i->get(), lo, hi));
    return static_cast<unsigned>(i->get());
  }
  // Bytes: an integer, or a string such as "8GiB" or "512M".
  std::optional<std::uint64_t> bytes(std::string_view k) const {
    const toml::node* n = get(k);
    if (!n) return std::nullopt;
    if (auto i = n->as_integer()) {
      if (i->get() < 1 || static_cast<std::uint64_t>(i->get()) > kMaxBytes)
        bad(k, *n, fmt::format("is {}; it must be between 1 byte and 1 PiB", i->get()));
      return static_cast<std::uint64_t>(i->get());
    }
    if (!n->is_string()) bad(k, *n, "must be a size: bytes, or a string such as \"8GiB\"");
    return util::parse_size(n->as_string()->get(), fmt::format("{}: '{}'", loc(*n), key(k)),
                            kMaxBytes);
  }
};

Table sub(const Table& parent, std::string_view k) {
  Table out{nullptr, parent.where, parent.name.empty() ? std::string(k) : parent.key(k)};
  if (const toml::node* n = parent.get(k)) {
    out.t = n->as_table();
    if (!out.t) input_error(parent.loc(*n), "'{}' must be a table ([{}])", out.name, out.name);
  }
  return out;
}

void check(const Table& t, std::initializer_list<std::string_view> known) {
  if (t.t) util::check_keys(*t.t, known, t.where, t.name);
}

// A name from a registry, checked by the registry's own lookup so the file
// and the flag accept the same names; its InputError is re-labelled with the
// file's line and key.
template <typename Lookup>
void check_name(const Table& t, std::string_view k, const std::optional<std::string>& v,
                Lookup lookup) {
  if (!v) return;
  try {
    lookup(*v);
  } catch (const InputError& e) {
    std::string why = e.what();
    // Drop the lookup's own "where: " prefix; keep its reason.
    if (auto c = why.find(": "); c != std::string::npos) why = why.substr(c + 2);
    input_error(t.loc(*t.get(k)), "'{}': {}", t.key(k), why);
  }
}

void check_in(const Table& t, std::string_view k, const std::optional<std::string>& v,
              const std::vector<std::string>& known) {
  if (v && std::find(known.begin(), known.end(), *v) == known.end())
    t.bad(k, *t.get(k), fmt::format("is '{}'; expected one of {}", *v, fmt::join(known, ", ")));
}

TierConfig read_tier(const Table& t, bool with_fraction) {
  if (with_fraction)
    check(t, {"budget", "fraction", "high_watermark", "low_watermark"});
  else
    check(t, {"budget", "high_watermark", "low_watermark"});
  TierConfig c;
  c.budget = t.bytes("budget");
  if (with_fraction) c.fraction = t.number("fraction", 0, 1, true);
  if (c.budget && c.fraction)
    input_error(t.loc(*t.get("fraction")), "'{}' and '{}' both set: give one", t.key("budget"),
                t.key("fraction"));
  c.high_watermark = t.number("high_watermark", 0, 1, true);
  c.low_watermark = t.number("low_watermark", 0, 1, true);
  if (c.high_watermark && c.low_watermark && !(*c.low_watermark <= *c.high_watermark))
    input_error(t.loc(*t.get("low_watermark")), "'{}' ({}) must not be above '{}' ({})",
                t.key("low_watermark"), *c.low_watermark, t.key("high_watermark"),
                *c.high_watermark);
  return c;
}

}  // namespace

RunConfig parse_run_config(std::string_view text, std::string_view where) {
  const toml::table root_table = util::parse_toml(text, where);
  const Table root{&root_table, std::string(where), ""};
  check(root, {"profile", "tiers", "links", "pool", "policy", "prefetch", "predictor", "kv"});
  RunConfig c;
  c.source = std::string(where);

  const Table profile = sub(root, "profile");
  check(profile, {"hw"});
  c.hw = profile.name_of("hw");
  check_name(profile, "hw", c.hw, [](const std::string& v) { sim::load_profile(v); });

  const Table tiers = sub(root, "tiers");
  check(tiers, {"device", "host", "ssd"});
  c.device = read_tier(sub(tiers, "device"), true);
  c.host = read_tier(sub(tiers, "host"), false);
  const Table ssd = sub(tiers, "ssd");
  check(ssd, {"dir", "size", "faults", "endurance_dwpd"});
  c.ssd.dir = ssd.text("dir");
  c.ssd.size = ssd.bytes("size");
  c.ssd.faults = ssd.text("faults");
  c.ssd.endurance_dwpd = ssd.number("endurance_dwpd", 0, 1000, true);
  check_name(ssd, "faults", c.ssd.faults,
             [](const std::string& v) { mem::FaultSpec::parse(v, "faults"); });
  if (c.ssd.faults && !c.ssd.faults->empty() && (!c.ssd.dir || c.ssd.dir->empty()))
    ssd.bad("faults", *ssd.get("faults"), "needs an SSD tier ('tiers.ssd.dir')");

  const Table links = sub(root, "links");
  check(links, {"h2d_gbps", "d2h_gbps"});
  c.links.h2d_gbps = links.number("h2d_gbps", 0, 1e6, false);
  c.links.d2h_gbps = links.number("d2h_gbps", 0, 1e6, false);

  const Table pool = sub(root, "pool");
  check(pool, {"config"});
  c.pool = pool.text("config");
  check_name(pool, "config", c.pool,
             [](const std::string& v) { mem::PoolConfig::parse(v, "config"); });

  const Table pol = sub(root, "policy");
  check(pol, {"tiering", "host_optimizer"});
  c.policy.tiering = pol.name_of("tiering");
  check_name(pol, "tiering", c.policy.tiering,
             [](const std::string& v) { policy::find_tiering_policy(v, "tiering"); });
  c.policy.host_optimizer = pol.flag("host_optimizer");

  const Table pre = sub(root, "prefetch");
  check(pre, {"lookahead", "mode"});
  c.prefetch.lookahead = pre.count("lookahead", 0, 1u << 20);
  c.prefetch.mode = pre.name_of("mode");
  check_in(pre, "mode", c.prefetch.mode, {"fixed", "link"});

  const Table pred = sub(root, "predictor");
  check(pred, {"name", "horizon"});
  c.predictor.name = pred.name_of("name");
  if (c.predictor.name) {
    bool deprecated = false;
    const std::string canonical(predict::canonical_predictor_name(*c.predictor.name, &deprecated));
    check_in(pred, "name", std::optional(canonical), predict::predictor_names());
    c.predictor.name = canonical;
  }
  c.predictor.horizon = pred.count("horizon", 1, 1u << 20);

  const Table kv = sub(root, "kv");
  check(kv, {"policy"});
  c.kv.policy = kv.name_of("policy");
  check_in(kv, "policy", c.kv.policy, experiments::serve_policy_names());
  return c;
}

RunConfig load_run_config(const std::string& path) {
  return parse_run_config(read_file(path), path);
}

nlohmann::json Binder::effective() const {
  RunConfig used;
  for (const auto& read : readers_) read(used);
  return {{"file", file_.source.empty() ? nlohmann::json(nullptr) : nlohmann::json(file_.source)},
          {"values", used.to_json()}};
}

nlohmann::json RunConfig::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  // j[path] = *v for a set field; a table appears only once a field in it is set.
  auto put = [&j](std::initializer_list<const char*> path, const auto& v) {
    if (!v) return;
    nlohmann::json* at = &j;
    for (const char* k : path) at = &(*at)[k];
    *at = *v;
  };
  put({"profile", "hw"}, hw);
  for (auto [name, t] : {std::pair{"device", &device}, std::pair{"host", &host}}) {
    put({"tiers", name, "budget"}, t->budget);
    put({"tiers", name, "fraction"}, t->fraction);
    put({"tiers", name, "high_watermark"}, t->high_watermark);
    put({"tiers", name, "low_watermark"}, t->low_watermark);
  }
  put({"tiers", "ssd", "dir"}, ssd.dir);
  put({"tiers", "ssd", "size"}, ssd.size);
  put({"tiers", "ssd", "faults"}, ssd.faults);
  put({"tiers", "ssd", "endurance_dwpd"}, ssd.endurance_dwpd);
  put({"links", "h2d_gbps"}, links.h2d_gbps);
  put({"links", "d2h_gbps"}, links.d2h_gbps);
  put({"pool", "config"}, pool);
  put({"policy", "tiering"}, policy.tiering);
  put({"policy", "host_optimizer"}, policy.host_optimizer);
  put({"prefetch", "lookahead"}, prefetch.lookahead);
  put({"prefetch", "mode"}, prefetch.mode);
  put({"predictor", "name"}, predictor.name);
  put({"predictor", "horizon"}, predictor.horizon);
  put({"kv", "policy"}, kv.policy);
  return j;
}

}  // namespace u3m::config
