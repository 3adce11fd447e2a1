// The binary trace format; layout in docs/trace-format.md.
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

#include <simdjson.h>
#include <xxhash.h>

#include "u3m/trace/io.hpp"
#include "u3m/util/error.hpp"
#include "u3m/util/output_file.hpp"
#include "varint.hpp"

static_assert(std::endian::native == std::endian::little, "the trace format is little-endian");

namespace u3m::trace {
namespace {

using namespace detail;

enum RecordType : std::uint8_t { kMeta = 1, kJob = 2, kName = 3, kTensor = 4, kOp = 5, kEvent = 6 };
constexpr std::size_t kHeaderBytes = 16;
constexpr std::size_t kBlockHeaderBytes = 16;
constexpr std::size_t kFlushBytes = 256 * 1024;
// A corrupt length must not make a reader allocate gigabytes.
constexpr std::uint32_t kMaxPayloadBytes = 64u << 20;

std::string header_bytes() {
  std::string h(kBinaryMagic, sizeof kBinaryMagic);
  put_fixed<std::uint32_t>(h, kBinaryVersion);
  put_fixed<std::uint32_t>(h, 0);
  return h;
}

}  // namespace

// ---------------------------------------------------------------- writer

struct BinaryWriter::Impl {
  explicit Impl(const std::string& path) : file(path) {}
  OutputFile file;
  bool finished = false;
  std::string buf;
  std::uint32_t block_records = 0;
  std::uint64_t total_records = 0;
  std::unordered_map<std::string, std::uint32_t> names;
  std::uint64_t last_t = 0;
  std::uint32_t last_op = 0;

  void write(const void* p, std::size_t n) { file.write(p, n); }
  void flush_block() {
    if (block_records == 0) return;
    std::string h;
    put_fixed<std::uint32_t>(h, static_cast<std::uint32_t>(buf.size()));
    put_fixed<std::uint32_t>(h, block_records);
    put_fixed<std::uint64_t>(h, XXH64(buf.data(), buf.size(), 0));
    write(h.data(), h.size());
    write(buf.data(), buf.size());
    buf.clear();
    block_records = 0;
  }
  void end_record() {
    ++block_records;
    ++total_records;
    if (buf.size() >= kFlushBytes) flush_block();
  }
  std::uint32_t intern(std::string_view s) {
    auto [it, fresh] = names.try_emplace(std::string(s), static_cast<std::uint32_t>(names.size()));
    if (fresh) {
      buf.push_back(static_cast<char>(kName));
      put_str(buf, s);
      end_record();
    }
    return it->second;
  }
};

BinaryWriter::BinaryWriter(const std::string& path) : impl_(std::make_unique<Impl>(path)) {
  std::string h = header_bytes();
  impl_->write(h.data(), h.size());
}

// Without finish() the output never appears (OutputFile), so nobody mistakes
// a partial trace for a whole one.
BinaryWriter::~BinaryWriter() = default;

void BinaryWriter::meta(std::string_view key, std::string_view value) {
  impl_->buf.push_back(static_cast<char>(kMeta));
  put_str(impl_->buf, key);
  put_str(impl_->buf, value);
  impl_->end_record();
}

void BinaryWriter::job(std::string_view name) {
  impl_->buf.push_back(static_cast<char>(kJob));
  put_str(impl_->buf, name);
  impl_->end_record();
}

void BinaryWriter::tensor(const Tensor& t) {
  auto& I = *impl_;
  std::uint32_t name = I.intern(t.name);
  I.buf.push_back(static_cast<char>(kTensor));
  put_fixed<std::uint64_t>(I.buf, t.id);
  put_varint(I.buf, name);
  put_varint(I.buf, t.bytes);
  I.buf.push_back(static_cast<char>(t.dtype));
  I.buf.push_back(static_cast<char>(t.role));
  put_varint(I.buf, zigzag(t.layer));
  put_varint(I.buf, t.job);
  I.end_record();
}

void BinaryWriter::op(const Op& o) {
  auto& I = *impl_;
  std::uint32_t name = I.intern(o.name);
  I.buf.push_back(static_cast<char>(kOp));
  put_varint(I.buf, name);
  I.buf.push_back(static_cast<char>(o.cls));
  I.buf.push_back(static_cast<char>(o.phase));
  put_varint(I.buf, o.job);
  put_varint(I.buf, o.iteration);
  put_varint(I.buf, zigzag(o.layer));
  put_fixed<double>(I.buf, o.flops);
  put_varint(I.buf, o.bytes);
  I.end_record();
}

void BinaryWriter::event(const Event& e) {
  auto& I = *impl_;
  I.buf.push_back(static_cast<char>(kEvent));
  I.buf.push_back(static_cast<char>(e.kind));
  put_varint(I.buf, zigzag(static_cast<std::int64_t>(e.time_ns - I.last_t)));
  put_varint(I.buf, zigzag(static_cast<std::int64_t>(e.op) - static_cast<std::int64_t>(I.last_op)));
  put_varint(I.buf, e.tensor);
  I.last_t = e.time_ns;
  I.last_op = e.op;
  I.end_record();
}

void BinaryWriter::finish() {
  auto& I = *impl_;
  if (I.finished) return;
  I.flush_block();
  std::string end;
  put_fixed<std::uint32_t>(end, 0);
  put_fixed<std::uint32_t>(end, 0);
  put_fixed<std::uint64_t>(end, I.total_records);
  I.write(end.data(), end.size());
  I.file.commit();
  I.finished = true;
}

// ---------------------------------------------------------------- reader

namespace {

// Decodes blocks in order, validating every field and reference, and feeds
// the sink. Shared by the in-memory and the streaming file reader.
class Decoder {
 public:
  Decoder(std::string_view source, TraceSink& out) : source_(source), out_(out) {}

