#include "afd/roles/async_attention.h"

#include <algorithm>
#include <cstring>

#include "afd/common/error.h"
#include "afd/common/fp8_rows.h"
#include "afd/kernels/afd_exchange.h"

namespace afd::roles {

AsyncAttentionMoe::AsyncAttentionMoe(const model::MoeModel& model, comm::AfdWorld& world,
                                     connector::AsyncConnector& connector,
                                     const ReplicaGroup& group)
    : model_(model),
      world_(world),
      connector_(connector),
      tp_(group.tp),
      tp_rank_(group.tp_rank),
      tp_group_(group.tp_group) {
  const int F = world.topology().num_ffn();
  AFD_CHECK(F <= kernels::Backend::kMaxAfdRanks,
            "{}: {} FFN ranks, the MoE exchange serves at most {}", world.config().connector, F,
            kernels::Backend::kMaxAfdRanks);
  // A bf16 model on a GPU: its rows go in bf16 (every expert GEMM rounds its input to bf16
  // anyway), and the replies are partial sums; the CPU and fp32 models stay exact.
  const bool gpu_bf16 = model.bf16_attention() && !model.backend().device().is_cpu();
  wire_ = gpu_bf16 ? DType::kBF16 : DType::kF32;
  // connector_extra_config.dispatch_dtype "fp8": E4M3 rows with their group scales (lossy, on
  // every backend alike: the CPU writes the bytes the GPU does).
  if (world.config().async_options.dispatch_dtype == "fp8") wire_ = DType::kF8E4M3;
  pairs_ = F > 1 && !gpu_bf16;
}

AsyncAttentionMoe::Pending& AsyncAttentionMoe::StageState(int stage) {
  AFD_CHECK(stage >= 0 && stage < connector_.layout().ring_depth,
            "async attention MoE: stage {} outside the ring depth {}", stage,
            connector_.layout().ring_depth);
  if (stage >= static_cast<int>(stages_.size())) stages_.resize(stage + 1);
  Pending& p = stages_[stage];
  if (!p.ws) {
    p.ws = std::make_unique<Workspace>(model_.backend());
    const int64_t cap = connector_.layout().cap.token_cap, k = model_.config().num_experts_per_tok;
    p.ids_buf = p.ws->Take(DType::kI32, {cap * k});
    p.weights_buf = p.ws->Take(DType::kF32, {cap * k});
    p.send_row_buf = p.ws->Take(DType::kI32, {cap * world_.topology().num_ffn()});
  }
  return p;
}

int64_t AsyncAttentionMoe::ReplyRows(int f, int64_t n) const {
  if (!pairs_) return n;
  return n *
         std::min<int64_t>(model_.config().num_experts_per_tok, connector_.num_local_experts(f));
}

void AsyncAttentionMoe::Start(int64_t layer, int stage, const Tensor& hidden, const Tensor& out,
                              Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  kernels::Backend& backend = model_.backend();
  Pending& p = StageState(stage);
  AFD_CHECK(p.layer < 0, "async attention MoE: stage {} started layer {} before finishing {}",
            stage, layer, p.layer);
  // The FFN ranks are done with this stage's slots before the host writes a header (device
  // sequencing: the device writes it, in stream order after the replies' waits).
  CheckReplies(stage, p);
  const int64_t m = hidden.dim(0);
  p.layer = layer;
  p.out = out;
  p.share_begin = SplitOffset(m, tp_, tp_rank_);
  p.share_count = SplitSize(m, tp_, tp_rank_);
  const int F = world_.topology().num_ffn();
  const int64_t n = p.share_count, k = c.num_experts_per_tok, H = c.hidden_size;
  p.seqs.assign(F, 0);
  p.sent = std::chrono::steady_clock::now();
  if (n == 0) return;  // fewer tokens than TP ranks: nothing to send
  AFD_CHECK(n <= connector_.layout().cap.token_cap,
            "async attention MoE: {} tokens in a micro-batch, the connector's capacity is {}", n,
            connector_.layout().cap.token_cap);
  p.ids = p.ids_buf.Rows(0, n * k).Reshape({n, k});
  p.weights = p.weights_buf.Rows(0, n * k).Reshape({n, k});
  p.send_row = p.send_row_buf.Rows(0, n * F).Reshape({n, F});
  const Tensor share = hidden.Rows(p.share_begin, n);
  model_.Route(layer, share, p.ids, p.weights, ws);
  const bool fp8 = wire_ == DType::kF8E4M3;
  const int64_t groups = AfdFp8Groups(H);
  std::vector<Tensor> rows(F), scales(fp8 ? F : 0), tables(F);
  for (int f = 0; f < F; ++f) {
    const connector::AsyncConnector::RowViews v = connector_.PeerSlot(f, stage);
    rows[f] = Tensor(v.routed, wire_, {n, H}, backend.device());
    if (fp8) scales[f] = Tensor(v.row_scales, DType::kF32, {n, groups}, backend.device());
    tables[f] = Tensor(v.table, DType::kI32, {2 * n * k}, backend.device());
  }
  const bool shared = c.n_shared_experts > 0;
  backend.AfdDispatch(share, p.ids, p.weights, c.n_routed_experts, rows, scales, tables, p.send_row,
                      shared);
  // With device flags the headers' flags follow the rows on the stream; else one wait first.
  if (!connector_.device_flags()) backend.Synchronize();
  for (int f = 0; f < F; ++f) {
    connector::SlotPayload s;
    s.layer = static_cast<int>(layer);
    s.stage = stage;
    s.num_tokens = static_cast<int>(n);
    s.flags = static_cast<uint16_t>((pairs_ ? connector::kSlotPairs : 0) |
                                    (wire_ == DType::kBF16 ? connector::kSlotBf16Rows : 0) |
                                    (fp8 ? connector::kSlotFp8Rows : 0) |
                                    (connector_.capturing() ? connector::kSlotGraph : 0));
    s.in_place = true;
    s.table_entries = 2 * n * k;
    s.routed_count = n;  // an upper bound: the rank's own rows come first, ids -1 after them
    s.shared_count = shared ? kernels::AfdOwnedTokens(n, F, f) : 0;
    s.payload_bytes =
        n * (H * static_cast<int64_t>(DTypeSize(wire_)) + (fp8 ? 4 * groups : 0) + 8 * k);
    p.seqs[f] = connector_.Send(f, s);
  }
}

void AsyncAttentionMoe::Finish(int stage, Workspace& ws) {
  Pending& p = StageState(stage);
  AFD_CHECK(p.layer >= 0, "async attention MoE: Finish of stage {} without a Start", stage);
  if (p.share_count > 0) Combine(stage, p, ws);
  // This TP rank's rows of the MoE output are in place; then (TP) every rank's.
  if (tp_group_) tp_group_->AllGatherRows(p.out);
  p.layer = -1;
}

void AsyncAttentionMoe::Combine(int stage, Pending& p, Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  kernels::Backend& backend = model_.backend();
  const int F = world_.topology().num_ffn();
  const int64_t n = p.share_count, k = c.num_experts_per_tok, H = c.hidden_size;
  const Tensor out = p.out.Rows(p.share_begin, n);
  const Device dev = backend.device();
  const bool device_flags = connector_.device_flags();
  const bool shared = c.n_shared_experts > 0;
  for (int f = 0; f < F; ++f) {
    if (device_flags) {
      // What follows starts when the reply lands (device sequencing: checked there).
      connector::ExpectedSlot e;
      e.flags =
          static_cast<uint16_t>(connector::kSlotCombine | (pairs_ ? connector::kSlotPairs : 0));
      e.layer = static_cast<int>(p.layer);
      e.num_tokens = static_cast<int>(n);
      e.routed_rows = ReplyRows(f, n);
      e.shared_rows = pairs_ && shared ? kernels::AfdOwnedTokens(n, F, f) : 0;
      e.table_entries = pairs_ ? n * k : 0;
      connector_.EnqueueWait(f, stage, e);
    } else {
      const connector::ReceivedSlot r = connector_.Receive(
          f, stage, [&] { return fmt::format("the reply to layer {} stage {}", p.layer, stage); });
      CheckReply(f, stage, p, p.layer, n, r);
    }
  }
  const Workspace::Mark scratch = ws.mark();
  if (!pairs_) {
    std::vector<Tensor> partials(F);
    for (int f = 0; f < F; ++f) {
      partials[f] = Tensor(connector_.RowsOf(f, stage).routed, DType::kF32, {n, H}, dev);
    }
    backend.AfdSumPartials(partials, p.send_row, out);
  } else {
    // Every reply's outputs side by side (each copied up to its bound), then the model's
    // combine over a token's slots ascending and the shared experts added: the monolithic
    // arithmetic.
    std::vector<int64_t> base(F), shared_base(F);
    int64_t rows = 0, shared_rows = 0;
    for (int f = 0; f < F; ++f) {
      base[f] = rows;
      rows += ReplyRows(f, n);
      shared_base[f] = shared_rows;
      shared_rows += kernels::AfdOwnedTokens(n, F, f);
    }
    const Tensor y = ws.Take(DType::kF32, {rows, H});
    const Tensor shared_cat = ws.Take(DType::kF32, {shared ? shared_rows : 0, H});
    std::vector<Tensor> row_of_slot(F);
    for (int f = 0; f < F; ++f) {
      const connector::AsyncConnector::RowViews v = connector_.RowsOf(f, stage);
      row_of_slot[f] = Tensor(v.table, DType::kI32, {n, k}, dev);
      const int64_t m = ReplyRows(f, n), s = kernels::AfdOwnedTokens(n, F, f);
      backend.Copy(y.Rows(base[f], m), Tensor(v.routed, DType::kF32, {m, H}, dev));
      if (shared && s > 0) {
        backend.Copy(shared_cat.Rows(shared_base[f], s),
                     Tensor(v.shared, DType::kF32, {s, H}, dev));
      }
    }
    const Tensor idx = ws.Take(DType::kI32, {n, k});
    const Tensor shared_idx = shared ? ws.Take(DType::kI32, {n}) : Tensor();
    backend.AfdPairIndex(p.ids, c.n_routed_experts, p.send_row, row_of_slot, base, shared_base, idx,
                         shared_idx);
    if (shared) {
      const Tensor shared_out = ws.Take(DType::kF32, {n, H});
      backend.GatherRows(shared_cat, shared_idx, shared_out);
      backend.MoeCombineAdd(y, idx, p.weights, shared_out, out);
    } else {
      backend.MoeCombine(y, idx, p.weights, /*accumulate=*/false, out);
    }
  }
  ws.Rewind(scratch);
  if (connector_.device_sequenced()) return;  // checked on the device (CheckDevice)
  if (device_flags) {
    p.unchecked_layer = p.layer;
    p.unchecked_tokens = n;
  } else if (record_round_trips_) {
    round_trips_.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - p.sent).count());
  }
}

