// Reading and writing traces.
//
// Formats:
//   u3m binary  (.u3mt)  compact, versioned, streamed; see docs/trace-format.md
//   u3m JSONL   (.jsonl) one JSON object a line, for humans and for the Python
//                        capture tool; see docs/trace-format.md
//   PyTorch Execution Trace (.json / .json.gz), import only; see et_import.hpp
//
// Every reader streams into a TraceSink and throws InputError naming the file,
// the line or block, and the field on bad input.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "u3m/trace/model.hpp"

namespace u3m::trace {

inline constexpr char kBinaryMagic[8] = {'U', '3', 'M', 'T', 'R', 'A', 'C', 'E'};
inline constexpr std::uint32_t kBinaryVersion = 1;

// Streams a trace to a binary file. Records are buffered into checksummed
// blocks of about 256 KiB; finish() writes the end block and closes the file.
class BinaryWriter final : public TraceSink {
 public:
  explicit BinaryWriter(const std::string& path);
  ~BinaryWriter() override;
  void meta(std::string_view key, std::string_view value) override;
  void job(std::string_view name) override;
  void tensor(const Tensor& t) override;
  void op(const Op& o) override;
  void event(const Event& e) override;
  void finish() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Streams a trace as JSON lines to a file ("-" for stdout).
class JsonlWriter final : public TraceSink {
 public:
  explicit JsonlWriter(const std::string& path);
  ~JsonlWriter() override;
  void meta(std::string_view key, std::string_view value) override;
  void job(std::string_view name) override;
  void tensor(const Tensor& t) override;
  void op(const Op& o) override;
  void event(const Event& e) override;
  void finish() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `source` names the input in error messages.
void read_binary(std::string_view data, std::string_view source, TraceSink& out);
void read_jsonl(std::string_view data, std::string_view source, TraceSink& out);
// Streams a binary trace file block by block (does not load it whole).
void read_binary_file(const std::string& path, TraceSink& out);

enum class Format { u3m_binary, u3m_jsonl, pytorch_et };
std::string_view to_string(Format f);

// Sniffs the content: binary magic, gzip (taken as ET), or the first JSON line.
Format detect_format(const std::string& path);

// Reads any supported format (ET is imported with default options).
void load(const std::string& path, TraceSink& out);
Trace load_trace(const std::string& path);

// Writes `path` in the format its extension implies: .jsonl -> JSONL, else binary.
std::unique_ptr<TraceSink> open_writer(const std::string& path);

}  // namespace u3m::trace
