#include "afd/runtime/async_ffn_worker.h"

#include <vector>

#include "afd/common/error.h"
#include "afd/common/fp8_rows.h"
#include "afd/kernels/afd_exchange.h"

namespace afd::runtime {

struct AsyncFfnWorker::Graph {
  std::unique_ptr<kernels::OpGraph> graph;
  connector::AsyncConnector::Captured seqs;
};

struct AsyncFfnWorker::GraphMemory {
  explicit GraphMemory(Allocator& allocator) : ws(allocator) {}
  Workspace ws;
  int64_t chunk_allocations = -1;  // when its first graph was captured
  std::vector<Key> graphs;
};

AsyncFfnWorker::~AsyncFfnWorker() = default;

AsyncFfnWorker::AsyncFfnWorker(const model::MoeModel& model, comm::AfdWorld& world,
                               connector::AsyncConnector& connector, bool graphs)
    : model_(model),
      world_(world),
      connector_(connector),
      ws_(model.backend()),
      graphs_enabled_(graphs && model.backend().SupportsGraphs() && connector.device_sequenced()) {
  AFD_CHECK(world.self().role == Role::kFfn, "AsyncFfnWorker on an attention rank");
  AFD_CHECK(model.backend().device().is_cpu() != connector.device_rows(),
            "{}: the FFN role runs on {} but the connector's rows are in {} memory",
            world.config().connector, model.backend().name(),
            connector.device_rows() ? "device" : "host");
  follow_ahead_ = graphs_enabled_ && world.topology().num_attention() == 1 &&
                  connector.layout().ring_depth == 1;
  const int me = world.self().rank;
  begin_ = connector.expert_begin(me);
  end_ = begin_ + connector.num_local_experts(me);
  const model::ModelConfig& c = model.config();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.IsMoeLayer(l)) continue;
    const kernels::ExpertWeights& e = model.weights().layers[l].moe.experts;
    AFD_CHECK(e.expert_begin == begin_ && e.num_experts() == end_ - begin_,
              "FFN rank {} holds experts [{}, {}) of layer {}, the async connector assigns it "
              "[{}, {})",
              me, e.expert_begin, e.expert_begin + e.num_experts(), l, begin_, end_);
  }
}

void AsyncFfnWorker::ServeClaimed(const connector::ReceivedSlot& in) {
  const connector::SlotHeader& h = in.header;
  AFD_CHECK(ahead_ && std::get<0>(ahead_->key) == h.sender && std::get<1>(ahead_->key) == h.stage &&
                ahead_->seq == h.seq,
            "FFN rank {}: the connector returned a claimed slot of attention rank {} (stage {}, "
            "seq {}) that was not claimed",
            world_.self().rank, h.sender, h.stage, h.seq);
  const Key key = ahead_->key;
  ahead_.reset();
  rows_served_ += std::get<3>(key);
  ++graph_items_;
  ++items_ahead_;
  FollowAhead(key);
}

void AsyncFfnWorker::FollowAhead(const Key& key) {
  if (!follow_ahead_) return;
  const model::ModelConfig& c = model_.config();
  const auto [sender, stage, layer, tokens, flags] = key;
  int next = layer + 1;
  while (next < c.num_hidden_layers && !c.IsMoeLayer(next)) ++next;
  if (next >= c.num_hidden_layers) return;  // the step's last MoE layer
  const Key k{sender, stage, next, tokens, flags};
  const auto it = graphs_.find(k);
  if (it == graphs_.end()) return;  // not captured yet: the host serves it
  const int64_t n = tokens, top = c.num_experts_per_tok;
  connector::ExpectedSlot e;
  e.flags = static_cast<uint16_t>(flags);
  e.layer = next;
  e.num_tokens = tokens;
  e.routed_rows = n;
  e.shared_rows = c.n_shared_experts > 0
                      ? kernels::AfdOwnedTokens(n, world_.topology().num_ffn(), world_.self().rank)
                      : 0;
  e.table_entries = 2 * n * top;
  const uint64_t seq = connector_.SeenSeq(sender, stage) + 1;
  connector_.Claim(sender, stage, seq, e);
  it->second->graph->Replay();
  connector_.Replayed(it->second->seqs);
  ahead_ = Ahead{k, seq};
}

