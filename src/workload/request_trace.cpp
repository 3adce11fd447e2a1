// Request traces: the u3m format, Mooncake and Azure importers, prefix-sharing
// analysis. The format and the rules are in docs/requests.md.
#include "u3m/workload/request_trace.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <simdjson.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "u3m/util/error.hpp"
#include "u3m/util/file.hpp"
#include "u3m/util/output_file.hpp"

namespace u3m::workload {

namespace sj = simdjson;

std::uint64_t ServeRequest::prompt_tokens() const {
  std::uint64_t n = 0;
  for (const PromptSegment& s : prompt) n += s.tokens;
  return n;
}

std::string_view to_string(RequestFormat f) {
  switch (f) {
    case RequestFormat::u3m:
      return "u3m";
    case RequestFormat::mooncake:
      return "mooncake";
    case RequestFormat::azure_csv:
      return "azure";
  }
  return "?";
}

std::optional<RequestFormat> parse_request_format(std::string_view s) {
  for (RequestFormat f : {RequestFormat::u3m, RequestFormat::mooncake, RequestFormat::azure_csv})
    if (s == to_string(f)) return f;
  return std::nullopt;
}

namespace {

constexpr std::string_view kAzureHeader = "TIMESTAMP,ContextTokens,GeneratedTokens";

std::string_view trim(std::string_view s) {
  if (s.starts_with("\xEF\xBB\xBF")) s.remove_prefix(3);  // a UTF-8 byte-order mark
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

std::optional<RequestFormat> detect_request_format(std::string_view first_line) {
  std::string_view t = trim(first_line);
  if (t == kAzureHeader) return RequestFormat::azure_csv;
  if (!t.starts_with('{')) return std::nullopt;
  sj::dom::parser parser;
  sj::padded_string padded(t);
  sj::dom::object obj;
  if (parser.parse(padded).get_object().get(obj)) return std::nullopt;
  for (auto [key, value] : obj) {
    if (key == "timestamp_ms" || key == "prompt") return RequestFormat::u3m;
    if (key == "hash_ids" || key == "input_length") return RequestFormat::mooncake;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- line parsers

namespace {

// Errors name "source:line: field 'f': what".
struct Where {
  std::string source;
  std::uint64_t line = 0;

  template <typename... Args>
  [[noreturn]] void fail(std::string_view field, fmt::format_string<Args...> f,
                         Args&&... args) const {
    const std::string what = fmt::format(f, std::forward<Args>(args)...);
    if (field.empty()) input_error(fmt::format("{}:{}", source, line), "{}", what);
    input_error(fmt::format("{}:{}", source, line), "field '{}': {}", field, what);
  }
};

// One format's lines. parse() returns nullopt for a line that is not a
// request (the CSV header).
class LineParser {
 public:
  explicit LineParser(const Where& w) : w_(w) {}
  virtual ~LineParser() = default;
  // `line` has simdjson padding available past its size.
  virtual std::optional<ServeRequest> parse(std::string_view line) = 0;
  virtual std::string_view timestamp_field() const = 0;
  virtual std::string_view prompt_field() const = 0;
  virtual std::string segment_field(std::size_t i) const = 0;

 protected:
  const Where& w_;
};

// ---- JSON helpers shared by the u3m and Mooncake parsers

class JsonFields {
 public:
  explicit JsonFields(const Where& w) : w_(w) {}

  sj::dom::element parse_object_line(std::string_view line) {
    sj::dom::element doc;
    if (auto err = parser_.parse(line.data(), line.size(), false).get(doc))
      w_.fail("", "invalid JSON: {}", sj::error_message(err));
    if (!doc.is_object()) w_.fail("", "expected a JSON object");
    return doc;
  }
  // A finite number >= 0.
  double timestamp(sj::dom::element e, std::string_view f) const {
    double d;
    if (e.get_double().get(d)) w_.fail(f, "expected a number of milliseconds");
    if (!std::isfinite(d) || d < 0) w_.fail(f, "must be a finite number >= 0, got {}", d);
    return d;
  }
  // An integer in [1, 2^32 - 1].
  std::uint32_t count(sj::dom::element e, std::string_view f) const {
    std::int64_t i;
    if (e.get_int64().get(i)) {
      std::uint64_t u;
      if (e.get_uint64().get(u)) w_.fail(f, "expected an integer");
      w_.fail(f, "value {} out of range (1 to 4294967295)", u);
    }
    if (i < 1 || i > UINT32_MAX) w_.fail(f, "value {} out of range (1 to 4294967295)", i);
    return static_cast<std::uint32_t>(i);
  }

 private:
  const Where& w_;
  sj::dom::parser parser_;
};

// Which of `known` keys appear; a repeated key is an error, an unknown one an
// error only when `strict`.
template <std::size_t N>
std::array<std::optional<sj::dom::element>, N> fields(sj::dom::object o,
                                                      const std::array<std::string_view, N>& known,
                                                      bool strict, const Where& w,
                                                      std::string_view prefix) {
  std::array<std::optional<sj::dom::element>, N> out;
  for (auto [key, value] : o) {
    std::size_t i = 0;
    while (i < N && known[i] != key) ++i;
    if (i == N) {
      if (strict) w.fail(fmt::format("{}{}", prefix, key), "unknown field");
      continue;
    }
    if (out[i]) w.fail(fmt::format("{}{}", prefix, key), "repeated");
    out[i] = value;
  }
  return out;
}

class U3mParser final : public LineParser {
 public:
  explicit U3mParser(const Where& w) : LineParser(w), json_(w) {}

  std::optional<ServeRequest> parse(std::string_view line) override {
    sj::dom::object o = json_.parse_object_line(line).get_object().value_unsafe();
    static constexpr std::array<std::string_view, 4> kKnown = {"timestamp_ms", "output_tokens",
                                                               "prompt", "session"};
    auto f = fields(o, kKnown, true, w_, "");
    for (std::size_t i = 0; i < 3; ++i)
      if (!f[i]) w_.fail(kKnown[i], "missing");
    ServeRequest r;
    r.timestamp_ms = json_.timestamp(*f[0], kKnown[0]);
    r.output_tokens = json_.count(*f[1], kKnown[1]);
    sj::dom::array prompt;
    if (f[2]->get_array().get(prompt)) w_.fail("prompt", "expected an array of segments");
    if (prompt.size() == 0) w_.fail("prompt", "empty: a request needs at least one segment");
    static constexpr std::array<std::string_view, 2> kSeg = {"id", "tokens"};
    std::size_t i = 0;
    for (sj::dom::element seg : prompt) {
      const std::string here = fmt::format("prompt[{}]", i);
      sj::dom::object so;
      if (seg.get_object().get(so)) w_.fail(here, "expected an object {{\"id\", \"tokens\"}}");
      auto sf = fields(so, kSeg, true, w_, here + ".");
      if (!sf[0]) w_.fail(here + ".id", "missing");
      if (!sf[1]) w_.fail(here + ".tokens", "missing");
      std::string_view id;
      if (sf[0]->get_string().get(id)) w_.fail(here + ".id", "expected a string");
      if (id.empty()) w_.fail(here + ".id", "empty");
      r.prompt.push_back({std::string(id), json_.count(*sf[1], here + ".tokens")});
      ++i;
    }
    if (auto s = f[3]) {
      std::string_view sv;
      if (s->get_string().get(sv)) w_.fail("session", "expected a string");
      r.session = sv;
    }
    return r;
  }
  std::string_view timestamp_field() const override { return "timestamp_ms"; }
  std::string_view prompt_field() const override { return "prompt"; }
  std::string segment_field(std::size_t i) const override {
    return fmt::format("prompt[{}].tokens", i);
  }

 private:
  JsonFields json_;
};

// Note [Mooncake block fitting]
// Mooncake's hash_ids name the prompt's 512-token blocks, so a line should
// have ceil(input_length / 512) ids; the last block holds the remainder. The
// published traces always do (checked on all 16,024 lines of the conversation
// and synthetic traces), so a mismatch is an error by default. With
// MooncakeMismatch::fit a line is fitted so that its tokens still sum to
// input_length:
//  * too many ids: the ids past the last needed block are dropped;
//  * too few ids: the last id absorbs every token past the earlier blocks,
//    so it may hold more than 512;
//  * no ids at all: one segment "mc:line:<line number>", unique to the line.
// A fitted id must still have one token count wherever it appears.
class MooncakeParser final : public LineParser {
 public:
  MooncakeParser(const Where& w, std::uint32_t block, MooncakeMismatch mismatch)
      : LineParser(w), json_(w), block_(block), mismatch_(mismatch) {
    if (block_ == 0) input_error("mooncake block tokens", "must be >= 1");
  }

  std::optional<ServeRequest> parse(std::string_view line) override {
    sj::dom::object o = json_.parse_object_line(line).get_object().value_unsafe();
    // Unknown keys are ignored: a third-party format may grow fields.
    static constexpr std::array<std::string_view, 4> kKnown = {"timestamp", "input_length",
                                                               "output_length", "hash_ids"};
    auto f = fields(o, kKnown, false, w_, "");
    for (std::size_t i = 0; i < 4; ++i)
      if (!f[i]) w_.fail(kKnown[i], "missing");
    ServeRequest r;
    r.timestamp_ms = json_.timestamp(*f[0], "timestamp");
    const std::uint32_t input = json_.count(*f[1], "input_length");
    r.output_tokens = json_.count(*f[2], "output_length");
    sj::dom::array ids;
    if (f[3]->get_array().get(ids)) w_.fail("hash_ids", "expected an array of integers");
    hashes_.clear();
    for (sj::dom::element h : ids) {
      std::uint64_t v;
      if (h.get_uint64().get(v))
        w_.fail(fmt::format("hash_ids[{}]", hashes_.size()), "expected an integer >= 0");
      hashes_.push_back(v);
    }
    const std::uint64_t need = (std::uint64_t{input} + block_ - 1) / block_;
    std::size_t use = hashes_.size();
    if (hashes_.size() != need) {
      if (mismatch_ == MooncakeMismatch::error)
        w_.fail("hash_ids",
                "{} ids, but input_length {} needs {} blocks of {} tokens (import with "
                "--mooncake-mismatch fit to accept it, docs/requests.md)",
                hashes_.size(), input, need, block_);
      if (hashes_.empty()) {
        r.prompt.push_back({fmt::format("mc:line:{}", w_.line), input});
        return r;
      }
      use = std::min<std::size_t>(hashes_.size(), need);
    }
    std::uint32_t left = input;
    for (std::size_t i = 0; i < use; ++i) {
      const std::uint32_t t = i + 1 == use ? left : block_;
      r.prompt.push_back({fmt::format("mc:{}", hashes_[i]), t});
      left -= t;
    }
    return r;
  }
  std::string_view timestamp_field() const override { return "timestamp"; }
  std::string_view prompt_field() const override { return "input_length"; }
  std::string segment_field(std::size_t i) const override { return fmt::format("hash_ids[{}]", i); }

 private:
  JsonFields json_;
  std::uint32_t block_;
  MooncakeMismatch mismatch_;
  std::vector<std::uint64_t> hashes_;
};

// "YYYY-MM-DD HH:MM:SS[.fraction][Z|+HH:MM|-HH:MM]" (also 'T' between date
// and time), years 1970-2200, to nanoseconds since 1970 UTC; nullopt if
// malformed or out of range.
std::optional<std::int64_t> parse_datetime_ns(std::string_view s) {
  auto num = [&](std::size_t pos, std::size_t len, int& out) {
    if (pos + len > s.size()) return false;
    auto [p, ec] = std::from_chars(s.data() + pos, s.data() + pos + len, out);
    return ec == std::errc() && p == s.data() + pos + len;
  };
  int y, mo, d, h, mi, sec;
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || (s[10] != ' ' && s[10] != 'T') ||
      s[13] != ':' || s[16] != ':')
    return std::nullopt;
  if (!num(0, 4, y) || !num(5, 2, mo) || !num(8, 2, d) || !num(11, 2, h) || !num(14, 2, mi) ||
      !num(17, 2, sec))
    return std::nullopt;
  // Years 1970-2200 keep nanoseconds, and differences of two of them, in 63 bits.
  if (y < 1970 || y > 2200 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
    return std::nullopt;
  std::size_t pos = 19;
  std::int64_t frac_ns = 0;
  if (pos < s.size() && s[pos] == '.') {
    ++pos;
    std::int64_t scale = 100'000'000;
    const std::size_t start = pos;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
      if (pos - start >= 9) return std::nullopt;  // finer than 1 ns
      frac_ns += (s[pos] - '0') * scale;
      scale /= 10;
      ++pos;
    }
    if (pos == start) return std::nullopt;
  }
  std::int64_t offset_s = 0;
  if (pos < s.size()) {
    if (s.substr(pos) == "Z") {
      pos = s.size();
    } else if ((s[pos] == '+' || s[pos] == '-') && s.size() - pos == 6 && s[pos + 3] == ':') {
      int oh, om;
      if (!num(pos + 1, 2, oh) || !num(pos + 4, 2, om) || oh > 23 || om > 59) return std::nullopt;
      offset_s = (s[pos] == '+' ? 1 : -1) * (oh * 3600 + om * 60);
      pos = s.size();
    } else {
      return std::nullopt;
    }
  }
  // Days from the civil date (H. Hinnant's algorithm, proleptic Gregorian).
  const int yy = y - (mo <= 2);
  const int era = yy / 400;
  const int yoe = yy - era * 400;
  const int doy = (153 * (mo + (mo > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  const std::int64_t days = std::int64_t{era} * 146097 + doe - 719468;
  const std::int64_t secs = days * 86400 + h * 3600 + mi * 60 + sec - offset_s;
  return secs * 1'000'000'000 + frac_ns;
}

// The Azure LLM inference CSV. It has no prefix information, so each request
// is one segment unique to it ("az:<request index>").
class AzureParser final : public LineParser {
 public:
  explicit AzureParser(const Where& w) : LineParser(w) {}

  std::optional<ServeRequest> parse(std::string_view line) override {
    line = trim(line);
    if (!seen_header_) {
      if (line != kAzureHeader) w_.fail("", "expected the CSV header \"{}\"", kAzureHeader);
      seen_header_ = true;
      return std::nullopt;
    }
    std::string_view col[3];
    std::size_t n = 0, pos = 0;
    while (true) {
      const std::size_t comma = line.find(',', pos);
      if (n == 3) w_.fail("", "expected 3 comma-separated columns ({}), got more", kAzureHeader);
      col[n++] = trim(line.substr(pos, comma == std::string_view::npos ? comma : comma - pos));
      if (comma == std::string_view::npos) break;
      pos = comma + 1;
    }
    if (n != 3) w_.fail("", "expected 3 comma-separated columns ({}), got {}", kAzureHeader, n);
    const auto ns = parse_datetime_ns(col[0]);
    if (!ns)
      w_.fail("TIMESTAMP",
              "\"{}\" is not a date-time YYYY-MM-DD HH:MM:SS[.fraction] (years 1970-2200)", col[0]);
    if (!first_ns_) first_ns_ = *ns;
    ServeRequest r;
    // Milliseconds from the first line; exact in a double to well below 1 us
    // for traces shorter than a few years.
    r.timestamp_ms = static_cast<double>(*ns - *first_ns_) / 1e6;
    const std::uint32_t context = count(col[1], "ContextTokens");
    r.output_tokens = count(col[2], "GeneratedTokens");
    r.prompt.push_back({fmt::format("az:{}", index_++), context});
    return r;
  }
  std::string_view timestamp_field() const override { return "TIMESTAMP"; }
  std::string_view prompt_field() const override { return "ContextTokens"; }
  std::string segment_field(std::size_t) const override { return "ContextTokens"; }

 private:
  std::uint32_t count(std::string_view s, std::string_view field) const {
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size() || s.empty())
      w_.fail(field, "\"{}\" is not a non-negative integer", s);
    if (v < 1 || v > UINT32_MAX) w_.fail(field, "value {} out of range (1 to 4294967295)", v);
    return static_cast<std::uint32_t>(v);
  }

  bool seen_header_ = false;
  std::optional<std::int64_t> first_ns_;
  std::uint64_t index_ = 0;
};

}  // namespace

// ---------------------------------------------------------------- the stream

struct RequestStream::Impl {
  Impl(std::istream& in, std::string source, ImportOptions o)
      : in(in), opt(o), where{std::move(source), 0} {}

  std::istream& in;
  ImportOptions opt;
  Where where;
  std::string buf;
  std::unique_ptr<LineParser> parser;
  std::optional<RequestFormat> format;
  double prev_ms = -1;
  // Segment id -> (tokens, first line): an id names content, so its length is fixed.
  std::unordered_map<std::string, std::pair<std::uint32_t, std::uint64_t>> lengths;

  // The next non-blank line, with simdjson padding reserved past its end.
  bool read_line(std::string_view& line) {
    while (std::getline(in, buf)) {
      ++where.line;
      if (!buf.empty() && buf.back() == '\r') buf.pop_back();
      if (buf.find_first_not_of(" \t") == std::string::npos) continue;
      buf.reserve(buf.size() + sj::SIMDJSON_PADDING);
      line = buf;
      return true;
    }
    if (in.bad()) where.fail("", "read error");
    return false;
  }

  void start(std::string_view first) {
    format = opt.format ? opt.format : detect_request_format(first);
    if (!format)
      where.fail("",
                 "cannot tell the request format: expected a u3m request "
                 "({{\"timestamp_ms\", \"output_tokens\", \"prompt\"}}), a Mooncake line "
                 "({{\"timestamp\", \"input_length\", \"output_length\", \"hash_ids\"}}) or the "
                 "Azure CSV header {}; or name it with --format",
                 kAzureHeader);
    switch (*format) {
      case RequestFormat::u3m:
        parser = std::make_unique<U3mParser>(where);
        break;
      case RequestFormat::mooncake:
        parser = std::make_unique<MooncakeParser>(where, opt.mooncake_block_tokens,
                                                  opt.mooncake_mismatch);
        break;
      case RequestFormat::azure_csv:
        parser = std::make_unique<AzureParser>(where);
        break;
    }
  }

  // The checks every format shares.
  void check(const ServeRequest& r) {
    if (opt.require_sorted && r.timestamp_ms < prev_ms)
      where.fail(parser->timestamp_field(),
                 "timestamps must not decrease: {} ms after {} ms (import with --sort to sort)",
                 r.timestamp_ms, prev_ms);
    prev_ms = std::max(prev_ms, r.timestamp_ms);
    if (r.prompt_tokens() > UINT32_MAX)
      where.fail(parser->prompt_field(), "prompt of {} tokens: more than 2^32 - 1",
                 r.prompt_tokens());
    for (std::size_t i = 0; i < r.prompt.size(); ++i) {
      const PromptSegment& s = r.prompt[i];
      auto [it, fresh] = lengths.try_emplace(s.id, s.tokens, where.line);
      if (!fresh && it->second.first != s.tokens)
        where.fail(parser->segment_field(i),
                   "segment \"{}\" has {} tokens here but {} at line {} (equal ids must mean "
                   "equal content)",
                   s.id, s.tokens, it->second.first, it->second.second);
    }
  }

  std::optional<ServeRequest> next() {
    std::string_view line;
    while (read_line(line)) {
      if (!parser) start(line);
      if (auto r = parser->parse(line)) {
        check(*r);
        return r;
      }
    }
    return std::nullopt;
  }
};

RequestStream::RequestStream(std::istream& in, std::string source, ImportOptions opt)
    : impl_(std::make_unique<Impl>(in, std::move(source), opt)) {}
RequestStream::~RequestStream() = default;
std::optional<ServeRequest> RequestStream::next() {
  return impl_->next();
}
std::optional<RequestFormat> RequestStream::format() const {
  return impl_->format;
}
std::uint64_t RequestStream::line() const {
  return impl_->where.line;
}

RequestFile::RequestFile(const std::string& path, ImportOptions opt) {
  require_regular_file(path);
  if (is_gzip_file(path)) {
    in_ = std::make_unique<std::istringstream>(read_file(path));
  } else {
    auto f = std::make_unique<std::ifstream>(path, std::ios::binary);
    if (!*f) input_error(path, "cannot open");
    in_ = std::move(f);
  }
  stream_ = std::make_unique<RequestStream>(*in_, path, opt);
}
RequestFile::~RequestFile() = default;

namespace {
std::vector<ServeRequest> drain(RequestStream& s) {
  std::vector<ServeRequest> out;
  while (auto r = s.next()) out.push_back(std::move(*r));
  return out;
}
}  // namespace

std::vector<ServeRequest> load_requests(const std::string& path, const ImportOptions& opt) {
  RequestFile f(path, opt);
  return drain(f.stream());
}

std::vector<ServeRequest> parse_requests(std::string_view text, std::string_view source,
                                         const ImportOptions& opt) {
  std::istringstream in{std::string(text)};
  RequestStream s(in, std::string(source), opt);
  return drain(s);
}

void sort_by_timestamp(std::vector<ServeRequest>& requests) {
  std::stable_sort(
      requests.begin(), requests.end(),
      [](const ServeRequest& a, const ServeRequest& b) { return a.timestamp_ms < b.timestamp_ms; });
  // Only an unsorted Azure trace, timed from its first line, has times below 0.
  if (!requests.empty() && requests.front().timestamp_ms < 0) {
    const double shift = -requests.front().timestamp_ms;
    for (ServeRequest& r : requests) r.timestamp_ms += shift;
  }
}

// ---------------------------------------------------------------- writer

namespace {
std::string quote(std::string_view s) {
  return nlohmann::json(std::string(s)).dump();
}
}  // namespace

std::string to_json_line(const ServeRequest& r) {
  std::string s = fmt::format(R"({{"timestamp_ms":{},"output_tokens":{},"prompt":[)",
                              r.timestamp_ms, r.output_tokens);
  for (std::size_t i = 0; i < r.prompt.size(); ++i)
    fmt::format_to(std::back_inserter(s), R"({}{{"id":{},"tokens":{}}})", i ? "," : "",
                   quote(r.prompt[i].id), r.prompt[i].tokens);
  s += ']';
  if (!r.session.empty())
    fmt::format_to(std::back_inserter(s), R"(,"session":{})", quote(r.session));
  s += '}';
  return s;
}

RequestWriter::RequestWriter(const std::string& path) : file_(std::make_unique<OutputFile>(path)) {}
RequestWriter::~RequestWriter() = default;

void RequestWriter::write(const ServeRequest& r) {
  buf_ += to_json_line(r);
  buf_ += '\n';
  ++written_;
  if (buf_.size() > (1 << 20)) {
    file_->write(buf_.data(), buf_.size());
    buf_.clear();
  }
}

void RequestWriter::finish() {
  file_->write(buf_.data(), buf_.size());
  buf_.clear();
  file_->commit();
}

std::vector<Request> to_requests(const std::vector<ServeRequest>& requests) {
  std::vector<Request> out;
  out.reserve(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const ServeRequest& r = requests[i];
    Request q;
    q.id = i;
    q.arrival_ns = static_cast<std::uint64_t>(std::llround(r.timestamp_ms * 1e6));
    q.prompt_tokens = static_cast<std::uint32_t>(r.prompt_tokens());
    q.output_tokens = r.output_tokens;
    out.push_back(q);
  }
  return out;
}

// ---------------------------------------------------------------- prefix sharing

std::vector<std::uint64_t> chain_keys(const ServeRequest& r) {
  std::vector<std::uint64_t> keys;
  keys.reserve(r.prompt.size());
  std::uint64_t parent = 0;
  for (const PromptSegment& s : r.prompt) {
    parent = XXH64(s.id.data(), s.id.size(), parent);
    keys.push_back(parent);
  }
  return keys;
}

PrefixCache::PrefixCache(std::optional<std::uint64_t> capacity_tokens)
    : capacity_(capacity_tokens) {}

std::uint64_t PrefixCache::access(const ServeRequest& r, const std::vector<std::uint64_t>& keys) {
  std::uint64_t hit = 0;
  for (std::size_t i = 0; i < keys.size() && where_.contains(keys[i]); ++i)
    hit += r.prompt[i].tokens;
  // Last segment first, so the prefix ends up most recent (Note [Ideal prefix cache]).
  for (std::size_t i = keys.size(); i-- > 0;) {
    auto it = where_.find(keys[i]);
    if (it != where_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
    } else {
      lru_.push_front({keys[i], r.prompt[i].tokens});
      where_.emplace(keys[i], lru_.begin());
      resident_ += r.prompt[i].tokens;
    }
  }
  while (capacity_ && resident_ > *capacity_) {
    const Entry& e = lru_.back();
    resident_ -= e.tokens;
    where_.erase(e.key);
    lru_.pop_back();
  }
  return hit;
}

Distribution Distribution::of(std::vector<std::uint64_t> v) {
  Distribution d;
  d.count = v.size();
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (std::uint64_t x : v) sum += static_cast<double>(x);
  d.mean = sum / static_cast<double>(v.size());
  // Nearest rank: the smallest value with at least p% of values at or below it.
  auto rank = [&](double p) {
    const auto k = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
    return v[std::max<std::size_t>(k, 1) - 1];
  };
  d.min = v.front();
  d.p50 = rank(50);
  d.p90 = rank(90);
  d.p99 = rank(99);
  d.max = v.back();
  return d;
}

RequestStats::RequestStats(std::vector<std::uint64_t> lru_capacities_tokens) {
  caches_.emplace_back(std::nullopt);
  for (std::uint64_t c : lru_capacities_tokens) caches_.emplace_back(c);
  hits_.assign(caches_.size(), 0);
  hit_requests_.assign(caches_.size(), 0);
}

void RequestStats::add(const ServeRequest& r) {
  if (prompt_.empty()) first_ms_ = r.timestamp_ms;
  last_ms_ = r.timestamp_ms;
  const std::uint64_t p = r.prompt_tokens();
  prompt_.push_back(p);
  output_.push_back(r.output_tokens);
  segments_.push_back(r.prompt.size());
  total_prompt_ += p;
  total_output_ += r.output_tokens;
  for (const PromptSegment& s : r.prompt) segment_ids_.insert(s.id);
  if (!r.session.empty()) sessions_.insert(r.session);
  const std::vector<std::uint64_t> keys = chain_keys(r);
  for (std::size_t i = 0; i < caches_.size(); ++i) {
    const std::uint64_t hit = caches_[i].access(r, keys);
    hits_[i] += hit;
    hit_requests_[i] += hit > 0;
  }
}

RequestStatsReport RequestStats::report() const {
  RequestStatsReport rep;
  rep.requests = prompt_.size();
  rep.first_ms = first_ms_;
  rep.last_ms = last_ms_;
  if (last_ms_ > first_ms_)
    rep.rate_per_s = static_cast<double>(rep.requests - 1) / ((last_ms_ - first_ms_) / 1e3);
  rep.prompt_tokens = Distribution::of(prompt_);
  rep.output_tokens = Distribution::of(output_);
  rep.segments = Distribution::of(segments_);
  rep.total_prompt_tokens = total_prompt_;
  rep.total_output_tokens = total_output_;
  rep.distinct_segments = segment_ids_.size();
  rep.distinct_prefix_tokens = caches_[0].resident_tokens();
  rep.sessions = sessions_.size();
  for (std::size_t i = 0; i < caches_.size(); ++i) {
    CacheResult c;
    c.capacity_tokens = caches_[i].capacity();
    c.hit_tokens = hits_[i];
    c.requests_with_hit = hit_requests_[i];
    c.hit_rate = total_prompt_ ? static_cast<double>(hits_[i]) / total_prompt_ : 0;
    rep.caches.push_back(c);
  }
  return rep;
}

}  // namespace u3m::workload
