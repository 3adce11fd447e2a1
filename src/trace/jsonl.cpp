// The JSON-lines trace format; fields in docs/trace-format.md.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>
#include <simdjson.h>
#include <nlohmann/json.hpp>

#include "u3m/trace/io.hpp"
#include "u3m/trace/op_class.hpp"
#include "u3m/util/error.hpp"
#include "u3m/util/output_file.hpp"

namespace u3m::trace {

// ---------------------------------------------------------------- writer

struct JsonlWriter::Impl {
  explicit Impl(const std::string& path) : file(path) {}
  OutputFile file;
  std::string buf;

  void flush() {
    file.write(buf.data(), buf.size());
    buf.clear();
  }
  void line(std::string_view s) {
    buf.append(s);
    buf.push_back('\n');
    if (buf.size() > (1 << 20)) flush();
  }
};

namespace {
std::string quote(std::string_view s) {
  return nlohmann::json(std::string(s)).dump();
}
}  // namespace

JsonlWriter::JsonlWriter(const std::string& path) : impl_(std::make_unique<Impl>(path)) {
  impl_->line(R"({"u3m_trace": 1})");
}

JsonlWriter::~JsonlWriter() = default;

void JsonlWriter::meta(std::string_view key, std::string_view value) {
  impl_->line(fmt::format(R"({{"meta": {{"key": {}, "value": {}}}}})", quote(key), quote(value)));
}
void JsonlWriter::job(std::string_view name) {
  impl_->line(fmt::format(R"({{"job": {}}})", quote(name)));
}
void JsonlWriter::tensor(const Tensor& t) {
  impl_->line(fmt::format(
      R"({{"tensor": {{"name": {}, "id": "{:016x}", "bytes": {}, "dtype": "{}", "role": "{}", "layer": {}, "job": {}}}}})",
      quote(t.name), t.id, t.bytes, to_string(t.dtype), to_string(t.role), t.layer, t.job));
}
void JsonlWriter::op(const Op& o) {
  impl_->line(fmt::format(
      R"({{"op": {{"name": {}, "class": "{}", "phase": "{}", "job": {}, "iteration": {}, "layer": {}, "flops": {}, "bytes": {}}}}})",
      quote(o.name), to_string(o.cls), to_string(o.phase), o.job, o.iteration, o.layer, o.flops,
      o.bytes));
}
void JsonlWriter::event(const Event& e) {
  impl_->line(fmt::format(R"({{"event": {{"t": {}, "op": {}, "tensor": {}, "kind": "{}"}}}})",
                          e.time_ns, e.op, e.tensor, to_string(e.kind)));
}
void JsonlWriter::finish() {
  impl_->flush();
  impl_->file.commit();
}

// ---------------------------------------------------------------- reader

namespace {

namespace sj = simdjson;

// One line's record, with errors that name file, line and field.
class LineReader {
 public:
  LineReader(std::string_view source, TraceSink& out) : source_(source), out_(out) {}

  void line(std::string_view text, std::uint64_t lineno, sj::dom::parser& parser) {
    lineno_ = lineno;
    sj::dom::element doc;
    if (auto err = parser.parse(text.data(), text.size(), false).get(doc))
      fail("", fmt::format("invalid JSON: {}", sj::error_message(err)));
    sj::dom::object obj;
    if (doc.get_object().get(obj)) fail("", "expected a JSON object");
    if (!seen_header_) return header(obj);
    if (obj.size() != 1) fail("", "expected exactly one record key (meta, job, tensor, op, event)");
    auto [key, value] = *obj.begin();
    if (key == "event") return event(value);
    if (key == "tensor") return tensor(value);
    if (key == "op") return op(value);
    if (key == "job") return job(value);
    if (key == "meta") return meta(value);
    if (key == "u3m_trace") fail("u3m_trace", "header repeated");
    fail(key, "unknown record type");
  }

  void finish() {
    if (!seen_header_) fail("", "empty file: missing header line {\"u3m_trace\": 1}");
    out_.finish();
  }

 private:
  [[noreturn]] void fail(std::string_view field, std::string_view what) const {
    if (field.empty()) input_error(fmt::format("{}:{}", source_, lineno_), "{}", what);
    input_error(fmt::format("{}:{}", source_, lineno_), "field '{}': {}", field, what);
  }

  void header(sj::dom::object obj) {
    std::int64_t v;
    if (obj["u3m_trace"].get_int64().get(v))
      fail("u3m_trace", "not a u3m JSONL trace: the first line must be {\"u3m_trace\": 1}");
    if (v != 1) fail("u3m_trace", fmt::format("unsupported version {} (this build reads 1)", v));
    seen_header_ = true;
  }