  void header(std::string_view h) {
    if (h.size() < kHeaderBytes)
      input_error(source_, "truncated header: {} of {} bytes", h.size(), kHeaderBytes);
    if (std::memcmp(h.data(), kBinaryMagic, sizeof kBinaryMagic) != 0)
      input_error(source_, "not a u3m binary trace (wrong magic)");
    std::uint32_t version;
    std::memcpy(&version, h.data() + 8, 4);
    if (version != kBinaryVersion)
      input_error(source_, "unsupported trace version {} (this build reads version {})", version,
                  kBinaryVersion);
    std::uint32_t flags;
    std::memcpy(&flags, h.data() + 12, 4);
    if (flags != 0)
      input_error(source_, "unsupported header flags {:#x} (this build knows none)", flags);
  }

  struct BlockHeader {
    std::uint32_t len, count;
    std::uint64_t sum;
  };
  BlockHeader block_header(std::string_view h, std::uint64_t offset) {
    if (h.size() < kBlockHeaderBytes)
      input_error(source_, "truncated at byte {}: block header cut short (missing end block)",
                  offset);
    BlockHeader b;
    std::memcpy(&b.len, h.data(), 4);
    std::memcpy(&b.count, h.data() + 4, 4);
    std::memcpy(&b.sum, h.data() + 8, 8);
    if (b.len > kMaxPayloadBytes)
      input_error(source_, "block {} at byte {}: payload length {} exceeds the {} byte limit",
                  block_, offset, b.len, kMaxPayloadBytes);
    return b;
  }

  void end(const BlockHeader& b, std::uint64_t offset) {
    if (b.count != 0)
      input_error(source_, "block {} at byte {}: empty block claims {} records", block_, offset,
                  b.count);
    if (b.sum != records_)
      input_error(source_, "end block says {} records, file holds {}", b.sum, records_);
    out_.finish();
  }

