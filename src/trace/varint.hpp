// LEB128 varints and zigzag, shared by the binary trace writer and reader.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace u3m::trace::detail {

inline void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline std::uint64_t zigzag(std::int64_t v) {
  return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63);
}
inline std::int64_t unzigzag(std::uint64_t v) {
  return static_cast<std::int64_t>(v >> 1) ^ -static_cast<std::int64_t>(v & 1);
}
template <typename T>
inline void put_fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (checked in binary.cpp)
  out.append(b, sizeof(T));
}
inline void put_str(std::string& out, std::string_view s) {
  put_varint(out, s.size());
  out.append(s);
}

// Bounds-checked cursor over a payload; every getter returns false on overrun
// so the reader can name the field that ran past the end.
struct Cursor {
  const unsigned char* p;
  const unsigned char* end;

  bool varint(std::uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p == end) return false;
      unsigned char b = *p++;
      if (shift == 63 && b > 1) return false;  // the 10th byte holds only bit 63
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;  // more than 10 bytes: malformed
  }
  bool byte(std::uint8_t& v) {
    if (p == end) return false;
    v = *p++;
    return true;
  }
  template <typename T>
  bool fixed(T& v) {
    if (static_cast<std::size_t>(end - p) < sizeof(T)) return false;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return true;
  }
  bool str(std::string_view& s) {
    std::uint64_t n;
    if (!varint(n) || n > static_cast<std::uint64_t>(end - p)) return false;
    s = std::string_view(reinterpret_cast<const char*>(p), n);
    p += n;
    return true;
  }
};

}  // namespace u3m::trace::detail
