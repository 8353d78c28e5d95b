// A MoE causal LM -- DeepSeek-V2/V3 or Qwen3-MoE -- written once against the backend op
// interface: embedding, decoder layers (attention over the paged cache: DeepSeek's MLA over the
// latent cache, or Qwen3's GQA over keys and values per KV head; then a dense MLP or a MoE
// block), final norm and lm_head. Hidden states are fp32 [n, H], token-major, in the backend's
// memory; a step's scratch tensors come from a Workspace (nothing is allocated inside a step).
//
// RunLayers is the only loop over layers, for every deployment: in process (LocalMoeBackend),
// the AFD attention role (a MoeBackend that ships the rows to the FFN role, with a head range
// under tensor parallelism and the step as micro-batches under DBO) and DP+EP; the per-layer
// functions are public so that the FFN role runs the model's own MoE code:
//   in = Upload(batch); x = Embed(in)
//   for each layer l, for each micro-batch s:
//       moe.Finish(s) of its previous MoE layer, if any
//       Attention(l, ...)  -> x += attn(norm(x)); mlp_in = post_norm(x)
//       l is MoE ? moe.Start(l, s, mlp_in -> mlp_out) : mlp_out = DenseMlp(l, mlp_in)
//       (mlp_out is added to x by the next layer's input norm)
//   logits = Logits(x, in)            (rows in.logits_rows only)
// Thread safety: const methods may run concurrently on distinct caches, workspaces and backends
// (one backend is used by one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "afd/kernels/backend.h"
#include "afd/kv/paged_cache.h"
#include "afd/model/forward_batch.h"
#include "afd/model/model_config.h"
#include "afd/model/moe_backend.h"
#include "afd/model/rope.h"
#include "afd/model/weights.h"
#include "afd/tensor/workspace.h"

