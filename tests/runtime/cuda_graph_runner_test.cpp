// CudaGraphRunner off the GPU: on a backend without graphs every step runs eagerly and the
// results equal the plain Generator's; the capture sizes are validated. (Graph replay itself
// needs a GPU: tools/device/gpu_check.sh compares graph and eager greedy ids there.)
#include "afd/runtime/cuda_graph_runner.h"

#include <gtest/gtest.h>

#include <cstring>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"

namespace afd::runtime {
namespace {

TEST(CudaGraphRunner, DefaultSizesAscendFromOneTo256) {
  const std::vector<int64_t> s = DefaultCudaGraphSizes();
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.front(), 1);
  EXPECT_EQ(s.back(), 256);
  for (size_t i = 1; i < s.size(); ++i) EXPECT_LT(s[i - 1], s[i]);
}

// The one-upload layout of a graph's step inputs: every field where the layout says, padding
// rows inert (token 0, position 0, row 0, slot -1), short block-table rows zero-filled.
TEST(CudaGraphRunner, PacksStepInputsPaddedToTheBucket) {
  model::ForwardBatch b;
  b.token_ids = {7, 9, 11};
  b.positions = {5, 0, 130};
  b.seq_index = {0, 1, 2};
  b.slot_mapping = {69, 512, 1090};
  b.seq_ids = {10, 11, 12};
  b.block_tables = {{1}, {8, 3}, {4, 5, 6}};
  b.logits_rows = {0, 1, 2};
  const PackedStepInputs layout{4, 4};
  std::vector<char> out;
  PackStepInputs(b, layout, out);
  ASSERT_EQ(static_cast<int64_t>(out.size()), layout.bytes());
  const auto at = [&](int64_t offset, auto sample, int64_t i) {
    decltype(sample) v;
    std::memcpy(&v, out.data() + offset + i * sizeof(v), sizeof(v));
    return v;
  };
  const std::vector<int64_t> positions = {5, 0, 130, 0}, slots = {69, 512, 1090, -1};
  const std::vector<int32_t> ids = {7, 9, 11, 0}, rows = {0, 1, 2, 0};
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(at(layout.positions(), int64_t{}, i), positions[i]) << i;
    EXPECT_EQ(at(layout.slots(), int64_t{}, i), slots[i]) << i;
    EXPECT_EQ(at(layout.ids(), int32_t{}, i), ids[i]) << i;
    EXPECT_EQ(at(layout.seq_index(), int32_t{}, i), rows[i]) << i;
  }
  const std::vector<int32_t> tables = {1, 0, 0, 0, 8, 3, 0, 0, 4, 5, 6, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(at(layout.tables(), int32_t{}, i), tables[i]) << i;
  EXPECT_EQ(layout.tables() % 8, 0);
  // No id sources: every id is in ids (-1 everywhere); with them, padding rows -1.
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(at(layout.id_source(), int32_t{}, i), -1) << i;
  b.id_source = {-1, 4, 0};
  PackStepInputs(b, layout, out);
  const std::vector<int32_t> sources = {-1, 4, 0, -1};
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(at(layout.id_source(), int32_t{}, i), sources[i]) << i;
  }
  // More tokens than the bucket, or a table wider than the graph's, is refused.
  EXPECT_THROW(PackStepInputs(b, PackedStepInputs{2, 4}, out), Error);
  EXPECT_THROW(PackStepInputs(b, PackedStepInputs{4, 2}, out), Error);
}

TEST(CudaGraphRunner, RejectsNonPositiveSizes) {
  kernels::cpu::CpuBackend cpu;
  const model::ModelConfig config = model::PresetConfig("tiny");
  model::MoeModel model(config, model::RandomWeights(config, 0, model::WeightOptions{}), cpu);
  EXPECT_THROW(CudaGraphRunner(model, CudaGraphOptions{{4, 0}, false}), Error);
}

