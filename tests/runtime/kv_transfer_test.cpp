// KV transfers between engines (prefill/decode disaggregation, issue 40): a prefill engine
// holds a finished request's cache rows, exports them, and a decode engine that imports them
// computes only the last prompt token and then decodes -- the same tokens and log-probabilities,
// bit for bit on the CPU, as one engine running the request alone, for both attention kinds
// (MLA's latent rows, GQA's key/value rows), with chunked prefill and concurrent requests.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <thread>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"
#include "afd/runtime/engine.h"

namespace afd::runtime {
namespace {

class KvTransfer : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { model_ = model::OpenModel(GetParam(), model::OpenOptions{}, cpu_); }
  static RequestParams Params(std::vector<int32_t> prompt, int64_t max_tokens) {
    RequestParams p;
    p.prompt = std::move(prompt);
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    p.logprobs = 2;
    return p;
  }
  kernels::cpu::CpuBackend cpu_;
  std::unique_ptr<model::MoeModel> model_;
};

std::map<uint64_t, std::vector<RequestOutput>> Drain(Engine& e) {
  std::map<uint64_t, std::vector<RequestOutput>> got;
  while (e.HasWork()) {
    for (RequestOutput& o : e.Step()) got[o.request_id].push_back(std::move(o));
  }
  return got;
}

// Every token id and log-probability (with its top list) of a request's outputs.
struct Result {
  std::vector<int32_t> ids;
  std::vector<float> lps;
  std::vector<int32_t> top_ids;
  bool operator==(const Result&) const = default;
};
Result Of(const std::vector<RequestOutput>& outs) {
  Result r;
  for (const RequestOutput& o : outs) {
    r.ids.insert(r.ids.end(), o.token_ids.begin(), o.token_ids.end());
    for (const TokenLogprobs& t : o.logprobs) {
      r.lps.push_back(t.logprob);
      for (const TopLogprob& top : t.top) r.top_ids.push_back(top.id);
    }
  }
  return r;
}

// Prompts of 22, 150 (three blocks of 64), 8 and 2 tokens.
std::vector<int32_t> LongPrompt() {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < 150; ++i) p.push_back((i * 37 + 11) % 1000 + 2);
  return p;
}
const std::vector<std::vector<int32_t>> kPrompts = {
    {5, 9, 300, 17, 42, 8, 8, 61, 2, 700, 11, 12, 13, 14, 15, 16, 99, 98, 97, 96, 1000, 4},
    LongPrompt(),
    {3, 1, 4, 1, 5, 9, 2, 6},
    {77, 78},
};

TEST_P(KvTransfer, DecodeFromImportedRowsEqualsTheColocatedRun) {
  LocalStepRunner runner(*model_);
  // The colocated reference: each prompt alone on one engine.
  std::map<uint64_t, Result> want;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    Engine e(*model_, runner, {0, 0, false, 32, 0});
    e.Add(i, Params(kPrompts[i], 12));
    want[i] = Of(Drain(e)[i]);
  }
  // Prefill engine: max_tokens 1 with the rows held (vLLM's proxy sends max_tokens 1), staged in
  // host memory (the default) or left in the cache's blocks (no staging budget).
  for (const int64_t stage : {EngineOptions{}.kv_stage_bytes, int64_t{0}}) {
    SCOPED_TRACE(stage > 0 ? "staged rows" : "rows in the cache's blocks");
    EngineOptions po{0, 0, false, 32, 0};
    po.kv_stage_bytes = stage;
    Engine producer(*model_, runner, po);
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      RequestParams p = Params(kPrompts[i], 1);
      p.hold_kv_s = 480;
      producer.Add(100 + i, p);
    }
    std::map<uint64_t, std::vector<RequestOutput>> prefilled = Drain(producer);
    EXPECT_EQ(producer.stats().kv_held, static_cast<int64_t>(kPrompts.size()));
    if (stage > 0) {
      EXPECT_EQ(producer.stats().kv_blocks_used, 0);  // copied out: the blocks are free
      EXPECT_EQ(producer.staged_kv().count(), static_cast<int64_t>(kPrompts.size()));
    } else {
      EXPECT_GT(producer.stats().kv_blocks_used, 0);
      EXPECT_EQ(producer.staged_kv().count(), 0);
    }
    std::map<uint64_t, std::shared_ptr<const KvRows>> rows;
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      const RequestOutput& last = prefilled[100 + i].back();
      ASSERT_TRUE(last.finished);
      EXPECT_TRUE(last.kv_held);
      EXPECT_EQ(last.kv_positions, static_cast<int64_t>(kPrompts[i].size()));
      EXPECT_GE(static_cast<int64_t>(last.kv_block_ids.size()),
                (last.kv_positions + kv::kDefaultBlockSize - 1) / kv::kDefaultBlockSize);
      // The producer's own first token is the colocated run's.
      EXPECT_EQ(last.token_ids.at(0), want[i].ids.at(0));
      rows[i] = producer.ExportHeldKv(100 + i);
      producer.ReleaseHeldKv(100 + i);
    }
    EXPECT_EQ(producer.stats().kv_held, 0);
    EXPECT_EQ(producer.stats().kv_blocks_used, 0);
    EXPECT_THROW(producer.ExportHeldKv(100), Error);  // released
    // Decode engine: the requests arrive with the rows, concurrently, in chunks of 3 tokens.
    Engine consumer(*model_, runner, {0, 3, true, 32, 0});
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      RequestParams p = Params(kPrompts[i], 12);
      p.imported_kv = rows[i];
      consumer.Add(200 + i, p);
    }
    std::map<uint64_t, std::vector<RequestOutput>> got = Drain(consumer);
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      EXPECT_EQ(Of(got[200 + i]), want[i]) << "prompt " << i;
    }
    EXPECT_EQ(consumer.stats().kv_blocks_used, 0);
    // The first output's computation was one token (the prompt's last): the decode engine never
    // prefilled the imported positions.
    EXPECT_EQ(consumer.generation_stats().prefill_tokens +
                  consumer.generation_stats().mixed_prefill_tokens,
              0);
  }
}

