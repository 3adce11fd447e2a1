// Crash consistency of the SSD store: a child process runs SSD-heavy work and
// is killed with SIGKILL at seeded random points; the next open of the same
// file starts empty, says so, and serves nothing from before. A file that a
// live store holds is refused to a second opener with busy.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <deque>
#include <future>
#include <map>
#include <random>

#include "test_ssd_util.hpp"

namespace u3m::mem {
namespace {

using testing::blob;
using testing::open_store;
using testing::ScratchDir;

constexpr std::uint64_t kCapacity = 16 * MiB;
constexpr std::uint64_t kChildKeys = 5000, kChildKeyCount = 24;

SsdStoreOptions crash_options(const std::string& path) {
  SsdStoreOptions o;
  o.path = path;
  o.capacity = kCapacity;
  o.chunk_bytes = 64 * KiB;
  return o;
}

// Exit codes of a child that stopped by itself (it should only ever be killed).
enum ChildExit { kOpenFailed = 10, kNotFresh = 11, kWrongBytes = 12, kOpFailed = 13 };

// The child: random puts (up to 4 in flight), gets and erases on its own keys,
// each get checked against a shadow copy, one progress byte over `report`
// after each op is issued, until it is killed.
[[noreturn]] void child_workload(const std::string& path, int report, std::uint64_t seed) {
  auto o = crash_options(path);
  o.remove_on_close = false;
  std::unique_ptr<SsdStore> s;
  if (!ok(SsdStore::open(o, s))) _exit(kOpenFailed);
  if (!s->open_notice().empty()) _exit(kNotFresh);  // the parent's store removed the file
  std::mt19937_64 rng(seed);
  std::map<std::uint64_t, std::vector<unsigned char>> shadow;
  struct InFlight {
    std::uint64_t key;
    std::vector<unsigned char> data;
    std::future<Status> done;
  };
  std::deque<InFlight> puts;
  auto settle = [&] {
    for (auto& p : puts) {
      if (!ok(p.done.get())) _exit(kOpFailed);
      shadow[p.key] = std::move(p.data);
    }
    puts.clear();
  };
  std::vector<unsigned char> out(600 * KiB);
  for (std::uint64_t op = 1;; ++op) {
    std::uint64_t key = kChildKeys + rng() % kChildKeyCount;
    int what = static_cast<int>(rng() % 10);
    if (what < 5) {
      bool busy_key = false;
      for (auto& p : puts) busy_key |= p.key == key;
      if (busy_key || puts.size() == 4) settle();
      std::size_t n = 1 + rng() % (600 * KiB);
      InFlight p{key, blob(key, op, n), {}};
      p.done = s->put_async(key, p.data.data(), n, false);
      puts.push_back(std::move(p));
    } else if (what < 9) {
      settle();
      std::size_t n = 0;
      Status st = s->get(key, out.data(), out.size(), &n);
      auto it = shadow.find(key);
      if (it == shadow.end() ? st != Status::not_found
                             : !ok(st) || n != it->second.size() ||
                                   !std::equal(it->second.begin(), it->second.end(), out.begin()))
        _exit(kWrongBytes);
    } else {
      settle();
      s->erase(key);
      shadow.erase(key);
    }
    char b = 1;
    if (::write(report, &b, 1) != 1) _exit(kOpFailed);
  }
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  if (WIFEXITED(status)) return "exited with " + std::to_string(WEXITSTATUS(status));
  return "status " + std::to_string(status);
}

// Forks the workload and returns its pid and the read end of its report pipe.
std::pair<pid_t, int> spawn_workload(const std::string& path, std::uint64_t seed) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, -1};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    child_workload(path, fds[1], seed);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

// Reads up to n progress bytes; fewer if the child stopped.
std::uint64_t await_progress(int fd, std::uint64_t n) {
  std::uint64_t got = 0;
  char buf[64];
  while (got < n) {
    ssize_t r = ::read(fd, buf, std::min<std::uint64_t>(sizeof buf, n - got));
    if (r <= 0) break;
    got += static_cast<std::uint64_t>(r);
  }
  return got;
}

TEST(SsdCrash, KilledMidWorkTheNextOpenStartsEmptyAndSaysSo) {
  ScratchDir dir;
  const std::string path = dir.file("store.dat");
  std::mt19937_64 rng(20261201);
  for (int round = 0; round < 12; ++round) {
    const std::uint64_t kill_at = 1 + rng() % 150;  // ops issued before the kill
    SCOPED_TRACE(::testing::Message() << "round " << round << ", killed after op " << kill_at);
    auto [pid, progress] = spawn_workload(path, 1 + round);
    ASSERT_GT(pid, 0);
    EXPECT_EQ(await_progress(progress, kill_at), kill_at);
    ::kill(pid, SIGKILL);  // while it issues its next ops
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ::close(progress);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the workload stopped by itself: " << describe(status);

    std::unique_ptr<SsdStore> s = open_store(crash_options(path));
    ASSERT_TRUE(s);
    EXPECT_NE(s->open_notice().find(path + ": discarded 16.0 MiB"), std::string::npos)
        << s->open_notice();
    EXPECT_NE(s->open_notice().find("starting empty"), std::string::npos);
    auto st = s->stats();
    EXPECT_EQ(st.discarded_at_open_bytes, kCapacity);
    EXPECT_EQ(st.entries, 0u);
    EXPECT_EQ(st.bytes_used, 0u);
    std::vector<unsigned char> out(600 * KiB);
    for (std::uint64_t k = kChildKeys; k < kChildKeys + kChildKeyCount; ++k) {
      EXPECT_FALSE(s->contains(k)) << k;
      EXPECT_EQ(s->get(k, out.data(), out.size()), Status::not_found) << k;
      EXPECT_EQ(s->verify(k), Status::not_found) << k;
    }
    // And it works as new, on the child's keys too.
    for (std::uint64_t k : {kChildKeys, kChildKeys + 1, std::uint64_t{1}}) {
      auto v = blob(k, 100 + round, 100 * KiB + k % 7);
      ASSERT_EQ(s->put(k, v.data(), v.size(), false), Status::ok);
      std::size_t n = 0;
      ASSERT_EQ(s->get(k, out.data(), out.size(), &n), Status::ok);
      EXPECT_EQ(std::vector<unsigned char>(out.begin(), out.begin() + n), v);
    }
    s.reset();  // removes the file: the next child starts fresh
  }
}

TEST(SsdCrash, SecondOpenerOfALiveStoreIsRefused) {
  ScratchDir dir;
  auto o = crash_options(dir.file("store.dat"));
  auto a = open_store(o);
  ASSERT_TRUE(a);
  auto v = blob(1, 1, 5000);
  ASSERT_EQ(a->put(1, v.data(), v.size(), false), Status::ok);
  std::unique_ptr<SsdStore> b;
  std::string why;
  EXPECT_EQ(SsdStore::open(o, b, &why), Status::busy);
  EXPECT_FALSE(b);
  EXPECT_NE(why.find(o.path + ": in use by another process"), std::string::npos) << why;
  // The holder is named where /proc/locks shows it (it does on ext4 and tmpfs).
  if (why.find("(pid") != std::string::npos) {
    EXPECT_NE(why.find("(pid " + std::to_string(::getpid()) + ", this process)"), std::string::npos)
        << why;
  }
  // The refused open changed nothing of the live store's.
  std::vector<unsigned char> out(5000);
  ASSERT_EQ(a->get(1, out.data(), out.size()), Status::ok);
  EXPECT_EQ(out, v);
  a.reset();
  b = open_store(o);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->open_notice(), "");  // the first store removed its file on close
}