namespace afd::model {

// A step's inputs in the backend's memory (views into the step's workspace).
struct StepInputs {
  int64_t n = 0;
  Tensor token_ids;               // [n] i32
  kernels::AttentionTokens attn;  // positions, seq_index, slot_mapping, block tables
  Tensor logits_rows;             // [m] i32
  // Tokens [begin, begin + count): per-token views; block tables shared; no logits rows.
  StepInputs Slice(int64_t begin, int64_t count) const;
};

// Attention tensor parallelism: this rank attends heads [head_begin, head_end) and the head
// outputs of all ranks are gathered before o_proj (implemented by the runtime over its TP group).
class HeadParallel {
 public:
  virtual ~HeadParallel() = default;
  virtual int64_t head_begin() const = 0;
  virtual int64_t head_end() const = 0;
  // all: [n, heads·dv] = every rank's `mine` ([n, its heads·dv]) side by side, heads in order.
  virtual void AllGatherHeads(const Tensor& mine, const Tensor& all) = 0;
};

// How RunLayers runs a step's layers (the default: one micro-batch, every head here).
struct LayerLoop {
  // Token offsets [0, o1, ..., n] of the micro-batches (ascending; empty: one micro-batch).
  // Micro-batch s's MoE of layer l is started after its attention and finished just before its
  // attention of layer l + 1, so the other micro-batches attend while it is away (DBO).
  std::vector<int64_t> splits;
  HeadParallel* tp = nullptr;  // attention tensor parallelism; null: all heads here
};

class MoeModel {
 public:
  // `backend` must outlive the model; the weights must be in its memory.
  MoeModel(ModelConfig config, ModelWeights weights, kernels::Backend& backend);
  MoeModel(const MoeModel&) = delete;
  MoeModel& operator=(const MoeModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  kernels::Backend& backend() const { return backend_; }
  // Whether the attention matrices are bf16 (a bf16 model: its activations are rounded to bf16
  // by every GEMM; an fp32 model stays exact). False where this process holds no attention.
  bool bf16_attention() const { return bf16_attention_; }
  // The cache shape of this model for `num_blocks` blocks (rows of kv_cache_dtype()).
  kv::CacheShape CacheShape(int64_t num_blocks, int64_t block_size = kv::kDefaultBlockSize) const;
  // The dtype of the cache's rows: kF32 (the default, exact) or kBF16 (half the memory and the
  // bytes a decode step reads; the rows are rounded when written, as a bf16 model's activations
  // are). Set before any cache is made.
  DType kv_cache_dtype() const { return kv_cache_dtype_; }
  void set_kv_cache_dtype(DType dtype);

  // Checks that the batch continues the cache and its ids are in the vocabulary; throws
  // afd::Error otherwise.
  void CheckBatch(const ForwardBatch& batch, const kv::PagedKvCache& cache) const;
  // Advances each sequence's cache length past the batch's tokens.
  static void CommitBatch(const ForwardBatch& batch, kv::PagedKvCache& cache);
  StepInputs Upload(const ForwardBatch& batch, Workspace& ws) const;

  // The whole stack: logits [m, vocab] for batch.logits_rows (in ws), cache committed.
  Tensor Forward(const ForwardBatch& batch, kv::PagedKvCache& cache, MoeBackend& moe,
                 Workspace& ws) const;
  // The stack on inputs already on the device (Forward without its checks, upload and cache
  // commit): logits [m, vocab] for in.logits_rows, in ws. Waits for nothing, so that a CUDA
  // graph can capture it (runtime/cuda_graph_runner.h).
  Tensor ForwardInputs(const StepInputs& in, kv::PagedKvCache& cache, MoeBackend& moe,
                       Workspace& ws) const {
    return RunLayers(in, &cache, moe, ws, {});
  }
  // The layer loop (the only one): ForwardInputs with micro-batches and a head range. A step
  // without tokens (in.n == 0) runs its MoE layers only when moe.RunsEmptySteps() (zero rows,
  // cache untouched: it may be null) and returns an empty tensor.
  Tensor RunLayers(const StepInputs& in, kv::PagedKvCache* cache, MoeBackend& moe, Workspace& ws,
                   const LayerLoop& loop) const;
  // The MoE layers a step of `stages` micro-batches starts, as (layer, micro-batch), in the
  // order RunLayers starts them (MoeBackend::Start): layer by layer, micro-batch by micro-batch.
  // A peer that serves them in turn (the P2P FFN role) walks this list instead of a loop of its
  // own; tests/model/layer_order_test.cpp holds RunLayers to it.
  std::vector<std::pair<int, int>> MoeStartOrder(int stages) const;

  // x: [n, H] = embedding rows of the step's ids.
  void Embed(const StepInputs& in, const Tensor& x) const;
  // x: [n, H] residual stream, updated with the attention of `layer` (cache rows written
  // first); mlp_in: [n, H] = post_attention_layernorm(x). tp: null for all heads here.
  // pending: the previous layer's MLP output not yet added to x (null: none); added here with
  // the input norm as one op (Backend::AddRmsNorm, equal to the Add then the norm).
  void Attention(int64_t layer, const StepInputs& in, kv::PagedKvCache& cache, const Tensor& x,
                 const Tensor& mlp_in, Workspace& ws, HeadParallel* tp = nullptr,
                 const Tensor* pending = nullptr) const;
  // out: [n, H] = dense MLP of a layer < first_k_dense_replace.
  void DenseMlp(int64_t layer, const Tensor& mlp_in, const Tensor& out, Workspace& ws) const;
  // Router of MoE `layer`: ids, weights: [n, k] (ids ascending per token).
  void Route(int64_t layer, const Tensor& hidden, const Tensor& ids, const Tensor& weights,
             Workspace& ws) const;
  // One MoE layer's expert pass on the experts loaded here: the one form the in-process MoE,
  // the FFN roles and expert parallelism run.
  //   1. beside (Backend::Beside): the shared experts of rows [0, shared_rows) -> shared_out;
  //   2. the slots grouped by local expert: `route` runs the router here first (ids and weights
  //      are then its outputs; fused with the grouping, Backend::RouteAndPermute), else the
  //      given ids are grouped (MoePermute; slots of experts not loaded here are skipped);
  //   3. every grouped slot through its expert (GatheredExpertMlp) -> pair_out, grouped by
  //      expert, unweighted; row_of_slot: where each slot's output is (-1: not here);
  //   4. the shared experts joined; with `out`, the combine: out[i] = Σ_j weights[i, j] ·
  //      pair_out[row_of_slot[i, j]] over slots ascending, from zero, + shared_out[i] for
  //      i < shared_rows (routed + shared, as transformers adds them).
  // Without `out` nothing is combined: the caller combines (its rows go to several places) or
  // sends pair_out back as it is. Tensors left empty are taken from ws.
  struct ExpertPassArgs {
    Tensor rows;              // [N, H] f32
    Tensor ids, weights;      // [N, k'] i32 / f32, k' <= k (expert-parallel rows carry one slot)
    bool route = false;       // ids, weights [N, k]: written by the router (needs the gate here)
    int64_t shared_rows = 0;  // needs the shared experts here when > 0
    Tensor shared_out;        // [shared_rows, H]
    Tensor pair_out;          // [N · min(k', local experts), H]
    Tensor row_of_slot;       // [N, k'] i32
    Tensor out;               // [N, H]; empty: no combine
  };
  struct ExpertPassOutputs {
    Tensor pair_out, row_of_slot, shared_out;
  };
  ExpertPassOutputs ExpertPass(int64_t layer, const ExpertPassArgs& args, Workspace& ws) const;
  // out: [n, H] = Σ over each token's slots whose expert is loaded here (ascending) of
  // weight · expert(hidden), from zero (the expert pass with the given routing, combined).
  void RoutedExperts(int64_t layer, const Tensor& hidden, const Tensor& ids, const Tensor& weights,
                     const Tensor& out, Workspace& ws) const;
  // out: [n, H] = shared experts(hidden) (the term AddSharedExperts adds). The model must have
  // shared experts (has_shared_experts()).
  void SharedExperts(int64_t layer, const Tensor& hidden, const Tensor& out, Workspace& ws) const;
  bool has_shared_experts(int64_t layer) const {
    return !weights_.layers[layer].moe.shared.empty();
  }
  // out += shared experts(hidden) (nothing when the model has none).
  void AddSharedExperts(int64_t layer, const Tensor& hidden, const Tensor& out,
                        Workspace& ws) const;
  // logits: [m, vocab] of the rows in.logits_rows of x: [n, H].
  Tensor Logits(const Tensor& x, const StepInputs& in, Workspace& ws) const;

 private:
  void Mlp(const MlpWeights& w, const Tensor& x, const Tensor& out, Workspace& ws) const;
  // The attention of each kind (Attention's contract, after the input norm).
  void MlaAttention(int64_t layer, const StepInputs& in, kv::PagedKvCache& cache,
                    const Tensor& normed, const Tensor& heads_out, int64_t h0, int64_t h1,
                    Workspace& ws) const;
  void GqaAttention(int64_t layer, const StepInputs& in, kv::PagedKvCache& cache,
                    const Tensor& normed, const Tensor& heads_out, int64_t h0, int64_t h1,
                    Workspace& ws) const;
  // The router of MoE `layer`, checked to be here.
  const MoeWeights& RouterOf(int64_t layer) const;

  ModelConfig config_;
  bool bf16_attention_ = false;
  ModelWeights weights_;
  kernels::Backend& backend_;
  Rope rope_;
  kernels::RopeSpec rope_spec_;
  kernels::RouterSpec router_spec_;
  Tensor inv_freq_;  // [rope_dim/2] on the device
  DType kv_cache_dtype_ = DType::kF32;
};

}  // namespace afd::model
