// The asynchronous window connector in one process: ranks are threads joined at a real
// rendezvous store, windows are real POSIX shared memory (connector/shm_window.h).
#include "afd/connector/async_connector.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <optional>
#include <thread>

#include "afd/comm/afd_world.h"
#include "afd/comm/socket.h"
#include "afd/common/error.h"
#include "afd/connector/shm_window.h"

namespace afd::connector {
namespace {

using RankFn = std::function<void(comm::AfdWorld&)>;

// Runs attention(world) on A threads and ffn(world) on F threads of one deployment; returns
// each rank's error ("" when it finished), FFN ranks first. `extra` continues every rank's
// connector_extra_config; `ffn_extra`, when given, the FFN ranks' instead.
std::vector<std::string> RunRanks(int A, int F, const std::string& extra, const RankFn& attention,
                                  const RankFn& ffn,
                                  const std::optional<std::string>& ffn_extra = std::nullopt) {
  setenv("AFD_JOIN_SECRET", "async-connector-test-secret-0123456789", 0);
  const int port = comm::PickRendezvousPort();
  std::vector<std::string> errors(A + F);
  std::vector<std::future<void>> ranks;
  for (int i = 0; i < A + F; ++i) {
    ranks.push_back(std::async(std::launch::async, [&, i] {
      const bool is_ffn = i < F;
      const std::string json = fmt::format(
          R"({{"role": "{}", "connector": "AsyncAFDConnector", "port": {},
              "num_attention_ranks": {}, "num_ffn_ranks": {}, "afd_process_group_timeout_s": 5,
              "connector_extra_config": {{"recv_poll_timeout_ms": 20 {}}}}})",
          is_ffn ? "ffn" : "attention", port, A, F, is_ffn && ffn_extra ? *ffn_extra : extra);
      std::unique_ptr<comm::AfdWorld> world;
      try {
        comm::JoinRequest req;
        req.config = ParseAfdConfig(json);
        req.role_rank = is_ffn ? i : i - F;
        req.hidden_size = 8;
        world = comm::AfdWorld::Join(req);
        (is_ffn ? ffn : attention)(*world);
        world->Barrier("test-done");
      } catch (const Error& e) {
        errors[i] = e.what();
        if (world) world->Abort(e.what());
      }
    }));
  }
  for (auto& r : ranks) {
    if (r.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      ADD_FAILURE() << "a rank still runs after 60 s";
      std::abort();
    }
  }
  return errors;
}

AsyncConnectorOptions Options(const comm::AfdWorld& w, int64_t token_cap) {
  AsyncConnectorOptions o;
  o.token_cap = w.self().role == Role::kAttention ? token_cap : 0;
  o.topk = 2;
  o.num_experts = 4;
  o.row = {8, DType::kF32};
  return o;
}

