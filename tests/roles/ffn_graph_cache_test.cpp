// The FFN roles' graph cache on a CPU backend that records captures (its graphs count their
// replays) and a connector that hands out numbered capture records: when work runs eagerly,
// when it is captured, when a graph replays (and gives the connector its record back), and when
// graphs are dropped because their memory grew.
#include "afd/roles/ffn_graph_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "afd/kernels/cpu/cpu_backend.h"

namespace afd::roles {
namespace {

class CapturingCpu : public kernels::cpu::CpuBackend {
 public:
  class Graph : public kernels::OpGraph {
   public:
    Graph(CapturingCpu& owner, int id) : owner_(owner), id_(id) {}
    void Replay() override { ++owner_.replays[id_]; }

   private:
    CapturingCpu& owner_;
    int id_;
  };
  bool SupportsGraphs() const override { return true; }
  void BeginCapture() override {
    EXPECT_FALSE(capturing);
    capturing = true;
  }
  std::unique_ptr<kernels::OpGraph> EndCapture() override {
    EXPECT_TRUE(capturing);
    capturing = false;
    return std::make_unique<Graph>(*this, next_graph++);
  }
  void Synchronize() override { ++syncs; }

  bool capturing = false;
  int next_graph = 0;
  int syncs = 0;
  std::map<int, int> replays;  // by graph id
};

struct RecordingConnector {
  using Captured = int;
  void BeginCapture() { ++begun; }
  Captured EndCapture() { return ++ended; }
  void Replayed(const Captured& c) { replayed.push_back(c); }
  int begun = 0, ended = 0;
  std::vector<int> replayed;
};

using Cache = FfnGraphCache<RecordingConnector, int>;

// Work that takes `bytes` of scratch and records whether it ran eagerly or under capture.
struct Work {
  CapturingCpu& backend;
  int64_t floats;
  int eager = 0, captured = 0;
  void operator()(Workspace& ws) {
    ws.Take(DType::kF32, {floats});
    ++(backend.capturing ? captured : eager);
  }
};

TEST(FfnGraphCache, FirstEagerSecondCapturedThenReplayed) {
  CapturingCpu cpu;
  RecordingConnector conn;
  Cache cache(cpu, conn, /*sync_before_capture=*/true);
  Work work{cpu, 64};
  EXPECT_FALSE(cache.Has(7));
  EXPECT_EQ(cache.Serve(7, /*pool=*/1, work), Cache::Served::kEager);
  EXPECT_EQ(work.eager, 1);
  EXPECT_EQ(work.captured, 0);
  EXPECT_EQ(cache.num_captures(), 0);
  EXPECT_FALSE(cache.Has(7));
  EXPECT_EQ(cache.Serve(7, 1, work), Cache::Served::kReplayed);
  EXPECT_EQ(work.captured, 1);
  EXPECT_EQ(cache.num_captures(), 1);
  EXPECT_EQ(cpu.syncs, 1);  // before the capture
  EXPECT_EQ(cpu.replays[0], 1);
  EXPECT_EQ(conn.replayed, std::vector<int>{1});  // the capture's record, given back
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cache.Serve(7, 1, work), Cache::Served::kReplayed);
  EXPECT_EQ(work.eager, 1);
  EXPECT_EQ(work.captured, 1);  // replays only
  EXPECT_EQ(cpu.replays[0], 4);
  EXPECT_EQ(conn.replayed, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_TRUE(cache.Replay(7));
  EXPECT_FALSE(cache.Replay(8));
  EXPECT_EQ(cpu.replays[0], 5);
}

TEST(FfnGraphCache, AGrownPoolDropsItsGraphsAndCapturesThemAgain) {
  CapturingCpu cpu;
  RecordingConnector conn;
  Cache cache(cpu, conn, /*sync_before_capture=*/false);
  Work small{cpu, 64}, big{cpu, 1 << 16};
  cache.Serve(1, /*pool=*/5, small);
  EXPECT_EQ(cache.Serve(1, 5, small), Cache::Served::kReplayed);
  EXPECT_EQ(cpu.syncs, 0);
  // Another key of the same pool needs more memory: the pool's memory grows (eagerly), so the
  // graph of key 1, which points into it, is dropped ...
  EXPECT_EQ(cache.Serve(2, 5, big), Cache::Served::kEager);
  EXPECT_EQ(cache.Serve(2, 5, big), Cache::Served::kReplayed);
  EXPECT_FALSE(cache.Has(1));
  EXPECT_TRUE(cache.Has(2));
  // ... and captured again on its next work (warmed already: no eager run first).
  EXPECT_EQ(cache.Serve(1, 5, small), Cache::Served::kReplayed);
  EXPECT_EQ(small.eager, 1);
  EXPECT_EQ(small.captured, 2);
  EXPECT_EQ(cache.num_captures(), 3);
  // A pool of its own is not touched by another pool's growth.
  cache.Serve(3, 6, small);
  cache.Serve(3, 6, small);
  Work bigger{cpu, 1 << 18};
  cache.Serve(4, 5, bigger);
  EXPECT_TRUE(cache.Has(3));
}

TEST(FfnGraphCache, ACaptureThatOutgrewItsMemoryRunsEagerlyAndIsNotKept) {
  CapturingCpu cpu;
  RecordingConnector conn;
  Cache cache(cpu, conn, false);
  Work work{cpu, 64};
  cache.Serve(1, 1, work);
  work.floats = 1 << 16;  // the same key now needs more: the capture takes a new chunk
  EXPECT_EQ(cache.Serve(1, 1, work), Cache::Served::kEager);
  EXPECT_EQ(work.captured, 1);
  EXPECT_EQ(work.eager, 2);  // the work ran eagerly after the discarded capture
  EXPECT_FALSE(cache.Has(1));
  EXPECT_TRUE(cpu.replays.empty());
  EXPECT_TRUE(conn.replayed.empty());
  EXPECT_EQ(cache.Serve(1, 1, work), Cache::Served::kReplayed);  // into the merged memory
  EXPECT_EQ(cache.num_captures(), 2);
}

TEST(FfnGraphCache, AFailedCaptureEndsTheCaptureAndThrows) {
  CapturingCpu cpu;
  RecordingConnector conn;
  Cache cache(cpu, conn, false);
  int calls = 0;
  const auto failing = [&](Workspace&) {
    if (++calls == 2) throw std::runtime_error("a peer went away");
  };
  cache.Serve(1, 1, failing);
  EXPECT_THROW(cache.Serve(1, 1, failing), std::runtime_error);
  EXPECT_FALSE(cpu.capturing);
  EXPECT_EQ(conn.begun, 1);
  EXPECT_EQ(conn.ended, 1);
  EXPECT_FALSE(cache.Has(1));
}

}  // namespace
}  // namespace afd::roles
