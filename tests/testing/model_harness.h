// A model on the CPU backend with its own paged cache and workspace, for tests that run forward
// steps by hand and look at every token's logits.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "afd/common/error.h"
#include "afd/kernels/backend.h"
#include "afd/model/loader.h"
#include "afd/model/model.h"

namespace afd::testing_util {

class ModelHarness {
 public:
  explicit ModelHarness(const std::string& spec, const model::OpenOptions& options = {},
                        int64_t num_blocks = 64, int64_t block_size = 4)
      : backend_(kernels::MakeBackend(Device::Cpu())),
        model_(model::OpenModel(spec, options, *backend_)),
        moe_(*model_),
        cache_(*backend_, model_->CacheShape(num_blocks, block_size)),
        ws_(*backend_) {}

  model::MoeModel& model() { return *model_; }
  kv::PagedKvCache& cache() { return cache_; }
  kernels::Backend& backend() { return *backend_; }
  int64_t vocab() const { return model_->config().vocab_size; }

  // A new cache sequence with room for `capacity` positions.
  int64_t NewSequence(int64_t capacity) {
    const int64_t seq = cache_.AddSequence();
    if (!cache_.Reserve(seq, capacity)) AFD_THROW("test cache too small");
    return seq;
  }
  // ids of `seq` at positions start, ...; every token's logits are returned by Run.
  void Add(model::ForwardBatch& b, int64_t seq, const std::vector<int32_t>& ids, int64_t start) {
    b.Add(cache_, seq, ids, start, model::ForwardBatch::Logits::kAll);
  }
  // Logits [rows, vocab] of the batch's logits rows (host copy).
  std::vector<float> Run(const model::ForwardBatch& b) {
    ws_.Reset();
    const Tensor logits = model_->Forward(b, cache_, moe_, ws_);
    std::vector<float> out(logits.numel());
    backend_->CopyToHost(out.data(), logits);
    return out;
  }

 private:
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::MoeModel> model_;
  model::LocalMoeBackend moe_;
  kv::PagedKvCache cache_;
  Workspace ws_;
};

// Every position's logits of one prompt `ids` through `model` (its own backend), in a fresh
// cache: [ids.size(), vocab] (host copy).
inline std::vector<float> PromptLogits(const model::MoeModel& model,
                                       const std::vector<int32_t>& ids) {
  model::LocalMoeBackend moe(model);
  kernels::Backend& backend = model.backend();
  kv::PagedKvCache cache(backend, model.CacheShape(4));
  Workspace ws(backend);
  const int64_t seq = cache.AddSequence();
  if (!cache.Reserve(seq, static_cast<int64_t>(ids.size()))) AFD_THROW("test cache too small");
  model::ForwardBatch batch;
  batch.Add(cache, seq, ids, 0, model::ForwardBatch::Logits::kAll);
  const Tensor logits = model.Forward(batch, cache, moe, ws);
  std::vector<float> out(logits.numel());
  backend.CopyToHost(out.data(), logits);
  return out;
}

}  // namespace afd::testing_util
