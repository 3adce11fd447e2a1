// A remote KV tier below host DRAM, shared by serving processes (issue 21 item 1; docs/kv.md,
// "Remote tier on Redis"). Full prompt blocks are stored under their content-addressed chain
// key (kv::block_keys, Note [Block keys]) in a key-value server; a process whose local tiers
// miss a prefix block asks the remote, and a hit is written into the request's freshly
// allocated block, so it is promoted into the local tiers and the prefill of that block can
// be skipped. Layers:
//   encode_value/decode_value  the value framing: magic, key, length, xxh64 checksum;
//   RemoteTier                 a batch get/put over some server (RedisTier: hiredis);
//   RemoteKv                   framing + a local index + counters + degrading on failure;
//   fetch_prefix/publish_prefix  moving blocks between a TieredStore and a RemoteKv.
// Note [Remote consistency] in src/kv/remote_tier.cpp gives the rules.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "u3m/kv/tiered_store.hpp"

struct redisContext;  // hiredis

namespace u3m::kv {

// ---- value framing -------------------------------------------------------------------------
// [8 B magic "u3mKVb01"][u64 LE chain key][u64 LE payload length][u64 LE xxh64(payload, key)]
// then the payload. The key in the header catches a value stored under the wrong name.
inline constexpr std::size_t kRemoteHeaderBytes = 32;
std::string encode_value(std::uint64_t key, std::string_view payload);
enum class DecodeError : std::uint8_t { ok, short_value, bad_magic, wrong_key, bad_length, bad_checksum };
std::string_view to_string(DecodeError e);
// On ok, *payload views the payload inside `value`. expect_len: the payload length the caller
// needs (a block's bytes); any other length is bad_length.
DecodeError decode_value(std::string_view value, std::uint64_t key, std::uint64_t expect_len,
                         std::string_view* payload);

// ---- the server ----------------------------------------------------------------------------
// A batch of gets or puts against one server. `down`: the server could not be reached or did
// not answer within the timeout; nothing of the batch is to be trusted.
enum class RemoteStatus : std::uint8_t { ok, down };
class RemoteTier {
 public:
  virtual ~RemoteTier() = default;
  // out[i]: the value of keys[i], or nullopt if the server holds none.
  virtual RemoteStatus get(const std::vector<std::string>& keys,
                           std::vector<std::optional<std::string>>& out) = 0;
  // Stores each (key, value), expiring after ttl_s seconds (0: never).
  virtual RemoteStatus put(const std::vector<std::pair<std::string, std::string>>& kv,
                           std::uint32_t ttl_s) = 0;
  virtual std::string describe() const = 0;
};

struct RedisOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::chrono::milliseconds timeout{250};        // connect, and each socket read/write
  std::chrono::milliseconds backoff_min{100};    // first wait before reconnecting after a failure
  std::chrono::milliseconds backoff_max{5000};   // the wait doubles up to this
  // redis://HOST:PORT (no user, password or database). InputError naming `field` otherwise.
  static RedisOptions parse_url(std::string_view url, std::string_view field);
};

// Pipelined GET / SET EX over one blocking hiredis connection (Note [Bounded waits]).
class RedisTier final : public RemoteTier {
 public:
  explicit RedisTier(RedisOptions o);
  ~RedisTier() override;
  RedisTier(const RedisTier&) = delete;
  RedisTier& operator=(const RedisTier&) = delete;
  RemoteStatus get(const std::vector<std::string>& keys,
                   std::vector<std::optional<std::string>>& out) override;
  RemoteStatus put(const std::vector<std::pair<std::string, std::string>>& kv,
                   std::uint32_t ttl_s) override;
  std::string describe() const override;
  std::uint64_t connects() const { return connects_; }
  std::uint64_t skipped() const { return skipped_; }  // calls not tried: backing off
  const std::string& last_error() const { return last_error_; }

 private:
  bool connected();  // connects if due; false while backing off or on failure
  void fail(const std::string& why);
  // Sends the appended commands and reads n replies; each reply goes to on_reply.
  template <class F>
  RemoteStatus round_trip(std::size_t n, F&& on_reply);
  RedisOptions o_;
  redisContext* ctx_ = nullptr;
  std::chrono::steady_clock::time_point retry_at_{};
  std::chrono::milliseconds backoff_{0};
  std::uint64_t connects_ = 0, skipped_ = 0;
  std::string last_error_;
};

// ---- framing, index, degradation -----------------------------------------------------------
struct RemoteStats {
  std::uint64_t lookups = 0;      // blocks asked for
  std::uint64_t hits = 0;         // blocks fetched with a good value
  std::uint64_t misses = 0;       // blocks the server did not hold
  std::uint64_t index_drops = 0;  // of those misses, blocks the index believed held
  std::uint64_t puts = 0, put_bytes = 0, get_bytes = 0;
  std::uint64_t put_skipped = 0;  // blocks not put: the index says the server holds them
  std::uint64_t corrupt = 0;      // values rejected by decode_value (counted as misses too)
  std::uint64_t errors = 0;       // batches that failed: server down or timed out
};

class RemoteKv {
 public:
  // ns names what the payload layout depends on (the KV geometry), so differently shaped
  // caches never read each other's values; keys are "<ns>:<16 hex digits of the chain key>".
  RemoteKv(std::unique_ptr<RemoteTier> tier, std::string ns, std::uint32_t ttl_s);
  // The payloads of the longest run of keys[0..] the server holds with good values, each of
  // value_len bytes; stops at the first miss, bad value or failure.
  std::vector<std::string> get_prefix(const std::vector<std::uint64_t>& keys,
                                      std::uint64_t value_len);
  // Puts each (chain key, payload) the index does not already hold; one pipelined batch.
  void put(const std::vector<std::pair<std::uint64_t, std::string>>& blocks);
  bool indexed(std::uint64_t key) const;
  // !indexed(key); counts a put saved when the index holds it.
  bool wants_put(std::uint64_t key);
  std::size_t index_size() const { return index_.size(); }
  const RemoteStats& stats() const { return st_; }
  RemoteTier& tier() { return *tier_; }
  std::string name(std::uint64_t key) const;

 private:
  void note_error(const char* what);
  std::unique_ptr<RemoteTier> tier_;
  std::string ns_;
  std::uint32_t ttl_s_;
  // Chain keys this process put or fetched, and when it last did: the server may have evicted
  // any of them since (TTL, maxmemory), so the index only saves puts, never answers a get.
  std::unordered_map<std::uint64_t, std::chrono::steady_clock::time_point> index_;
  RemoteStats st_;
  bool logged_ = false;  // one stderr line per outage
};

// The namespace of a geometry's values (RemoteKv's ns).
std::string remote_namespace(const KvGeometry& g);

// A request just admitted with `local_hits` leading blocks found locally: fetches the blocks
// after them that the remote holds (keys: block_keys of its prompt) and writes each into the
// request's block, all groups. Returns the request's hit blocks, local and remote.
std::uint32_t fetch_prefix(TieredStore& store, RemoteKv& remote, RequestId id,
                           const std::vector<std::uint64_t>& keys, std::uint32_t local_hits);
// Puts the requests' full prompt blocks (keys: block_keys of each one's prompt) that the index
// does not hold yet, each key once, in one pipelined batch; call once their KV is written
// (after prefill).
void publish_prefix(TieredStore& store, RemoteKv& remote,
                    const std::vector<std::pair<RequestId, std::vector<std::uint64_t>>>& requests);

}  // namespace u3m::kv
