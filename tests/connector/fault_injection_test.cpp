// Fault injection through the P2P connector: a 1A1F (and 2A1F) deployment whose ranks are
// threads joined at a real rendezvous store, with in-memory communicators that drop, delay,
// corrupt or close at a chosen message of the control plane or the data plane. Every fault
// must end in a named error on some rank within the timeout, with every rank finished (nothing
// left running); a short delay must be survived. Each clean attention rank also records one
// step's transfers as a CUDA graph capture would (P2pConnector::BeginCapture / EndCapture /
// Replayed: counted once per replay, not at the capture).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <thread>

#include "afd/comm/afd_world.h"
#include "afd/comm/memory_communicator.h"
#include "afd/comm/socket.h"
#include "afd/common/error.h"
#include "afd/connector/p2p_connector.h"

namespace afd::connector {
namespace {

using comm::FaultPlan;
using Clock = std::chrono::steady_clock;

constexpr int kTimeoutS = 1;
constexpr int kSteps = 4;
constexpr int64_t kHidden = 8;

struct Outcome {
  std::vector<std::string> errors;  // per rank thread, "" when it finished cleanly
  double seconds = 0;
  bool injected = false;
};

AfdConfig Config(Role role, int port, int A, int F) {
  AfdConfig c;
  c.role = role;
  c.connector = std::string(kP2pHostConnector);
  c.host = "127.0.0.1";
  c.port = port;
  c.num_attention_ranks = A;
  c.num_ffn_ranks = F;
  c.afd_process_group_timeout_s = kTimeoutS;
  return c;
}

float Value(int a, int step, int64_t row, int64_t col) {
  return static_cast<float>(a * 100000 + step * 1000 + row * 10 + col);
}

void AttentionRank(comm::AfdWorld& world, P2pConnector& conn, int A) {
  const int me = world.self().rank;
  const RowFormat fmt{kHidden, DType::kF32};
  for (int step = 0; step <= kSteps; ++step) {
    StepMetadata meta;
    meta.step = step;
    meta.num_attention_ranks = A;
    meta.flags = step == kSteps ? static_cast<uint32_t>(kShutdown) : 0u;
    for (int a = 0; a < A; ++a) meta.token_counts.push_back(step == kSteps ? 0 : 3 + a);
    conn.control_plane().Send(meta);
    if (step == kSteps) break;
    const int64_t n = meta.tokens(0, me);
    std::vector<float> rows(n * kHidden), out(n * kHidden);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < kHidden; ++c) rows[r * kHidden + c] = Value(me, step, r, c);
    }
    // Step 1 as if recorded into a CUDA graph (the host transport still moves the rows): its
    // counters come back from EndCapture, not in stats(), until each replay adds them.
    const bool capture = step == 1;
    const std::map<int, LayerTransferStats> before = conn.stats();
    if (capture) conn.BeginCapture();
    conn.SendToFfn(0, 0, 0, fmt, rows.data(), n);
    conn.RecvFromFfn(0, 0, fmt, out.data(), n);
    if (capture) {
      const P2pConnector::Captured added = conn.EndCapture();
      const uint64_t bytes = 2 * n * fmt.row_bytes();
      AFD_CHECK(added.size() == 1 && added.at(0).messages == 2 && added.at(0).bytes == bytes,
                "attention {}: a capture of one send and one receive added {} layers", me,
                added.size());
      AFD_CHECK(conn.stats().at(0).messages == before.at(0).messages &&
                    conn.stats().at(0).bytes == before.at(0).bytes,
                "attention {}: the capture's transfers were counted", me);
      conn.Replayed(added);
      conn.Replayed(added);
      AFD_CHECK(conn.stats().at(0).messages == before.at(0).messages + 4 &&
                    conn.stats().at(0).bytes == before.at(0).bytes + 2 * bytes,
                "attention {}: two replays added {} messages", me,
                conn.stats().at(0).messages - before.at(0).messages);
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      AFD_CHECK(out[i] == 2 * rows[i], "attention {}: row element {} came back as {}, not {}", me,
                i, out[i], 2 * rows[i]);
    }
  }
}

void FfnRank(comm::AfdWorld& world, P2pConnector& conn) {
  const RowFormat fmt{kHidden, DType::kF32};
  const Deadline give_up = Deadline::In(30);  // the test's own bound; the runtime has none
  while (true) {
    AFD_CHECK(!give_up.expired(), "ffn {}: the idle loop never ended", world.self().rank);
    std::optional<StepMetadata> meta = conn.control_plane().Recv(0.05);
    if (!meta) {
      world.CheckAbort();  // what the FFN worker's idle loop does
      continue;
    }
    if (meta->has(kShutdown)) return;
    int64_t n = 0;
    for (int64_t c : conn.IncomingRowCounts(*meta, 0)) n += c;
    std::vector<float> rows(n * kHidden);
    conn.RecvFromAttention(0, 0, 0, fmt, *meta, rows.data());
    for (float& v : rows) v *= 2;
    conn.SendToAttention(0, 0, fmt, *meta, rows.data());
  }
}