void AsyncAttentionMoe::CheckReply(int f, int stage, const Pending& p, int64_t layer, int64_t n,
                                   const connector::ReceivedSlot& r) const {
  const connector::SlotHeader& h = r.header;
  const std::string me = world_.Describe(world_.world_rank());
  const int F = world_.topology().num_ffn();
  const bool shared = model_.config().n_shared_experts > 0;
  const int64_t rows = ReplyRows(f, n);
  const int64_t shared_rows = pairs_ && shared ? kernels::AfdOwnedTokens(n, F, f) : 0;
  const int64_t table = pairs_ ? n * model_.config().num_experts_per_tok : 0;
  AFD_CHECK(!r.shutdown(),
            "FFN rank {} shut down while {} waited for the reply to layer {} stage {}", f, me,
            layer, stage);
  AFD_CHECK((h.flags & connector::kSlotCombine) &&
                ((h.flags & connector::kSlotPairs) != 0) == pairs_ && h.echo_seq == p.seqs[f] &&
                h.layer == layer && h.num_tokens == n && h.routed_rows == rows &&
                h.shared_rows == shared_rows && h.table_entries == table,
            "{}: FFN rank {} answered seq {} layer {} ({} tokens, {} rows, {} shared rows, {} "
            "table entries, flags {:#x}) to the dispatch of seq {} layer {} ({} tokens: {} rows, "
            "{} shared rows, {} table entries expected)",
            me, f, h.echo_seq, h.layer, h.num_tokens, h.routed_rows, h.shared_rows, h.table_entries,
            h.flags, p.seqs[f], layer, n, rows, shared_rows, table);
}