TEST(ShmWindow, OneSidedWriteThenFlagAndNamesAreUnlinked) {
  std::string name_of_ffn;
  const auto errors = RunRanks(
      1, 1, "",
      [&](comm::AfdWorld& w) {
        auto win = ShmWindow::Create(w, 4096, {0});
        const char payload[] = "hello from attention 0";
        win->Write(0, 512, payload, sizeof(payload));
        win->WriteFlag(0, 8, 42);
        EXPECT_THROW(win->Write(0, 4000, payload, 200), Error);  // past the end
        EXPECT_FALSE(win->PeerExited(0));
        w.Barrier("read");
      },
      [&](comm::AfdWorld& w) {
        auto win = ShmWindow::Create(w, 4096, {1});
        name_of_ffn = ShmWindow::SegmentName(w.config().host, w.config().port, 0);
        const std::vector<uint64_t> seen = {0, 0};
        const int hit = WaitForFlags(*win, 0, seen, 0, Deadline::In(5), [] {});
        EXPECT_EQ(hit, 1);
        EXPECT_STREQ(win->local() + 512, "hello from attention 0");
        // Mapped everywhere: the name is gone already, nothing can leak in /dev/shm.
        EXPECT_LT(shm_open(name_of_ffn.c_str(), O_RDONLY, 0), 0);
        w.Barrier("read");
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(AsyncConnector, RoundTripWithTheSeenMirror) {
  const auto errors = RunRanks(
      1, 1, "",
      [](comm::AfdWorld& w) {
        AsyncConnector c(w, Options(w, 4));
        const std::vector<int32_t> counts = {2, 1, 0, 0}, route = {0, 1, 1}, shared = {0, 1};
        const std::vector<float> rows(3 * 8, 1.5f), shared_rows(2 * 8, 2.5f);
        for (int layer = 1; layer <= 3; ++layer) {
          SlotPayload p;
          p.layer = layer;
          p.num_tokens = 2;
          p.expert_counts = counts;
          p.route = route;
          p.routed_rows = rows.data();
          p.shared_index = shared;
          p.shared_rows = shared_rows.data();
          const uint64_t seq = c.Send(0, p);
          EXPECT_EQ(seq, static_cast<uint64_t>(layer));
          const ReceivedSlot r = c.Receive(0, 0, "a reply");
          EXPECT_EQ(r.header.echo_seq, seq);
          EXPECT_EQ(r.header.layer, layer);
          ASSERT_EQ(r.header.routed_rows, 3);
          float v;
          std::memcpy(&v, r.routed_rows, 4);
          EXPECT_EQ(v, 1.5f * layer);
        }
        c.AnnounceShutdown();
      },
      [](comm::AfdWorld& w) {
        AsyncConnector c(w, Options(w, 0));
        EXPECT_EQ(c.layout().cap.token_cap, 4);  // learned from the attention rank
        EXPECT_EQ(c.layout().num_regions, 1);
        for (int layer = 1; layer <= 3; ++layer) {
          std::optional<ReceivedSlot> in;
          while (!(in = c.Poll(20))) {
          }
          EXPECT_EQ(in->header.layer, layer);
          EXPECT_EQ(in->header.num_experts, 4);
          EXPECT_EQ(in->expert_counts[0], 2);
          EXPECT_EQ(in->route[2], 1);
          // Seen: the same flag is not delivered twice.
          EXPECT_FALSE(c.Poll(20).has_value());
          std::vector<float> out(3 * 8, 1.5f * layer);
          SlotPayload p;
          p.layer = layer;
          p.num_tokens = 2;
          p.flags = kSlotCombine;
          p.echo_seq = in->header.seq;
          p.route = std::span<const int32_t>(in->route, 3);
          p.routed_rows = out.data();
          c.Send(0, p);
        }
        std::optional<ReceivedSlot> in;
        while (!(in = c.Poll(20))) {
        }
        EXPECT_TRUE(in->shutdown());
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// TryReceive (the FFN gathering one layer's items of several senders): a slot that has arrived
// is read at once, one that has not yields nothing without waiting, and a slot is never
// delivered twice -- neither by TryReceive nor by a later Poll.
TEST(AsyncConnector, TryReceiveTakesAnArrivedSlotWithoutWaiting) {
  const auto errors = RunRanks(
      2, 1, "",
      [](comm::AfdWorld& w) {
        AsyncConnector c(w, Options(w, 4));
        const std::vector<int32_t> counts = {1, 0, 0, 0}, route = {0};
        const std::vector<float> rows(8, 1.0f);
        // Attention rank 1 sends only after rank 0's round trip (the barrier below).
        if (w.self().rank == 1) w.Barrier("first-sent");
        SlotPayload p;
        p.layer = 5 + w.self().rank;
        p.num_tokens = 1;
        p.expert_counts = counts;
        p.route = route;
        p.routed_rows = rows.data();
        const uint64_t seq = c.Send(0, p);
        if (w.self().rank == 0) w.Barrier("first-sent");
        EXPECT_EQ(c.Receive(0, 0, "a reply").header.echo_seq, seq);
        c.AnnounceShutdown();
      },
      [](comm::AfdWorld& w) {
        AsyncConnector c(w, Options(w, 0));
        const auto reply = [&](const ReceivedSlot& in) {
          SlotPayload p;
          p.layer = in.header.layer;
          p.num_tokens = 1;
          p.flags = kSlotCombine;
          p.echo_seq = in.header.seq;
          c.Send(in.header.sender, p);
        };
        const auto start = std::chrono::steady_clock::now();
        const auto take = [&](int sender) {
          std::optional<ReceivedSlot> in;
          while (!(in = c.TryReceive(sender, 0))) {
            if (std::chrono::steady_clock::now() - start > std::chrono::seconds(20)) {
              AFD_THROW("attention rank {}'s slot never came", sender);
            }
          }
          return *in;
        };
        const ReceivedSlot first = take(0);
        EXPECT_EQ(first.header.layer, 5);
        EXPECT_EQ(first.header.sender, 0);
        EXPECT_FALSE(c.TryReceive(0, 0).has_value()) << "delivered twice";
        EXPECT_FALSE(c.TryReceive(1, 0).has_value()) << "rank 1 has not sent yet";
        w.Barrier("first-sent");
        const ReceivedSlot second = take(1);
        EXPECT_EQ(second.header.layer, 6);
        EXPECT_THROW(c.TryReceive(2, 0), Error) << "no third attention rank";
        EXPECT_FALSE(c.Poll(20).has_value()) << "a slot taken by TryReceive came again";
        reply(second);
        reply(first);
        int shutdowns = 0;
        while (shutdowns < 2) {
          if (std::optional<ReceivedSlot> in = c.Poll(20)) {
            EXPECT_TRUE(in->shutdown());
            ++shutdowns;
          }
          ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
        }
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(AsyncConnector, OverflowIsAnErrorNamingCapSenderAndReceiver) {
  const auto errors = RunRanks(
      1, 2, "",
      [](comm::AfdWorld& w) {
        AsyncConnector c(w, Options(w, 3));
        // routed_cap = ceil(3 * 2 / 2) * 2 = 6
        EXPECT_EQ(c.layout().cap.routed_cap, 6);
        const std::vector<int32_t> route(7, 0), counts = {7, 0};
        const std::vector<float> rows(7 * 8, 0.0f);
        SlotPayload p;
        p.num_tokens = 3;
        p.expert_counts = counts;
        p.route = route;
        p.routed_rows = rows.data();
        c.Send(1, p);
      },
      [](comm::AfdWorld& w) { AsyncConnector c(w, Options(w, 0)); });
  EXPECT_NE(errors[2].find("7 routed rows"), std::string::npos) << errors[2];
  EXPECT_NE(errors[2].find("capacity of 6"), std::string::npos) << errors[2];
  EXPECT_NE(errors[2].find("world rank 2 (attention 0)"), std::string::npos) << errors[2];
  EXPECT_NE(errors[2].find("world rank 1 (ffn 1)"), std::string::npos) << errors[2];
}

// A sender that writes a ring slot again before the receiver read it (more in flight than
// ring_depth): the flag jumps, and the receiver says so instead of reading a torn slot.
TEST(AsyncConnector, AnOverwrittenSlotIsDetected) {
  const auto errors = RunRanks(
      1, 1, "",
      [](comm::AfdWorld& w) {
        AsyncConnector c(w, Options(w, 2));
        SlotPayload p;
        p.num_tokens = 1;
        c.Send(0, p);
        c.Send(0, p);
        w.Barrier("sent");
      },
      [](comm::AfdWorld& w) {
        AsyncConnector c(w, Options(w, 0));
        w.Barrier("sent");
        c.Poll(1000);
      });
  EXPECT_NE(errors[0].find("flag jumped from 0 to 2"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("ring_depth 1"), std::string::npos) << errors[0];
}

// Two stages in flight use two ring slots; each is answered separately. The FFN rank leaves
// ring_depth out (as an FFN command without --enable-dbo does): the windows take the deeper ring.
TEST(AsyncConnector, RingDepthTwoKeepsTwoStagesInFlight) {
  const auto errors = RunRanks(
      1, 1, ", \"ring_depth\": 2",
      [](comm::AfdWorld& w) {
        AsyncConnector c(w, Options(w, 2));
        SlotPayload p;
        p.num_tokens = 1;
        const uint64_t s0 = c.Send(0, p);
        p.stage = 1;
        const uint64_t s1 = c.Send(0, p);
        EXPECT_EQ(c.Receive(0, 1, "stage 1").header.echo_seq, s1);
        EXPECT_EQ(c.Receive(0, 0, "stage 0").header.echo_seq, s0);
        c.AnnounceShutdown();
      },
      [](comm::AfdWorld& w) {
        AsyncConnector c(w, Options(w, 0));
        EXPECT_EQ(c.layout().ring_depth, 2);
        int served = 0;
        while (true) {
          std::optional<ReceivedSlot> in = c.Poll(20);
          if (!in) continue;
          if (in->shutdown()) break;
          SlotPayload p;
          p.stage = in->header.stage;
          p.num_tokens = 1;
          p.flags = kSlotCombine;
          p.echo_seq = in->header.seq;
          c.Send(0, p);
          ++served;
        }
        EXPECT_EQ(served, 2);
      },
      /*ffn_extra=*/"");
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// An FFN rank that claims the sender's next message ahead (AsyncConnector::Claim; inline flags:
// the calling thread is the stream) serves it before Poll reports it; Poll then returns it as
// claimed without reading the slot -- which by then holds the sender's following message, as
// the next Poll returns. A claim that does not match the message names the field.
TEST(AsyncConnector, AClaimedMessageIsServedAheadAndPollReportsItAfter) {
  const auto attention = [](comm::AfdWorld& w) {
    AsyncConnector c(w, Options(w, 4));
    const std::vector<int32_t> counts = {1, 0, 0, 0}, route = {0};
    const std::vector<float> rows(8, 1.0f);
    for (int layer = 1; layer <= 3; ++layer) {
      SlotPayload p;
      p.layer = layer;
      p.num_tokens = 1;
      p.expert_counts = counts;
      p.route = route;
      p.routed_rows = rows.data();
      const uint64_t seq = c.Send(0, p);
      EXPECT_EQ(c.Receive(0, 0, "a reply").header.echo_seq, seq);
    }
    c.AnnounceShutdown();
  };
  const auto reply = [](AsyncConnector& c, int layer, uint64_t seq) {
    SlotPayload p;
    p.layer = layer;
    p.num_tokens = 1;
    p.flags = kSlotCombine;
    p.echo_seq = seq;
    c.Send(0, p);
  };
  const auto expect = [](int layer) {
    ExpectedSlot e;
    e.layer = layer;
    e.num_tokens = 1;
    e.routed_rows = 1;
    e.table_entries = 1;  // the route table
    return e;
  };
  const auto errors = RunRanks(1, 1, "", attention, [&](comm::AfdWorld& w) {
    AsyncConnectorOptions o = Options(w, 0);
    o.inline_flags = true;
    AsyncConnector c(w, o);
    std::optional<ReceivedSlot> in;
    while (!(in = c.Poll(20))) {
    }
    EXPECT_EQ(in->header.layer, 1);
    reply(c, 1, in->header.seq);
    // Only the next message may be claimed.
    try {
      c.Claim(0, 0, 3, expect(2));
      ADD_FAILURE() << "a claim past the next message";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("only the next slot may be claimed"), std::string::npos)
          << e.what();
    }
    c.Claim(0, 0, 2, expect(2));  // returns once message 2 is there, its header checked
    EXPECT_EQ(c.SeenSeq(0, 0), 1u);
    reply(c, 2, 2);  // served ahead of the poll: the sender goes on to message 3
    while (!(in = c.Poll(20))) {
    }
    EXPECT_TRUE(in->claimed);
    EXPECT_FALSE(in->shutdown());
    EXPECT_EQ(in->header.seq, 2u);
    EXPECT_EQ(c.SeenSeq(0, 0), 2u);
    while (!(in = c.Poll(20))) {
    }
    EXPECT_FALSE(in->claimed);
    EXPECT_EQ(in->header.layer, 3);
    EXPECT_EQ(in->header.seq, 3u);
    reply(c, 3, 3);
    while (!(in = c.Poll(20))) {
    }
    EXPECT_TRUE(in->shutdown());
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");

  const auto wrong = RunRanks(1, 1, "", attention, [&](comm::AfdWorld& w) {
    AsyncConnectorOptions o = Options(w, 0);
    o.inline_flags = true;
    AsyncConnector c(w, o);
    std::optional<ReceivedSlot> in;
    while (!(in = c.Poll(20))) {
    }
    reply(c, 1, in->header.seq);
    c.Claim(0, 0, 2, expect(7));  // message 2 is layer 2
  });
  EXPECT_NE(wrong[0].find("header layer is 2, the claim expects 7"), std::string::npos) << wrong[0];
  EXPECT_NE(wrong[0].find("the claimed message 2 from world rank 1 (attention 0)"),
            std::string::npos)
      << wrong[0];
}

// Ranks whose windows would not pair up (flags stored by the streams on one side, by the host
// on the other) fail at the join, naming the field, before any window exists.
TEST(AsyncConnector, RanksThatDisagreeOnTheProtocolFailAtTheJoinNamingTheField) {
  std::atomic<bool> connected{false};
  const RankFn connect = [&](comm::AfdWorld&) { connected = true; };
  const auto errors = RunRanks(1, 1, ", \"device_flags\": false", connect, connect, "");
  EXPECT_FALSE(connected);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("configuration mismatch in field 'connector_extra_config.device_flags'"),
              std::string::npos)
        << e;
  }
}

// An abort anywhere ends a rank waiting for a reply, with the cause.
TEST(AsyncConnector, AnAbortEndsAWaitNamingTheCause) {
  const auto start = std::chrono::steady_clock::now();
  const auto errors = RunRanks(
      1, 1, "",
      [](comm::AfdWorld& w) {
        AsyncConnector c(w, Options(w, 2));
        SlotPayload p;
        p.num_tokens = 1;
        c.Send(0, p);
        c.Receive(0, 0, "the reply to layer 0");
      },
      [](comm::AfdWorld& w) {
        AsyncConnector c(w, Options(w, 0));
        w.Abort("ffn rank 0 failed: injected");
        AFD_THROW("injected");
      });
  EXPECT_NE(errors[1].find("injected"), std::string::npos) << errors[1];
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
}

}  // namespace
}  // namespace afd::connector
