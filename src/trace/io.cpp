#include "u3m/trace/io.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "u3m/trace/et_import.hpp"
#include "u3m/util/error.hpp"
#include "u3m/util/file.hpp"

namespace u3m::trace {
namespace {

bool has_magic(std::string_view head) {
  return head.size() >= sizeof kBinaryMagic &&
         std::memcmp(head.data(), kBinaryMagic, sizeof kBinaryMagic) == 0;
}

// The content's format, from its first bytes (already decompressed).
Format sniff(std::string_view data, std::string_view source) {
  if (has_magic(data)) return Format::u3m_binary;
  std::size_t i = data.find_first_not_of(" \t\r\n");
  if (i != std::string_view::npos && data[i] == '{') {
    // A u3m JSONL trace opens with {"u3m_trace": 1} on its first line.
    std::string_view first = data.substr(i, data.find('\n', i) - i);
    if (first.find("\"u3m_trace\"") != std::string_view::npos) return Format::u3m_jsonl;
    return Format::pytorch_et;
  }
  input_error(source,
              "unrecognised format: not a u3m binary trace, a u3m JSONL trace (first line "
              "{{\"u3m_trace\": 1}}) or a PyTorch Execution Trace (a JSON object)");
}

std::string read_head(const std::string& path, std::size_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) input_error(path, "cannot open: {}", std::strerror(errno));
  std::string head(n, '\0');
  in.read(head.data(), static_cast<std::streamsize>(n));
  head.resize(static_cast<std::size_t>(in.gcount()));
  return head;
}

}  // namespace

std::string_view to_string(Format f) {
  switch (f) {
    case Format::u3m_binary: return "u3m-binary";
    case Format::u3m_jsonl: return "u3m-jsonl";
    case Format::pytorch_et: return "pytorch-et";
  }
  return "?";
}

Format detect_format(const std::string& path) {
  if (is_gzip_file(path)) return sniff(read_file(path), path);
  return sniff(read_head(path, 4096), path);
}

void load(const std::string& path, TraceSink& out) {
  // Binary traces stream block by block; the JSON formats are read whole.
  if (!is_gzip_file(path) && has_magic(read_head(path, sizeof kBinaryMagic)))
    return read_binary_file(path, out);
  std::string data = read_file(path);
  switch (sniff(data, path)) {
    case Format::u3m_binary: return read_binary(data, path, out);
    case Format::u3m_jsonl: return read_jsonl(data, path, out);
    case Format::pytorch_et: return import_pytorch_et(data, path, out);
  }
}

Trace load_trace(const std::string& path) {
  Trace t;
  load(path, t);
  return t;
}

std::unique_ptr<TraceSink> open_writer(const std::string& path) {
  auto ends_with = [&](std::string_view s) {
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  if (path == "-" || ends_with(".jsonl")) return std::make_unique<JsonlWriter>(path);
  return std::make_unique<BinaryWriter>(path);
}

}  // namespace u3m::trace
