// The price table's parser (prices.hpp). JSON rather than TOML: toml++ is
// compiled with its own assertion handling in src/sim/profile.cpp alone
// (Note [toml++ assertions]), and a second configuration of the header-only
// library in the same binary would break the one-definition rule.
#include "prices.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "u3m/util/error.hpp"

namespace u3m::cli {
namespace {

using nlohmann::json;

std::string str_field(const json& o, const char* key, const std::string& where, bool required) {
  const auto it = o.find(key);
  if (it == o.end()) {
    if (required) input_error(where, "missing '{}'", key);
    return {};
  }
  if (!it->is_string()) input_error(where, "'{}' must be a string", key);
  return it->get<std::string>();
}

bool blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

// YYYY-MM-DD with a plausible month and day.
bool is_date(const std::string& d) {
  if (d.size() != 10 || d[4] != '-' || d[7] != '-') return false;
  for (int i : {0, 1, 2, 3, 5, 6, 8, 9})
    if (d[i] < '0' || d[i] > '9') return false;
  const int m = std::stoi(d.substr(5, 2)), day = std::stoi(d.substr(8, 2));
  return m >= 1 && m <= 12 && day >= 1 && day <= 31;
}

Price read_price(const json& o, const std::string& where, double usd_cny, bool fx) {
  if (!o.is_object()) input_error(where, "expected an object {{ value, currency, unit, source, date }}");
  for (auto it = o.begin(); it != o.end(); ++it) {
    static const char* known[] = {"value", "currency", "unit", "source", "date", "status", "note"};
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) input_error(where, "unknown key '{}'", it.key());
  }
  Price p;
  p.source = str_field(o, "source", where, true);
  if (blank(p.source)) input_error(where, "'source' is empty: give where the price was found");
  p.date = str_field(o, "date", where, true);
  if (!is_date(p.date)) input_error(where, "'date' must be YYYY-MM-DD, got '{}'", p.date);
  p.note = str_field(o, "note", where, false);
  const auto v = o.find("value");
  const std::string status = str_field(o, "status", where, false);
  if (v == o.end() || v->is_null()) {
    if (fx || status != "not found")
      input_error(where, "no 'value': give a price, or status = \"not found\" with where it was "
                         "searched in 'source'");
    p.unit = str_field(o, "unit", where, false);
    return p;
  }
  if (!status.empty()) input_error(where, "'status' is only for a price that was not found");
  if (!v->is_number()) input_error(where, "'value' must be a number");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x <= 0 || x > 1e12)
    input_error(where, "'value' must be a finite number in (0, 1e12], got {}", x);
  p.value = x;
  if (fx) return p;
  p.currency = str_field(o, "currency", where, true);
  if (p.currency != "CNY" && p.currency != "USD")
    input_error(where, "'currency' must be CNY or USD, got '{}'", p.currency);
  p.unit = str_field(o, "unit", where, true);
  if (p.unit != "card" && p.unit != "GB" && p.unit != "drive")
    input_error(where, "'unit' must be card, GB or drive, got '{}'", p.unit);
  p.cny = p.currency == "USD" ? x * usd_cny : x;
  return p;
}

// 1-based line of byte offset `pos` in `text`.
std::size_t line_at(std::string_view text, std::size_t pos) {
  std::size_t line = 1;
  for (std::size_t i = 0; i < pos && i < text.size(); ++i) line += text[i] == '\n';
  return line;
}

}  // namespace

const Price& PriceTable::at(const std::string& key, std::string_view flag) const {
  const auto it = items.find(key);
  if (it == items.end()) input_error(flag, "{} has no price '{}'", origin, key);
  return it->second;
}

PriceTable parse_prices(std::string_view text, std::string_view where) {
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    input_error(fmt::format("{}:{}", where, line_at(text, e.byte ? e.byte - 1 : 0)),
                "not JSON ({})", e.what());
  } catch (const json::exception& e) {  // e.g. out_of_range: a number too large (found by fuzzing)
    input_error(where, "not JSON the table can hold ({})", e.what());
  }
  const std::string w(where);
  if (!doc.is_object()) input_error(w, "expected an object with 'currency', 'fx' and 'items'");
  for (auto it = doc.begin(); it != doc.end(); ++it)
    if (it.key() != "currency" && it.key() != "fx" && it.key() != "items" && it.key() != "note")
      input_error(w, "unknown key '{}' (expected currency, fx, items, note)", it.key());
  if (str_field(doc, "currency", w, true) != "CNY")
    input_error(w + ": currency", "the table's currency must be CNY (prices convert into it)");
  PriceTable t;
  t.origin = w;
  const auto fx = doc.find("fx");
  if (fx == doc.end() || !fx->is_object() || fx->size() != 1 || !fx->contains("USD"))
    input_error(w + ": fx", "expected {{ \"USD\": {{ value, source, date }} }} (CNY per USD)");
  t.fx = read_price((*fx)["USD"], w + ": fx.USD", 0, true);
  t.usd_cny = *t.fx.value;
  const auto items = doc.find("items");
  if (items == doc.end() || !items->is_object() || items->empty())
    input_error(w + ": items", "expected an object of prices");
  for (auto it = items->begin(); it != items->end(); ++it) {
    const std::string iw = fmt::format("{}: items.\"{}\"", w, it.key());
    const std::string& k = it.key();
    if (k != "dram_gb" && k != "ssd_drive" && (!k.starts_with("card/") || k.size() == 5))
      input_error(iw, "unknown item (expected card/<hw profile>, dram_gb, ssd_drive)");
    Price p = read_price(it.value(), iw, t.usd_cny, false);
    const char* unit = k == "dram_gb" ? "GB" : k == "ssd_drive" ? "drive" : "card";
    if (!p.unit.empty() && p.unit != unit) input_error(iw, "'unit' must be {} for this item", unit);
    p.unit = unit;
    t.items.emplace(k, std::move(p));
  }
  return t;
}

PriceTable load_prices(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) input_error("--prices", "cannot read '{}'", path);
  std::ostringstream s;
  s << f.rdbuf();
  return parse_prices(s.str(), path);
}

}  // namespace u3m::cli