TEST(CudaGraphRunner, EagerOnCpuMatchesGenerator) {
  kernels::cpu::CpuBackend cpu;
  const model::ModelConfig config = model::PresetConfig("tiny");
  model::MoeModel model(config, model::RandomWeights(config, 0, model::WeightOptions{}), cpu);
  const std::vector<std::vector<int32_t>> prompts = {{10, 20, 30}, {7}, {1, 2, 3, 4, 5}};
  GenerationOptions options;
  options.max_tokens = 6;
  options.ignore_eos = true;
  options.prompt_logprobs = true;
  Generator plain(model);
  const auto want = plain.Generate(prompts, options);
  CudaGraphRunner runner(model, CudaGraphOptions{});
  Generator graphed(model, runner);
  const auto got = graphed.Generate(prompts, options);
  ASSERT_EQ(got.size(), want.size());
  for (size_t p = 0; p < want.size(); ++p) {
    EXPECT_EQ(got[p].output_ids, want[p].output_ids) << "prompt " << p;
    EXPECT_EQ(got[p].logprobs, want[p].logprobs) << "prompt " << p;
  }
  EXPECT_EQ(runner.graph_steps(), 0);  // the CPU backend has no graphs
  EXPECT_GT(runner.eager_steps(), 0);
  EXPECT_EQ(runner.num_captures(), 0);
}

// A GraphedStep is asked once per step, before anything runs, which size to replay (the P2P
// attention ranks decide it together there); a step that cannot replay is told 0 and runs
// eagerly, and a plan that names a graph for it is refused.
class CountingStep : public GraphedStep {
 public:
  explicit CountingStep(const model::MoeModel& model) : model_(model), moe_(model) {}
  int64_t Plan(const model::ForwardBatch& batch, int64_t bucket) override {
    ++plans;
    offered.push_back(bucket);
    planned_tokens += batch.size();
    return answer;
  }
  Tensor Eager(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace& ws) override {
    ++eager;
    return model_.Forward(batch, cache, moe_, ws);
  }
  Tensor Body(const model::StepInputs& in, kv::PagedKvCache& cache, Workspace& ws) override {
    return model_.ForwardInputs(in, cache, moe_, ws);
  }
  int plans = 0, eager = 0;
  int64_t planned_tokens = 0, answer = 0;
  std::vector<int64_t> offered;

 private:
  const model::MoeModel& model_;
  model::LocalMoeBackend moe_;
};

TEST(CudaGraphRunner, EveryStepIsPlannedOnceBeforeItRuns) {
  kernels::cpu::CpuBackend cpu;
  const model::ModelConfig config = model::PresetConfig("tiny");
  model::MoeModel model(config, model::RandomWeights(config, 0, model::WeightOptions{}), cpu);
  const std::vector<std::vector<int32_t>> prompts = {{10, 20, 30}, {7}};
  GenerationOptions options;
  options.max_tokens = 4;
  options.ignore_eos = true;
  Generator plain(model);
  const auto want = plain.Generate(prompts, options);
  CountingStep step(model);
  CudaGraphRunner runner(model, step, CudaGraphOptions{});
  Generator graphed(model, runner);
  const auto got = graphed.Generate(prompts, options);
  for (size_t p = 0; p < want.size(); ++p) EXPECT_EQ(got[p].output_ids, want[p].output_ids);
  EXPECT_GT(step.plans, 0);
  EXPECT_EQ(step.plans, step.eager);
  EXPECT_EQ(runner.eager_steps(), step.plans);
  for (int64_t b : step.offered) EXPECT_EQ(b, 0);  // no graphs on the CPU backend
  EXPECT_EQ(step.planned_tokens, 3 + 1 + 2 * (options.max_tokens - 1));

  // A plan that answers a graph size for a step that cannot replay is refused.
  step.answer = 4;
  Generator refused(model, runner);
  try {
    refused.Generate(prompts, options);
    ADD_FAILURE() << "a graph planned on a backend without graphs ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("planned a graph of 4 rows"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace afd::runtime
