// The FFN role's worker over the asynchronous connector, in one process: ranks are threads
// joined at a real rendezvous store, windows real POSIX shared memory, the model preset:tiny on
// the CPU. The attention ranks dispatch one MoE layer each (AsyncAttentionMoe, the attention
// role's own MoE) before the FFN rank starts serving, so what the worker finds is known: every
// sender's item for the same layer, there at once. Whether ranks in separate processes meet is
// timing (tests/e2e check only that the results stay exact); here the gathering itself is
// checked -- one expert pass for the senders of a layer, each reply the same bytes as served
// alone.
#include "afd/runtime/async_ffn_worker.h"

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
#include "afd/runtime/async_attention_runner.h"
#include "afd/tensor/workspace.h"

namespace afd::runtime {
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
  // [attention rank] the MoE output of that rank's rows, as the attention rank combined it
  std::vector<std::vector<float>> out;
};

int64_t Tokens(int rank) { return 2 + rank; }  // senders of different sizes

// A attention ranks and one FFN rank; each attention rank dispatches the model's first MoE layer,
// every dispatch made before the FFN rank starts serving.
Served Serve(int A, bool gather) {
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
              "connector_extra_config": {{"recv_poll_timeout_ms": 20, "ffn_gather": {}}}}})",
          is_ffn ? "ffn" : "attention", port, A, gather ? "true" : "false");
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
        int64_t layer = 0;
        while (!mc.IsMoeLayer(layer)) ++layer;
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
          AsyncAttentionMoe moe(*model, *world, connector, 1, 0, nullptr);
          Workspace ws(model->backend());
          const int64_t n = Tokens(rank), H = mc.hidden_size;
          const Tensor hidden = ws.Take(DType::kF32, {n, H});
          const Tensor out = ws.Take(DType::kF32, {n, H});
          float* h = hidden.data_as<float>();
          for (int64_t j = 0; j < n * H; ++j) {
            h[j] = 0.01f * static_cast<float>((j * 7 + rank * 13) % 41) - 0.2f;
          }
          moe.Start(layer, 0, hidden, out, ws);
          world->Barrier("dispatched");
          moe.Finish(0, ws);
          moe.EndStep();
          const float* o = out.data_as<float>();
          served.out[rank].assign(o, o + n * H);
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
  const Served alone = Serve(3, /*gather=*/false);
  EXPECT_EQ(alone.items, 3);
  EXPECT_EQ(alone.gathered, 0);
  EXPECT_EQ(alone.groups, 0);
  std::vector<int64_t> rows = alone.ffn_step_rows;
  std::sort(rows.begin(), rows.end());
  EXPECT_EQ(rows, (std::vector<int64_t>{Tokens(0), Tokens(1), Tokens(2)}));
  const Served together = Serve(3, /*gather=*/true);
  EXPECT_EQ(together.items, 3);
  EXPECT_EQ(together.gathered, 3);
  EXPECT_EQ(together.groups, 1);
  EXPECT_EQ(together.ffn_step_rows, (std::vector<int64_t>{Tokens(0) + Tokens(1) + Tokens(2)}));
  // Each sender's reply the same bytes whether its rows ran alone or beside the others'.
  ASSERT_EQ(together.out.size(), alone.out.size());
  for (size_t r = 0; r < alone.out.size(); ++r) {
    ASSERT_FALSE(alone.out[r].empty()) << "attention rank " << r;
    EXPECT_NE(alone.out[r], std::vector<float>(alone.out[r].size(), 0.0f)) << "no MoE output";
    EXPECT_EQ(together.out[r], alone.out[r]) << "attention rank " << r;
  }
}

}  // namespace
}  // namespace afd::runtime
