#include "u3m/util/file.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <zlib.h>

#include "u3m/util/error.hpp"

namespace u3m {
namespace {

std::string read_raw(const std::string& path) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) input_error(path, "cannot open: {}", std::strerror(errno));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) input_error(path, "read failed: {}", std::strerror(errno));
  return data;
}

bool has_gzip_magic(std::string_view d) {
  return d.size() >= 2 && static_cast<unsigned char>(d[0]) == 0x1f &&
         static_cast<unsigned char>(d[1]) == 0x8b;
}

std::string gunzip(const std::string& raw, const std::string& path) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) input_error(path, "gzip: cannot initialise zlib");
  // zlib counts input in uInt: feed it in chunks so inputs over 4 GiB work.
  std::size_t fed = 0;
  auto feed = [&] {
    std::size_t n = std::min<std::size_t>(raw.size() - fed, 1u << 30);
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data() + fed));
    zs.avail_in = static_cast<uInt>(n);
    fed += n;
  };
  feed();
  std::string out;
  char buf[1 << 16];
  int rc = Z_OK;
  do {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    if (zs.avail_in == 0 && fed < raw.size()) feed();
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      std::string msg = zs.msg ? zs.msg : "corrupt data";
      auto at = zs.total_in;
      inflateEnd(&zs);
      if (rc == Z_BUF_ERROR) input_error(path, "gzip: truncated after {} compressed bytes", at);
      input_error(path, "gzip: {} at compressed byte {}", msg, at);
    }
    out.append(buf, sizeof buf - zs.avail_out);
    // Concatenated gzip members are legal; keep going while input remains.
    if (rc == Z_STREAM_END && (zs.avail_in > 0 || fed < raw.size())) {
      if (inflateReset(&zs) != Z_OK) break;
      rc = Z_OK;
    }
  } while (rc != Z_STREAM_END);
  inflateEnd(&zs);
  return out;
}

}  // namespace

void require_regular_file(const std::string& path) {
  std::error_code ec;
  auto st = std::filesystem::status(path, ec);
  if (ec || st.type() == std::filesystem::file_type::not_found)
    input_error(path, "cannot open: No such file or directory");
  if (st.type() == std::filesystem::file_type::directory)
    input_error(path, "is a directory, not a file");
  if (st.type() != std::filesystem::file_type::regular) input_error(path, "not a regular file");
}

bool is_gzip_file(const std::string& path) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  char m[2] = {0, 0};
  in.read(m, 2);
  return in.gcount() == 2 && has_gzip_magic(std::string_view(m, 2));
}

std::string read_file(const std::string& path) {
  std::string raw = read_raw(path);
  if (has_gzip_magic(raw)) return gunzip(raw, path);
  return raw;
}

}  // namespace u3m
