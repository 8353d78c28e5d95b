// The AFD attention role's forward step (seed 000): embedding, attention (heads split over the
// tensor-parallel ranks of this data-parallel replica), dense MLP layers, lm_head -- and for every
// MoE layer, the normalized hidden states go to the FFN role through the P2P connector and the
// MoE output comes back.
//
// Data parallelism: every attention rank takes part in every step, in lockstep. Each step starts
// with an all-reduce over all attention ranks of (token count, still-active flag) per rank; that
// vector is the step's DP metadata, sent on the control plane. A replica that has finished its
// own requests keeps running empty (zero-row) steps via Drain() until every replica is done;
// then the control-plane senders send the shutdown step.
//
// Tensor parallelism: the ranks of one replica hold the same tokens and the full MLA cache; each
// attends its heads (SplitSizes(num_heads, tp)), the head outputs are all-gathered, and every
// rank applies the full o_proj (and projects q for all heads), so results are exactly those of
// the monolithic model: TP splits the attention over the cache, the part that grows with the
// context, and repeats the projections.
//
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <memory>

#include "afd/comm/afd_world.h"
#include "afd/connector/p2p_connector.h"
#include "afd/model/model.h"
#include "afd/runtime/generator.h"

namespace afd::runtime {

class AttentionRunner : public StepRunner {
 public:
  // Collective: forms the attention-world group (all attention ranks) and this replica's TP
  // group. `model`, `world` and `connector` must outlive the runner. tp: ranks per replica.
  AttentionRunner(const model::DeepseekModel& model, comm::AfdWorld& world,
                  connector::P2pConnector& connector, int tp);

  void Forward(const model::ForwardBatch& batch, model::MlaKvCache& cache, float* logits) override;

  // Runs empty steps until every replica is done, then sends the shutdown step.
  void Drain();

  int64_t steps() const { return steps_; }

 private:
  // All-reduces this rank's (count, active) with every attention rank; returns the vector
  // [A counts..., A active flags].
  std::vector<int64_t> ExchangeCounts(int64_t n, bool active);
  void SendMetadata(const std::vector<int64_t>& counts, uint32_t flags);
  // x: [n, H] updated with layer's attention; mlp_in: [n, H] = post_attention_layernorm(x).
  void AttentionLayer(int64_t layer, const model::ForwardBatch& batch, model::MlaKvCache& cache,
                      float* x, float* mlp_in);
  void MoeLayer(int64_t layer, const float* mlp_in, int64_t n, float* out);
  // Layers of one step on `batch` (possibly empty); logits [n, vocab] unless null.
  void RunLayers(const model::ForwardBatch& batch, model::MlaKvCache* cache, float* logits);

  const model::DeepseekModel& model_;
  comm::AfdWorld& world_;
  connector::P2pConnector& connector_;
  int tp_, tp_rank_;
  int64_t head_begin_, head_end_;
  std::unique_ptr<comm::Communicator> attention_world_;
  std::unique_ptr<comm::Communicator> tp_group_;  // null when tp == 1
  int64_t steps_ = 0;
};

}  // namespace afd::runtime
