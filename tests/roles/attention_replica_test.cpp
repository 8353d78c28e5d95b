// The attention replica over a recording StepCoordinator (the MoE in process): the replica's
// own part -- the order of the coordinator's calls in a step, the micro-batch cut it asks for,
// empty lockstep steps, the counters, its refusals -- apart from any connector. One attention
// rank and one FFN rank are threads joined at a real rendezvous store (the replica lives in a
// world); the FFN rank only waits. The connectors' replicas are checked end to end by the
// deployment tests (every xAyF == the monolithic run).
#include "afd/roles/attention_replica.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/comm/socket.h"
#include "afd/common/error.h"
#include "afd/config/afd_config.h"
#include "afd/topology/topology.h"
#include "testing/model_harness.h"

namespace afd::roles {
namespace {

// The in-process MoE, recording each Start's (layer, stage, rows); empty_steps: whether a step
// without tokens runs its MoE layers (zero rows), as the P2P connector's lockstep has it.
class RecordingMoe : public model::LocalMoeBackend {
 public:
  RecordingMoe(const model::MoeModel& model, bool empty_steps)
      : LocalMoeBackend(model), empty_steps_(empty_steps) {}
  void Start(int64_t layer, int stage, const Tensor& hidden, const Tensor& out,
             Workspace& ws) override {
    starts.push_back({static_cast<int>(layer), stage, hidden.dim(0)});
    if (hidden.dim(0) > 0) LocalMoeBackend::Start(layer, stage, hidden, out, ws);
  }
  bool RunsEmptySteps() const override { return empty_steps_; }
  struct Call {
    int layer;
    int stage;
    int64_t rows;
    bool operator==(const Call&) const = default;
  };
  std::vector<Call> starts;

 private:
  bool empty_steps_;
};

// Records the calls it gets, by name; Plan answers `plan` (its stages from the DBO rule when
// `follow_dbo`), IdleStep answers the queued results.
class RecordingCoordinator : public StepCoordinator {
 public:
  RecordingCoordinator(const model::MoeModel& model, bool empty_steps)
      : moe_(model, empty_steps), empty_steps_(empty_steps) {}
  model::MoeBackend& moe() override { return moe_; }
  bool AllowsGraphs() const override { return true; }
  bool RunsEmptySteps() const override { return empty_steps_; }
  void BeginStep() override { calls.push_back("BeginStep"); }
  ReplicaStep Plan(const model::ForwardBatch& batch, int64_t bucket,
                   const DboOptions& dbo) override {
    calls.push_back("Plan");
    planned_buckets.push_back(bucket);
    return {dbo.Stages(batch.size(), batch.HasPrefill()), 0};
  }
  std::vector<int64_t> SplitPoints(const model::ForwardBatch& batch, int stages) const override {
    calls.push_back("SplitPoints");
    return StepCoordinator::SplitPoints(batch, stages);
  }
  void EndLayers() override { calls.push_back("EndLayers"); }
  void BeginCapture() override { calls.push_back("BeginCapture"); }
  int EndCapture() override { return 0; }
  void Replayed(int /*token*/) override {}
  Idle IdleStep(bool active, const DboOptions& /*dbo*/) override {
    calls.push_back(active ? "IdleStep(active)" : "IdleStep(done)");
    AFD_CHECK(!idle.empty(), "no idle result queued");
    const Idle r = idle.front();
    idle.erase(idle.begin());
    return r;
  }
  void RecordRoundTrips() override { calls.push_back("RecordRoundTrips"); }
  std::vector<double> TakeRoundTrips() override { return {0.5}; }

