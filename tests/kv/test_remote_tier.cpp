// The remote KV tier (src/kv/remote_tier.cpp, docs/kv.md "Remote tier on Redis"): the value
// framing, then a real redis-server this test starts on a free loopback port: pipelined
// batches, a corrupted value, a restart (reconnect), a paused server (timeout), and two
// TieredStores sharing a prefix through it as two serving processes would.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "u3m/kv/remote_tier.hpp"
#include "u3m/util/error.hpp"

using namespace u3m;
using namespace u3m::kv;
using namespace std::chrono_literals;

namespace {

std::string payload(std::size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7919) & 0xff);
  return s;
}

TEST(RemoteFraming, RoundTripsAndRejectsEveryDamage) {
  const std::string p = payload(1000, 3);
  const std::string v = encode_value(42, p);
  ASSERT_EQ(v.size(), kRemoteHeaderBytes + p.size());
  std::string_view out;
  ASSERT_EQ(decode_value(v, 42, p.size(), &out), DecodeError::ok);
  EXPECT_EQ(out, p);

  std::string flipped = v;
  flipped[kRemoteHeaderBytes + 500] ^= 1;  // one payload bit
  EXPECT_EQ(decode_value(flipped, 42, p.size(), &out), DecodeError::bad_checksum);
  std::string sum = v;
  sum[24] ^= 1;  // the checksum itself
  EXPECT_EQ(decode_value(sum, 42, p.size(), &out), DecodeError::bad_checksum);
  EXPECT_EQ(decode_value(v, 43, p.size(), &out), DecodeError::wrong_key);
  EXPECT_EQ(decode_value(v, 42, p.size() + 1, &out), DecodeError::bad_length);
  EXPECT_EQ(decode_value(v.substr(0, v.size() - 1), 42, p.size(), &out), DecodeError::bad_length);
  EXPECT_EQ(decode_value(v.substr(0, 31), 42, p.size(), &out), DecodeError::short_value);
  std::string magic = v;
  magic[0] = 'X';
  EXPECT_EQ(decode_value(magic, 42, p.size(), &out), DecodeError::bad_magic);
  std::string len = v;
  len[23] = '\x7f';  // a huge length in the header
  EXPECT_EQ(decode_value(len, 42, p.size(), &out), DecodeError::bad_length);
}

TEST(RemoteFraming, ParsesOnlyRedisUrls) {
  const RedisOptions o = RedisOptions::parse_url("redis://127.0.0.1:6390", "remote");
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.port, 6390);
  for (const char* bad : {"http://x:1", "redis://x", "redis://:1", "redis://x:0", "redis://x:70000",
                          "redis://u@x:1", "redis://x:1/2", "redis://x:1a"})
    EXPECT_THROW(RedisOptions::parse_url(bad, "remote"), InputError) << bad;
}

// ---- a real server -------------------------------------------------------------------------

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

bool have_redis() { return std::system("command -v redis-server >/dev/null 2>&1") == 0; }

// redis-server on loopback, no persistence, bounded memory with LRU eviction.
class Server {
 public:
  explicit Server(int port) : port_(port) { start(); }
  ~Server() { stop(); }
  void start() {
    pid_ = fork();
    if (pid_ == 0) {
      const int null = open("/dev/null", O_WRONLY);  // its start-up banner and warnings
      dup2(null, 1);
      const std::string port = std::to_string(port_);
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--maxmemory", "64mb", "--maxmemory-policy",
             "allkeys-lru", "--loglevel", "warning", static_cast<char*>(nullptr));
      _exit(127);
    }
    // Ready once it answers (a fresh RedisTier, so no backoff state carries over).
    for (int i = 0; i < 100; ++i) {
      RedisOptions o;
      o.port = port_;
      RedisTier t(o);
      std::vector<std::optional<std::string>> out;
      if (t.get({"ping"}, out) == RemoteStatus::ok) return;
      std::this_thread::sleep_for(50ms);
    }
    FAIL() << "redis-server did not come up on port " << port_;
  }
  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGCONT);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void pause() { kill(pid_, SIGSTOP); }
  void resume() { kill(pid_, SIGCONT); }
  int port() const { return port_; }

 private:
  int port_;
  pid_t pid_ = -1;
};

RedisOptions opts(int port) {
  RedisOptions o;
  o.port = port;
  o.timeout = 200ms;
  o.backoff_min = 50ms;
  o.backoff_max = 200ms;
  return o;
}

class RemoteRedis : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_redis()) GTEST_SKIP() << "redis-server is not installed (scripts/install-deps.sh)";
    server_ = std::make_unique<Server>(free_port());
  }
  std::unique_ptr<Server> server_;
};

