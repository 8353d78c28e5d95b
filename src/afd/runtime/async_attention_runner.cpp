#include "afd/runtime/async_attention_runner.h"

#include <algorithm>
#include <cstring>

#include "afd/common/error.h"

namespace afd::runtime {

AsyncAttentionRunner::AsyncAttentionRunner(const model::DeepseekModel& model, comm::AfdWorld& world,
                                           connector::AsyncConnector& connector, int tp,
                                           DboOptions dbo)
    : model_(model), world_(world), connector_(connector), tp_(tp), dbo_(dbo) {
  AFD_CHECK(world.self().role == Role::kAttention, "AsyncAttentionRunner on an FFN rank");
  AFD_CHECK(model.backend().device().is_cpu() != connector.device_rows(),
            "{}: the attention role runs on {} but the connector's rows are in {} memory",
            world.config().connector, model.backend().name(),
            connector.device_rows() ? "device" : "host");
  const Topology& t = world.topology();
  const AsyncOptions& o = world.config().async_options;
  const int64_t heads = model.config().num_attention_heads;
  AFD_CHECK(tp >= 1 && t.num_attention() % tp == 0 && tp <= heads,
            "attention tensor-parallel size {}: must divide num_attention_ranks ({}) and not "
            "exceed the model's {} attention heads",
            tp, t.num_attention(), heads);
  AFD_CHECK(o.attn_ranks_per_dp == tp,
            "afd.connector_extra_config.attn_ranks_per_dp is {}, but the attention role runs {} "
            "rank(s) per data-parallel replica (its tensor-parallel size): leave it out, or set "
            "them equal",
            o.attn_ranks_per_dp, tp);
  if (tp > 1) {
    AFD_CHECK(model.backend().device().is_cpu(),
              "{}: attention tensor parallelism (tp {}) runs on CPU ranks; on {} run one "
              "attention rank per data-parallel replica",
              world.config().connector, tp, model.backend().name());
    const int me = world.self().rank, dp_rank = me / tp;
    tp_rank_ = me % tp;
    std::vector<int> replica;
    for (int i = 0; i < tp; ++i)
      replica.push_back(t.WorldRank({Role::kAttention, dp_rank * tp + i}));
    tp_comm_ = world.CreateGroup(fmt::format("attention_tp_{}", dp_rank), replica);
    tp_group_ = std::make_unique<TpGroup>(*tp_comm_, heads, model.config().v_head_dim);
  }
  AFD_CHECK(!dbo.enabled || o.ring_depth >= 2,
            "--enable-dbo with {} needs two ring slots per peer: "
            "connector_extra_config.ring_depth is {} (leave it out, or set 2)",
            world.config().connector, o.ring_depth);
  AFD_CHECK(model.config().num_experts_per_tok >= 1 && model.config().n_routed_experts >= 1,
            "{}: the model has no routed experts", world.config().connector);
  moe_ =
      std::make_unique<AsyncAttentionMoe>(model, world, connector, tp, tp_rank_, tp_group_.get());
}

AsyncAttentionMoe::AsyncAttentionMoe(const model::DeepseekModel& model, comm::AfdWorld& world,
                                     connector::AsyncConnector& connector, int tp, int tp_rank,
                                     TpGroup* tp_group)
    : model_(model),
      world_(world),
      connector_(connector),
      tp_(tp),
      tp_rank_(tp_rank),
      tp_group_(tp_group) {}

AsyncAttentionMoe::Pending& AsyncAttentionMoe::StageState(int stage) {
  AFD_CHECK(stage >= 0 && stage < connector_.layout().ring_depth,
            "async attention MoE: stage {} outside the ring depth {}", stage,
            connector_.layout().ring_depth);
  if (stage >= static_cast<int>(stages_.size())) stages_.resize(stage + 1);
  Pending& p = stages_[stage];
  if (!p.ws) p.ws = std::make_unique<Workspace>(model_.backend());
  return p;
}

void AsyncAttentionMoe::Start(int64_t layer, int stage, const Tensor& hidden, const Tensor& out,
                              Workspace& ws) {
  Pending& p = StageState(stage);
  AFD_CHECK(p.layer < 0, "async attention MoE: stage {} started layer {} before finishing {}",
            stage, layer, p.layer);
  const int64_t m = hidden.dim(0);
  const MicroBatch mb{hidden, out, SplitOffset(m, tp_, tp_rank_), SplitSize(m, tp_, tp_rank_)};
  CheckReplies(stage, p);  // before the host blocks on the stream (the routing ids)
  p.ws->Reset();
  p.mb = mb;
  Dispatch(layer, stage, mb, p, ws);
}

void AsyncAttentionMoe::Finish(int stage, Workspace& ws) {
  Pending& p = StageState(stage);
  AFD_CHECK(p.layer >= 0, "async attention MoE: Finish of stage {} without a Start", stage);
  if (!p.combined && p.mb.share_count > 0) CombineRows(stage, p.mb, p, ws);
  // This TP rank's rows of the MoE output are in place; then (TP) every rank's.
  if (tp_group_) tp_group_->AllGatherRows(p.mb.out);
  p.layer = -1;
  p.combined = false;
}

void AsyncAttentionMoe::EndStep() {
  for (size_t s = 0; s < stages_.size(); ++s) CheckReplies(static_cast<int>(s), stages_[s]);
}

int AsyncAttentionRunner::ChooseStages(const model::ForwardBatch& batch) const {
  const AsyncOptions& o = world_.config().async_options;
  const int64_t n = batch.size();
  if (o.async_moe_ubatching)
    return static_cast<int>(std::min<int64_t>(o.async_moe_num_ubatches, n));
  if (!dbo_.enabled) return 1;
  const int64_t threshold =
      batch.HasPrefill() ? dbo_.prefill_token_threshold : dbo_.decode_token_threshold;
  return n >= std::max<int64_t>(threshold, 2) ? 2 : 1;
}

// Token offsets of the micro-batches: an even token split ("token"), or the sequence boundaries
// nearest to it ("request", the default; fewer stages when there are fewer sequences).
std::vector<int64_t> AsyncAttentionRunner::SplitPoints(const model::ForwardBatch& b,
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

std::vector<int64_t> AsyncAttentionMoe::FitChunks(const std::vector<int32_t>& ids,
                                                  int64_t n) const {
  const model::ModelConfig& c = model_.config();
  const int F = world_.topology().num_ffn();
  const int64_t k = c.num_experts_per_tok, E = c.n_routed_experts;
  const int64_t cap = connector_.layout().cap.routed_cap;
  std::vector<int> owner(E);
  for (int f = 0; f < F; ++f) {
    for (int64_t e = SplitOffset(E, F, f); e < SplitOffset(E, F, f + 1); ++e) owner[e] = f;
  }
  std::vector<int64_t> cuts = {0}, rows(F, 0), add(F, 0);
  for (int64_t t = 0; t < n; ++t) {
    std::fill(add.begin(), add.end(), 0);
    for (int64_t j = 0; j < k; ++j) ++add[owner[ids[t * k + j]]];
    bool over = false;
    for (int f = 0; f < F; ++f) over = over || rows[f] + add[f] > cap;
    if (over && t > cuts.back()) {  // a token over the cap alone stays one chunk: Send names it
      cuts.push_back(t);
      std::fill(rows.begin(), rows.end(), 0);
    }
    for (int f = 0; f < F; ++f) rows[f] += add[f];
  }
  if (cuts.size() == 1) return {};
  cuts.push_back(n);
  return cuts;
}

// Skewed routing: more rows for some FFN rank than its slot holds. The chunks go one after the
// other through the same ring slot (each waits for its replies), outputs combined in place; the
// per-token arithmetic is the same, so the results are too.
void AsyncAttentionMoe::ExchangeInChunks(int64_t layer, int stage, const MicroBatch& mb, Pending& p,
                                         Workspace& ws, const std::vector<int64_t>& cuts) {
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    MicroBatch chunk = mb;
    chunk.share_begin = mb.share_begin + cuts[i];
    chunk.share_count = cuts[i + 1] - cuts[i];
    Dispatch(layer, stage, chunk, p, ws, /*allow_split=*/false);
    CombineRows(stage, chunk, p, ws);
  }
  if (split_exchanges_++ == 0) {
    fmt::print(stderr,
               "{}: layer {}: the routed rows for an FFN rank exceed its slot's capacity of {}; "
               "exchanged in {} token chunks (this and later such steps take more round trips: "
               "raise connector_extra_config.routed_cap_multiplier to avoid them)\n",
               world_.Describe(world_.world_rank()), layer, connector_.layout().cap.routed_cap,
               cuts.size() - 1);
  }
  p.layer = layer;
  p.combined = true;
}

void AsyncAttentionMoe::Dispatch(int64_t layer, int stage, const MicroBatch& mb, Pending& p,
                                 Workspace& ws, bool allow_split) {
  const model::ModelConfig& c = model_.config();
  kernels::Backend& backend = model_.backend();
  // This TP rank's tokens (all of them without TP): an independent sender of their rows.
  const int64_t n = mb.share_count, k = c.num_experts_per_tok, H = c.hidden_size;
  const Tensor mlp_in = mb.hidden.Rows(mb.share_begin, n);
  const int F = world_.topology().num_ffn();
  CheckReplies(stage, p);  // before the host blocks on the stream (the routing ids)
  p.layer = layer;
  p.seqs.assign(F, 0);
  p.sent = std::chrono::steady_clock::now();
  if (n == 0) {  // fewer tokens than TP ranks: nothing to send
    p.plan = connector::PlanDispatch(nullptr, 0, k, c.n_routed_experts, F, c.n_shared_experts > 0);
    return;
  }
  // Kept until the replies are combined; the rest is scratch.
  const Tensor ids = p.ws->Take(DType::kI32, {n, k});
  p.weights = p.ws->Take(DType::kF32, {n, k});
  const Workspace::Mark scratch = ws.mark();
  model_.Route(layer, mlp_in, ids, p.weights, ws);
  std::vector<int32_t> host_ids(n * k);
  backend.CopyToHost(host_ids.data(), ids);
  if (allow_split) {
    const std::vector<int64_t> cuts = FitChunks(host_ids, n);
    if (!cuts.empty()) {
      ws.Rewind(scratch);
      ExchangeInChunks(layer, stage, mb, p, ws, cuts);
      return;
    }
  }
  p.plan =
      connector::PlanDispatch(host_ids.data(), n, k, c.n_routed_experts, F, c.n_shared_experts > 0);
  const connector::DispatchPlan& plan = p.plan;
  const int64_t pairs = n * k;
  // [pairs, H]: the rows in sorted order, each FFN rank's segment contiguous.
  const Tensor sorted = ws.Take(DType::kF32, {pairs, H});
  const Tensor token_at = ws.Take(DType::kI32, {pairs});
  backend.CopyToDevice(token_at, plan.token_at.data());
  backend.GatherRows(mlp_in, token_at, sorted);
  // Every FFN rank's shared-expert rows, then the sends: with device flags the copies and flags
  // follow the rows on the stream; else one wait for the device first (host-side flags).
  std::vector<Tensor> shared_rows(F);
  for (int f = 0; f < F; ++f) {
    const std::vector<int32_t>& shared = plan.shared_tokens[f];
    const int64_t m = static_cast<int64_t>(shared.size());
    if (!plan.HasWork(f) || m == 0) continue;
    shared_rows[f] = ws.Take(DType::kF32, {m, H});
    const Tensor index = ws.Take(DType::kI32, {m});
    backend.CopyToDevice(index, shared.data());
    backend.GatherRows(mlp_in, index, shared_rows[f]);
  }
  if (!connector_.device_flags()) backend.Synchronize();
  for (int f = 0; f < F; ++f) {
    if (!plan.HasWork(f)) continue;
    const int64_t b = plan.segment[f], e = plan.segment[f + 1];
    connector::SlotPayload s;
    s.layer = static_cast<int>(layer);
    s.stage = stage;
    s.num_tokens = static_cast<int>(n);
    s.expert_counts = plan.expert_counts[f];
    s.route = std::span<const int32_t>(plan.token_at.data() + b, e - b);
    s.routed_rows = sorted.data_as<const float>() + b * H;
    s.shared_index = plan.shared_tokens[f];
    s.shared_rows = shared_rows[f].empty() ? nullptr : shared_rows[f].data();
    p.seqs[f] = connector_.Send(f, s);
  }
  ws.Rewind(scratch);
}

void AsyncAttentionMoe::CheckReply(int f, int stage, const Pending& p, int64_t layer,
                                   const connector::ReceivedSlot& r) const {
  const connector::DispatchPlan& plan = p.plan;
  const connector::SlotHeader& h = r.header;
  const int64_t b = plan.segment[f], e = plan.segment[f + 1];
  const std::vector<int32_t>& st = plan.shared_tokens[f];
  const int64_t n = plan.num_tokens;
  const std::string me = world_.Describe(world_.world_rank());
  const std::string what = fmt::format("the reply to layer {} stage {}", layer, stage);
  AFD_CHECK(!r.shutdown(), "FFN rank {} shut down while {} waited for {}", f, me, what);
  AFD_CHECK((h.flags & connector::kSlotCombine) && h.echo_seq == p.seqs[f] && h.layer == layer &&
                h.num_tokens == n && h.routed_rows == e - b &&
                h.shared_rows == static_cast<int32_t>(st.size()),
            "{}: FFN rank {} answered seq {} layer {} ({} tokens, {} routed, {} shared rows) "
            "to the dispatch of seq {} layer {} ({} tokens, {} routed, {} shared rows)",
            me, f, h.echo_seq, h.layer, h.num_tokens, h.routed_rows, h.shared_rows, p.seqs[f],
            layer, n, e - b, st.size());
  AFD_CHECK(std::memcmp(r.route, plan.token_at.data() + b, 4 * (e - b)) == 0 &&
                std::memcmp(r.shared_index, st.data(), 4 * st.size()) == 0,
            "{}: FFN rank {}'s reply to layer {} carries other tokens than were sent", me, f,
            layer);
}

void AsyncAttentionMoe::CombineRows(int stage, const MicroBatch& mb, Pending& p, Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  kernels::Backend& backend = model_.backend();
  const connector::DispatchPlan& plan = p.plan;
  const int64_t n = mb.share_count, k = c.num_experts_per_tok, H = c.hidden_size;
  const Tensor out = mb.out.Rows(mb.share_begin, n);
  const Workspace::Mark scratch = ws.mark();
  // y: [pairs, H] unweighted expert outputs in sorted order; shared: [n, H]. Each reply's rows
  // are copied out of the window (host or device memory); the shared rows of all replies are
  // concatenated in rank order and gathered back into token order. The index uploads come
  // first: with device flags nothing after a stream wait may block the host.
  const Device dev = backend.device();
  const Tensor y = ws.Take(DType::kF32, {n * k, H});
  const Tensor shared = ws.Take(DType::kF32, {n, H});
  const Tensor shared_cat = ws.Take(DType::kF32, {n, H});
  std::vector<int32_t> cat_row_of_token(n, -1);
  int64_t cat = 0;
  for (int f = 0; f < plan.num_ffn; ++f) {
    if (p.seqs[f] == 0) continue;
    for (int32_t t : plan.shared_tokens[f]) cat_row_of_token[t] = static_cast<int32_t>(cat++);
  }
  const std::string me = world_.Describe(world_.world_rank());
  Tensor index;
  if (c.n_shared_experts > 0) {
    AFD_CHECK(cat == n, "{}: shared-expert rows go back for {} of {} tokens", me, cat, n);
    index = ws.Take(DType::kI32, {n});
    backend.CopyToDevice(index, cat_row_of_token.data());
  }
  const Tensor row_of_slot = ws.Take(DType::kI32, {n, k});
  backend.CopyToDevice(row_of_slot, plan.position.data());
  const bool device_flags = connector_.device_flags();
  cat = 0;
  for (int f = 0; f < plan.num_ffn; ++f) {
    if (p.seqs[f] == 0) continue;
    connector::AsyncConnector::RowViews rows;
    if (device_flags) {
      connector_.EnqueueWait(f, stage);  // the copies below start when the reply lands
      rows = connector_.RowsOf(f, stage);
    } else {
      const connector::ReceivedSlot r = connector_.Receive(
          f, stage, [&] { return fmt::format("the reply to layer {} stage {}", p.layer, stage); });
      CheckReply(f, stage, p, p.layer, r);
      rows = {r.routed_rows, r.shared_rows};
    }
    const int64_t b = plan.segment[f], e = plan.segment[f + 1];
    const int64_t m = static_cast<int64_t>(plan.shared_tokens[f].size());
    if (e > b) backend.Copy(y.Rows(b, e - b), Tensor(rows.routed, DType::kF32, {e - b, H}, dev));
    if (m > 0) {
      backend.Copy(shared_cat.Rows(cat, m), Tensor(rows.shared, DType::kF32, {m, H}, dev));
      cat += m;
    }
  }
  if (c.n_shared_experts > 0) backend.GatherRows(shared_cat, index, shared);
  // The monolithic MoE's arithmetic: weighted sum over slots ascending from zero, then shared.
  backend.MoeCombine(y, row_of_slot, p.weights, /*accumulate=*/false, out);
  if (c.n_shared_experts > 0) backend.Add(out, shared);
  ws.Rewind(scratch);
  if (device_flags) {
    p.unchecked_layer = p.layer;
  } else if (record_round_trips_) {
    round_trips_.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - p.sent).count());
  }
}

