#include "afd/runtime/attention_runner.h"

#include <algorithm>

#include "afd/common/error.h"

namespace afd::runtime {

namespace {

// Connector channels of a MoE layer's rows.
constexpr int kHiddenChannel = 0;
constexpr int kTopkIdsChannel = 1;
constexpr int kTopkWeightsChannel = 2;

}  // namespace

P2pAttentionMoe::P2pAttentionMoe(const model::MoeModel& model, comm::AfdWorld& world,
                                 connector::P2pConnector& connector, int tp, int tp_rank,
                                 TpGroup* tp_group)
    : model_(model),
      world_(world),
      connector_(connector),
      tp_(tp),
      tp_rank_(tp_rank),
      tp_group_(tp_group) {}

P2pAttentionMoe::InFlight& P2pAttentionMoe::StageState(int stage) {
  AFD_CHECK(stage >= 0 && stage < connector::kMaxStagesPerLayer,
            "P2P attention MoE: stage {} of at most {}", stage, connector::kMaxStagesPerLayer);
  if (stage >= static_cast<int>(stages_.size())) stages_.resize(stage + 1);
  InFlight& st = stages_[stage];
  if (!st.ws) st.ws = std::make_unique<Workspace>(model_.backend());
  return st;
}

void P2pAttentionMoe::Start(int64_t layer, int stage, const Tensor& hidden, const Tensor& out,
                            Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  InFlight& st = StageState(stage);
  AFD_CHECK(st.layer < 0, "P2P attention MoE: stage {} started layer {} before finishing {}", stage,
            layer, st.layer);
  const int64_t m = hidden.dim(0);
  st.layer = layer;
  st.out = out;
  st.share_begin = SplitOffset(m, tp_, tp_rank_);
  st.share_count = SplitSize(m, tp_, tp_rank_);
  if (group_open_) Flush();  // a group holds one Start
  connector_.GroupStart();
  group_open_ = true;
  group_layer_ = layer;
  st.sent = std::chrono::steady_clock::now();
  const int l = static_cast<int>(layer);
  const Tensor share = hidden.Rows(st.share_begin, st.share_count);
  connector_.SendToFfn(l, stage, kHiddenChannel, {c.hidden_size, DType::kF32}, share.data(),
                       st.share_count);  // takes part even with zero rows
  if (!world_.config().compute_gate_on_attention) return;
  const int64_t k = c.num_experts_per_tok;
  // Alive until the connector group completes (the next Start of this stage resets it).
  st.ws->Reset();
  const Tensor ids = st.ws->Take(DType::kI32, {st.share_count, k});
  const Tensor weights = st.ws->Take(DType::kF32, {st.share_count, k});
  if (st.share_count > 0) model_.Route(layer, share, ids, weights, ws);
  connector_.SendToFfn(l, stage, kTopkIdsChannel, {k, DType::kI32}, ids.data(), st.share_count);
  connector_.SendToFfn(l, stage, kTopkWeightsChannel, {k, DType::kF32}, weights.data(),
                       st.share_count);
}

void P2pAttentionMoe::Finish(int stage, Workspace& /*ws*/) {
  InFlight& st = StageState(stage);
  AFD_CHECK(st.layer >= 0, "P2P attention MoE: Finish of stage {} without a Start", stage);
  const Tensor share = st.out.Rows(st.share_begin, st.share_count);
  connector_.RecvFromFfn(static_cast<int>(st.layer), stage,
                         {model_.config().hidden_size, DType::kF32}, share.data(), st.share_count);
  Flush();  // the group this receive joined (the Start just before), if any
  if (record_round_trips_ && st.share_count > 0) {
    round_trips_.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - st.sent).count());
  }
  if (tp_group_ && st.out.dim(0) > 0) tp_group_->AllGatherRows(st.out);
  st.layer = -1;
}

void P2pAttentionMoe::Flush() {
  if (!group_open_) return;
  group_open_ = false;
  connector_.GroupEnd(static_cast<int>(group_layer_));
}

std::vector<double> P2pAttentionMoe::TakeRoundTrips() {
  std::vector<double> out;
  out.swap(round_trips_);
  return out;
}

AttentionRunner::AttentionRunner(const model::MoeModel& model, comm::AfdWorld& world,
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
    tp_group_ = std::make_unique<TpGroup>(*tp_comm_, heads, model.config().value_head_dim());
  }
  moe_ = std::make_unique<P2pAttentionMoe>(model, world, connector, tp, tp_rank_, tp_group_.get());
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
  const model::StepInputs in = batch.size() > 0 ? model_.Upload(batch, ws) : model::StepInputs{};
  Tensor logits = RunLayers(in, &cache, stages, ws);
  model::MoeModel::CommitBatch(batch, cache);
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
  RunLayers(model::StepInputs{}, nullptr, stages, drain_ws_);
  ++steps_;
  dbo_steps_ += stages > 1;
  return IdleResult::kTookPart;
}

Tensor AttentionRunner::RunLayers(const model::StepInputs& in, kv::PagedKvCache* cache, int stages,
                                  Workspace& ws) {
  model::LayerLoop loop;
  for (int s = 0; s <= stages; ++s) loop.splits.push_back(SplitOffset(in.n, stages, s));
  loop.tp = tp_group_.get();
  return model_.RunLayers(in, cache, *moe_, ws, loop);
}

}  // namespace afd::runtime
