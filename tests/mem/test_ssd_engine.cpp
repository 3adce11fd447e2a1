// The I/O engines on their own: the io_uring engine's queue-depth cap, its
// FIFO of waiting ops, and the depth statistics the benchmark reports.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <vector>

#include "test_ssd_util.hpp"

namespace u3m::mem {
namespace {

using testing::ScratchDir;

constexpr std::uint32_t kOp = 4096;

// A file of n blocks, block i filled with the byte i.
int block_file(const ScratchDir& dir, int n) {
  int fd = ::open(dir.file("blocks").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  EXPECT_GE(fd, 0);
  std::vector<unsigned char> b(kOp);
  for (int i = 0; i < n; ++i) {
    std::fill(b.begin(), b.end(), static_cast<unsigned char>(i));
    EXPECT_EQ(::pwrite(fd, b.data(), kOp, static_cast<off_t>(i) * kOp), kOp);
  }
  return fd;
}

// Reads n blocks in one submit() on `e` and checks every byte and result.
void read_all(IoEngine& e, int fd, int n) {
  std::vector<std::vector<unsigned char>> bufs(n, std::vector<unsigned char>(kOp, 0xEE));
  std::vector<std::int64_t> res(n, -1);
  std::atomic<int> left{n};
  std::promise<void> all;
  std::vector<IoOp> ops;
  for (int i = 0; i < n; ++i)
    ops.push_back(
        IoOp{IoKind::read, fd, bufs[i].data(), kOp, std::uint64_t(i) * kOp, [&, i](std::int64_t r) {
               res[i] = r;
               if (--left == 0) all.set_value();
             }});
  e.submit(ops);
  all.get_future().wait();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(res[i], kOp) << i;
    EXPECT_EQ(bufs[i], std::vector<unsigned char>(kOp, static_cast<unsigned char>(i))) << i;
  }
}

TEST(UringEngine, CapsOpsInFlightAtQueueDepthAndQueuesTheRest) {
  ScratchDir dir;
  const int n = 64;
  int fd = block_file(dir, n);
  std::unique_ptr<IoEngine> e;
  std::string why;
  if (!ok(make_uring_engine(4, e, &why))) GTEST_SKIP() << "io_uring unavailable: " << why;
  read_all(*e, fd, n);  // submit() returns without waiting for the device
  IoEngineStats st = e->stats();
  EXPECT_EQ(st.reads, std::uint64_t(n));
  EXPECT_EQ(st.completions, std::uint64_t(n));
  EXPECT_EQ(st.bytes_read, std::uint64_t(n) * kOp);
  // One submit() holds the engine's lock throughout: the first 4 start, and
  // the other 60 wait for the completion thread to start them.
  EXPECT_EQ(st.max_depth, 4u);
  EXPECT_EQ(st.queued, std::uint64_t(n - 4));
  double mean = double(st.depth_sum) / double(st.completions);
  EXPECT_GE(mean, 1.0);
  EXPECT_LE(mean, 4.0);
  ::close(fd);
}

TEST(SyncEngine, ReportsDepthOne) {
  ScratchDir dir;
  int fd = block_file(dir, 8);
  auto e = make_sync_engine();
  read_all(*e, fd, 8);
  IoEngineStats st = e->stats();
  EXPECT_EQ(st.completions, 8u);
  EXPECT_EQ(st.depth_sum, 8u);
  EXPECT_EQ(st.max_depth, 1u);
  EXPECT_EQ(st.queued, 0u);
  ::close(fd);
}

}  // namespace
}  // namespace u3m::mem
