// The FFN role's worker over the asynchronous connector, in one process: ranks are threads
// joined at a real rendezvous store, windows real POSIX shared memory, the model preset:tiny on
// the CPU. The attention ranks dispatch one MoE layer each (AsyncAttentionMoe, the attention
// role's own MoE) before the FFN rank starts serving, so what the worker finds is known: every
// sender's item for the same layer, there at once. Whether ranks in separate processes meet is
// timing (tests/e2e check only that the results stay exact); here the gathering itself is
// checked -- one expert pass for the senders of a layer, each reply the same bytes as served
// alone.
#include "afd/roles/async_ffn_worker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/comm/socket.h"
#include "afd/common/error.h"
#include "afd/config/afd_config.h"
#include "afd/connector/async_connector.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"
#include "afd/roles/async_attention.h"
#include "afd/tensor/workspace.h"

namespace afd::roles {
namespace {

constexpr int kTokenCap = 8;

// The CPU backend, recording the step rows declared to it (a GPU backend's launch choices
// follow them: the FFN must declare each expert pass's rows as the layer loop declares a step's).
class RowsRecordingCpu : public kernels::cpu::CpuBackend {
 public:
  void SetStepRows(int64_t rows) override { rows_.push_back(rows); }
  std::vector<int64_t> rows_;
};

struct Served {
  int64_t items = 0, gathered = 0, groups = 0;
  std::vector<int64_t> ffn_step_rows;  // SetStepRows calls on the FFN rank's backend
  // [attention rank][item] the MoE output of that rank's rows, as the attention rank combined it
  std::vector<std::vector<std::vector<float>>> out;
};

int64_t Tokens(int rank) { return 2 + rank; }  // senders of different sizes

// One FFN rank and layers.size() attention ranks; attention rank r dispatches the model's MoE
// layers numbered layers[r] (0: its first MoE layer, ...) one after another, each once the
// previous one's reply is in. Every rank's first dispatch is in the window before the FFN rank
// starts serving. wait_us: ffn_gather_wait_us.
Served Serve(const std::vector<std::vector<int>>& layers, bool gather, int wait_us = 200) {
  const int A = static_cast<int>(layers.size());
  setenv("AFD_JOIN_SECRET", "async-ffn-worker-test-secret-0123456789", 0);
  const int port = comm::PickRendezvousPort();
  Served served;
  served.out.resize(A);
  std::vector<std::string> errors(A + 1);
  std::vector<std::future<void>> ranks;
  for (int i = 0; i < A + 1; ++i) {
    ranks.push_back(std::async(std::launch::async, [&, i] {
      const bool is_ffn = i == 0;
      const std::string json = fmt::format(
          R"({{"role": "{}", "connector": "AsyncAFDConnector", "port": {},
              "num_attention_ranks": {}, "num_ffn_ranks": 1, "afd_process_group_timeout_s": 20,
              "connector_extra_config": {{"recv_poll_timeout_ms": 20, "ffn_gather": {},
                                          "ffn_gather_wait_us": {}}}}})",
          is_ffn ? "ffn" : "attention", port, A, gather ? "true" : "false", wait_us);
      std::unique_ptr<comm::AfdWorld> world;
      try {
        const AfdConfig config = ParseAfdConfig(json);
        model::OpenOptions open;
        if (is_ffn) {
          open.weights.load_attention = false;
        } else {
          open.weights.load_moe = config.compute_gate_on_attention;
          open.weights.expert_begin = 0;
          open.weights.expert_end = 0;
        }
        RowsRecordingCpu cpu;
        const std::unique_ptr<model::MoeModel> model = model::OpenModel("preset:tiny", open, cpu);
        const model::ModelConfig& mc = model->config();
        comm::JoinRequest req{config, is_ffn ? 0 : i - 1, mc.hidden_size, DType::kF32, {}};
        world = comm::AfdWorld::Join(req);
        connector::AsyncConnectorOptions ao;
        ao.token_cap = is_ffn ? 0 : kTokenCap;
        ao.topk = mc.num_experts_per_tok;
        ao.num_experts = mc.n_routed_experts;
        ao.row = {mc.hidden_size, DType::kF32};
        connector::AsyncConnector connector(*world, ao);
        std::vector<int64_t> moe_layers;
        for (int64_t l = 0; l < mc.num_hidden_layers; ++l) {
          if (mc.IsMoeLayer(l)) moe_layers.push_back(l);
        }
        if (is_ffn) {
          AsyncFfnWorker worker(*model, *world, connector, /*graphs=*/false);
          // Serving starts once every dispatch is in the window.
          world->Barrier("dispatched");
          served.items = worker.Run();
          served.gathered = worker.gathered_items();
          served.groups = worker.groups();
          served.ffn_step_rows = cpu.rows_;
        } else {
          const int rank = i - 1;
          AsyncAttentionMoe moe(*model, *world, connector, ReplicaGroup{});
          Workspace ws(model->backend());
          const int64_t n = Tokens(rank), H = mc.hidden_size;
          const Tensor hidden = ws.Take(DType::kF32, {n, H});
          const Tensor out = ws.Take(DType::kF32, {n, H});
          for (size_t item = 0; item < layers[rank].size(); ++item) {
            const int index = layers[rank][item];
            AFD_CHECK(index < static_cast<int>(moe_layers.size()), "MoE layer {} of {}", index,
                      moe_layers.size());
            float* h = hidden.data_as<float>();
            for (int64_t j = 0; j < n * H; ++j) {
              h[j] = 0.01f * static_cast<float>((j * 7 + rank * 13 + index * 5) % 41) - 0.2f;
            }
            moe.Start(moe_layers[index], 0, hidden, out, ws);
            if (item == 0) world->Barrier("dispatched");
            moe.Finish(0, ws);
            moe.EndStep();
            const float* o = out.data_as<float>();
            served.out[rank].emplace_back(o, o + n * H);
          }
          if (layers[rank].empty()) world->Barrier("dispatched");
          connector.AnnounceShutdown();
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
  for (int i = 0; i < A + 1; ++i) EXPECT_EQ(errors[i], "") << (i == 0 ? "FFN" : "attention");
  return served;
}

TEST(AsyncFfnWorker, GathersTheSendersOfALayerIntoOneExpertPass) {
  const std::vector<std::vector<int>> layers = {{0}, {0}, {0}};
  const Served alone = Serve(layers, /*gather=*/false);
  EXPECT_EQ(alone.items, 3);
  EXPECT_EQ(alone.gathered, 0);
  EXPECT_EQ(alone.groups, 0);
  std::vector<int64_t> rows = alone.ffn_step_rows;
  std::sort(rows.begin(), rows.end());
  EXPECT_EQ(rows, (std::vector<int64_t>{Tokens(0), Tokens(1), Tokens(2)}));
  const Served together = Serve(layers, /*gather=*/true);
  EXPECT_EQ(together.items, 3);
  EXPECT_EQ(together.gathered, 3);
  EXPECT_EQ(together.groups, 1);
  EXPECT_EQ(together.ffn_step_rows, (std::vector<int64_t>{Tokens(0) + Tokens(1) + Tokens(2)}));
  // Each sender's reply the same bytes whether its rows ran alone or beside the others'.
  ASSERT_EQ(together.out.size(), alone.out.size());
  for (size_t r = 0; r < alone.out.size(); ++r) {
    ASSERT_EQ(alone.out[r].size(), 1u) << "attention rank " << r;
    EXPECT_NE(alone.out[r][0], std::vector<float>(alone.out[r][0].size(), 0.0f)) << "no output";
    EXPECT_EQ(together.out[r], alone.out[r]) << "attention rank " << r;
  }
}

// SenderLockstep in the worker (roles/ffn_gather.h): rank 0's first item is for the second
// MoE layer, rank 1's for the first -- rank 1 is behind, so it is served first while rank 0's
// item is held; rank 1's next item (the second layer) then joins it: one expert pass of both.
// (The wait for rank 1's second item is bounded by ffn_gather_wait_us: 1 s here, so that a
// loaded machine does not miss it.) The replies are those of serving every item alone.
TEST(AsyncFfnWorker, ARankBehindIsServedFirstAndThenGathered) {
  const std::vector<std::vector<int>> layers = {{1}, {0, 1}};
  const Served alone = Serve(layers, /*gather=*/false);
  EXPECT_EQ(alone.items, 3);
  EXPECT_EQ(alone.groups, 0);
  const Served together = Serve(layers, /*gather=*/true, /*wait_us=*/1000000);
  EXPECT_EQ(together.items, 3);
  EXPECT_EQ(together.groups, 1);
  EXPECT_EQ(together.gathered, 2);
  // Rank 1's first item alone, then the second layer of both.
  EXPECT_EQ(together.ffn_step_rows, (std::vector<int64_t>{Tokens(1), Tokens(0) + Tokens(1)}));
  EXPECT_EQ(together.out, alone.out);
}

}  // namespace
}  // namespace afd::roles
