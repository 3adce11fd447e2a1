// An output file that appears only when complete. Writes go to a temporary
// file beside the target; commit() renames it into place. Dropped without
// commit() (an exception mid-write, a failed import), the temporary file is
// removed and whatever was at the target path before is left untouched, so a
// failed run never destroys an earlier output or leaves a half-written one.
// "-" writes to stdout directly.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace u3m {

class OutputFile {
 public:
  // Throws InputError naming the path when it cannot be created (a missing
  // directory, a directory in its place); later failures are runtime_errors.
  explicit OutputFile(std::string path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, std::size_t n);  // throws on a short write (e.g. disk full)
  void commit();                                // flush, close, rename into place
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
};

}  // namespace u3m