void AsyncFfnWorker::Serve(const connector::ReceivedSlot& in) {
  if (in.claimed) {
    ServeClaimed(in);
    return;
  }
  AFD_CHECK(!ahead_,
            "FFN rank {}: a work item of attention rank {} (layer {}) arrived while the "
            "next one was claimed ahead",
            world_.self().rank, in.header.sender, in.header.layer);
  const model::ModelConfig& c = model_.config();
  const connector::SlotHeader& h = in.header;
  const int64_t k = c.num_experts_per_tok;
  const int64_t n = h.num_tokens, S = h.shared_rows;
  // Worded only for an error (a work item formats nothing on its way).
  const auto from = [&] {
    return fmt::format("work item of attention rank {} (layer {}, stage {})", h.sender, h.layer,
                       h.stage);
  };
  AFD_CHECK(!(h.flags & connector::kSlotCombine), "{}: a reply sent to an FFN rank", from());
  AFD_CHECK(h.layer < c.num_hidden_layers && c.IsMoeLayer(h.layer),
            "{}: layer {} is not a MoE layer of this model", from(), h.layer);
  const int F = world_.topology().num_ffn();
  const bool shared = c.n_shared_experts > 0;
  const int64_t owned = shared ? kernels::AfdOwnedTokens(n, F, world_.self().rank) : 0;
  AFD_CHECK(h.routed_rows == n && h.table_entries == 2 * n * k && S == owned,
            "{}: {} rows, {} table entries, {} shared rows for {} tokens (expected {}, {}, {})",
            from(), h.routed_rows, h.table_entries, S, n, n, 2 * n * k, owned);
  rows_served_ += n;
  if (graphs_enabled_ && (h.flags & connector::kSlotGraph) && n > 0) {
    ServeFromGraph(h);
    return;
  }
  ws_.Reset();
  Compute(h, ws_);
}

void AsyncFfnWorker::ServeFromGraph(const connector::SlotHeader& h) {
  const Key key{h.sender, h.stage, h.layer, h.num_tokens, h.flags};
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    it->second->graph->Replay();
    connector_.Replayed(it->second->seqs);
    ++graph_items_;
    FollowAhead(key);
    return;
  }
  kernels::Backend& backend = model_.backend();
  std::unique_ptr<GraphMemory>& memory = graph_memory_[h.num_tokens];
  if (!memory) memory = std::make_unique<GraphMemory>(backend);
  Workspace& ws = memory->ws;
  const auto drop_if_grown = [&] {
    if (memory->chunk_allocations < 0 || ws.chunk_allocations() == memory->chunk_allocations) {
      return;
    }
    for (const Key& k : memory->graphs) graphs_.erase(k);  // they point into released memory
    memory->graphs.clear();
    memory->chunk_allocations = -1;
  };
  if (warmed_.insert(key).second) {  // the key's first item: eagerly, in the graphs' memory
    ws.Reset();
    Compute(h, ws);
    ws.Reset();
    drop_if_grown();
    return;
  }
  ws.Reset();
  drop_if_grown();
  const int64_t chunks = ws.chunk_allocations();
  connector_.BeginCapture();
  backend.BeginCapture();
  std::unique_ptr<kernels::OpGraph> graph;
  try {
    Compute(h, ws);
  } catch (...) {
    backend.EndCapture();
    connector_.EndCapture();
    throw;
  }
  graph = backend.EndCapture();
  connector::AsyncConnector::Captured seqs = connector_.EndCapture();
  ++num_captures_;
  if (ws.chunk_allocations() != chunks) {
    // It outgrew the memory while capturing: serve this one eagerly; the next one captures
    // into the merged memory.
    ws.Reset();
    Compute(h, ws);
    ws.Reset();
    drop_if_grown();
    return;
  }
  if (memory->chunk_allocations < 0) memory->chunk_allocations = ws.chunk_allocations();
  memory->graphs.push_back(key);
  auto g = std::make_unique<Graph>();
  g->graph = std::move(graph);
  g->seqs = std::move(seqs);
  g->graph->Replay();
  connector_.Replayed(g->seqs);
  graphs_[key] = std::move(g);
  ++graph_items_;
  FollowAhead(key);
}

