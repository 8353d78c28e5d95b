// One forward step of the model: logits [m, vocab] (in ws) for the batch's logits rows,
// appending its tokens to the cache. In process (LocalStepRunner) or as the AFD attention role
// with the MoE layers elsewhere (runtime/attention_runner.h).
#pragma once

#include "afd/model/model.h"

namespace afd::runtime {

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                         Workspace& ws) = 0;
};

class LocalStepRunner : public StepRunner {
 public:
  // `model` must outlive the runner; it must hold every expert.
  explicit LocalStepRunner(const model::DeepseekModel& model) : model_(model), moe_(model) {}
  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                 Workspace& ws) override {
    return model_.Forward(batch, cache, moe_, ws);
  }

 private:
  const model::DeepseekModel& model_;
  model::LocalMoeBackend moe_;
};

}  // namespace afd::runtime
