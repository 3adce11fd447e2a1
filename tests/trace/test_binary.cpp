#include <cstring>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "trace_testing.hpp"
#include "u3m/trace/io.hpp"
#include "u3m/util/error.hpp"

namespace u3m::trace {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void expect_same(const Trace& a, const Trace& b) {
  ASSERT_EQ(a.metadata, b.metadata);
  ASSERT_EQ(a.jobs, b.jobs);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor &x = a.tensors[i], &y = b.tensors[i];
    EXPECT_EQ(x.id, y.id);
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.bytes, y.bytes);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.role, y.role);
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.job, y.job);
  }
  ASSERT_EQ(a.ops.size(), b.ops.size());
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    const Op &x = a.ops[i], &y = b.ops[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.cls, y.cls);
    EXPECT_EQ(x.phase, y.phase);
    EXPECT_EQ(x.job, y.job);
    EXPECT_EQ(x.iteration, y.iteration);
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.flops, y.flops);
    EXPECT_EQ(x.bytes, y.bytes);
  }
  ASSERT_EQ(a.events.size(), b.events.size());
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    EXPECT_EQ(a.events[i].time_ns, b.events[i].time_ns) << i;
    EXPECT_EQ(a.events[i].op, b.events[i].op) << i;
    EXPECT_EQ(a.events[i].tensor, b.events[i].tensor) << i;
    EXPECT_EQ(a.events[i].kind, b.events[i].kind) << i;
  }
}

std::string write_binary(const Trace& t, const std::filesystem::path& p) {
  BinaryWriter w(p.string());
  t.replay(w);
  return slurp(p);
}

// Expects read_binary on `data` to throw an InputError containing `needle`.
void expect_error(const std::string& data, const std::string& needle) {
  Trace out;
  try {
    read_binary(data, "t.u3mt", out);
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("t.u3mt"), std::string::npos) << e.what();
  }
}

class Binary : public ::testing::Test {
 protected:
  std::filesystem::path dir = testing::temp_dir();
  void TearDown() override { std::filesystem::remove_all(dir); }
};

TEST_F(Binary, RoundTripsEveryField) {
  Trace src = testing::sample_trace();
  std::string data = write_binary(src, dir / "a.u3mt");
  Trace from_buffer, from_file;
  read_binary(data, "a.u3mt", from_buffer);
  read_binary_file((dir / "a.u3mt").string(), from_file);
  expect_same(src, from_buffer);
  expect_same(src, from_file);
}

TEST_F(Binary, ManyBlocksStayCompact) {
  // 300k events span several 256 KiB blocks; repeating accesses keep deltas small.
  Trace src;
  src.job("train-0");
  for (int i = 0; i < 1000; ++i) {
    std::string name = "train-0.t" + std::to_string(i);
    src.tensor(
        Tensor{stable_id(name), name, 4096u * (i + 1), DType::f16, Role::activation, i % 40, 0});
  }
  for (int i = 0; i < 3000; ++i)
    src.op(Op{"aten::mm", OpClass::matmul, Phase::forward, 0, static_cast<std::uint32_t>(i / 300),
              i % 40, 1e6, 1000});
  std::uint64_t t = 0;
  for (int i = 0; i < 300000; ++i) {
    t += 700 + i % 13;
    src.event(Event{t, static_cast<std::uint32_t>(i / 100), static_cast<std::uint32_t>(i % 1000),
                    static_cast<EventKind>(i % 4)});
  }
  std::string data = write_binary(src, dir / "big.u3mt");
  Trace back;
  read_binary_file((dir / "big.u3mt").string(), back);
  expect_same(src, back);
  double bytes_per_event = static_cast<double>(data.size()) / src.events.size();
  EXPECT_LT(bytes_per_event, 8.0);  // the format's point: a fraction of JSON's ~70 bytes
}

TEST_F(Binary, RejectsWrongMagicAndVersion) {
  std::string data = write_binary(testing::sample_trace(), dir / "a.u3mt");
  std::string bad = data;
  bad[0] = 'X';
  expect_error(bad, "wrong magic");
  bad = data;
  bad[8] = 9;
  expect_error(bad, "unsupported trace version 9");
}

TEST_F(Binary, EveryTruncationIsACleanError) {
  std::string data = write_binary(testing::sample_trace(), dir / "a.u3mt");
  for (std::size_t n = 0; n < data.size(); ++n) {
    Trace out;
    EXPECT_THROW(read_binary(std::string_view(data).substr(0, n), "t.u3mt", out), InputError)
        << "prefix of " << n << " bytes";
  }
  expect_error(data.substr(0, data.size() - 3), "truncated");
}

TEST_F(Binary, DetectsCorruptionAndTrailingGarbage) {
  std::string data = write_binary(testing::sample_trace(), dir / "a.u3mt");
  std::string bad = data;
  bad[40] ^= 0x10;  // inside the first block's payload
  expect_error(bad, "checksum mismatch");
  expect_error(data + "x", "garbage");
}

TEST_F(Binary, UnfinishedWriterNeitherCreatesNorClobbers) {
  auto path = (dir / "out.u3mt").string();
  std::string before = write_binary(testing::sample_trace(), path);
  {
    BinaryWriter w(path);
    w.job("train-0");
    // destroyed without finish(), as after an exception mid-import
  }
  EXPECT_EQ(slurp(path), before);  // the earlier output is intact
  {
    BinaryWriter w((dir / "fresh.u3mt").string());
    w.job("train-0");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "fresh.u3mt"));
  for (auto& e : std::filesystem::directory_iterator(dir))  // no temporary files left behind
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}

TEST_F(Binary, RejectsOverflowingDeltasAndFlags) {
  // Hand-built records: a job, a tensor, an op, then events whose time delta
  // would overflow int64 (must be an error, never undefined behaviour).
  Trace src;
  src.job("j");
  src.tensor(make_tensor("x", 1, DType::f32, Role::other));
  src.op(Op{"aten::mm", OpClass::matmul, Phase::forward, 0, 0, kNoLayer, 0, 0});
  src.event(Event{INT64_MAX, 0, 0, EventKind::read});
  src.event(Event{static_cast<std::uint64_t>(INT64_MAX) * 2, 0, 0, EventKind::read});
  std::string data = write_binary(src, dir / "ovf.u3mt");
  expect_error(data, "event.time");
  std::string flagged = write_binary(testing::sample_trace(), dir / "f.u3mt");
  flagged[12] = 1;
  expect_error(flagged, "unsupported header flags");
}

TEST_F(Binary, FileReaderNamesTheFile) {
  std::ofstream((dir / "junk.u3mt").string()) << "U3MTRACE";
  Trace out;
  try {
    read_binary_file((dir / "junk.u3mt").string(), out);
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("junk.u3mt"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("truncated header"), std::string::npos) << e.what();
  }
}

TEST_F(Binary, RejectsIdThatIsNotTheNameHash) {
  Trace src;
  src.job("j");
  src.tensor(Tensor{42, "x", 1, DType::f32, Role::other, kNoLayer, 0});
  std::string data = write_binary(src, dir / "id.u3mt");
  expect_error(data, "tensor.id");
}

}  // namespace
}  // namespace u3m::trace
