// The serving engine: requests that arrive at any step, leave by abort, stop at their stop
// tokens, ask for top log-probabilities, or are malformed -- each result is that of the prompt
// run alone, and nothing holds cache blocks once its request ended.
#include "afd/runtime/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"
#include "afd/runtime/generator.h"

namespace afd::runtime {
namespace {

class EngineTest : public testing::Test {
 protected:
  void SetUp() override { model_ = model::OpenModel("preset:tiny", model::OpenOptions{}, cpu_); }
  static RequestParams Params(std::vector<int32_t> prompt, int64_t max_tokens) {
    RequestParams p;
    p.prompt = std::move(prompt);
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    return p;
  }
  kernels::cpu::CpuBackend cpu_;
  std::unique_ptr<model::MoeModel> model_;
};

// Steps until the engine is idle; every output by request id.
std::map<uint64_t, std::vector<RequestOutput>> Drain(Engine& e) {
  std::map<uint64_t, std::vector<RequestOutput>> got;
  while (e.HasWork()) {
    for (RequestOutput& o : e.Step()) got[o.request_id].push_back(std::move(o));
  }
  return got;
}

std::vector<int32_t> Tokens(const std::vector<RequestOutput>& outs) {
  std::vector<int32_t> ids;
  for (const auto& o : outs) ids.insert(ids.end(), o.token_ids.begin(), o.token_ids.end());
  return ids;
}

TEST_F(EngineTest, RequestsArrivingLaterMatchTheirRunAlone) {
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4}, {9, 8, 7}, {5, 5, 5, 5, 5, 5}};
  Generator g(*model_);
  GenerationOptions go;
  go.max_tokens = 9;
  go.ignore_eos = true;
  LocalStepRunner runner(*model_);
  Engine e(*model_, runner, {0, 8, true, 16, 0});
  e.Add(10, Params(prompts[0], 9));
  std::map<uint64_t, std::vector<RequestOutput>> got;
  for (int step = 0; step < 4; ++step) {
    for (RequestOutput& o : e.Step()) got[o.request_id].push_back(std::move(o));
    if (step == 1) e.Add(11, Params(prompts[1], 9));
    if (step == 2) e.Add(12, Params(prompts[2], 9));
  }
  for (auto& [id, outs] : Drain(e)) {
    for (auto& o : outs) got[id].push_back(std::move(o));
  }
  for (uint64_t id = 10; id <= 12; ++id) {
    GenerationOptions alone = go;
    alone.sampler_streams = {0};
    const auto want = g.Generate({prompts[id - 10]}, alone)[0];
    EXPECT_EQ(Tokens(got[id]), want.output_ids) << "request " << id;
    EXPECT_TRUE(got[id].back().finished);
    EXPECT_EQ(got[id].back().finish_reason, FinishReason::kLength);
    EXPECT_EQ(got[id].back().num_prompt_tokens, static_cast<int64_t>(prompts[id - 10].size()));
  }
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  EXPECT_EQ(e.stats().num_running, 0);
}

// The steady decode counters leave out the engine's first kWarmDecodeSteps decode-only steps.
TEST_F(EngineTest, SteadyDecodeStatsSkipTheWarmUpSteps) {
  LocalStepRunner runner(*model_);
  Engine e(*model_, runner, {0, 8, true, 16, 0});
  e.Add(1, Params({1, 2, 3}, 7));
  e.Add(2, Params({4, 5}, 7));
  Drain(e);
  const GenerationStats& st = e.generation_stats();
  const int64_t warm = GenerationStats::kWarmDecodeSteps;
  ASSERT_GT(st.decode_steps, warm);
  EXPECT_EQ(st.steady_decode_steps, st.decode_steps - warm);
  EXPECT_EQ(st.steady_decode_tokens, st.decode_tokens - 2 * warm);  // two sequences a step
  EXPECT_GT(st.steady_decode_seconds, 0.0);
  EXPECT_LT(st.steady_decode_seconds, st.decode_seconds);
}

TEST_F(EngineTest, AbortEndsTheRequestAndFreesItsBlocks) {
  LocalStepRunner runner(*model_);
  Engine e(*model_, runner, {0, 0, false, 8, 0});
  e.Add(1, Params({1, 2, 3}, 50));
  e.Add(2, Params({4, 5, 6}, 5));
  e.Step();
  e.Step();
  EXPECT_GT(e.stats().kv_blocks_used, 0);
  e.Abort(1);
  e.Abort(77);  // unknown: ignored
  const auto got = Drain(e);
  ASSERT_EQ(got.at(1).size(), 1u);
  EXPECT_TRUE(got.at(1)[0].finished);
  EXPECT_EQ(got.at(1)[0].finish_reason, FinishReason::kAbort);
  EXPECT_EQ(Tokens(got.at(2)).size(), 3u);  // 2 tokens before, 3 after the abort
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
}