// Past the staging budget a request's rows stay in the cache's blocks; both kinds export and
// release alike.
TEST_P(KvTransfer, TheStagingBudgetSpillsToTheBlocks) {
  LocalStepRunner runner(*model_);
  const std::vector<int32_t> prompt = {9, 8, 7, 6, 5, 4, 3};
  EngineOptions o{0, 0, false, 16, 0};
  {
    Engine probe(*model_, runner, o);
    o.kv_stage_bytes = model_->config().num_hidden_layers * static_cast<int64_t>(prompt.size()) *
                       probe.kv_row_width() * static_cast<int64_t>(DTypeSize(probe.kv_dtype()));
  }
  Engine e(*model_, runner, o);  // room for one request's rows
  for (uint64_t id : {1u, 2u}) {
    RequestParams p = Params(prompt, 1);
    p.hold_kv_s = 60;
    e.Add(id, p);
  }
  Drain(e);
  EXPECT_EQ(e.stats().kv_held, 2);
  EXPECT_EQ(e.staged_kv().count(), 1);
  EXPECT_EQ(e.staged_kv().bytes(), o.kv_stage_bytes);
  EXPECT_GT(e.stats().kv_blocks_used, 0);  // the other one's
  const std::shared_ptr<const KvRows> a = e.ExportHeldKv(1), b = e.ExportHeldKv(2, true);
  EXPECT_EQ(a->bytes, b->bytes);        // the same prompt: the same rows, either way
  EXPECT_FALSE(b->device.has_value());  // (no CUDA IPC on the CPU: bytes)
  e.ReleaseHeldKv(1);
  e.ReleaseHeldKv(2);
  EXPECT_EQ(e.stats().kv_held, 0);
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  EXPECT_EQ(e.staged_kv().bytes(), 0);
}

// hold_kv_on_device (a producer of the cuda_ipc transport): the rows stay in the cache's blocks
// however much staging room there is, for a consumer to read in place; exported as bytes they
// are the rows a staged request gives.
TEST_P(KvTransfer, RowsHeldOnTheDeviceStayInTheBlocks) {
  LocalStepRunner runner(*model_);
  Engine e(*model_, runner, {0, 0, false, 16, 0});
  for (uint64_t id : {1u, 2u}) {
    RequestParams p = Params({9, 8, 7, 6, 5}, 1);
    p.hold_kv_s = 60;
    p.hold_kv_on_device = id == 2;
    e.Add(id, p);
  }
  Drain(e);
  EXPECT_EQ(e.stats().kv_held, 2);
  EXPECT_EQ(e.staged_kv().count(), 1);
  EXPECT_GT(e.stats().kv_blocks_used, 0);
  EXPECT_EQ(e.ExportHeldKv(1)->bytes, e.ExportHeldKv(2, true)->bytes);
  e.ReleaseHeldKv(2);
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
}

