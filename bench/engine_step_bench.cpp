// Host time of one decode step of the engine, without the model: a StepRunner that checks the
// batch as the CUDA graph runner does (MoeModel::CheckBatch, PackStepInputs, CommitBatch)
// and returns ready logits, so what is timed is what the host does around a GPU forward --
// scheduling and building the batch, packing the graph's inputs, sampling calls (greedy over a
// tiny vocabulary on the CPU backend: the GPU's sampling kernels are device time), reading the
// results and updating the requests. Issue 11's target for the GPU: <= 50 us per step with graphs.
//   build/engine_step_bench [--benchmark_filter=...]   (docs/perf.md)
#include <benchmark/benchmark.h>

#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"
#include "afd/runtime/cuda_graph_runner.h"
#include "afd/runtime/engine.h"

namespace afd::runtime {
namespace {

class ReadyLogitsRunner : public StepRunner {
 public:
  ReadyLogitsRunner(const model::MoeModel& model, int64_t max_rows)
      : model_(model),
        mem_(model.backend().Allocate(max_rows * model.config().vocab_size * sizeof(float))),
        logits_(mem_.get(), DType::kF32, {max_rows, model.config().vocab_size},
                model.backend().device(), mem_) {
    model.backend().Fill(logits_, 0.0f);
  }
  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace&) override {
    model_.CheckBatch(batch, cache);
    int64_t width = 4;
    for (const auto& t : batch.block_tables) {
      while (width < static_cast<int64_t>(t.size())) width *= 2;
    }
    PackStepInputs(batch, PackedStepInputs{batch.size(), width}, packed_);
    model::MoeModel::CommitBatch(batch, cache);
    return logits_.Rows(0, static_cast<int64_t>(batch.logits_rows.size()));
  }

 private:
  const model::MoeModel& model_;
  std::shared_ptr<void> mem_;
  Tensor logits_;
  std::vector<char> packed_;
};

constexpr int64_t kSteps = 500;  // timed decode steps per batch size

// One decode step of `batch` sequences of 1024 tokens each (block size 64: 16-17 blocks a row),
// greedy, with the log-prob of every output token (as `afd run` asks).
void BM_DecodeStepHost(benchmark::State& state) {
  const int64_t batch = state.range(0), context = 1024;
  kernels::cpu::CpuBackend cpu;
  model::ModelConfig config = model::PresetConfig("tiny");
  config.vocab_size = 16;  // sampling is device time on a GPU: keep its host share out
  config.max_position_embeddings = 1 << 20;
  model::WeightOptions wo;
  wo.load_moe = false;
  const model::MoeModel model(config, model::RandomWeights(config, 0, wo), cpu);
  ReadyLogitsRunner runner(model, batch);
  EngineOptions eo;
  eo.num_kv_blocks = batch * ((context + kSteps + 63) / 64 + 1);
  eo.max_num_batched_tokens = batch * context + batch;
  Engine engine(model, runner, eo);
  for (int64_t s = 0; s < batch; ++s) {
    RequestParams p;
    p.prompt.assign(context, 3);
    p.max_tokens = 1 + kSteps;  // every sequence decodes through every timed step
    p.ignore_eos = true;
    p.logprobs = 0;
    engine.Add(static_cast<uint64_t>(s), std::move(p));
  }
  engine.Step();  // the prefill
  for (auto _ : state) benchmark::DoNotOptimize(engine.Step());
}
BENCHMARK(BM_DecodeStepHost)
    ->Arg(1)
    ->Arg(16)
    ->Arg(64)
    ->Arg(256)
    ->Iterations(kSteps)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace afd::runtime

BENCHMARK_MAIN();