TEST_F(EngineTest, StopTokenIdsAndEos) {
  LocalStepRunner runner(*model_);
  Engine probe(*model_, runner, {0, 0, false, 8, 0});
  probe.Add(1, Params({3, 1, 4, 1, 5}, 6));
  const std::vector<int32_t> free_run = Tokens(Drain(probe).at(1));
  ASSERT_EQ(free_run.size(), 6u);
  Engine e(*model_, runner, {0, 0, false, 8, 0});
  RequestParams p = Params({3, 1, 4, 1, 5}, 6);
  p.stop_token_ids = {free_run[2]};
  e.Add(1, p);
  const auto got = Drain(e).at(1);
  const std::vector<int32_t> ids = Tokens(got);
  // Stops at the first occurrence of the stop token, which is included in the ids.
  const auto first = std::find(free_run.begin(), free_run.end(), free_run[2]);
  EXPECT_EQ(ids, std::vector<int32_t>(free_run.begin(), first + 1));
  EXPECT_EQ(got.back().finish_reason, FinishReason::kStop);
  EXPECT_EQ(got.back().stop_token_id, free_run[2]);
}

TEST_F(EngineTest, TopLogprobsAreSortedAndAgreeWithTheTokensLogprob) {
  LocalStepRunner runner(*model_);
  Engine e(*model_, runner, {0, 0, false, 8, 0});
  RequestParams p = Params({2, 7, 1, 8, 2, 8}, 4);
  p.logprobs = 5;
  p.prompt_logprobs = 3;
  p.sampling = {0.9f, 0, 1.0f, 5};
  e.Add(1, p);
  const auto got = Drain(e).at(1);
  ASSERT_EQ(got.front().prompt_logprobs.size(), 6u);
  EXPECT_TRUE(std::isnan(got.front().prompt_logprobs[0].logprob));
  for (size_t j = 1; j < 6; ++j) {
    const TokenLogprobs& t = got.front().prompt_logprobs[j];
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
    EXPECT_LE(t.logprob, t.top[0].logprob);
  }
  int64_t n = 0;
  for (const RequestOutput& o : got) {
    for (size_t i = 0; i < o.token_ids.size(); ++i, ++n) {
      const TokenLogprobs& t = o.logprobs[i];
      ASSERT_EQ(t.top.size(), 5u);
      double total = 0;
      for (size_t k = 0; k + 1 < t.top.size(); ++k) {
        EXPECT_GE(t.top[k].logprob, t.top[k + 1].logprob);
        total += std::exp(t.top[k].logprob);
      }
      EXPECT_LT(total, 1.0 + 1e-6);
      for (const TopLogprob& c : t.top) {
        if (c.id == o.token_ids[i]) {
          EXPECT_EQ(c.logprob, t.logprob);  // the same computation
        }
      }
    }
  }
  EXPECT_EQ(n, 4);
  // The same logprob as without the top list (the CPU reference computes both alike).
  Engine plain(*model_, runner, {0, 0, false, 8, 0});
  p.logprobs = 0;
  p.prompt_logprobs = -1;
  plain.Add(1, p);
  const auto again = Drain(plain).at(1);
  for (size_t i = 0; i < again.size(); ++i) {
    ASSERT_EQ(again[i].logprobs.size(), got[i].logprobs.size());
    for (size_t j = 0; j < again[i].logprobs.size(); ++j) {
      EXPECT_EQ(again[i].logprobs[j].logprob, got[i].logprobs[j].logprob);
      EXPECT_TRUE(again[i].logprobs[j].top.empty());
    }
  }
}