  void block(const BlockHeader& b, std::string_view payload, std::uint64_t offset) {
    if (payload.size() < b.len)
      input_error(source_, "truncated at byte {}: block {} needs {} payload bytes, {} remain",
                  offset, block_, b.len, payload.size());
    payload = payload.substr(0, b.len);
    if (XXH64(payload.data(), payload.size(), 0) != b.sum)
      input_error(source_, "block {} at byte {}: checksum mismatch (corrupt data)", block_, offset);
    Cursor c{reinterpret_cast<const unsigned char*>(payload.data()),
             reinterpret_cast<const unsigned char*>(payload.data() + payload.size())};
    for (std::uint32_t r = 0; r < b.count; ++r) record(c, r);
    if (c.p != c.end)
      input_error(source_, "block {}: {} bytes left after {} records", block_, c.end - c.p,
                  b.count);
    ++block_;
  }

 private:
  [[noreturn]] void bad(std::uint32_t r, std::string_view field, std::string_view what) {
    input_error(fmt::format("{}: block {}, record {}", source_, block_, r), "field {}: {}", field,
                what);
  }
  template <typename T>
  T u(Cursor& c, std::uint32_t r, std::string_view field, std::uint64_t limit) {
    std::uint64_t v;
    if (!c.varint(v)) bad(r, field, "truncated or malformed varint");
    if (v >= limit) bad(r, field, fmt::format("value {} out of range (< {})", v, limit));
    return static_cast<T>(v);
  }
  template <typename E>
  E enum8(Cursor& c, std::uint32_t r, std::string_view field, int count) {
    std::uint8_t v;
    if (!c.byte(v)) bad(r, field, "truncated");
    if (v >= count) bad(r, field, fmt::format("unknown value {}", v));
    return static_cast<E>(v);
  }
  std::int32_t layer(Cursor& c, std::uint32_t r) {
    std::uint64_t v;
    if (!c.varint(v)) bad(r, "layer", "truncated");
    std::int64_t l = unzigzag(v);
    if (l < -1 || l > INT32_MAX) bad(r, "layer", fmt::format("value {} out of range", l));
    return static_cast<std::int32_t>(l);
  }
  std::string_view str(Cursor& c, std::uint32_t r, std::string_view field) {
    std::string_view s;
    if (!c.str(s)) bad(r, field, "truncated string");
    // JSON lines hold UTF-8 only: a trace that one format can hold and the
    // other cannot would fail at `trace convert` (found by fuzz_binary).
    if (!simdjson::validate_utf8(s.data(), s.size())) bad(r, field, "not valid UTF-8");
    return s;
  }

