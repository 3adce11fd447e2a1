// libFuzzer target for the remote KV tier's value decoder (src/kv/remote_tier.cpp,
// decode_value): what a Redis server hands back is untrusted bytes. Input: 8 bytes of the
// chain key asked for and 2 of the payload length expected (little endian), then the value.
//
// Checked: decode_value never reads outside the value; it accepts a value exactly when the
// value is what encode_value makes of that key and a payload of that length (the framing is
// canonical), so a value it takes re-encodes to itself byte for byte, and a one-bit change
// anywhere in an accepted value is refused.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "u3m/kv/remote_tier.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 10) return 0;
  std::uint64_t key = 0;
  for (int i = 0; i < 8; ++i) key |= std::uint64_t(data[i]) << (8 * i);
  const std::uint64_t expect = data[8] | (std::uint64_t(data[9]) << 8);
  const std::string value(reinterpret_cast<const char*>(data) + 10, size - 10);
  std::string_view payload;
  const u3m::kv::DecodeError e = u3m::kv::decode_value(value, key, expect, &payload);
  if (e != u3m::kv::DecodeError::ok) return 0;
  if (payload.size() != expect || u3m::kv::encode_value(key, payload) != value) std::abort();
  std::string flipped = value;
  flipped[(key ^ expect) % flipped.size()] ^= 1;
  if (u3m::kv::decode_value(flipped, key, expect, nullptr) == u3m::kv::DecodeError::ok) std::abort();
  return 0;
}