// Asynchronous scheduling (the next step of decodes launched before this one's ids are read)
// hands every request what waiting for the ids gives: through arrivals, an abort, a stop token
// that ends a sequence already planned into the next step, top log-probabilities (steps read at
// once), max_tokens 0 and sampling.
TEST_F(EngineTest, AsyncSchedulingGivesEveryRequestTheSameOutputs) {
  LocalStepRunner runner(*model_);
  Engine probe(*model_, runner, {0, 0, false, 16, 0});
  probe.Add(1, Params({6, 2, 8}, 9));
  const std::vector<int32_t> free_run = Tokens(Drain(probe).at(1));
  ASSERT_EQ(free_run.size(), 9u);
  const auto run = [&](bool async, GenerationStats* stats) {
    EngineOptions o{0, 0, false, 16, 0};
    o.async_scheduling = async ? AsyncScheduling::kOn : AsyncScheduling::kOff;
    Engine e(*model_, runner, o);
    RequestParams greedy = Params({1, 2, 3, 4}, 12);
    greedy.logprobs = 0;
    e.Add(1, greedy);
    RequestParams sampled = Params({9, 8, 7}, 10);
    sampled.sampling = {0.8f, 0, 0.9f, 3};
    sampled.sampler_stream = 3;
    sampled.logprobs = 0;
    e.Add(2, sampled);
    RequestParams stops = Params({6, 2, 8}, 20);
    stops.stop_token_ids = {free_run[4]};
    e.Add(3, stops);
    e.Add(5, Params({4, 4, 4, 4, 4}, 30));
    std::map<uint64_t, std::vector<RequestOutput>> got;
    for (int step = 0; e.HasWork(); ++step) {
      for (RequestOutput& out : e.Step()) got[out.request_id].push_back(std::move(out));
      if (step == 3) {
        RequestParams tops = Params({3, 1, 4, 1, 5}, 5);
        tops.logprobs = 3;
        tops.prompt_logprobs = 2;
        e.Add(4, tops);
      }
      if (step == 6) e.Abort(5);
      if (step == 8) e.Add(6, Params({2, 2}, 0));
    }
    EXPECT_EQ(e.stats().kv_blocks_used, 0);
    EXPECT_EQ(e.stats().num_running, 0);
    *stats = e.generation_stats();
    return got;
  };
  GenerationStats sync_stats, async_stats;
  const auto want = run(false, &sync_stats);
  const auto got = run(true, &async_stats);
  EXPECT_EQ(sync_stats.ahead_steps, 0);
  EXPECT_GE(async_stats.ahead_steps, 4);  // the top-logprobs request's steps are read at once
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(Tokens(want.at(3)).size(), 5u);  // stopped at free_run[4]
  EXPECT_EQ(want.at(3).back().finish_reason, FinishReason::kStop);
  EXPECT_EQ(want.at(5).back().finish_reason, FinishReason::kAbort);
  EXPECT_EQ(want.at(6).back().finish_reason, FinishReason::kLength);
  for (const auto& [id, outs] : want) {
    SCOPED_TRACE(testing::Message() << "request " << id);
    const std::vector<RequestOutput>& g = got.at(id);
    EXPECT_EQ(Tokens(g), Tokens(outs));
    EXPECT_EQ(g.back().finish_reason, outs.back().finish_reason);
    EXPECT_EQ(g.back().stop_token_id, outs.back().stop_token_id);
    std::vector<TokenLogprobs> a, b;
    for (const auto& o : outs) b.insert(b.end(), o.logprobs.begin(), o.logprobs.end());
    for (const auto& o : g) a.insert(a.end(), o.logprobs.begin(), o.logprobs.end());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].logprob, b[i].logprob) << i;
      ASSERT_EQ(a[i].top.size(), b[i].top.size());
      for (size_t k = 0; k < a[i].top.size(); ++k) {
        EXPECT_EQ(a[i].top[k].id, b[i].top[k].id);
        EXPECT_EQ(a[i].top[k].logprob, b[i].top[k].logprob);
      }
    }
    ASSERT_EQ(g.front().prompt_logprobs.size(), outs.front().prompt_logprobs.size());
    for (size_t j = 1; j < outs.front().prompt_logprobs.size(); ++j) {
      EXPECT_EQ(g.front().prompt_logprobs[j].logprob, outs.front().prompt_logprobs[j].logprob);
    }
  }
}

// An engine destroyed with a step still launched ahead waits for it (no stray device writes).
TEST_F(EngineTest, AnEngineLeftWithAStepAheadEndsCleanly) {
  LocalStepRunner runner(*model_);
  EngineOptions o{0, 0, false, 16, 0};
  o.async_scheduling = AsyncScheduling::kOn;
  Engine e(*model_, runner, o);
  e.Add(1, Params({1, 2, 3}, 20));
  for (int i = 0; i < 4; ++i) e.Step();
  // Each call after the prefill's (a step with prompt tokens launches nothing ahead) launched
  // the next step before reading its own.
  EXPECT_EQ(e.generation_stats().ahead_steps, 3);
  EXPECT_TRUE(e.HasWork());
}

TEST_F(EngineTest, BadRequestsEndWithAnErrorNamingTheCause) {
  LocalStepRunner runner(*model_);
  Engine e(*model_, runner, {0, 0, false, 1, 100});
  e.Add(1, Params({}, 4));
  e.Add(2, Params({1, static_cast<int32_t>(model_->config().vocab_size)}, 4));
  e.Add(3, Params({1, 2}, 99));  // 101 > max_model_len 100
  RequestParams bad_sampling = Params({1}, 2);
  bad_sampling.sampling.top_p = 0.0f;
  e.Add(4, bad_sampling);
  e.Add(5, Params(std::vector<int32_t>(90, 1), 2));  // fits the length, not 1 block of 64
  e.Add(6, Params({1, 2}, 3));                       // fine
  EXPECT_THROW(e.Add(6, Params({1}, 1)), Error);     // id already live
  const auto got = Drain(e);
  const std::map<uint64_t, std::string> want = {{1, "empty"},
                                                {2, "outside the vocabulary"},
                                                {3, "maximum model length 100"},
                                                {4, "top_p"},
                                                {5, "KV cache blocks"}};
  for (const auto& [id, text] : want) {
    ASSERT_EQ(got.at(id).size(), 1u) << id;
    EXPECT_EQ(got.at(id)[0].finish_reason, FinishReason::kError) << id;
    EXPECT_TRUE(got.at(id)[0].rejected) << id;  // the request's own input: the API's 400
    EXPECT_NE(got.at(id)[0].error.find(text), std::string::npos) << got.at(id)[0].error;
  }
  EXPECT_EQ(Tokens(got.at(6)).size(), 3u);
  EXPECT_THROW(Engine(*model_, runner, {0, 0, false, 0, 0}), Error);  // no cache
}

}  // namespace
}  // namespace afd::runtime