  RecordingMoe moe_;
  bool empty_steps_;
  mutable std::vector<std::string> calls;
  std::vector<int64_t> planned_buckets;
  std::vector<Idle> idle;
};

// Runs `body` on the attention rank of a 1A1F world (the FFN rank joins and waits); returns
// the attention rank's error ("" when none).
std::string OnAttentionRank(const std::function<void(comm::AfdWorld&)>& body) {
  setenv("AFD_JOIN_SECRET", "attention-replica-test-secret-0123456789", 0);
  const int port = comm::PickRendezvousPort();
  std::vector<std::string> errors(2);
  std::vector<std::future<void>> ranks;
  for (int i = 0; i < 2; ++i) {
    ranks.push_back(std::async(std::launch::async, [&, i] {
      const bool is_ffn = i == 0;
      std::unique_ptr<comm::AfdWorld> world;
      try {
        const AfdConfig config = ParseAfdConfig(fmt::format(
            R"({{"role": "{}", "port": {}, "num_attention_ranks": 1, "num_ffn_ranks": 1,
                "afd_process_group_timeout_s": 20}})",
            is_ffn ? "ffn" : "attention", port));
        world = comm::AfdWorld::Join(comm::JoinRequest{config, 0, 8, DType::kF32, {}});
        if (!is_ffn) {
          try {
            body(*world);
          } catch (const Error& e) {
            errors[i] = e.what();
          }
        }
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
  EXPECT_EQ(errors[0], "") << "the FFN rank";
  return errors[1];
}

// Makes a replica over a RecordingCoordinator it keeps a pointer to.
std::unique_ptr<AttentionReplica> Replica(const model::MoeModel& model, comm::AfdWorld& world,
                                          DboOptions dbo, bool empty_steps,
                                          RecordingCoordinator** coordinator, int tp = 1) {
  return std::make_unique<AttentionReplica>(
      model, world, tp, dbo, runtime::CudaGraphOptions{}, [&](const ReplicaGroup& group) {
        EXPECT_EQ(group.tp, 1);
        EXPECT_EQ(group.tp_rank, 0);
        EXPECT_EQ(group.tp_group, nullptr);
        auto c = std::make_unique<RecordingCoordinator>(model, empty_steps);
        *coordinator = c.get();
        return c;
      });
}

TEST(AttentionReplica, RunsAStepAsTheCoordinatorsMicroBatchesWithTheModelsResults) {
  testing_util::ModelHarness h("preset:tiny");
  const model::MoeModel& model = h.model();
  const std::vector<std::vector<int32_t>> prompts = {{3, 4, 5}, {6, 7}, {8, 9, 10}};
  // The reference: the in-process model, one step.
  std::vector<float> expected;
  {
    model::ForwardBatch batch;
    for (const auto& p : prompts) h.Add(batch, h.NewSequence(4), p, 0);
    expected = h.Run(batch);
  }
  const std::string error = OnAttentionRank([&](comm::AfdWorld& world) {
    DboOptions dbo;
    dbo.enabled = true;
    dbo.prefill_token_threshold = 4;
    RecordingCoordinator* c = nullptr;
    const auto replica = Replica(model, world, dbo, /*empty_steps=*/false, &c);
    model::ForwardBatch batch;
    for (const auto& p : prompts) h.Add(batch, h.NewSequence(4), p, 0);
    Workspace ws(h.backend());
    const Tensor logits = replica->Forward(batch, h.cache(), ws);
    std::vector<float> got(logits.numel());
    h.backend().CopyToHost(got.data(), logits);
    EXPECT_EQ(got, expected);  // micro-batches do not change a token's arithmetic
    EXPECT_EQ(c->calls,
              (std::vector<std::string>{"BeginStep", "Plan", "SplitPoints", "EndLayers"}));
    EXPECT_EQ(c->planned_buckets, std::vector<int64_t>{0});  // no graphs on the CPU
    // Two micro-batches of the 8 tokens (4 + 4), every MoE layer of each.
    const int moe_layers = model.config().num_moe_layers();
    ASSERT_EQ(c->moe_.starts.size(), 2u * moe_layers);
    for (const auto& s : c->moe_.starts) EXPECT_EQ(s.rows, 4);
    EXPECT_EQ(replica->steps(), 1);
    EXPECT_EQ(replica->dbo_steps(), 1);
    EXPECT_EQ(replica->graph_steps(), 0);
    EXPECT_EQ(replica->num_captures(), 0);
    replica->RecordRoundTrips();
    EXPECT_EQ(replica->TakeRoundTrips(), std::vector<double>{0.5});
  });
  EXPECT_EQ(error, "");
}

TEST(AttentionReplica, IdleStepsRunEveryMicroBatchEmptyAndDrainEndsAtTheShutdown) {
  testing_util::ModelHarness h("preset:tiny");
  const model::MoeModel& model = h.model();
  const std::string error = OnAttentionRank([&](comm::AfdWorld& world) {
    RecordingCoordinator* c = nullptr;
    const auto replica = Replica(model, world, DboOptions{}, /*empty_steps=*/true, &c);
    using R = runtime::ReplicaRunner::IdleResult;
    c->idle = {{R::kNoneBusy, 1}, {R::kTookPart, 2}};
    EXPECT_EQ(replica->Idle(true), R::kNoneBusy);
    EXPECT_TRUE(c->moe_.starts.empty());  // nothing ran
    EXPECT_EQ(replica->steps(), 0);
    EXPECT_EQ(replica->Idle(true), R::kTookPart);
    // The other replicas' step of two micro-batches: zero rows in each stage of every MoE layer,
    // in the model's order.
    std::vector<RecordingMoe::Call> expected;
    for (const auto& [layer, stage] : model.MoeStartOrder(2)) expected.push_back({layer, stage, 0});
    EXPECT_EQ(c->moe_.starts, expected);
    EXPECT_EQ(replica->steps(), 1);
    EXPECT_EQ(replica->dbo_steps(), 1);
    // Drain: idle steps until the coordinator says the deployment shuts down.
    c->calls.clear();
    c->idle = {{R::kTookPart, 1}, {R::kNoneBusy, 1}, {R::kShutdown, 1}};
    replica->Drain();
    EXPECT_EQ(c->calls,
              (std::vector<std::string>{"IdleStep(done)", "IdleStep(done)", "IdleStep(done)"}));
    EXPECT_EQ(replica->steps(), 2);
    EXPECT_EQ(replica->dbo_steps(), 1);
    // An empty step with tokens nowhere is valid where the coordinator runs empty steps.
    model::ForwardBatch empty;
    Workspace ws(h.backend());
    c->calls.clear();
    replica->Forward(empty, h.cache(), ws);
    EXPECT_EQ(c->calls,
              (std::vector<std::string>{"BeginStep", "Plan", "SplitPoints", "EndLayers"}));
    EXPECT_EQ(replica->steps(), 3);
  });
  EXPECT_EQ(error, "");
}

TEST(AttentionReplica, RefusesAnEmptyStepWhereTheCoordinatorRunsNone) {
  testing_util::ModelHarness h("preset:tiny");
  const std::string error = OnAttentionRank([&](comm::AfdWorld& world) {
    RecordingCoordinator* c = nullptr;
    const auto replica = Replica(h.model(), world, DboOptions{}, /*empty_steps=*/false, &c);
    model::ForwardBatch empty;
    Workspace ws(h.backend());
    try {
      replica->Forward(empty, h.cache(), ws);
      ADD_FAILURE() << "an empty step ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("an empty step"), std::string::npos) << e.what();
    }
    EXPECT_EQ(c->calls, std::vector<std::string>{"BeginStep"});  // nothing planned or run
    EXPECT_EQ(replica->steps(), 0);
  });
  EXPECT_EQ(error, "");
}

TEST(AttentionReplica, RefusesATensorParallelSizeThatDoesNotDivideTheAttentionRanks) {
  testing_util::ModelHarness h("preset:tiny");
  const std::string error = OnAttentionRank([&](comm::AfdWorld& world) {
    RecordingCoordinator* c = nullptr;
    Replica(h.model(), world, DboOptions{}, false, &c, /*tp=*/2);
  });
  EXPECT_NE(error.find("attention tensor-parallel size 2: must divide num_attention_ranks (1)"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace afd::roles
