#include "u3m/util/output_file.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include "u3m/util/error.hpp"

namespace u3m {
namespace {
[[noreturn]] void fail(const std::string& path, std::string_view what) {
  throw std::runtime_error(fmt::format("{}: {}: {}", path, what, std::strerror(errno)));
}
}  // namespace

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
  if (path_ == "-") {
    f_ = stdout;
    return;
  }
  // A path that cannot be written is the user's bad input (InputError, exit
  // 2), found here before any work: a directory would only fail at commit().
  struct stat st{};
  if (::stat(path_.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw InputError(fmt::format("{}: cannot create: {}", path_, std::strerror(EISDIR)));
  tmp_ = fmt::format("{}.tmp.{}", path_, ::getpid());
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) throw InputError(fmt::format("{}: cannot create: {}", path_, std::strerror(errno)));
}

OutputFile::~OutputFile() {
  if (!f_ || tmp_.empty()) return;
  std::fclose(f_);
  std::remove(tmp_.c_str());
}

void OutputFile::write(const void* data, std::size_t n) {
  if (!f_) throw std::runtime_error(fmt::format("{}: write after commit", path_));
  if (n && std::fwrite(data, 1, n, f_) != n) fail(path_, "write failed");
}

void OutputFile::commit() {
  if (!f_) return;
  std::FILE* f = f_;
  f_ = nullptr;
  if (tmp_.empty()) {
    if (std::fflush(f) != 0) fail(path_, "flush failed");
    return;
  }
  if (std::fclose(f) != 0) {
    std::remove(tmp_.c_str());
    fail(path_, "close failed");
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_.c_str());
    fail(path_, "cannot rename the finished file into place");
  }
}

}  // namespace u3m
