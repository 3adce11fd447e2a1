// The remote KV tier (include/u3m/kv/remote_tier.hpp; docs/kv.md, "Remote tier on Redis").
//
// Note [Remote consistency]
// The remote holds immutable values under content-addressed names: a block's chain key
// (Note [Block keys]) names exactly the tokens [0, (i+1)*B) of its prompt, the segment ids
// carry what else the KV depends on (the caller's model id and dtype: prompt_segments' salt),
// and the namespace carries the slot layout (remote_namespace). So two writers of one name
// write the same bytes, and a reader never needs a version: the last SET wins and is right.
// What can go wrong is only that a value is missing, torn or foreign, and every one of those
// reads as a miss:
//   - missing: the server's TTL (SET EX) or maxmemory eviction dropped it, or it never came;
//   - torn or corrupted: decode_value checks magic, key, length and the xxh64 checksum;
//   - foreign (another key's value under this name): the key in the header must match.
// A miss ends the remote prefix there (a block is only usable if all blocks before it are).
// The local index (RemoteKv::index_) is advisory: it saves re-putting what this process put
// or fetched within the last half TTL; a get never trusts it, and a get that misses a key it
// held drops the key. A server that is down or slow makes the whole batch a miss (a get) or
// a no-op (a put): the caller carries on with its local tiers and computes what it would
// have fetched, so a remote failure costs time, never correctness.
//
// Note [Bounded waits]
// Every call to the server is bounded: the connect and each socket read/write time out after
// RedisOptions::timeout (redisConnectWithTimeout, redisSetTimeout), and a failure closes the
// connection and backs off (doubling from backoff_min to backoff_max) before the next try,
// so a dead server costs one timeout per backoff period, not one per call. A paused server
// (SIGSTOP) accepts connections in the kernel but never answers: the read times out. Puts are
// synchronous and batched (one pipeline per request's prefill), not asynchronous: the process
// stays single-threaded, and the timeout bounds what a put can cost.
#include "u3m/kv/remote_tier.hpp"

#include <hiredis.h>  // pkg-config hiredis puts include/hiredis on the path
#include <signal.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include <fmt/format.h>

#include "u3m/util/error.hpp"

namespace u3m::kv {

namespace {

constexpr char kMagic[8] = {'u', '3', 'm', 'K', 'V', 'b', '0', '1'};

void put_u64(char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint64_t get_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// hiredis writes with write(2): a server that went away makes that a SIGPIPE, whose default
// action kills the process. This blocks SIGPIPE in the calling thread for one round trip and
// swallows one it raised, so EPIPE comes back as an error instead.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe, nullptr, &zero) > 0) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t old_;
  bool was_pending_ = false;
};

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

}  // namespace

std::string encode_value(std::uint64_t key, std::string_view payload) {
  std::string v(kRemoteHeaderBytes + payload.size(), '\0');
  std::memcpy(v.data(), kMagic, 8);
  put_u64(v.data() + 8, key);
  put_u64(v.data() + 16, payload.size());
  put_u64(v.data() + 24, XXH64(payload.data(), payload.size(), key));
  if (!payload.empty()) std::memcpy(v.data() + kRemoteHeaderBytes, payload.data(), payload.size());
  return v;
}

std::string_view to_string(DecodeError e) {
  switch (e) {
    case DecodeError::ok: return "ok";
    case DecodeError::short_value: return "short value";
    case DecodeError::bad_magic: return "bad magic";
    case DecodeError::wrong_key: return "wrong key";
    case DecodeError::bad_length: return "bad length";
    case DecodeError::bad_checksum: return "bad checksum";
  }
  return "?";
}

DecodeError decode_value(std::string_view value, std::uint64_t key, std::uint64_t expect_len,
                         std::string_view* payload) {
  if (value.size() < kRemoteHeaderBytes) return DecodeError::short_value;
  if (std::memcmp(value.data(), kMagic, 8) != 0) return DecodeError::bad_magic;
  if (get_u64(value.data() + 8) != key) return DecodeError::wrong_key;
  const std::uint64_t len = get_u64(value.data() + 16);
  // Compared before any arithmetic on len: a hostile length cannot overflow anything.
  if (len != expect_len || value.size() - kRemoteHeaderBytes != len) return DecodeError::bad_length;
  const char* body = value.data() + kRemoteHeaderBytes;
  if (XXH64(body, len, key) != get_u64(value.data() + 24)) return DecodeError::bad_checksum;
  if (payload) *payload = std::string_view(body, len);
  return DecodeError::ok;
}

// ---- RedisTier -----------------------------------------------------------------------------

RedisOptions RedisOptions::parse_url(std::string_view url, std::string_view field) {
  constexpr std::string_view scheme = "redis://";
  if (url.substr(0, scheme.size()) != scheme)
    input_error(field, "a remote is redis://HOST:PORT, got \"{}\"", url);
  std::string_view rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  const auto colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || rest.find_first_of("@/") != std::string_view::npos)
    input_error(field, "a remote is redis://HOST:PORT (no user, password or database), got \"{}\"", url);
  RedisOptions o;
  o.host = std::string(rest.substr(0, colon));
  const std::string_view port = rest.substr(colon + 1);
  int p = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || end != port.data() + port.size() || p < 1 || p > 65535)
    input_error(field, "port of \"{}\" must be 1..65535", url);
  o.port = p;
  return o;
}

