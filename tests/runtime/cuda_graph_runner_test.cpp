// CudaGraphRunner off the GPU: on a backend without graphs every step runs eagerly and the
// results equal the plain Generator's; the capture sizes are validated. (Graph replay itself
// needs a GPU: tools/device/gpu_check.sh compares graph and eager greedy ids there.)
#include "afd/runtime/cuda_graph_runner.h"

#include <gtest/gtest.h>

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

TEST(CudaGraphRunner, RejectsNonPositiveSizes) {
  kernels::cpu::CpuBackend cpu;
  const model::ModelConfig config = model::PresetConfig("tiny");
  model::DeepseekModel model(config, model::RandomWeights(config, 0, model::WeightOptions{}), cpu);
  EXPECT_THROW(CudaGraphRunner(model, CudaGraphOptions{{4, 0}, false}), Error);
}

TEST(CudaGraphRunner, EagerOnCpuMatchesGenerator) {
  kernels::cpu::CpuBackend cpu;
  const model::ModelConfig config = model::PresetConfig("tiny");
  model::DeepseekModel model(config, model::RandomWeights(config, 0, model::WeightOptions{}), cpu);
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

}  // namespace
}  // namespace afd::runtime
