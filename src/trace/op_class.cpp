#include "u3m/trace/op_class.hpp"

#include <cctype>
#include <string>
#include <unordered_map>
#include <vector>

namespace u3m::trace {
namespace detail {
extern const char* const kOpClassesTsv;
}

namespace {

struct Rule {
  std::string pattern;  // lower-case
  bool attention = false;
  OpClass cls = OpClass::other;
};

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

// Glob match with '*' only; iterative with backtracking to the last star.
bool glob(std::string_view p, std::string_view s) {
  std::size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (pi < p.size() && p[pi] == s[si]) {
      ++pi, ++si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

std::vector<Rule> parse_rules() {
  // The table is checked at build time by tests; a bad line here is a
  // programming error, so it is skipped rather than thrown at users.
  std::vector<Rule> rules;
  std::string_view text = detail::kOpClassesTsv;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (line.empty() || line[0] == '#') continue;
    auto t1 = line.find('\t');
    if (t1 == std::string_view::npos) continue;
    auto t2 = line.find('\t', t1 + 1);
    std::string_view pat = line.substr(0, t1);
    std::string_view cls = line.substr(t1 + 1, t2 == std::string_view::npos ? line.npos : t2 - t1 - 1);
    Rule r{lower(pat)};
    if (cls == "attention") {
      r.attention = true;
    } else if (auto c = parse_op_class(cls)) {
      r.cls = *c;
    } else {
      continue;
    }
    rules.push_back(std::move(r));
  }
  return rules;
}

const std::vector<Rule>& rules() {
  static const std::vector<Rule> r = parse_rules();
  return r;
}

}  // namespace

std::size_t op_class_rule_count() { return rules().size(); }

OpClass classify_op(std::string_view name, Phase phase) {
  // Importers classify the same few hundred names many times; cache per thread.
  thread_local std::unordered_map<std::string, const Rule*> cache;
  std::string key = lower(name);
  const Rule* hit = nullptr;
  if (auto it = cache.find(key); it != cache.end()) {
    hit = it->second;
  } else {
    for (const Rule& r : rules())
      if (glob(r.pattern, key)) {
        hit = &r;
        break;
      }
    cache.emplace(std::move(key), hit);
  }
  if (!hit) return OpClass::other;
  if (hit->attention) return phase == Phase::decode ? OpClass::attn_decode : OpClass::attn_prefill;
  return hit->cls;
}

}  // namespace u3m::trace
