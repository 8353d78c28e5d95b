#include "afd/runtime/attention_runner.h"

#include <algorithm>

#include "afd/common/error.h"
#include "afd/kernels/cpu/linear.h"
#include "afd/kernels/cpu/ops.h"
#include "afd/model/router.h"

namespace afd::runtime {

namespace {

// Connector channels of a MoE layer's rows.
constexpr int kHiddenChannel = 0;
constexpr int kTopkIdsChannel = 1;
constexpr int kTopkWeightsChannel = 2;

}  // namespace

AttentionRunner::AttentionRunner(const model::DeepseekModel& model, comm::AfdWorld& world,
                                 connector::P2pConnector& connector, int tp)
    : model_(model), world_(world), connector_(connector), tp_(tp) {
  const Topology& t = world.topology();
  const int me = world.self().rank;
  AFD_CHECK(world.self().role == Role::kAttention, "AttentionRunner on an FFN rank");
  AFD_CHECK(tp >= 1 && t.num_attention() % tp == 0,
            "attention tensor-parallel size {} does not divide num_attention_ranks {}", tp,
            t.num_attention());
  const int64_t heads = model.config().num_attention_heads;
  AFD_CHECK(tp <= heads, "attention tensor-parallel size {} exceeds the {} attention heads", tp,
            heads);
  tp_rank_ = me % tp;
  head_begin_ = SplitOffset(heads, tp, tp_rank_);
  head_end_ = SplitOffset(heads, tp, tp_rank_ + 1);
  std::vector<int> all, replica;
  for (int a = 0; a < t.num_attention(); ++a) all.push_back(t.WorldRank({Role::kAttention, a}));
  attention_world_ = world.CreateGroup("attention_world", all);
  if (tp > 1) {
    const int dp_rank = me / tp;
    for (int i = 0; i < tp; ++i) {
      replica.push_back(t.WorldRank({Role::kAttention, dp_rank * tp + i}));
    }
    tp_group_ = world.CreateGroup(fmt::format("attention_tp_{}", dp_rank), replica);
  }
}

std::vector<int64_t> AttentionRunner::ExchangeCounts(int64_t n, bool active) {
  const int A = world_.topology().num_attention(), me = world_.self().rank;
  std::vector<int64_t> v(2 * A, 0);
  v[me] = n;
  v[A + me] = active ? 1 : 0;
  attention_world_->AllReduce(v.data(), v.size(), DType::kI64, comm::ReduceOp::kSum);
  return v;
}

void AttentionRunner::SendMetadata(const std::vector<int64_t>& counts, uint32_t flags) {
  connector::StepMetadata meta;
  meta.step = static_cast<uint64_t>(steps_);
  meta.flags = flags;
  meta.num_stages = 1;
  meta.num_attention_ranks = world_.topology().num_attention();
  meta.token_counts.assign(counts.begin(), counts.begin() + meta.num_attention_ranks);
  connector_.control_plane().Send(meta);
}

void AttentionRunner::AttentionLayer(int64_t layer, const model::ForwardBatch& batch,
                                     model::MlaKvCache& cache, float* x, float* mlp_in) {
  const model::ModelConfig& c = model_.config();
  if (tp_ == 1) {
    model_.AttentionStep(layer, batch, cache, x, mlp_in);
    return;
  }
  // The steps of DeepseekModel::AttentionStep, with the heads split over the TP ranks.
  const int64_t n = batch.size(), H = c.hidden_size, dv = c.v_head_dim;
  const int64_t heads = c.num_attention_heads, my_heads = head_end_ - head_begin_;
  const model::LayerWeights& lw = model_.weights().layers[layer];
  const model::MlaAttention& attn = model_.attention();
  std::vector<float> normed(n * H);  // [n, H]
  kernels::RmsNorm(x, n, H, lw.attn.input_norm.data(), c.rms_norm_eps, normed.data());
  attn.WriteCache(lw.attn, layer, normed.data(), batch, cache);
  // The query projection of all heads, then this rank's heads: a GEMM over a slice of the
  // weight rows may round differently from the full one, and TP must not change the results.
  const int64_t qk = c.qk_head_dim();
  std::vector<float> q_all(n * heads * qk);  // [n, heads, dn + dr]
  attn.ProjectQuery(lw.attn, normed.data(), batch, 0, heads, q_all.data());
  std::vector<float> q(n * my_heads * qk);  // [n, my_heads, dn + dr]
  for (int64_t t = 0; t < n; ++t) {
    std::copy(q_all.begin() + (t * heads + head_begin_) * qk,
              q_all.begin() + (t * heads + head_end_) * qk, q.begin() + t * my_heads * qk);
  }
  std::vector<float> mine(n * my_heads * dv);  // [n, my_heads·dv]
  attn.AttendHeads(lw.attn, layer, q.data(), batch, cache, head_begin_, head_end_, mine.data());
  // All-gather the head outputs: every rank sends its block to every rank.
  std::vector<float> send(tp_ * mine.size());
  for (int p = 0; p < tp_; ++p) std::copy(mine.begin(), mine.end(), send.begin() + p * mine.size());
  std::vector<size_t> send_counts(tp_, mine.size()), recv_counts(tp_);
  int64_t total = 0;
  for (int p = 0; p < tp_; ++p) {
    recv_counts[p] = n * (SplitOffset(heads, tp_, p + 1) - SplitOffset(heads, tp_, p)) * dv;
    total += recv_counts[p];
  }
  std::vector<float> blocks(total);  // rank p's block: [n, heads_p·dv]
  tp_group_->AllToAllV(send.data(), send_counts, blocks.data(), recv_counts, DType::kF32);
  std::vector<float> all_heads(n * heads * dv);  // [n, heads·dv], heads in order
  int64_t offset = 0;
  for (int p = 0; p < tp_; ++p) {
    const int64_t width = (SplitOffset(heads, tp_, p + 1) - SplitOffset(heads, tp_, p)) * dv;
    const int64_t col = SplitOffset(heads, tp_, p) * dv;
    for (int64_t t = 0; t < n; ++t) {
      std::copy(blocks.begin() + offset + t * width, blocks.begin() + offset + (t + 1) * width,
                all_heads.begin() + t * heads * dv + col);
    }
    offset += n * width;
  }
  std::vector<float> out(n * H);  // [n, H]
  kernels::Linear(all_heads.data(), n, lw.attn.o_proj, out.data());
  kernels::AddInPlace(x, out.data(), n * H);
  kernels::RmsNorm(x, n, H, lw.post_attention_norm.data(), c.rms_norm_eps, mlp_in);
}

void AttentionRunner::MoeLayer(int64_t layer, const float* mlp_in, int64_t n, float* out) {
  const model::ModelConfig& c = model_.config();
  const connector::RowFormat hidden{c.hidden_size, DType::kF32};
  connector_.SendToFfn(static_cast<int>(layer), 0, kHiddenChannel, hidden, mlp_in, n);
  if (world_.config().compute_gate_on_attention) {
    const int64_t k = c.num_experts_per_tok;
    std::vector<int32_t> ids(n * k);  // [n, k]
    std::vector<float> weights(n * k);
    if (n > 0) {
      model::RouteTokens(c, model_.weights().layers[layer].moe, mlp_in, n, ids.data(),
                         weights.data());
    }
    connector_.SendToFfn(static_cast<int>(layer), 0, kTopkIdsChannel, {k, DType::kI32}, ids.data(),
                         n);
    connector_.SendToFfn(static_cast<int>(layer), 0, kTopkWeightsChannel, {k, DType::kF32},
                         weights.data(), n);
  }
  connector_.RecvFromFfn(static_cast<int>(layer), 0, hidden, out, n);
}

void AttentionRunner::RunLayers(const model::ForwardBatch& batch, model::MlaKvCache* cache,
                                float* logits) {
  const model::ModelConfig& c = model_.config();
  const int64_t n = batch.size(), H = c.hidden_size;
  std::vector<float> x(n * H), mlp_in(n * H), mlp_out(n * H);  // [n, H] each
  if (n > 0) model_.Embed(batch.token_ids.data(), n, x.data());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (n > 0) AttentionLayer(l, batch, *cache, x.data(), mlp_in.data());
    if (c.IsMoeLayer(l)) {
      MoeLayer(l, mlp_in.data(), n, mlp_out.data());  // takes part even with zero rows
    } else if (n > 0) {
      model_.DenseMlp(l, mlp_in.data(), n, mlp_out.data());
    }
    if (n > 0) kernels::AddInPlace(x.data(), mlp_out.data(), n * H);
  }
  if (n > 0) {
    model::DeepseekModel::CommitBatch(batch, *cache);
    model_.Logits(x.data(), n, logits);
  }
}

void AttentionRunner::Forward(const model::ForwardBatch& batch, model::MlaKvCache& cache,
                              float* logits) {
  model_.CheckBatch(batch, cache);
  const std::vector<int64_t> v = ExchangeCounts(batch.size(), true);
  SendMetadata(v, 0);
  RunLayers(batch, &cache, logits);
  ++steps_;
}

void AttentionRunner::Drain() {
  const int A = world_.topology().num_attention();
  const model::ForwardBatch empty;
  while (true) {
    const std::vector<int64_t> v = ExchangeCounts(0, false);
    const bool any_active = std::any_of(v.begin() + A, v.end(), [](int64_t f) { return f != 0; });
    if (!any_active) {
      SendMetadata(std::vector<int64_t>(A, 0), connector::kShutdown);
      return;
    }
    SendMetadata(v, 0);
    RunLayers(empty, nullptr, nullptr);
    ++steps_;
  }
}

}  // namespace afd::runtime