  // The record's object; a field outside `known` is an error, not ignored,
  // so a misspelt optional field cannot silently take its default.
  sj::dom::object object(sj::dom::element e, std::string_view name,
                         std::initializer_list<std::string_view> known) const {
    sj::dom::object o;
    if (e.get_object().get(o)) fail(name, "expected an object");
    for (auto [key, value] : o) {
      bool ok = false;
      for (auto k : known) ok = ok || key == k;
      if (!ok) fail(key, fmt::format("unknown field of a {} record", name));
    }
    return o;
  }
  std::uint32_t job_index(sj::dom::object o) const {
    if (jobs_ == 0) fail("job", "no job declared before this record");
    return static_cast<std::uint32_t>(uint(o, "job", 0, jobs_));
  }
  std::string_view req_str(sj::dom::object o, std::string_view f) const {
    std::string_view s;
    auto el = o[f];
    if (el.error() == sj::NO_SUCH_FIELD) fail(f, "missing");
    if (el.get_string().get(s)) fail(f, "expected a string");
    return s;
  }
  // Optional non-negative integer below `limit`; `def` when absent.
  std::uint64_t uint(sj::dom::object o, std::string_view f, std::uint64_t def, std::uint64_t limit,
                     bool required = false) const {
    auto el = o[f];
    if (el.error() == sj::NO_SUCH_FIELD) {
      if (required) fail(f, "missing");
      return def;
    }
    std::int64_t i;
    std::uint64_t u;
    if (!el.get_int64().get(i)) {
      if (i < 0) fail(f, fmt::format("must be non-negative, got {}", i));
      u = static_cast<std::uint64_t>(i);
    } else if (el.get_uint64().get(u)) {
      fail(f, "expected an integer");
    }
    if (u >= limit) fail(f, fmt::format("value {} out of range (< {})", u, limit));
    return u;
  }
  std::int32_t layer(sj::dom::object o) const {
    auto el = o["layer"];
    if (el.error() == sj::NO_SUCH_FIELD) return kNoLayer;
    std::int64_t i;
    if (el.get_int64().get(i)) fail("layer", "expected an integer");
    if (i < -1 || i > INT32_MAX)
      fail("layer", fmt::format("value {} out of range (-1 or more)", i));
    return static_cast<std::int32_t>(i);
  }
  template <typename E>
  E enum_field(sj::dom::object o, std::string_view f, E def,
               std::optional<E> (*parse)(std::string_view), bool required = false) const {
    auto el = o[f];
    if (el.error() == sj::NO_SUCH_FIELD) {
      if (required) fail(f, "missing");
      return def;
    }
    std::string_view s;
    if (el.get_string().get(s)) fail(f, "expected a string");
    auto v = parse(s);
    if (!v) fail(f, fmt::format("unknown value \"{}\"", s));
    return *v;
  }

  void meta(sj::dom::element e) {
    auto o = object(e, "meta", {"key", "value"});
    out_.meta(req_str(o, "key"), req_str(o, "value"));
  }
  void job(sj::dom::element e) {
    std::string_view s;
    if (e.get_string().get(s)) fail("job", "expected a string");
    out_.job(s);
    ++jobs_;
  }
  void tensor(sj::dom::element e) {
    auto o = object(e, "tensor", {"name", "id", "bytes", "dtype", "role", "layer", "job"});
    Tensor t;
    t.name = std::string(req_str(o, "name"));
    t.id = stable_id(t.name);
    if (auto id = o["id"]; id.error() != sj::NO_SUCH_FIELD) {
      std::string_view s;
      if (id.get_string().get(s)) fail("id", "expected a string of 16 hex digits");
      if (s != fmt::format("{:016x}", t.id))
        fail("id", fmt::format("\"{}\" is not xxh64 of the name ({:016x})", s, t.id));
    }
    t.bytes = uint(o, "bytes", 0, UINT64_MAX, true);
    t.dtype = enum_field(o, "dtype", DType::other, parse_dtype);
    t.role = enum_field(o, "role", Role::other, parse_role);
    t.layer = layer(o);
    t.job = job_index(o);
    if (tensors_ >= UINT32_MAX) fail("tensor", "more than 2^32 - 1 tensors");
    out_.tensor(t);
    ++tensors_;
  }
  void op(sj::dom::element e) {
    auto o =
        object(e, "op", {"name", "class", "phase", "job", "iteration", "layer", "flops", "bytes"});
    Op op;
    op.name = std::string(req_str(o, "name"));
    op.phase = enum_field(o, "phase", Phase::other, parse_phase);
    op.cls = o["class"].error() == sj::NO_SUCH_FIELD
                 ? classify_op(op.name, op.phase)
                 : enum_field(o, "class", OpClass::other, parse_op_class);
    op.job = job_index(o);
    op.iteration = static_cast<std::uint32_t>(uint(o, "iteration", 0, UINT32_MAX));
    op.layer = layer(o);
    if (auto fl = o["flops"]; fl.error() != sj::NO_SUCH_FIELD) {
      double d;
      if (fl.get_double().get(d)) fail("flops", "expected a number");
      if (!(d >= 0)) fail("flops", fmt::format("must be non-negative, got {}", d));
      op.flops = d;
    }
    op.bytes = uint(o, "bytes", 0, UINT64_MAX);
    if (ops_ >= UINT32_MAX) fail("op", "more than 2^32 - 1 ops");
    out_.op(op);
    ++ops_;
  }
  void event(sj::dom::element e) {
    auto o = object(e, "event", {"t", "op", "tensor", "kind"});
    Event ev;
    ev.time_ns = uint(o, "t", 0, UINT64_MAX, true);
    ev.op = static_cast<std::uint32_t>(uint(o, "op", 0, ops_, true));
    ev.tensor = static_cast<std::uint32_t>(uint(o, "tensor", 0, tensors_, true));
    ev.kind = enum_field(o, "kind", EventKind::read, parse_event_kind, true);
    out_.event(ev);
  }

  std::string source_;
  TraceSink& out_;
  std::uint64_t lineno_ = 0, jobs_ = 0, tensors_ = 0, ops_ = 0;
  bool seen_header_ = false;
};

}  // namespace

void read_jsonl(std::string_view data, std::string_view source, TraceSink& out) {
  // One padded copy lets simdjson parse each line in place.
  sj::padded_string padded(data);
  std::string_view all(padded.data(), padded.size());
  sj::dom::parser parser;
  LineReader reader(source, out);
  std::uint64_t lineno = 0;
  std::size_t pos = 0;
  while (pos < all.size()) {
    std::size_t nl = all.find('\n', pos);
    if (nl == std::string_view::npos) nl = all.size();
    std::string_view line = all.substr(pos, nl - pos);
    ++lineno;
    pos = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    reader.line(line, lineno, parser);
  }
  reader.finish();
}

}  // namespace u3m::trace