// Runs the deployment with `plan` applied to group `group`.
Outcome RunDeployment(int A, int F, const std::string& group, const FaultPlan& plan) {
  auto registry = std::make_shared<comm::MemoryFabricRegistry>();
  registry->SetPlan(group, plan);
  const int port = comm::PickRendezvousPort();
  comm::CommunicatorFactory factory = [registry](comm::Store&, const comm::GroupSpec& spec) {
    return std::unique_ptr<comm::Communicator>(
        new comm::MemoryCommunicator(registry->Get(spec.name, spec.size), spec));
  };
  Outcome outcome;
  outcome.errors.resize(A + F);
  const auto start = Clock::now();
  std::vector<std::future<void>> ranks;
  for (int i = 0; i < F + A; ++i) {
    const Role role = i < F ? Role::kFfn : Role::kAttention;
    const int r = i < F ? i : i - F;
    ranks.push_back(std::async(std::launch::async, [&, i, role, r] {
      std::unique_ptr<comm::AfdWorld> world;
      std::unique_ptr<P2pConnector> conn;
      try {
        comm::JoinRequest req;
        req.config = Config(role, port, A, F);
        req.role_rank = r;
        req.hidden_size = kHidden;
        world = comm::AfdWorld::Join(req, factory);
        conn = std::make_unique<P2pConnector>(*world);
        if (role == Role::kAttention) {
          AttentionRank(*world, *conn, A);
        } else {
          FfnRank(*world, *conn);
        }
      } catch (const Error& e) {
        outcome.errors[i] = e.what();
        // What role_worker does: tell the others, close the connections.
        if (world) world->Abort(fmt::format("{} {} failed: {}", RoleName(role), r, e.what()));
        if (conn) conn->Shutdown();
      }
    }));
  }
  for (auto& f : ranks) {
    if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      ADD_FAILURE() << "a rank is still running 60 s after the start";
      std::abort();  // a hung thread cannot be joined; end the test binary loudly
    }
  }
  outcome.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  outcome.injected = registry->FaultInjected(group);
  return outcome;
}

std::string AllErrors(const Outcome& o) {
  std::string s;
  for (size_t i = 0; i < o.errors.size(); ++i) s += fmt::format("  [{}] {}\n", i, o.errors[i]);
  return s;
}

TEST(FaultInjection, CleanRunSucceeds) {
  for (auto [A, F] : {std::pair{1, 1}, std::pair{2, 1}}) {
    const Outcome o = RunDeployment(A, F, "none", {});
    for (const auto& e : o.errors) EXPECT_EQ(e, "") << A << "A" << F << "F";
  }
}

// Every fault kind at every message of both planes ends in a named error within the bound.
TEST(FaultInjection, EveryFaultEndsInANamedErrorWithinTheTimeout) {
  struct Kind {
    FaultPlan::Kind kind;
    double delay_s;
    std::vector<std::string> names;  // one of them must appear in some rank's error
  };
  const std::vector<Kind> kinds = {
      {FaultPlan::Kind::kDrop, 0, {"timed out", "sent tag", "arrived where message"}},
      {FaultPlan::Kind::kDelay, 3 * kTimeoutS, {"timed out"}},
      {FaultPlan::Kind::kCorrupt,
       0,
       {"corrupt message header", "arrived where message", "sent tag"}},
      {FaultPlan::Kind::kClose, 0, {"closed the connection", "injected fault"}},
  };
  int injected = 0, survived = 0;
  for (const std::string group : {"p2p", "afd_subgroup_0"}) {
    for (const Kind& k : kinds) {
      for (uint64_t at = 0; at < 4; ++at) {
        FaultPlan plan;
        plan.kind = k.kind;
        plan.at_message = at;
        plan.delay_s = k.delay_s;
        plan.corrupt_byte = at * 7 % 32;  // different header fields
        const Outcome o = RunDeployment(1, 1, group, plan);
        SCOPED_TRACE(fmt::format("{} at message {} of {}:\n{}", comm::FaultName(k.kind), at, group,
                                 AllErrors(o)));
        if (!o.injected) continue;  // the run had fewer messages than that
        ++injected;
        bool named = false;
        for (const auto& e : o.errors) {
          for (const auto& n : k.names) named |= e.find(n) != std::string::npos;
        }
        EXPECT_TRUE(named);
        // A fault surfaces within a timeout or two (the peer that sees it second may wait one
        // timeout on its own receive first), plus the store's heartbeat period and thread starts.
        EXPECT_LT(o.seconds, 4.0 * kTimeoutS + 2);
        survived += named;
      }
    }
  }
  EXPECT_EQ(injected, 32);  // every combination was reached
  std::printf("fault injection: %d faults injected, %d ended in a named error in time\n", injected,
              survived);
}

TEST(FaultInjection, ShortDelaysAreSurvived) {
  for (const std::string group : {"p2p", "afd_subgroup_0"}) {
    for (uint64_t at = 0; at < 3; ++at) {
      FaultPlan plan;
      plan.kind = FaultPlan::Kind::kDelay;
      plan.at_message = at;
      plan.delay_s = 0.2 * kTimeoutS;
      const Outcome o = RunDeployment(1, 1, group, plan);
      EXPECT_TRUE(o.injected) << group << " " << at;
      for (const auto& e : o.errors) EXPECT_EQ(e, "") << group << " message " << at;
    }
  }
}

TEST(FaultInjection, TwoAttentionRanksOneFfnRankCloseIsNamed) {
  FaultPlan plan;
  plan.kind = FaultPlan::Kind::kClose;
  plan.sender = 2;  // subgroup rank 2: attention 1 (the FFN hub is rank 0)
  plan.at_message = 1;
  const Outcome o = RunDeployment(2, 1, "afd_subgroup_0", plan);
  ASSERT_TRUE(o.injected);
  bool named = false;
  for (const auto& e : o.errors) named |= e.find("attention 1") != std::string::npos;
  EXPECT_TRUE(named) << AllErrors(o);
}

}  // namespace
}  // namespace afd::connector