  void record(Cursor& c, std::uint32_t r) {
    std::uint8_t type;
    if (!c.byte(type)) bad(r, "type", "truncated");
    ++records_;
    switch (type) {
      case kMeta: {
        auto k = str(c, r, "meta.key");
        auto v = str(c, r, "meta.value");
        out_.meta(k, v);
        return;
      }
      case kJob:
        out_.job(str(c, r, "job.name"));
        ++jobs_;
        return;
      case kName:
        names_.emplace_back(str(c, r, "name"));
        return;
      case kTensor: {
        Tensor t;
        if (!c.fixed(t.id)) bad(r, "tensor.id", "truncated");
        t.name = names_[u<std::size_t>(c, r, "tensor.name", names_.size())];
        if (!c.varint(t.bytes)) bad(r, "tensor.bytes", "truncated");
        t.dtype = enum8<DType>(c, r, "tensor.dtype", 12);
        t.role = enum8<Role>(c, r, "tensor.role", 9);
        t.layer = layer(c, r);
        t.job = u<std::uint32_t>(c, r, "tensor.job", jobs_);
        if (t.id != stable_id(t.name))
          bad(r, "tensor.id", fmt::format("{:016x} is not xxh64(\"{}\")", t.id, t.name));
        // Events name tensors with 32 bits (model.hpp): refuse what would wrap.
        if (tensors_ >= UINT32_MAX) bad(r, "tensor", "more than 2^32 - 1 tensors");
        out_.tensor(t);
        ++tensors_;
        return;
      }
      case kOp: {
        Op o;
        o.name = names_[u<std::size_t>(c, r, "op.name", names_.size())];
        o.cls = enum8<OpClass>(c, r, "op.class", kNumOpClasses);
        o.phase = enum8<Phase>(c, r, "op.phase", kNumPhases);
        o.job = u<std::uint32_t>(c, r, "op.job", jobs_);
        o.iteration = u<std::uint32_t>(c, r, "op.iteration", UINT32_MAX);
        o.layer = layer(c, r);
        if (!c.fixed(o.flops)) bad(r, "op.flops", "truncated");
        if (!(o.flops >= 0)) bad(r, "op.flops", "negative or NaN");
        if (!c.varint(o.bytes)) bad(r, "op.bytes", "truncated");
        if (ops_ >= UINT32_MAX) bad(r, "op", "more than 2^32 - 1 ops");
        out_.op(o);
        ++ops_;
        return;
      }
      case kEvent: {
        Event e;
        e.kind = enum8<EventKind>(c, r, "event.kind", 4);
        std::uint64_t dt, dop;
        if (!c.varint(dt)) bad(r, "event.time", "truncated");
        if (!c.varint(dop)) bad(r, "event.op", "truncated");
        // Deltas may be hostile: add with overflow checks, never wrap.
        std::int64_t t, op;
        if (__builtin_add_overflow(static_cast<std::int64_t>(last_t_), unzigzag(dt), &t) || t < 0)
          bad(r, "event.time", "time delta leaves the range [0, 2^63)");
        if (__builtin_add_overflow(static_cast<std::int64_t>(last_op_), unzigzag(dop), &op) ||
            op < 0 || static_cast<std::uint64_t>(op) >= ops_)
          bad(r, "event.op", fmt::format("op {} not declared ({} ops so far)", op, ops_));
        e.time_ns = static_cast<std::uint64_t>(t);
        e.op = static_cast<std::uint32_t>(op);
        e.tensor = u<std::uint32_t>(c, r, "event.tensor", tensors_);
        last_t_ = e.time_ns;
        last_op_ = e.op;
        out_.event(e);
        return;
      }
      default:
        bad(r, "type", fmt::format("unknown record type {}", type));
    }
  }

  std::string source_;
  TraceSink& out_;
  std::vector<std::string> names_;
  std::uint64_t jobs_ = 0, tensors_ = 0, ops_ = 0, records_ = 0;
  std::uint32_t block_ = 0;
  std::uint64_t last_t_ = 0;
  std::uint32_t last_op_ = 0;
};

}  // namespace

void read_binary(std::string_view data, std::string_view source, TraceSink& out) {
  Decoder d(source, out);
  d.header(data);
  std::uint64_t off = kHeaderBytes;
  for (;;) {
    auto h = d.block_header(data.substr(std::min<std::uint64_t>(off, data.size())), off);
    off += kBlockHeaderBytes;
    if (h.len == 0) {
      d.end(h, off);
      if (off != data.size())
        input_error(source, "{} bytes of garbage after the end block", data.size() - off);
      return;
    }
    d.block(h, data.substr(off), off);
    off += h.len;
  }
}

void read_binary_file(const std::string& path, TraceSink& out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) input_error(path, "cannot open: {}", std::strerror(errno));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> guard(f, &std::fclose);
  Decoder d(path, out);
  std::string buf(kHeaderBytes, '\0');
  buf.resize(std::fread(buf.data(), 1, kHeaderBytes, f));
  d.header(buf);
  std::uint64_t off = kHeaderBytes;
  for (;;) {
    buf.resize(kBlockHeaderBytes);
    buf.resize(std::fread(buf.data(), 1, kBlockHeaderBytes, f));
    auto h = d.block_header(buf, off);
    off += kBlockHeaderBytes;
    if (h.len == 0) {
      d.end(h, off);
      if (std::fgetc(f) != EOF) input_error(path, "garbage after the end block at byte {}", off);
      return;
    }
    buf.resize(h.len);
    buf.resize(std::fread(buf.data(), 1, h.len, f));
    if (std::ferror(f)) input_error(path, "read failed at byte {}: {}", off, std::strerror(errno));
    d.block(h, buf, off);
    off += h.len;
  }
}

}  // namespace u3m::trace