TEST_F(RemoteRedis, PipelinedBatchesStopAtTheFirstMissOrBadValue) {
  auto tier = std::make_unique<RedisTier>(opts(server_->port()));
  RedisTier& raw = *tier;
  RemoteKv kv(std::move(tier), "t", 60);
  std::vector<std::pair<std::uint64_t, std::string>> blocks;
  std::vector<std::uint64_t> keys;
  for (unsigned i = 0; i < 64; ++i) {
    keys.push_back(1000 + i);
    blocks.emplace_back(1000 + i, payload(4096, i));
  }
  kv.put(blocks);  // one pipeline of 64 SETs
  EXPECT_EQ(kv.stats().puts, 64u);
  EXPECT_EQ(kv.stats().errors, 0u);
  EXPECT_EQ(kv.index_size(), 64u);

  const std::vector<std::string> got = kv.get_prefix(keys, 4096);
  ASSERT_EQ(got.size(), 64u);
  for (unsigned i = 0; i < 64; ++i) EXPECT_EQ(got[i], blocks[i].second) << i;
  EXPECT_EQ(kv.stats().hits, 64u);

  // A key never put ends the prefix; so does a corrupted value (written under block 10's
  // name: its checksum no longer matches), which also drops block 10 from the index.
  std::vector<std::uint64_t> gap = keys;
  gap[20] = 7;
  EXPECT_EQ(kv.get_prefix(gap, 4096).size(), 20u);
  std::string bad = encode_value(1010, payload(4096, 10));
  bad[kRemoteHeaderBytes + 1] ^= 0x40;
  ASSERT_EQ(raw.put({{kv.name(1010), bad}}, 60), RemoteStatus::ok);
  EXPECT_TRUE(kv.indexed(1010));
  EXPECT_EQ(kv.get_prefix(keys, 4096).size(), 10u);
  EXPECT_EQ(kv.stats().corrupt, 1u);
  EXPECT_EQ(kv.stats().index_drops, 1u);
  EXPECT_FALSE(kv.indexed(1010));
  // A value of another size (another geometry's block) is not taken either.
  EXPECT_EQ(kv.get_prefix(keys, 4095).size(), 0u);
}

TEST_F(RemoteRedis, ReconnectsAfterTheServerRestarts) {
  auto tier = std::make_unique<RedisTier>(opts(server_->port()));
  RedisTier& raw = *tier;
  RemoteKv kv(std::move(tier), "t", 60);
  kv.put({{1, payload(100, 1)}});
  ASSERT_EQ(kv.get_prefix({1}, 100).size(), 1u);
  EXPECT_EQ(raw.connects(), 1u);

  server_->stop();
  EXPECT_EQ(kv.get_prefix({1}, 100).size(), 0u);  // the server is gone: a miss, counted
  EXPECT_EQ(kv.stats().errors, 1u);
  kv.put({{2, payload(100, 2)}});  // within the backoff: not even tried
  EXPECT_EQ(kv.stats().errors, 2u);
  EXPECT_GE(raw.skipped(), 1u);

  server_->start();  // same port, empty (no persistence)
  std::this_thread::sleep_for(250ms);  // past the backoff
  // The index held block 1, the new server does not: a miss that drops it from the index.
  EXPECT_EQ(kv.get_prefix({1}, 100).size(), 0u);
  EXPECT_EQ(kv.stats().index_drops, 1u);
  EXPECT_EQ(raw.connects(), 2u);
  kv.put({{1, payload(100, 1)}});
  EXPECT_EQ(kv.get_prefix({1}, 100).size(), 1u);
}

TEST_F(RemoteRedis, APausedServerTimesOutWithinTheBound) {
  auto tier = std::make_unique<RedisTier>(opts(server_->port()));
  RemoteKv kv(std::move(tier), "t", 60);
  kv.put({{1, payload(100, 1)}});
  server_->pause();  // connections stay open, nothing answers
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(kv.get_prefix({1}, 100).size(), 0u);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 150ms);  // it did wait for the server...
  EXPECT_LT(waited, 1000ms);  // ...but only about one 200 ms timeout
  EXPECT_EQ(kv.stats().errors, 1u);
  // A put to a new connection (the failed one was closed) times out likewise.
  std::this_thread::sleep_for(60ms);
  const auto t1 = std::chrono::steady_clock::now();
  kv.put({{2, payload(1 << 20, 2)}});
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 1500ms);
  EXPECT_EQ(kv.stats().errors, 2u);
  EXPECT_EQ(kv.stats().puts, 1u);
  server_->resume();
}

