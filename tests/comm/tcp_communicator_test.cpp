// TcpCommunicator across threads of one process over loopback (the cross-process and
// cross-host tests are in tests/connector).
#include "afd/comm/tcp_communicator.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "afd/comm/socket.h"
#include "afd/comm/wire.h"
#include "afd/common/error.h"

namespace afd::comm {
namespace {

// Runs body(rank, comm) on `size` threads that form one group; returns each rank's error text
// ("" when it succeeded).
std::vector<std::string> RunGroup(int size, double timeout_s,
                                  const std::function<void(int, Communicator&)>& body) {
  TcpStoreServer server(0);
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        TcpStoreClient client("127.0.0.1", server.port(), timeout_s);
        PrefixStore store(client, "g");
        GroupSpec spec;
        spec.name = "test_group";
        spec.rank = r;
        spec.size = size;
        for (int i = 0; i < size; ++i) spec.labels.push_back("member " + std::to_string(i));
        spec.local_address = "127.0.0.1";
        spec.timeout_s = timeout_s;
        auto comm = TcpCommunicator::Create(store, spec);
        body(r, *comm);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(TcpCommunicator, HubGathersAndScattersInOneGroup) {
  const int n = 4;
  auto errors = RunGroup(n, 10, [](int rank, Communicator& c) {
    if (rank == 0) {
      // Hub: post all receives, then all sends, in one group.
      std::vector<std::vector<float>> in(n);
      c.GroupStart();
      for (int p = 1; p < n; ++p) {
        in[p].resize(1000 * p);
        c.Recv(in[p].data(), in[p].size(), p, 7);
      }
      c.GroupEnd();
      for (int p = 1; p < n; ++p) {
        for (size_t i = 0; i < in[p].size(); ++i) ASSERT_EQ(in[p][i], p * 1e6f + i);
        for (auto& v : in[p]) v = -v;
      }
      c.GroupStart();
      for (int p = 1; p < n; ++p) c.Send(in[p].data(), in[p].size(), p, 8);
      c.GroupEnd();
    } else {
      std::vector<float> out(1000 * rank);
      for (size_t i = 0; i < out.size(); ++i) out[i] = rank * 1e6f + i;
      c.Send(out.data(), out.size(), 0, 7);
      std::vector<float> back(out.size());
      c.Recv(back.data(), back.size(), 0, 8);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(back[i], -out[i]);
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(TcpCommunicator, LargeMessagesBothWaysDoNotDeadlockInAGroup) {
  auto errors = RunGroup(2, 10, [](int rank, Communicator& c) {
    std::vector<float> out(4 << 20, static_cast<float>(rank)), in(4 << 20);
    c.GroupStart();
    c.Send(out.data(), out.size(), 1 - rank, 1);
    c.Recv(in.data(), in.size(), 1 - rank, 1);
    c.GroupEnd();
    ASSERT_EQ(in.front(), 1 - rank);
    ASSERT_EQ(in.back(), 1 - rank);
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(TcpCommunicator, CollectivesAreExactAndIdenticalOnEveryRank) {
  const int n = 3;
  std::vector<std::vector<float>> results(n);
  auto errors = RunGroup(n, 10, [&](int rank, Communicator& c) {
    c.Barrier();
    std::vector<float> v = {0.1f * (rank + 1), 1e8f * (rank == 0 ? 1 : -0.5f), 1.0f};
    c.AllReduce(v.data(), v.size(), DType::kF32, ReduceOp::kSum);
    results[rank] = v;
    // All-to-all-v: rank r sends p+1 copies of (r*10+p) to each rank p.
    std::vector<size_t> send_counts(n), recv_counts(n);
    std::vector<int32_t> send;
    for (int p = 0; p < n; ++p) {
      send_counts[p] = p + 1;
      recv_counts[p] = rank + 1;
      for (int i = 0; i <= p; ++i) send.push_back(rank * 10 + p);
    }
    std::vector<int32_t> recv(n * (rank + 1));
    c.AllToAllV(send.data(), send_counts, recv.data(), recv_counts, DType::kI32);
    for (int p = 0; p < n; ++p) {
      for (int i = 0; i <= rank; ++i) ASSERT_EQ(recv[p * (rank + 1) + i], p * 10 + rank);
    }
    c.Barrier();
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  const float expected0 = (0.1f + 0.2f) + 0.3f;  // rank order
  EXPECT_EQ(results[0][0], expected0);
  for (int r = 1; r < n; ++r) EXPECT_EQ(results[r], results[0]);  // bitwise identical
  EXPECT_EQ(results[0][2], 3.0f);
}

TEST(TcpCommunicator, ShapeMismatchIsNamedOnTheReceiver) {
  auto errors = RunGroup(2, 5, [](int rank, Communicator& c) {
    std::vector<float> buf(16);
    if (rank == 0) {
      c.Send(buf.data(), 16, 1, 3);
    } else {
      c.Recv(buf.data(), 8, 0, 3);
    }
  });
  EXPECT_NE(errors[1].find("rank 0 (member 0)"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("64 bytes"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("32 bytes"), std::string::npos) << errors[1];
}

TEST(TcpCommunicator, PeerThatGoesAwayIsNamed) {
  auto errors = RunGroup(2, 20, [](int rank, Communicator& c) {
    if (rank == 1) {
      c.Shutdown();  // as if the process exited
      return;
    }
    float x;
    c.Recv(&x, 1, 1, 0);
  });
  EXPECT_NE(errors[0].find("rank 1 (member 1)"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("closed the connection"), std::string::npos) << errors[0];
}

TEST(TcpCommunicator, SilentPeerTimesOutListingWhatIsMissing) {
  auto errors = RunGroup(2, 0.5, [](int rank, Communicator& c) {
    float x = 0;
    if (rank == 0) {
      EXPECT_FALSE(c.WaitReadable(1, 0.05));
      c.Recv(&x, 1, 1, 5);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    }
  });
  EXPECT_NE(errors[0].find("timed out"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("receive of 4 bytes (tag 0x5) from rank 1 (member 1)"),
            std::string::npos)
      << errors[0];
}

TEST(TcpCommunicator, FailedOperationMakesTheGroupUnusable) {
  auto errors = RunGroup(2, 5, [](int rank, Communicator& c) {
    float x = 1;
    if (rank == 1) {
      c.Send(&x, 1, 0, 9);  // rank 0 expects tag 5
      return;
    }
    try {
      c.Recv(&x, 1, 1, 5);
      ADD_FAILURE() << "the mismatched receive succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sent tag 0x9"), std::string::npos) << e.what();
    }
    c.Send(&x, 1, 1, 6);  // must fail at once: the streams are out of step
  });
  EXPECT_EQ(errors[1], "");
  EXPECT_NE(errors[0].find("group test_group: group unusable after an earlier failed operation"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("sent tag 0x9"), std::string::npos) << errors[0];
}

TEST(TcpCommunicator, OutsiderWithoutTheSecretCannotTakeAMembersPlace) {
  // An outsider who learned rank 0's listening address connects first, with a well-formed hello
  // claiming rank 1 but no knowledge of the join secret: rank 0 drops it, and the real rank 1
  // (which proves the secret) still joins.
  const std::string secret = "group-test-secret-0123456789";
  TcpStoreServer server(0);
  auto spec_of = [&](int rank) {
    GroupSpec spec{"guarded", rank, 2, {"a", "b"}, "127.0.0.1", 5, secret};
    return spec;
  };
  std::string errors[2];
  std::thread rank0([&] {
    try {
      TcpStoreClient client("127.0.0.1", server.port(), 5);
      PrefixStore store(client, "g");
      auto comm = TcpCommunicator::Create(store, spec_of(0));
      int32_t x = 7;
      static_cast<Communicator&>(*comm).Send(&x, 1, 1, 3);
    } catch (const Error& e) {
      errors[0] = e.what();
    }
  });
  TcpStoreClient client("127.0.0.1", server.port(), 5);
  const std::string addr = client.Get("g/addr/0", 5);
  const size_t colon = addr.rfind(':');
  Socket outsider =
      Connect(addr.substr(0, colon), std::stoi(addr.substr(colon + 1)), Deadline::In(5), "rank 0");
  const HelloHeader hello{kHelloMagic, kWireVersion, 0, HashName("guarded"), 1};
  outsider.SendAll(&hello, sizeof(hello), Deadline::In(5), "rank 0");
  std::string nonce(kHelloNonceBytes, '\0');
  outsider.RecvAll(nonce.data(), nonce.size(), Deadline::In(5), "rank 0");
  const std::string forged = HelloProof(std::string("a-guessed-secret-0123"), "guarded", 1, nonce);
  outsider.SendAll(forged.data(), forged.size(), Deadline::In(5), "rank 0");
  std::thread rank1([&] {
    try {
      PrefixStore store(client, "g");
      auto comm = TcpCommunicator::Create(store, spec_of(1));
      int32_t x = 0;
      static_cast<Communicator&>(*comm).Recv(&x, 1, 0, 3);
      AFD_CHECK(x == 7, "rank 1 received {}", x);
    } catch (const Error& e) {
      errors[1] = e.what();
    }
  });
  rank0.join();
  rank1.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(TcpCommunicator, MissingMemberIsNamedAtCreation) {
  TcpStoreServer server(0);
  TcpStoreClient client("127.0.0.1", server.port(), 5);
  PrefixStore store(client, "g");
  GroupSpec spec{"lonely", 0, 3, {"a", "b", "c"}, "127.0.0.1", 0.3, std::nullopt};
  try {
    TcpCommunicator::Create(store, spec);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 (b), rank 2 (c)"), std::string::npos) << e.what();
  }
}

TEST(Socket, LocalAddressTowardLoopbackIsLoopback) {
  EXPECT_EQ(LocalAddressToward("127.0.0.1", 1239), "127.0.0.1");
  EXPECT_EQ(LocalAddressToward("localhost", 1239), "127.0.0.1");
  EXPECT_THROW(ResolveIPv4("no-such-host.invalid"), Error);
}

}  // namespace
}  // namespace afd::comm

namespace afd::comm {
namespace {

TEST(Socket, RendezvousPortsComeFromBelowTheEphemeralRange) {
  for (int i = 0; i < 5; ++i) {
    const int port = PickRendezvousPort();
    EXPECT_GE(port, 1024);
    EXPECT_LT(port, 32768);  // the default range starts at 32768; machines may start it later
    EXPECT_NO_THROW(TcpStoreServer server(port));
  }
}

}  // namespace
}  // namespace afd::comm
