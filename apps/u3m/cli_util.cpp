#include "cli_util.hpp"

#include <algorithm>
#include <limits>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include "u3m/util/error.hpp"
#include "u3m/workload/rag.hpp"

namespace u3m::cli {

std::string machine() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return fmt::format("{}, {} cores", host, std::thread::hardware_concurrency());
}

std::vector<std::uint64_t> parse_size_list(std::string_view list, std::string_view where,
                                           std::uint64_t max_bytes) {
  std::vector<std::uint64_t> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    if (i == list.size() || list[i] == ',') {
      out.push_back(parse_size(list.substr(start, i - start),
                               fmt::format("{} item {}", where, out.size() + 1), max_bytes));
      start = i + 1;
    }
  }
  return out;
}

std::vector<std::uint64_t> parse_token_list(std::string_view list, std::string_view where) {
  std::vector<std::uint64_t> out;
  if (list.empty()) return out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = list.find(',', start);
    const std::string_view item =
        list.substr(start, comma == std::string_view::npos ? comma : comma - start);
    const auto v = parse_number<std::uint64_t>(item);
    if (!v || *v == 0)
      input_error(where, "item {}: '{}' is not a positive number of tokens", out.size() + 1, item);
    out.push_back(*v);
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

std::vector<std::string> parse_name_list(std::string_view list, std::string_view where,
                                         const std::vector<std::string>& known) {
  std::vector<std::string> out;
  for (std::size_t b = 0;;) {
    const std::size_t e = std::min(list.find(',', b), list.size());
    const std::string_view item = list.substr(b, e - b);
    if (std::find(known.begin(), known.end(), item) == known.end())
      input_error(where, "item {}: '{}' is not one of {}", out.size() + 1, item,
                  fmt::join(known, ", "));
    out.emplace_back(item);
    if (e == list.size()) return out;
    b = e + 1;
  }
}

namespace {

double spec_number(std::string_view v, std::string_view where) {
  const auto x = parse_number<double>(v);
  if (!x) input_error(where, "'{}' is not a finite number", v);
  return *x;
}

template <typename T>
T spec_count(std::string_view v, std::string_view where) {
  const auto x = parse_number<T>(v);
  if (!x)
    input_error(where, "'{}' is not a non-negative integer up to {}", v,
                std::numeric_limits<T>::max());
  return *x;
}

}  // namespace

workload::RagConfig parse_rag_spec(std::string_view spec) {
  workload::RagConfig c;
  if (!spec.starts_with("rag")) input_error("--requests", "'{}': expected rag or rag:KEY=V,...", spec);
  std::string_view rest = spec.substr(3);
  if (!rest.empty()) {
    if (rest.front() != ':') input_error("--requests", "'{}': expected rag or rag:KEY=V,...", spec);
    rest.remove_prefix(1);
  }
  for (bool more = !rest.empty(); more;) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    more = comma != std::string_view::npos;  // "k=v," ends in an empty item: an error
    rest = more ? rest.substr(comma + 1) : std::string_view{};
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      input_error("--requests", "'{}': expected KEY=V in '{}'", item, spec);
    const std::string_view k = item.substr(0, eq), v = item.substr(eq + 1);
    const std::string where = fmt::format("{}{}", workload::RagConfig::kSpecPrefix, k);
    if (k == "requests")
      c.requests = spec_count<std::uint32_t>(v, where);
    else if (k == "rate")
      c.rate_per_s = spec_number(v, where);
    else if (k == "system")
      c.system_tokens = spec_count<std::uint32_t>(v, where);
    else if (k == "corpus")
      c.corpus = spec_count<std::uint32_t>(v, where);
    else if (k == "passages")
      c.passages_per_request = spec_count<std::uint32_t>(v, where);
    else if (k == "zipf")
      c.zipf_s = spec_number(v, where);
    else if (k == "passage-len")
      c.passage = workload::LengthDist::parse(v, where);
    else if (k == "question-len")
      c.question = workload::LengthDist::parse(v, where);
    else if (k == "output-len")
      c.output = workload::LengthDist::parse(v, where);
    else if (k == "order") {
      if (v != "sorted" && v != "rank") input_error(where, "'{}': expected rank or sorted", v);
      c.sort_passages = v == "sorted";
    } else if (k == "turns")
      c.turns = spec_count<std::uint32_t>(v, where);
    else if (k == "seed")
      c.seed = spec_count<std::uint64_t>(v, where);
    else if (k == "system-prompts")
      c.system_prompts = spec_count<std::uint32_t>(v, where);
    else if (k == "system-zipf")
      c.system_zipf = spec_number(v, where);
    else if (k == "topics")
      c.topics = spec_count<std::uint32_t>(v, where);
    else if (k == "topic-zipf")
      c.topic_zipf = spec_number(v, where);
    else if (k == "rank-noise")
      c.rank_noise = spec_number(v, where);
    else
      input_error("--requests",
                  "unknown rag key '{}' (keys: requests, rate, system, system-prompts, "
                  "system-zipf, corpus, passages, zipf, topics, topic-zipf, rank-noise, "
                  "passage-len, question-len, output-len, order, turns, seed)",
                  k);
  }
  // 0 means "every arrival" with --arrivals-from, which a spec has not.
  if (c.requests == 0)
    input_error(fmt::format("{}requests", workload::RagConfig::kSpecPrefix), "must be >= 1");
  c.validate(workload::RagConfig::kSpecPrefix);
  return c;
}

std::string approx_bytes(double b) {
  const double a = b < 0 ? -b : b;
  if (a >= double(1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (a >= double(1ull << 20)) return fmt::format("{:.2f} MiB", b / double(1ull << 20));
  if (a >= 1024) return fmt::format("{:.1f} KiB", b / 1024);
  return fmt::format("{:.0f} B", b);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace u3m::cli