void AsyncAttentionMoe::CheckReplies(int stage, Pending& p) {
  if (p.unchecked_layer < 0) return;
  const int64_t layer = p.unchecked_layer;
  p.unchecked_layer = -1;
  for (int f = 0; f < world_.topology().num_ffn(); ++f) {
    const connector::ReceivedSlot r = connector_.Receive(
        f, stage, [&] { return fmt::format("the reply to layer {} stage {}", layer, stage); });
    CheckReply(f, stage, p, layer, p.unchecked_tokens, r);
  }
  if (record_round_trips_) {
    round_trips_.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - p.sent).count());
  }
}

void AsyncAttentionMoe::EndStep() {
  for (size_t s = 0; s < stages_.size(); ++s) CheckReplies(static_cast<int>(s), stages_[s]);
}

std::vector<double> AsyncAttentionMoe::TakeRoundTrips() {
  std::vector<double> out;
  out.swap(round_trips_);
  return out;
}

AsyncStepCoordinator::AsyncStepCoordinator(const model::MoeModel& model, comm::AfdWorld& world,
                                           connector::AsyncConnector& connector,
                                           const ReplicaGroup& group, const DboOptions& dbo)
    : model_(model), world_(world), connector_(connector), moe_(model, world, connector, group) {
  const AsyncOptions& o = world.config().async_options;
  AFD_CHECK(model.backend().device().is_cpu() != connector.device_rows(),
            "{}: the attention role runs on {} but the connector's rows are in {} memory",
            world.config().connector, model.backend().name(),
            connector.device_rows() ? "device" : "host");
  AFD_CHECK(o.attn_ranks_per_dp == group.tp,
            "afd.connector_extra_config.attn_ranks_per_dp is {}, but the attention role runs {} "
            "rank(s) per data-parallel replica (its tensor-parallel size): leave it out, or set "
            "them equal",
            o.attn_ranks_per_dp, group.tp);
  AFD_CHECK(!dbo.enabled || o.ring_depth >= 2,
            "--enable-dbo with {} needs two ring slots per peer: "
            "connector_extra_config.ring_depth is {} (leave it out, or set 2)",
            world.config().connector, o.ring_depth);
  AFD_CHECK(model.config().num_experts_per_tok >= 1 && model.config().n_routed_experts >= 1,
            "{}: the model has no routed experts", world.config().connector);
}

