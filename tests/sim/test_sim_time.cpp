// The simulator's pieces on their own: virtual time, the modelled links
// (contention worked out by hand), the fake host tier.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <vector>

#include "u3m/sim/sim_host.hpp"
#include "u3m/sim/sim_transport.hpp"
#include "u3m/sim/virtual_time.hpp"
#include "u3m/util/error.hpp"

namespace u3m::sim {
namespace {

using engine::Link;
using engine::Status;
using engine::Transfer;

TEST(VirtualTime, RunsEventsInTimeOrderAndTiesInSchedulingOrder) {
  VirtualTime vt;
  std::vector<int> order;
  vt.schedule_at(30, [&] { order.push_back(3); });
  vt.schedule_at(10, [&] { order.push_back(1); });
  vt.schedule_at(10, [&] { order.push_back(2); });
  // A callback may schedule more, including at the current time.
  vt.schedule_at(20, [&] {
    order.push_back(4);
    vt.schedule_after(0, [&] { order.push_back(5); });
  });
  EXPECT_EQ(vt.next_time(), 10u);
  vt.run_until(25);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 4, 5}));
  EXPECT_EQ(vt.now_ns(), 25u);  // run_until moves time to its argument
  EXPECT_EQ(vt.pending(), 1u);
  EXPECT_TRUE(vt.run_next());
  EXPECT_EQ(vt.now_ns(), 30u);
  EXPECT_FALSE(vt.run_next());
  EXPECT_EQ(vt.events_run(), 5u);
  EXPECT_EQ(vt.next_time(), std::nullopt);
  EXPECT_THROW(vt.schedule_at(29, [] {}), std::logic_error);
  EXPECT_THROW(vt.run_until(29), std::logic_error);
}

// Many events whose callbacks schedule more (so queue slots are reused while
// others wait): they run in (time, scheduling order), each exactly once.
TEST(VirtualTime, InterleavedSchedulingKeepsTimeThenSchedulingOrder) {
  VirtualTime vt;
  struct Ran {
    std::uint64_t t, seq;
  };
  std::vector<Ran> ran;
  std::uint64_t seq = 0, x = 12345;
  auto next = [&x] { return x = x * 6364136223846793005ull + 1442695040888963407ull; };
  std::function<void(int)> spawn = [&](int depth) {
    const std::uint64_t at = vt.now_ns() + (next() >> 60);  // 0..15 ns ahead: many ties
    const std::uint64_t s = seq++;
    vt.schedule_at(at, [&, at, s, depth] {
      ran.push_back({at, s});
      if (depth < 3) {
        spawn(depth + 1);
        spawn(depth + 1);
      }
    });
  };
  for (int i = 0; i < 50; ++i) spawn(0);
  vt.run_all();
  ASSERT_EQ(ran.size(), 50u * 15u);  // 1 + 2 + 4 + 8 events per root
  EXPECT_EQ(vt.events_run(), ran.size());
  for (std::size_t i = 1; i < ran.size(); ++i) {
    const bool ordered =
        ran[i - 1].t < ran[i].t || (ran[i - 1].t == ran[i].t && ran[i - 1].seq < ran[i].seq);
    ASSERT_TRUE(ordered) << "event " << i;
  }
}

struct Done {
  std::uint64_t ticket, at;
  Status status;
};

struct LinkRig {
  VirtualTime vt;
  SimTransport tr;
  std::vector<Done> done;
  explicit LinkRig(SimTransportConfig c) : tr(vt, c) {
    tr.set_completion([this](const Transfer& t, Status s) {
      done.push_back({t.ticket, vt.now_ns(), s});
    });
  }
  void start(std::uint64_t ticket, Link l, std::uint64_t bytes, std::uint64_t key = 0,
             double rate = 0) {
    Transfer t;
    t.ticket = ticket;
    t.tensor = key;
    t.link = l;
    t.bytes = bytes;
    t.rate_limit = rate;
    tr.start(t);
  }
  const Done* find(std::uint64_t ticket) const {
    for (const Done& d : done) {
      if (d.ticket == ticket) return &d;
    }
    return nullptr;
  }
  std::uint64_t at(std::uint64_t ticket) const { return find(ticket) ? find(ticket)->at : ~0ull; }
  Status status(std::uint64_t ticket) const {
    return find(ticket) ? find(ticket)->status : Status::invalid_argument;
  }
};

// 1 GB/s and 10 us on the memory links; SSD writes 1 GB/s + 20 us, reads 2 GB/s + 80 us.
SimTransportConfig by_hand(bool shared) {
  SimTransportConfig c;
  c.links[static_cast<int>(Link::d2h)] = {1e9, 10e-6};
  c.links[static_cast<int>(Link::h2d)] = {1e9, 10e-6};
  c.links[static_cast<int>(Link::h2s)] = {1e9, 20e-6};
  c.links[static_cast<int>(Link::s2h)] = {2e9, 80e-6};
  c.ssd_capacity = 10'000'000;
  c.ssd_shared = shared;
  return c;
}