RedisTier::RedisTier(RedisOptions o) : o_(std::move(o)) {
  if (o_.timeout.count() <= 0) input_error("remote timeout", "must be > 0 ms, got {}", o_.timeout.count());
}

RedisTier::~RedisTier() {
  if (ctx_) redisFree(ctx_);
}

std::string RedisTier::describe() const { return fmt::format("redis://{}:{}", o_.host, o_.port); }

void RedisTier::fail(const std::string& why) {
  last_error_ = why;
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
  backoff_ = backoff_.count() == 0 ? o_.backoff_min : std::min(2 * backoff_, o_.backoff_max);
  retry_at_ = std::chrono::steady_clock::now() + backoff_;
}

bool RedisTier::connected() {
  if (ctx_) return true;
  if (std::chrono::steady_clock::now() < retry_at_) {
    ++skipped_;
    return false;
  }
  ctx_ = redisConnectWithTimeout(o_.host.c_str(), o_.port, to_timeval(o_.timeout));
  if (!ctx_ || ctx_->err) {
    fail(ctx_ ? std::string("connect: ") + ctx_->errstr : "connect: out of memory");
    return false;
  }
  if (redisSetTimeout(ctx_, to_timeval(o_.timeout)) != REDIS_OK) {
    fail("set timeout");
    return false;
  }
  ++connects_;
  return true;
}

template <class F>
RemoteStatus RedisTier::round_trip(std::size_t n, F&& on_reply) {
  for (std::size_t i = 0; i < n; ++i) {
    void* r = nullptr;
    if (redisGetReply(ctx_, &r) != REDIS_OK || !r) {
      fail(ctx_->err ? std::string(ctx_->errstr) : "no reply");
      return RemoteStatus::down;
    }
    on_reply(i, static_cast<const redisReply*>(r));
    freeReplyObject(r);
  }
  backoff_ = std::chrono::milliseconds(0);  // the server answered: the outage, if any, is over
  return RemoteStatus::ok;
}

RemoteStatus RedisTier::get(const std::vector<std::string>& keys,
                            std::vector<std::optional<std::string>>& out) {
  out.assign(keys.size(), std::nullopt);
  if (keys.empty()) return RemoteStatus::ok;
  SigpipeGuard guard;
  if (!connected()) return RemoteStatus::down;
  for (const std::string& k : keys)
    if (redisAppendCommand(ctx_, "GET %b", k.data(), k.size()) != REDIS_OK) {
      fail("append GET");
      return RemoteStatus::down;
    }
  return round_trip(keys.size(), [&](std::size_t i, const redisReply* r) {
    // NIL: not held. An error reply (WRONGTYPE) is not a value either.
    if (r->type == REDIS_REPLY_STRING) out[i] = std::string(r->str, r->len);
  });
}

RemoteStatus RedisTier::put(const std::vector<std::pair<std::string, std::string>>& kv,
                            std::uint32_t ttl_s) {
  if (kv.empty()) return RemoteStatus::ok;
  SigpipeGuard guard;
  if (!connected()) return RemoteStatus::down;
  for (const auto& [k, v] : kv) {
    const int rc = ttl_s ? redisAppendCommand(ctx_, "SET %b %b EX %u", k.data(), k.size(), v.data(),
                                              v.size(), static_cast<unsigned>(ttl_s))
                         : redisAppendCommand(ctx_, "SET %b %b", k.data(), k.size(), v.data(), v.size());
    if (rc != REDIS_OK) {
      fail("append SET");
      return RemoteStatus::down;
    }
  }
  // A SET refused (maxmemory with noeviction: an error reply) is a value the server does not
  // hold; a later get misses it, which is all a miss costs (Note [Remote consistency]).
  return round_trip(kv.size(), [](std::size_t, const redisReply*) {});
}

// ---- RemoteKv ------------------------------------------------------------------------------

std::string remote_namespace(const KvGeometry& g) {
  return fmt::format("u3m:kv1:bt{}:l{}:g{}:b{}", g.block_tokens, g.layers, g.layers_per_group,
                     g.bytes_per_token_layer);
}

RemoteKv::RemoteKv(std::unique_ptr<RemoteTier> tier, std::string ns, std::uint32_t ttl_s)
    : tier_(std::move(tier)), ns_(std::move(ns)), ttl_s_(ttl_s) {}

std::string RemoteKv::name(std::uint64_t key) const { return fmt::format("{}:{:016x}", ns_, key); }

bool RemoteKv::indexed(std::uint64_t key) const {
  const auto it = index_.find(key);
  if (it == index_.end()) return false;
  // Past half its TTL a value is put again, so a prefix in use does not expire.
  return ttl_s_ == 0 || std::chrono::steady_clock::now() - it->second < std::chrono::seconds(ttl_s_) / 2;
}