void AsyncStepCoordinator::BeginStep() {
  AFD_CHECK(!shut_down_, "{}: a step after the shutdown was announced",
            world_.Describe(world_.world_rank()));
  connector_.CheckDevice();  // the device waits of the steps before
}

ReplicaStep AsyncStepCoordinator::Plan(const model::ForwardBatch& batch, int64_t bucket,
                                       const DboOptions& dbo) {
  ReplicaStep plan;
  plan.graph_bucket = bucket;
  plan.stages = bucket > 0 ? dbo.Stages(bucket, /*prefill=*/false)
                           : dbo.Stages(batch.size(), batch.HasPrefill());
  return plan;
}

// Token offsets of the micro-batches: an even token split ("token"), or the sequence boundaries
// nearest to it ("request", the default; fewer stages when there are fewer sequences).
std::vector<int64_t> AsyncStepCoordinator::SplitPoints(const model::ForwardBatch& b,
                                                       int stages) const {
  const int64_t n = b.size();
  std::vector<int64_t> points = {0};
  const bool by_token = world_.config().async_options.async_moe_split == "token";
  for (int s = 1; s < stages; ++s) {
    const int64_t target = SplitOffset(n, stages, s);
    int64_t best = target;
    if (!by_token) {
      best = n;
      for (int64_t i = 1; i <= n; ++i) {
        const bool boundary = i == n || b.seq_index[i] != b.seq_index[i - 1];
        if (boundary && std::llabs(i - target) < std::llabs(best - target)) best = i;
      }
    }
    if (best > points.back() && best < n) points.push_back(best);
  }
  points.push_back(n);
  return points;
}

int AsyncStepCoordinator::EndCapture() {
  captures_.push_back(connector_.EndCapture());
  return static_cast<int>(captures_.size()) - 1;
}

StepCoordinator::Idle AsyncStepCoordinator::IdleStep(bool active, const DboOptions& /*dbo*/) {
  if (active) return {runtime::ReplicaRunner::IdleResult::kNoneBusy, 1};
  if (!shut_down_) {
    model_.backend().Synchronize();
    connector_.CheckDevice();
    connector_.AnnounceShutdown();
    shut_down_ = true;
  }
  return {runtime::ReplicaRunner::IdleResult::kShutdown, 1};
}

std::unique_ptr<AttentionReplica> MakeAsyncAttentionReplica(const model::MoeModel& model,
                                                            comm::AfdWorld& world,
                                                            connector::AsyncConnector& connector,
                                                            int tp, DboOptions dbo,
                                                            runtime::CudaGraphOptions graphs) {
  const AsyncOptions& o = world.config().async_options;
  if (o.async_moe_ubatching) dbo.fixed_stages = static_cast<int>(o.async_moe_num_ubatches);
  return std::make_unique<AttentionReplica>(
      model, world, tp, dbo, graphs, [&](const ReplicaGroup& group) {
        return std::make_unique<AsyncStepCoordinator>(model, world, connector, group, dbo);
      });
}

}  // namespace afd::roles
