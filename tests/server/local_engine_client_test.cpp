// The in-process engine client: requests submitted from many threads at once each get the
// result of their prompt run alone; aborts and shutdown end requests with the right reason.
#include "afd/server/local_engine_client.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>

#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"
#include "afd/runtime/generator.h"

namespace afd::server {
namespace {

struct Collected {
  std::vector<int32_t> ids;
  runtime::FinishReason reason = runtime::FinishReason::kNone;
  std::string error;
};

// Submits and returns a future of the collected outputs.
std::future<Collected> SubmitAndCollect(EngineClient& client, uint64_t id,
                                        runtime::RequestParams p) {
  auto promise = std::make_shared<std::promise<Collected>>();
  auto acc = std::make_shared<Collected>();
  client.Submit(id, std::move(p), [promise, acc](const runtime::RequestOutput& o) {
    acc->ids.insert(acc->ids.end(), o.token_ids.begin(), o.token_ids.end());
    if (o.finished) {
      acc->reason = o.finish_reason;
      acc->error = o.error;
      promise->set_value(*acc);
    }
  });
  return promise->get_future();
}

// Both ways of scheduling: waiting for each step's ids (the CPU's default), and launching the
// next decode step first (CUDA's default, forced here).
class LocalEngineClientTest : public testing::TestWithParam<runtime::AsyncScheduling> {
 protected:
  runtime::EngineOptions Options(runtime::EngineOptions o) const {
    o.async_scheduling = GetParam();
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Scheduling, LocalEngineClientTest,
                         testing::Values(runtime::AsyncScheduling::kOff,
                                         runtime::AsyncScheduling::kOn),
                         [](const auto& info) {
                           return info.param == runtime::AsyncScheduling::kOn ? "Async" : "Sync";
                         });

TEST_P(LocalEngineClientTest, ConcurrentRequestsMatchTheirRunAlone) {
  kernels::cpu::CpuBackend cpu;
  const auto model = model::OpenModel("preset:tiny", model::OpenOptions{}, cpu);
  constexpr int kRequests = 24;
  std::vector<runtime::RequestParams> params(kRequests);
  std::vector<std::vector<int32_t>> want(kRequests);
  runtime::Generator g(*model);
  for (int i = 0; i < kRequests; ++i) {
    params[i].prompt = {static_cast<int32_t>(i + 1), 3, static_cast<int32_t>(2 * i + 5)};
    params[i].max_tokens = 4 + i % 5;
    params[i].ignore_eos = true;
    params[i].sampling = {i % 2 ? 0.8f : 0.0f, 0, 1.0f, static_cast<uint64_t>(i)};
    runtime::GenerationOptions o;  // each alone, before the client's thread uses the backend
    o.max_tokens = params[i].max_tokens;
    o.ignore_eos = true;
    o.sampling = params[i].sampling;
    want[i] = g.Generate({params[i].prompt}, o)[0].output_ids;
  }
  runtime::LocalStepRunner runner(*model);
  LocalEngineClient client(*model, runner, Options({4, 32, true, 64, 0}));
  EXPECT_TRUE(client.Ready());
  EXPECT_EQ(client.model_info().vocab_size, model->config().vocab_size);
  std::vector<std::future<Collected>> futures(kRequests);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kRequests; i += 4)
        futures[i] = SubmitAndCollect(client, 100 + i, params[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    const Collected got = futures[i].get();
    EXPECT_EQ(got.ids, want[i]) << "request " << i;
    EXPECT_EQ(got.reason, runtime::FinishReason::kLength);
  }
  const EngineLoad load = client.Load();
  EXPECT_EQ(load.total.kv_blocks_used, 0);
  // The engine thread's time: in steps, and (a part of that thread's time) in delivering outputs.
  EXPECT_GT(load.step_seconds, 0.0);
  EXPECT_GT(load.delivery_seconds, 0.0);
  EXPECT_LT(load.delivery_seconds, load.step_seconds);
}

TEST_P(LocalEngineClientTest, AbortAndShutdownEndRequests) {
  kernels::cpu::CpuBackend cpu;
  const auto model = model::OpenModel("preset:tiny", model::OpenOptions{}, cpu);
  runtime::LocalStepRunner runner(*model);
  std::future<Collected> pending;
  {
    LocalEngineClient client(*model, runner, Options({0, 0, false, 64, 0}));
    runtime::RequestParams p;
    p.prompt = {1, 2, 3};
    p.max_tokens = 2000;
    p.ignore_eos = true;
    auto aborted = SubmitAndCollect(client, 1, p);
    client.Abort(1);
    const Collected a = aborted.get();
    EXPECT_EQ(a.reason, runtime::FinishReason::kAbort);
    runtime::RequestParams bad = p;
    bad.prompt = {};
    EXPECT_EQ(SubmitAndCollect(client, 2, bad).get().reason, runtime::FinishReason::kError);
    pending = SubmitAndCollect(client, 3, p);  // still running when the client goes away
  }
  const Collected c = pending.get();
  EXPECT_EQ(c.reason, runtime::FinishReason::kError);
  EXPECT_NE(c.error.find("stopped"), std::string::npos);
}

}  // namespace
}  // namespace afd::server