TEST(SsdCrash, StoreHeldByAnotherProcessIsRefusedUntilItDies) {
  ScratchDir dir;
  const std::string path = dir.file("store.dat");
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    auto o = crash_options(path);
    std::unique_ptr<SsdStore> s;
    if (!ok(SsdStore::open(o, s))) _exit(kOpenFailed);
    char b = 1;
    if (::write(fds[1], &b, 1) != 1) _exit(kOpFailed);
    for (;;) ::pause();
  }
  ::close(fds[1]);
  ASSERT_EQ(await_progress(fds[0], 1), 1u);
  std::unique_ptr<SsdStore> s;
  std::string why;
  EXPECT_EQ(SsdStore::open(crash_options(path), s, &why), Status::busy);
  EXPECT_NE(why.find(path + ": in use by another process"), std::string::npos) << why;
  if (why.find("(pid") != std::string::npos) {
    EXPECT_NE(why.find("(pid " + std::to_string(pid) + ")"), std::string::npos) << why;
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::close(fds[0]);
  s = open_store(crash_options(path));  // the lock died with it
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().discarded_at_open_bytes, kCapacity);
}

TEST(SsdCrash, FileKeptOnCloseIsDiscardedOnTheNextOpen) {
  ScratchDir dir;
  auto o = crash_options(dir.file("store.dat"));
  o.capacity = 4 * MiB;
  o.remove_on_close = false;
  {
    auto a = open_store(o);
    auto v = blob(1, 1, 70000);
    ASSERT_EQ(a->put(1, v.data(), v.size(), false), Status::ok);
    EXPECT_EQ(a->open_notice(), "");
  }
  struct stat st {};
  ASSERT_EQ(::stat(o.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 4 * MiB);
  o.remove_on_close = true;
  auto b = open_store(o);
  EXPECT_EQ(b->open_notice(),
            o.path +
                ": discarded 4.0 MiB left by an earlier process that did not remove it (killed, or "
                "remove_on_close = false); the index lives in memory, so none of it can be "
                "trusted; starting empty");
  EXPECT_EQ(b->stats().discarded_at_open_bytes, 4 * MiB);
  EXPECT_FALSE(b->contains(1));
  b.reset();
  EXPECT_NE(::stat(o.path.c_str(), &st), 0);  // removed on close this time
}

}  // namespace
}  // namespace u3m::mem