void AsyncFfnWorker::Compute(const connector::SlotHeader& h, Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  kernels::Backend& backend = model_.backend();
  const int64_t H = c.hidden_size, k = c.num_experts_per_tok, local = end_ - begin_;
  const int64_t n = h.num_tokens, S = h.shared_rows;
  const bool pairs = (h.flags & connector::kSlotPairs) != 0;
  const DType wire = (h.flags & connector::kSlotFp8Rows)    ? DType::kF8E4M3
                     : (h.flags & connector::kSlotBf16Rows) ? DType::kBF16
                                                            : DType::kF32;
  // The rows and their routing, read in place in this rank's window; the outputs are written
  // straight into the sender's slot (PeerSlot).
  const connector::AsyncConnector::RowViews mine = connector_.RowsOf(h.sender, h.stage);
  const connector::AsyncConnector::RowViews reply = connector_.PeerSlot(h.sender, h.stage);
  const Device dev = backend.device();
  const Tensor ids(mine.table, DType::kI32, {n, k}, dev);
  const Tensor weights(mine.table + n * k, DType::kF32, {n, k}, dev);
  Tensor x(mine.routed, wire, {n, H}, dev);
  if (wire == DType::kF8E4M3) {
    const Tensor x32 = ws.Take(DType::kF32, {n, H});
    backend.DequantFp8Rows(x, Tensor(mine.row_scales, DType::kF32, {n, AfdFp8Groups(H)}, dev), x32);
    x = x32;
  } else if (wire != DType::kF32) {
    const Tensor x32 = ws.Take(DType::kF32, {n, H});
    backend.Convert(x32, x);
    x = x32;
  }
  // Grouped by local expert here (rows past the sender's tokens for this rank carry ids -1).
  const int64_t m = n * std::min(k, local);  // pairs this rank can own
  const Tensor offsets = ws.Take(DType::kI32, {local + 1});
  const Tensor src_row = ws.Take(DType::kI32, {n * k});
  const Tensor row_of_slot =
      pairs ? Tensor(reply.table, DType::kI32, {n, k}, dev) : ws.Take(DType::kI32, {n, k});
  const Tensor y =
      pairs ? Tensor(reply.routed, DType::kF32, {m, H}, dev) : ws.Take(DType::kF32, {m, H});
  // The shared experts of this rank's share of tokens (its first S rows) beside the routed ones
  // (Backend::Beside: a second stream on a GPU).
  const Tensor shared_out =
      pairs ? Tensor(reply.shared, DType::kF32, {S, H}, dev) : ws.Take(DType::kF32, {S, H});
  if (S > 0) {
    backend.Beside([&] { model_.SharedExperts(h.layer, x.Rows(0, S), shared_out, ws); }, S);
  }
  if (n > 0) {
    backend.MoePermute(ids, begin_, local, offsets, src_row, row_of_slot);
    const Tensor grouped = ws.Take(DType::kF32, {m, H});
    backend.GatheredExpertMlp(x, src_row.Rows(0, m), grouped, offsets,
                              model_.weights().layers[h.layer].moe.experts, y);
  }
  backend.JoinBeside();
  if (!pairs && n > 0) {
    // One partial sum per row: the model's combine over the row's slots here, ascending, from
    // zero (+ the shared experts for the first S rows), as the monolithic MoE adds them.
    const Tensor out(reply.routed, DType::kF32, {n, H}, dev);
    if (S > 0) {
      backend.MoeCombineAdd(y, row_of_slot.Rows(0, S), weights.Rows(0, S), shared_out,
                            out.Rows(0, S));
    }
    if (n > S) {
      backend.MoeCombine(y, row_of_slot.Rows(S, n - S), weights.Rows(S, n - S),
                         /*accumulate=*/false, out.Rows(S, n - S));
    }
  }
  connector::SlotPayload r;
  r.layer = h.layer;
  r.stage = h.stage;
  r.num_tokens = h.num_tokens;
  r.flags = static_cast<uint16_t>(connector::kSlotCombine | (pairs ? connector::kSlotPairs : 0));
  r.echo_seq = h.seq;
  r.echo_received = connector_.device_sequenced();  // a graph's echo is read on the device
  r.in_place = true;
  r.routed_count = pairs ? m : n;
  r.shared_count = pairs ? S : 0;
  r.table_entries = pairs ? n * k : 0;
  r.payload_bytes = 4 * H * (r.routed_count + r.shared_count) + 4 * r.table_entries;
  // The reply's flag once the outputs are written: on the stream with device flags, else after
  // a host wait.
  if (!connector_.device_flags()) backend.Synchronize();
  connector_.Send(h.sender, r);
}

int64_t AsyncFfnWorker::Run() {
  const int A = world_.topology().num_attention();
  const int timeout_ms = world_.config().async_options.recv_poll_timeout_ms;
  std::vector<bool> done(A, false);
  int remaining = A;
  int64_t served = 0;
  while (remaining > 0) {
    std::optional<connector::ReceivedSlot> in = connector_.Poll(timeout_ms);
    connector_.CheckDevice();  // a claimed slot's device check that failed, named
    if (!in) continue;         // Poll checked for an abort and for exited peers
    const int sender = in->header.sender;
    AFD_CHECK(!done[sender], "attention rank {} sent a work item after its shutdown", sender);
    if (in->shutdown()) {
      done[sender] = true;
      --remaining;
      continue;
    }
    Serve(*in);
    ++served;
  }
  connector_.AnnounceShutdown();
  return served;
}

}  // namespace afd::runtime
