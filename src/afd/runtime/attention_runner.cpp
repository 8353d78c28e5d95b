#include "afd/runtime/attention_runner.h"

#include <algorithm>

#include "afd/common/error.h"

namespace afd::runtime {

AttentionRunner::AttentionRunner(const model::DeepseekModel& model, comm::AfdWorld& world,
                                 connector::P2pConnector& connector, int tp, DboOptions dbo)
    : model_(model),
      world_(world),
      connector_(connector),
      tp_(tp),
      dbo_(dbo),
      drain_ws_(model.backend()) {
  const Topology& t = world.topology();
  // On a GPU the rows stay in device memory (the data plane over NCCL); the TP all-gather runs
  // over the host transport, so TP stays on CPU ranks.
  AFD_CHECK(tp == 1 || model.backend().device().is_cpu(),
            "attention tensor parallelism with the P2P connector runs on CPU ranks only, not on "
            "{}",
            model.backend().name());
  const int me = world.self().rank;
  AFD_CHECK(world.self().role == Role::kAttention, "AttentionRunner on an FFN rank");
  AFD_CHECK(tp >= 1 && t.num_attention() % tp == 0,
            "attention tensor-parallel size {} does not divide num_attention_ranks {}", tp,
            t.num_attention());
  const int64_t heads = model.config().num_attention_heads;
  AFD_CHECK(tp <= heads, "attention tensor-parallel size {} exceeds the {} attention heads", tp,
            heads);
  tp_rank_ = me % tp;
  std::vector<int> all, replica;
  for (int a = 0; a < t.num_attention(); ++a) all.push_back(t.WorldRank({Role::kAttention, a}));
  attention_world_ = world.CreateGroup("attention_world", all);
  if (tp > 1) {
    const int dp_rank = me / tp;
    for (int i = 0; i < tp; ++i) {
      replica.push_back(t.WorldRank({Role::kAttention, dp_rank * tp + i}));
    }
    tp_comm_ = world.CreateGroup(fmt::format("attention_tp_{}", dp_rank), replica);
    tp_group_ = std::make_unique<TpGroup>(*tp_comm_, heads, model.config().v_head_dim);
  }
}

std::vector<int64_t> AttentionRunner::ExchangeCounts(const model::ForwardBatch& batch,
                                                     bool active) {
  const int A = world_.topology().num_attention(), me = world_.self().rank;
  const int64_t n = batch.size();
  std::vector<int64_t> v(3 * A, 0);
  v[me] = n;
  v[A + me] = active ? 1 : 0;
  if (dbo_.enabled && n > 0) {
    const int64_t threshold =
        batch.HasPrefill() ? dbo_.prefill_token_threshold : dbo_.decode_token_threshold;
    v[2 * A + me] = n >= std::max<int64_t>(threshold, 2) ? 1 : 0;  // two non-empty halves
  }
  attention_world_->AllReduce(v.data(), v.size(), DType::kI64, comm::ReduceOp::kSum);
  return v;
}

int AttentionRunner::ChooseStages(const std::vector<int64_t>& v) const {
  // Two micro-batches when every rank that has tokens wants them (vLLM's rule: all DP ranks
  // agree); ranks without tokens do not object.
  const int A = world_.topology().num_attention();
  bool any = false;
  for (int r = 0; r < A; ++r) {
    if (v[r] == 0) continue;
    any = true;
    if (v[2 * A + r] == 0) return 1;
  }
  return any ? 2 : 1;
}

void AttentionRunner::SendMetadata(const std::vector<int64_t>& counts, int stages, uint32_t flags) {
  const int A = world_.topology().num_attention();
  connector::StepMetadata meta;
  meta.step = static_cast<uint64_t>(steps_);
  meta.flags = flags;
  meta.num_stages = stages;
  meta.num_attention_ranks = A;
  // Rows attention rank r sends in stage s: its TP share of micro-batch s of its replica.
  for (int s = 0; s < stages; ++s) {
    for (int r = 0; r < A; ++r) {
      meta.token_counts.push_back(SplitSize(SplitSize(counts[r], stages, s), tp_, r % tp_));
    }
  }
  connector_.control_plane().Send(meta);
}

Tensor AttentionRunner::Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                                Workspace& ws) {
  model_.CheckBatch(batch, cache);
  const std::vector<int64_t> v = ExchangeCounts(batch, true);
  const int stages = ChooseStages(v);
  SendMetadata(v, stages, 0);
  Tensor logits = RunLayers(batch, &cache, stages, ws);
  ++steps_;
  dbo_steps_ += stages > 1;
  return logits;
}

void AttentionRunner::Drain() {
  while (Idle(false) != IdleResult::kShutdown) {
  }
}

AttentionRunner::IdleResult AttentionRunner::Idle(bool active) {
  const int A = world_.topology().num_attention();
  const model::ForwardBatch empty;
  const std::vector<int64_t> v = ExchangeCounts(empty, active);
  const bool any_active =
      std::any_of(v.begin() + A, v.begin() + 2 * A, [](int64_t f) { return f != 0; });
  if (!any_active) {
    SendMetadata(std::vector<int64_t>(A, 0), 1, connector::kShutdown);
    return IdleResult::kShutdown;
  }
  // No replica has tokens: nothing for the FFN role this step.
  if (std::all_of(v.begin(), v.begin() + A, [](int64_t n) { return n == 0; })) {
    return IdleResult::kNoneBusy;
  }
  const int stages = ChooseStages(v);
  SendMetadata(v, stages, 0);
  drain_ws_.Reset();
  RunLayers(empty, nullptr, stages, drain_ws_);
  ++steps_;
  dbo_steps_ += stages > 1;
  return IdleResult::kTookPart;
}

std::vector<double> AttentionRunner::TakeRoundTrips() {
  std::vector<double> out;
  out.swap(round_trips_);
  return out;
}

}  // namespace afd::runtime
