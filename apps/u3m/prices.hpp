// The price table `u3m plan cost` reads (data/prices.json, docs/cost.md):
// every price with its source and the date it was found, or marked as not
// found, never invented. Parsed strictly: an unknown key, a price without a
// source or date, a bad number is an InputError naming the file and field.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace u3m::cli {

struct Price {
  std::optional<double> value;  // as written, in `currency` per `unit`; none: not found
  std::string currency;         // "CNY" or "USD" (with a value)
  std::string unit;             // "card", "GB", "drive"
  std::string source, date;     // where and when (YYYY-MM-DD); for "not found", where searched
  std::string note;
  double cny = 0;  // value in CNY (0 when not found)
};

struct PriceTable {
  std::string origin;         // the file it was read from
  double usd_cny = 0;         // exchange rate used for USD prices
  Price fx;                   // its source and date
  std::map<std::string, Price> items;  // "card/<hw profile>", "dram_gb", "ssd_drive"
  // The item, or an InputError naming `flag` when the table has no such key.
  const Price& at(const std::string& key, std::string_view flag) const;
};

PriceTable parse_prices(std::string_view text, std::string_view where);
PriceTable load_prices(const std::string& path);  // InputError naming the path

}  // namespace u3m::cli
