// `afd bench decode` in one process (diag::BenchDecode) on the CPU backend: one row per batch
// size, the timed steps exclude the warm-up ones, the device time of a step's forward is within
// its wall time, and bad options are refused naming them.
#include "afd/diag/bench_decode.h"

#include <gtest/gtest.h>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"

namespace afd::diag {
namespace {

model::MoeModel TinyModel(kernels::Backend& backend) {
  const model::ModelConfig config = model::PresetConfig("tiny");
  return model::MoeModel(config, model::RandomWeights(config, 0, model::WeightOptions{}), backend);
}

// Prefill FLOPs per token: the weights' part does not depend on the prompt length, attention
// grows by heads x (2 kv_lora + rope) multiply-adds a layer per position of mean prefix, and the
// LM head is shared by the prompt's tokens.
TEST(BenchDecode, PrefillFlopsPerTokenGrowWithThePrefix) {
  kernels::cpu::CpuBackend cpu;
  const model::MoeModel model = TinyModel(cpu);
  const model::ModelConfig& c = model.config();
  const double lm = static_cast<double>(c.vocab_size) * static_cast<double>(c.hidden_size);
  const double attn = static_cast<double>(c.num_hidden_layers) * c.num_attention_heads *
                      (2.0 * c.kv_lora_rank + c.qk_rope_head_dim);
  const double f1 = PrefillFlopsPerToken(model, 1), f3 = PrefillFlopsPerToken(model, 3);
  // Mean prefix 1 -> 2 positions; LM head per token lm -> lm / 3.
  EXPECT_NEAR(f3 - f1, 2.0 * (attn - lm * 2.0 / 3.0), 1e-6 * f1);
  EXPECT_GT(f1, 2.0 * (lm + attn));
}

TEST(BenchDecode, RowsPerBatchWithDeviceTimeWithinTheStep) {
  kernels::cpu::CpuBackend cpu;
  const model::MoeModel model = TinyModel(cpu);
  BenchDecodeOptions o;
  o.batch_sizes = {1, 3};
  o.context = 8;
  o.steps = 3;
  const BenchDecodeResult r = BenchDecode(model, o);
  ASSERT_EQ(r.rows.size(), 2u);
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const BenchDecodeRow& row = r.rows[i];
    EXPECT_EQ(row.batch, o.batch_sizes[i]);
    EXPECT_GT(row.ms_per_step, 0.0);
    EXPECT_GT(row.device_ms_per_step, 0.0);
    EXPECT_LE(row.device_ms_per_step, row.ms_per_step);
    EXPECT_EQ(row.graph_steps, 0);  // no graphs on the CPU
    // tokens/s counts the timed steps' tokens only: batch x steps over their time.
    EXPECT_NEAR(row.tokens_per_s, 1e3 * row.batch / row.ms_per_step, 1e-6 * row.tokens_per_s);
    EXPECT_GT(row.floor_ms, 0.0);
  }
}

// Prompts over prefill_tokens_per_step are prefilled in waves (whole prompts): the timed steps
// still decode the whole batch, and the prefill steps' tokens all count.
TEST(BenchDecode, PrefillInWavesStillTimesTheWholeBatch) {
  kernels::cpu::CpuBackend cpu;
  const model::MoeModel model = TinyModel(cpu);
  BenchDecodeOptions o;
  o.batch_sizes = {5};
  o.context = 8;
  o.steps = 3;
  o.prefill_tokens_per_step = 17;  // 2 prompts per wave: 3 waves
  const BenchDecodeResult r = BenchDecode(model, o);
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_NEAR(r.rows[0].tokens_per_s, 1e3 * 5 / r.rows[0].ms_per_step,
              1e-6 * r.rows[0].tokens_per_s);
  EXPECT_GT(r.rows[0].prefill_tokens_per_s, 0.0);
  EXPECT_NEAR(r.rows[0].prefill_tflops,
              r.rows[0].prefill_tokens_per_s * PrefillFlopsPerToken(model, o.context) / 1e12,
              1e-9 * r.rows[0].prefill_tflops);
  o.prefill_tokens_per_step = 0;
  EXPECT_THROW(BenchDecode(model, o), Error);
}

// A prompt longer than a step's prefill budget (long contexts: 131,072 on a GPU) is prefilled in
// chunks beside the decodes of the sequences already running; the timed steps still decode the
// whole batch.
TEST(BenchDecode, PromptsPastAStepsBudgetArePrefilledInChunks) {
  kernels::cpu::CpuBackend cpu;
  const model::MoeModel model = TinyModel(cpu);
  BenchDecodeOptions o;
  o.batch_sizes = {2};
  o.context = 300;
  o.steps = 3;
  o.prefill_tokens_per_step = 64;  // each prompt takes five steps
  const BenchDecodeResult r = BenchDecode(model, o);
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0].batch, 2);
  EXPECT_NEAR(r.rows[0].tokens_per_s, 1e3 * 2 / r.rows[0].ms_per_step,
              1e-6 * r.rows[0].tokens_per_s);
  EXPECT_GT(r.rows[0].prefill_tokens_per_s, 0.0);
  o.context_mix = {{1, 700}, {3, 20}};  // a long chat beside short ones, the long one chunked
  const BenchDecodeResult mix = BenchDecode(model, o);
  ASSERT_EQ(mix.rows.size(), 1u);
  EXPECT_EQ(mix.rows[0].batch, 4);
}