void AsyncAttentionMoe::CheckReplies(int stage, Pending& p) {
  if (p.unchecked_layer < 0) return;
  const int64_t layer = p.unchecked_layer;
  p.unchecked_layer = -1;
  for (int f = 0; f < p.plan.num_ffn; ++f) {
    if (p.seqs[f] == 0) continue;
    const connector::ReceivedSlot r = connector_.Receive(
        f, stage, [&] { return fmt::format("the reply to layer {} stage {}", layer, stage); });
    CheckReply(f, stage, p, layer, r);
  }
  if (record_round_trips_) {
    round_trips_.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - p.sent).count());
  }
}

Tensor AsyncAttentionRunner::Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                                     Workspace& ws) {
  AFD_CHECK(!shut_down_, "{}: a step after the shutdown was announced",
            world_.Describe(world_.world_rank()));
  model_.CheckBatch(batch, cache);
  AFD_CHECK(batch.size() >= 1,
            "AsyncAttentionRunner: an empty step (the async connector runs none)");
  const model::StepInputs in = model_.Upload(batch, ws);
  model::LayerLoop loop;
  // Stage s's MoE of layer l is combined just before its attention of layer l + 1, so the FFN
  // serves it while the other stages attend.
  loop.splits = SplitPoints(batch, ChooseStages(batch));
  loop.tp = tp_group_.get();
  const Tensor logits = model_.RunLayers(in, &cache, *moe_, ws, loop);
  model::DeepseekModel::CommitBatch(batch, cache);
  ++steps_;
  dbo_steps_ += loop.splits.size() > 2;
  moe_->EndStep();
  return logits;
}

ReplicaRunner::IdleResult AsyncAttentionRunner::Idle(bool active) {
  if (active) return IdleResult::kNoneBusy;
  Drain();
  return IdleResult::kShutdown;
}

void AsyncAttentionRunner::Drain() {
  if (shut_down_) return;
  connector_.AnnounceShutdown();
  shut_down_ = true;
}

std::vector<double> AsyncAttentionMoe::TakeRoundTrips() {
  std::vector<double> out;
  out.swap(round_trips_);
  return out;
}

}  // namespace afd::runtime