bool RemoteKv::wants_put(std::uint64_t key) {
  if (!indexed(key)) return true;
  ++st_.put_skipped;
  return false;
}

void RemoteKv::note_error(const char* what) {
  ++st_.errors;
  if (logged_) return;
  logged_ = true;
  std::string why;
  if (auto* r = dynamic_cast<RedisTier*>(tier_.get())) why = r->last_error();
  std::fprintf(stderr, "u3m: remote KV tier %s: %s failed (%s); serving from the local tiers\n",
               tier_->describe().c_str(), what, why.empty() ? "unavailable" : why.c_str());
}

std::vector<std::string> RemoteKv::get_prefix(const std::vector<std::uint64_t>& keys,
                                              std::uint64_t value_len) {
  std::vector<std::string> got;
  if (keys.empty()) return got;
  std::vector<std::string> names;
  names.reserve(keys.size());
  for (std::uint64_t k : keys) names.push_back(name(k));
  std::vector<std::optional<std::string>> values;
  st_.lookups += keys.size();
  if (tier_->get(names, values) != RemoteStatus::ok) {
    note_error("get");
    return got;
  }
  logged_ = false;
  const auto now = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::string_view payload;
    const DecodeError e = values[i] ? decode_value(*values[i], keys[i], value_len, &payload)
                                    : DecodeError::short_value;
    if (!values[i] || e != DecodeError::ok) {
      ++st_.misses;
      if (values[i]) ++st_.corrupt;
      if (index_.erase(keys[i])) ++st_.index_drops;
      break;
    }
    ++st_.hits;
    st_.get_bytes += values[i]->size();
    index_[keys[i]] = now;
    values[i]->erase(0, kRemoteHeaderBytes);  // in place: blocks are MiBs, a copy costs
    got.push_back(std::move(*values[i]));
  }
  return got;
}

void RemoteKv::put(const std::vector<std::pair<std::uint64_t, std::string>>& blocks) {
  if (blocks.empty()) return;
  std::vector<std::pair<std::string, std::string>> kv;
  kv.reserve(blocks.size());
  std::uint64_t bytes = 0;
  for (const auto& [k, payload] : blocks) {
    kv.emplace_back(name(k), encode_value(k, payload));
    bytes += kv.back().second.size();
  }
  if (tier_->put(kv, ttl_s_) != RemoteStatus::ok) {
    note_error("put");
    return;
  }
  logged_ = false;
  st_.puts += blocks.size();
  st_.put_bytes += bytes;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& b : blocks) index_[b.first] = now;
}

// ---- between a TieredStore and a RemoteKv --------------------------------------------------

namespace {
std::uint64_t block_bytes(const KvGeometry& g) {
  std::uint64_t n = 0;
  for (std::uint32_t grp = 0; grp < g.groups(); ++grp) n += g.group_bytes(grp);
  return n;
}
}  // namespace

std::uint32_t fetch_prefix(TieredStore& store, RemoteKv& remote, RequestId id,
                           const std::vector<std::uint64_t>& keys, std::uint32_t local_hits) {
  if (local_hits >= keys.size()) return local_hits;
  const KvGeometry& g = store.manager().config().geometry;
  const std::vector<std::uint64_t> wanted(keys.begin() + local_hits, keys.end());
  const std::vector<std::string> got = remote.get_prefix(wanted, block_bytes(g));
  for (std::size_t j = 0; j < got.size(); ++j) {
    std::uint64_t off = 0;
    for (std::uint32_t grp = 0; grp < g.groups(); ++grp) {
      store.write(id, static_cast<std::uint32_t>(local_hits + j), grp, 0, got[j].data() + off,
                  g.group_bytes(grp));
      off += g.group_bytes(grp);
    }
  }
  return local_hits + static_cast<std::uint32_t>(got.size());
}

void publish_prefix(TieredStore& store, RemoteKv& remote,
                    const std::vector<std::pair<RequestId, std::vector<std::uint64_t>>>& requests) {
  const KvGeometry& g = store.manager().config().geometry;
  std::vector<std::pair<std::uint64_t, std::string>> blocks;
  std::unordered_set<std::uint64_t> taken;  // rows of a batch share prefix blocks
  for (const auto& [id, keys] : requests)
    for (std::size_t b = 0; b < keys.size(); ++b) {
      if (!taken.insert(keys[b]).second || !remote.wants_put(keys[b])) continue;
      std::string payload(block_bytes(g), '\0');
      std::uint64_t off = 0;
      for (std::uint32_t grp = 0; grp < g.groups(); ++grp) {
        store.read(id, static_cast<std::uint32_t>(b), grp, 0, payload.data() + off, g.group_bytes(grp));
        off += g.group_bytes(grp);
      }
      blocks.emplace_back(keys[b], std::move(payload));
    }
  remote.put(blocks);
}

}  // namespace u3m::kv