TEST_P(KvTransfer, BadRowsAreRejectedNamingTheMismatch) {
  LocalStepRunner runner(*model_);
  Engine e(*model_, runner, {0, 0, false, 16, 0});
  auto reject = [&](KvRows kv, bool prompt_logprobs, const std::string& says) {
    RequestParams p = Params({1, 2, 3, 4}, 2);
    if (prompt_logprobs) p.prompt_logprobs = 0;
    p.imported_kv = std::make_shared<const KvRows>(std::move(kv));
    e.Add(1, p);
    const std::vector<RequestOutput> out = e.Step();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(out[0].rejected);
    EXPECT_NE(out[0].error.find(says), std::string::npos) << out[0].error;
  };
  KvRows ok;
  ok.num_layers = model_->config().num_hidden_layers;
  ok.row_width = e.kv_row_width();
  ok.dtype = e.kv_dtype();
  ok.positions = 3;
  ok.bytes.resize(ok.expected_bytes());
  KvRows wide = ok;
  wide.row_width += 1;
  wide.bytes.resize(wide.expected_bytes());
  reject(wide, false, "-wide");
  KvRows too_many = ok;
  too_many.positions = 5;
  too_many.bytes.resize(too_many.expected_bytes());
  reject(too_many, false, "5 positions for a prompt of 4 tokens");
  KvRows short_bytes = ok;
  short_bytes.bytes.resize(10);
  reject(short_bytes, false, "10 bytes");
  reject(ok, true, "prompt log-probabilities");
  // Rows left in another process's GPU cache (the cuda_ipc transport): checked before a byte is
  // read, and a CPU engine cannot read them at all.
  KvRows device = ok;
  device.bytes.clear();
  device.device = KvDeviceRows{std::string(64, 'h'), 1024, 64, {3}};
  KvRows few_blocks = device;
  few_blocks.device->block_size = 1;
  reject(few_blocks, false, "1 blocks of 1 slots (1024 per layer) for 3 positions");
  KvRows outside = device;
  outside.device->blocks = {16};
  reject(outside, false, "block 16 outside the producer's 16");
  KvRows ragged = device;
  ragged.device->num_slots = 1000;
  reject(ragged, false, "(1000 per layer)");
  KvRows huge = device;
  huge.device->num_slots = int64_t{1} << 40;
  reject(huge, false, "(1099511627776 per layer)");
  reject(device, false, "cannot read them");
  for (double hold : {-1.0, std::nan(""), 1e300}) {
    RequestParams p = Params({1, 2, 3, 4}, 1);
    p.hold_kv_s = hold;
    e.Add(2, p);
    const std::vector<RequestOutput> out = e.Step();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(out[0].rejected);
    EXPECT_NE(out[0].error.find("hold_kv_s"), std::string::npos) << out[0].error;
  }
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
}

TEST_P(KvTransfer, HeldRowsExpireAfterTheTimeout) {
  for (const int64_t stage : {EngineOptions{}.kv_stage_bytes, int64_t{0}}) {
    SCOPED_TRACE(stage > 0 ? "staged rows" : "rows in the cache's blocks");
    LocalStepRunner runner(*model_);
    EngineOptions o{0, 0, false, 16, 0};
    o.kv_stage_bytes = stage;
    Engine e(*model_, runner, o);
    RequestParams p = Params({1, 2, 3, 4, 5}, 1);
    p.hold_kv_s = 0.05;
    e.Add(7, p);
    Drain(e);
    EXPECT_EQ(e.stats().kv_held, 1);
    EXPECT_EQ(e.stats().kv_blocks_used > 0, stage == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(80));  // past the timeout
    e.Add(8, Params({6, 7}, 1));  // the next request (its Add frees expired rows)
    Drain(e);
    EXPECT_EQ(e.stats().kv_held, 0);
    EXPECT_EQ(e.stats().kv_blocks_used, 0);
    try {
      e.ExportHeldKv(7);
      FAIL();
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("request 7 holds no KV rows"), std::string::npos);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, KvTransfer, ::testing::Values("preset:tiny", "preset:tiny-qwen3"),
                         [](const auto& info) {
                           return info.param == "preset:tiny" ? std::string("mla")
                                                              : std::string("gqa");
                         });

}  // namespace
}  // namespace afd::runtime