// Round trips of pipelined batches against one call per block, medians measured on this
// machine (printed). With small values a round trip dominates and the pipeline must win; with
// block-sized values the bytes dominate and the figures are only reported.
struct Timing {
  double put_us, batch_us, single_us;
};
Timing time_batches(int port, unsigned blocks, unsigned bytes) {
  std::vector<std::pair<std::uint64_t, std::string>> vals;
  std::vector<std::uint64_t> keys;
  for (unsigned i = 0; i < blocks; ++i) {
    keys.push_back(i + 1);
    vals.emplace_back(i + 1, payload(bytes, i));
  }
  auto median_us = [](auto&& f) {
    std::vector<double> t;
    for (int rep = 0; rep < 7; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  RemoteKv kv(std::make_unique<RedisTier>(opts(port)), fmt::format("t{}", bytes), 60);
  kv.put(vals);  // connects
  Timing t{};
  t.put_us = median_us([&] {
    RemoteKv fresh(std::make_unique<RedisTier>(opts(port)), fmt::format("t{}", bytes), 60);
    fresh.put(vals);  // an empty index: every block is put, and a connect
  });
  t.batch_us = median_us([&] { EXPECT_EQ(kv.get_prefix(keys, bytes).size(), blocks); });
  t.single_us = median_us([&] {
    for (std::uint64_t k : keys) EXPECT_EQ(kv.get_prefix({k}, bytes).size(), 1u);
  });
  EXPECT_EQ(kv.stats().errors, 0u);
  const double mb = double(blocks) * bytes / 1e6;
  std::printf("measured on this machine, loopback, %u blocks of %u B: pipelined put %.0f us "
              "(with a connect), pipelined get %.0f us (%.0f MB/s), one get per block %.0f us\n",
              blocks, bytes, t.put_us, t.batch_us, mb / (t.batch_us / 1e6), t.single_us);
  return t;
}

TEST_F(RemoteRedis, APipelinedBatchSavesRoundTrips) {
  const Timing small = time_batches(server_->port(), 64, 256);
  EXPECT_LT(small.batch_us, small.single_us);
  time_batches(server_->port(), 64, 32 << 10);
  time_batches(server_->port(), 16, 1 << 20);  // a real model's block is MiBs
}

// 8 layers in 2 groups of 4; 4-token blocks; 32 B per token and layer: 512 B slots.
KvConfig config() {
  KvConfig c;
  c.geometry.block_tokens = 4;
  c.geometry.layers = 8;
  c.geometry.layers_per_group = 4;
  c.geometry.bytes_per_token_layer = 32;
  c.capacity_slots = {16, 32, 0};
  c.overcommit = 0;
  return c;
}

workload::ServeRequest prompt(const std::string& tail) {
  workload::ServeRequest r;
  r.output_tokens = 4;
  r.prompt = {{"system", 12}, {tail, 3}};  // 3 full blocks shared, then a partial one
  return r;
}

TEST_F(RemoteRedis, TwoStoresShareAPrefixThroughTheRemote) {
  const KvConfig c = config();
  const std::string ns = remote_namespace(c.geometry);
  const std::uint64_t slot = c.geometry.group_bytes(0);
  const auto keys = block_keys(prompt("a").prompt, c.geometry.block_tokens);
  ASSERT_EQ(keys.size(), 3u);

  // The first "process" computes the prefix and publishes it.
  TieredStore first(c);
  RemoteKv r1(std::make_unique<RedisTier>(opts(server_->port())), ns, 60);
  Admission a;
  ASSERT_EQ(first.submit(1, prompt("a"), &a), SubmitResult::admitted);
  EXPECT_EQ(a.hit_blocks, 0u);
  for (std::uint32_t b = 0; b < 4; ++b)
    for (std::uint32_t g = 0; g < 2; ++g) {
      const std::string p = payload(slot, b * 2 + g);
      first.write(1, b, g, 0, p.data(), p.size());
    }
  publish_prefix(first, r1, {{1, keys}, {1, keys}});
  EXPECT_EQ(r1.stats().puts, 3u);  // full blocks only, each key once
  EXPECT_EQ(r1.stats().put_skipped, 0u);
  publish_prefix(first, r1, {{1, keys}});
  EXPECT_EQ(r1.stats().put_skipped, 3u);  // the index saves the second put

  // The second has nothing locally; its three prefix blocks come from the remote.
  TieredStore second(c);
  RemoteKv r2(std::make_unique<RedisTier>(opts(server_->port())), ns, 60);
  ASSERT_EQ(second.submit(7, prompt("b"), &a), SubmitResult::admitted);
  EXPECT_EQ(a.hit_blocks, 0u);
  EXPECT_EQ(fetch_prefix(second, r2, 7, keys, a.hit_blocks), 3u);
  for (std::uint32_t b = 0; b < 3; ++b)
    for (std::uint32_t g = 0; g < 2; ++g) {
      std::string got(slot, '\0');
      second.read(7, b, g, 0, got.data(), got.size());
      EXPECT_EQ(got, payload(slot, b * 2 + g)) << b << "/" << g;
    }
  // Promoted: once finished, its blocks are local prefix hits for the next request.
  second.finish(7);
  ASSERT_EQ(second.submit(8, prompt("c"), &a), SubmitResult::admitted);
  EXPECT_EQ(a.hit_blocks, 3u);
  EXPECT_EQ(fetch_prefix(second, r2, 8, keys, a.hit_blocks), 3u);  // nothing asked
  EXPECT_EQ(r2.stats().lookups, 3u);

  // Another geometry never reads these values (its namespace differs).
  KvConfig other = c;
  other.geometry.bytes_per_token_layer = 16;
  EXPECT_NE(remote_namespace(other.geometry), ns);
}

}  // namespace