TEST(SimTransport, TransfersOnOneLinkQueueAndDirectionsAreIndependent) {
  LinkRig r(by_hand(true));
  r.start(1, Link::d2h, 1'000'000);
  r.start(2, Link::d2h, 1'000'000);
  r.start(3, Link::h2d, 1'000'000);
  EXPECT_TRUE(r.done.empty());  // completions come from the event loop only
  r.vt.run_all();
  ASSERT_EQ(r.done.size(), 3u);
  // 1 MB at 1 GB/s holds the link 1 ms; latency 10 us is pipelined.
  EXPECT_EQ(r.at(1), 1'010'000u);
  EXPECT_EQ(r.at(2), 2'010'000u);  // waited 1 ms behind the first
  EXPECT_EQ(r.at(3), 1'010'000u);  // the other direction does not wait
  EXPECT_EQ(r.tr.link(Link::d2h).busy_ns, 2'000'000u);
  EXPECT_EQ(r.tr.link(Link::d2h).queue_ns, 1'000'000u);
  EXPECT_EQ(r.tr.link(Link::d2h).bytes, 2'000'000u);
  EXPECT_EQ(r.tr.link(Link::d2h).transfers, 2u);
  EXPECT_EQ(r.tr.link(Link::h2d).bytes, 1'000'000u);

  // A transfer issued after the link went idle starts at once.
  r.vt.run_until(5'000'000);
  r.start(4, Link::d2h, 500'000);
  r.vt.run_all();
  EXPECT_EQ(r.at(4), 5'000'000u + 500'000u + 10'000u);
}

TEST(SimTransport, RateLimitSlowsTheTransferAndHoldsTheLinkLonger) {
  LinkRig r(by_hand(true));
  r.start(1, Link::h2d, 1'000'000, 0, /*rate=*/0.5e9);  // capped below the link's 1 GB/s
  r.start(2, Link::h2d, 1'000'000, 0, /*rate=*/4e9);    // a cap above it changes nothing
  r.vt.run_all();
  EXPECT_EQ(r.at(1), 2'010'000u);
  EXPECT_EQ(r.at(2), 3'010'000u);
}

TEST(SimTransport, SsdReadsQueueBehindWritesOnlyWhenTheDriveIsShared) {
  for (bool shared : {true, false}) {
    LinkRig r(by_hand(shared));
    r.start(1, Link::h2s, 1'000'000, /*key=*/7);  // 1 ms of writing
    r.start(2, Link::s2h, 1'000'000, /*key=*/7);  // 0.5 ms of reading
    r.vt.run_all();
    EXPECT_EQ(r.at(1), 1'020'000u) << shared;
    EXPECT_EQ(r.at(2), shared ? 1'580'000u : 580'000u) << shared;
  }
}

TEST(SimTransport, SsdCapacityIsBookkeptAndAFullDriveSaysNoSpace) {
  SimTransportConfig c = by_hand(true);
  c.ssd_capacity = 1'500'000;
  LinkRig r(c);
  r.start(1, Link::h2s, 1'000'000, 1);
  r.start(2, Link::h2s, 1'000'000, 2);  // would exceed 1.5 MB
  r.start(3, Link::s2h, 1'000, 99);     // never written
  r.vt.run_all();
  ASSERT_EQ(r.done.size(), 3u);
  EXPECT_EQ(r.status(1), Status::ok);
  EXPECT_EQ(r.status(2), Status::no_space);
  EXPECT_EQ(r.status(3), Status::io_error);
  EXPECT_EQ(r.at(2), 20'000u);  // refused after the latency, without holding the drive
  EXPECT_EQ(r.tr.ssd_used(), 1'000'000u);
  EXPECT_EQ(r.tr.link(Link::h2s).failures, 1u);
  EXPECT_EQ(r.tr.erase_ssd(1), Status::ok);
  EXPECT_EQ(r.tr.erase_ssd(1), Status::not_found);
  EXPECT_EQ(r.tr.ssd_used(), 0u);
  EXPECT_EQ(r.tr.ssd_peak(), 1'000'000u);
  r.start(4, Link::h2s, 1'400'000, 2);  // room again
  r.vt.run_all();
  EXPECT_EQ(r.status(4), Status::ok);
}

TEST(SimTransport, ConfigNamesTheBadField) {
  SimTransportConfig c = by_hand(true);
  c.links[static_cast<int>(Link::h2d)].bandwidth = 0;
  try {
    c.validate();
    FAIL() << "validate accepted a zero bandwidth";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("h2d.bandwidth"), std::string::npos) << e.what();
  }
  // Without an SSD tier the SSD links need no numbers.
  SimTransportConfig two;
  two.links[0] = two.links[1] = {1e9, 0};
  EXPECT_NO_THROW(two.validate());
  two.links[0].latency_s = -1;
  EXPECT_THROW(two.validate(), InputError);
}

TEST(SimHost, HandsOutDistinctFakeAddressesWithinItsCapacity) {
  SimHost h(3000);
  void *a = nullptr, *b = nullptr, *c = nullptr;
  ASSERT_EQ(h.allocate(1000, &a), Status::ok);
  ASSERT_EQ(h.allocate(1000, &b), Status::ok);
  EXPECT_NE(a, b);
  EXPECT_EQ(h.allocate(1001, &c), Status::out_of_memory);
  EXPECT_EQ(c, nullptr);  // left unchanged on error
  EXPECT_EQ(h.allocate(0, &c), Status::invalid_argument);
  std::uint64_t free_b = 0, total = 0;
  ASSERT_EQ(h.mem_info(&free_b, &total), Status::ok);
  EXPECT_EQ(total, 3000u);
  EXPECT_EQ(free_b, 1000u);
  EXPECT_EQ(h.free(a), Status::ok);
  EXPECT_EQ(h.free(a), Status::invalid_argument);  // double free
  ASSERT_EQ(h.allocate(2000, &c), Status::ok);
  EXPECT_EQ(h.used(), 3000u);
  EXPECT_EQ(h.peak(), 3000u);
  EXPECT_EQ(h.live_allocations(), 2u);
  EXPECT_EQ(h.capabilities().tier, mem::Tier::host);
}

}  // namespace
}  // namespace u3m::sim