// --context-mix: one row of sequences of different lengths (prefilled in waves like any batch);
// the floor's bytes count each sequence's own cache: a mix of 1 x 200 + 3 x 10 reads 190 rows
// per layer more a step than 4 x 10, the same weights; the prefill FLOPs weighted by tokens.
TEST(BenchDecode, AContextMixIsOneBatchOfItsLengths) {
  kernels::cpu::CpuBackend cpu;
  const model::MoeModel model = TinyModel(cpu);
  BenchDecodeOptions o;
  o.steps = 3;
  o.prefill_tokens_per_step = 64;  // the long prompt a wave of its own
  o.context_mix = {{1, 200}, {3, 10}};
  const BenchDecodeResult mix = BenchDecode(model, o);
  ASSERT_EQ(mix.rows.size(), 1u);
  EXPECT_EQ(mix.rows[0].batch, 4);
  EXPECT_NEAR(mix.rows[0].tokens_per_s, 1e3 * 4 / mix.rows[0].ms_per_step,
              1e-6 * mix.rows[0].tokens_per_s);
  o.context_mix.clear();
  o.batch_sizes = {4};
  o.context = 10;
  const BenchDecodeResult uniform = BenchDecode(model, o);
  const kv::CacheShape shape = model.CacheShape(1);
  const double row_bytes = static_cast<double>(shape.row_width) * DTypeSize(shape.dtype) *
                           model.config().num_hidden_layers;
  EXPECT_NEAR(mix.rows[0].bytes_per_step - uniform.rows[0].bytes_per_step, 190 * row_bytes, 1e-6);
  const double flops =
      (200 * PrefillFlopsPerToken(model, 200) + 30 * PrefillFlopsPerToken(model, 10)) / 230;
  EXPECT_NEAR(mix.rows[0].prefill_tflops, mix.rows[0].prefill_tokens_per_s * flops / 1e12,
              1e-9 * mix.rows[0].prefill_tflops);
  o.context_mix = {{1, 5000}};  // past tiny's 4,096 positions
  try {
    BenchDecode(model, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a prompt of 5000 tokens"), std::string::npos) << e.what();
  }
  o.context_mix = {{0, 10}};
  EXPECT_THROW(BenchDecode(model, o), Error);
}

// A CPU backend that reports one op of 2 ms for every forward profiled (each turns it on).
class ProfilingCpu : public kernels::cpu::CpuBackend {
 public:
  void SetProfiling(bool on, bool /*profiler_range*/) override { spans_ += on ? 1 : 0; }
  std::vector<kernels::OpTime> TakeProfile() override {
    std::vector<kernels::OpTime> out;
    if (spans_ > 0) out.push_back({"Op", spans_, 2.0 * static_cast<double>(spans_)});
    spans_ = 0;
    return out;
  }

 private:
  int64_t spans_ = 0;
};

// --profile: the prefill steps' op times come apart from the decode steps', each per step.
TEST(BenchDecode, ProfileKeepsThePrefillStepsApart) {
  ProfilingCpu cpu;
  const model::MoeModel model = TinyModel(cpu);
  BenchDecodeOptions o;
  o.batch_sizes = {5};
  o.context = 8;
  o.steps = 3;
  o.profile = true;
  o.prefill_tokens_per_step = 17;  // 2 prompts per wave: 3 prefill (or mixed) steps
  const BenchDecodeResult r = BenchDecode(model, o);
  ASSERT_EQ(r.rows.size(), 1u);
  const BenchDecodeRow& row = r.rows[0];
  EXPECT_EQ(row.prefill_steps, 3);
  ASSERT_EQ(row.prefill_profile.size(), 1u);
  EXPECT_DOUBLE_EQ(row.prefill_profile[0].ms, 2.0);  // one 2 ms span per prefill step
  EXPECT_EQ(row.prefill_profile[0].calls, 1);
  ASSERT_EQ(row.profile.size(), 1u);
  EXPECT_DOUBLE_EQ(row.profile[0].ms, 2.0);  // the timed decode steps only, one span each
}

TEST(BenchDecode, RefusesPositionsPastTheModel) {
  kernels::cpu::CpuBackend cpu;
  const model::MoeModel model = TinyModel(cpu);
  BenchDecodeOptions o;
  o.batch_sizes = {1};
  o.context =
      model.config().max_position_embeddings - 4;  // + 2 warm-up + 1 timed + 1 + 1: one too many
  o.steps = 1;
  try {
    BenchDecode(model, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("warm-up"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings"), std::string::npos) << e.what();
  }
  o.context = 8;
  o.batch_sizes = {0};
  EXPECT_THROW(BenchDecode(model, o), Error);
}

}  // namespace
}  // namespace afd::diag

namespace afd::diag {
namespace {

// Overlapping step spans (asynchronous scheduling) never make a negative host time.
TEST(BenchDecodeRow, HostTimeIsNeverNegative) {
  BenchDecodeRow row;
  row.ms_per_step = 2.0;
  row.device_ms_per_step = 2.5;
  EXPECT_EQ(row.host_ms_per_step(), 0.0);
  row.device_ms_per_step = 1.5;
  EXPECT_DOUBLE_EQ(row.host_ms_per_step(), 0.5);
}

}  // namespace
}  // namespace afd::diag
