#include "afd/roles/async_ffn_worker.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "afd/common/error.h"
#include "afd/common/fp8_rows.h"
#include "afd/kernels/afd_exchange.h"

namespace afd::roles {

AsyncFfnWorker::~AsyncFfnWorker() = default;

std::vector<std::pair<std::string, int64_t>> AsyncFfnWorker::Counters() const {
  return {{"rows", rows_served_},        {"graph_items", graph_items_},
          {"items_ahead", items_ahead_}, {"gathered_items", gathered_items_},
          {"groups", groups_},           {"graph_captures", num_captures()}};
}

namespace {

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

AsyncFfnWorker::AsyncFfnWorker(const model::MoeModel& model, comm::AfdWorld& world,
                               connector::AsyncConnector& connector, bool graphs)
    : model_(model),
      world_(world),
      connector_(connector),
      ws_(model.backend()),
      gather_(world.config().async_options.ffn_gather && world.topology().num_attention() > 1),
      lockstep_(model.config().MoeLayers(), world.topology().num_attention(),
                connector.layout().ring_depth) {
  AFD_CHECK(world.self().role == Role::kFfn, "AsyncFfnWorker on an attention rank");
  AFD_CHECK(model.backend().device().is_cpu() != connector.device_rows(),
            "{}: the FFN role runs on {} but the connector's rows are in {} memory",
            world.config().connector, model.backend().name(),
            connector.device_rows() ? "device" : "host");
  if (graphs && model.backend().SupportsGraphs() && connector.device_sequenced()) {
    graphs_ = std::make_unique<Graphs>(model.backend(), connector, /*sync_before_capture=*/false);
  }
  follow_ahead_ =
      graphs_ && world.topology().num_attention() == 1 && connector.layout().ring_depth == 1;
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
  AFD_CHECK(ahead_ && ahead_->key.members.front().first == h.sender &&
                ahead_->key.stage == h.stage && ahead_->seq == h.seq,
            "FFN rank {}: the connector returned a claimed slot of attention rank {} (stage {}, "
            "seq {}) that was not claimed",
            world_.self().rank, h.sender, h.stage, h.seq);
  const Key key = ahead_->key;
  ahead_.reset();
  rows_served_ += key.members.front().second;
  lockstep_.Served(h.sender, h.stage, key.layer, key.flags);
  ++graph_items_;
  ++items_ahead_;
  FollowAhead(key);
}

void AsyncFfnWorker::FollowAhead(const Key& key) {
  if (!follow_ahead_) return;
  const model::ModelConfig& c = model_.config();
  const auto [sender, tokens] = key.members.front();  // one attention rank: groups of one
  const int stage = key.stage, flags = key.flags;
  int next = key.layer + 1;
  while (next < c.num_hidden_layers && !c.IsMoeLayer(next)) ++next;
  if (next >= c.num_hidden_layers) return;  // the step's last MoE layer
  Key k = key;
  k.layer = next;
  if (!graphs_->Has(k)) return;  // not captured yet: the host serves it
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
  graphs_->Replay(k);
  ahead_ = Ahead{k, seq};
}

void AsyncFfnWorker::Validate(const connector::SlotHeader& h) const {
  const model::ModelConfig& c = model_.config();
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
}

AsyncFfnWorker::Key AsyncFfnWorker::KeyOf(const Group& group) {
  Key key;
  key.stage = group.front().stage;
  key.layer = group.front().layer;
  key.flags = group.front().flags;
  for (const connector::SlotHeader& h : group) key.members.emplace_back(h.sender, h.num_tokens);
  return key;
}

bool AsyncFfnWorker::Gatherable(const connector::ReceivedSlot& in) const {
  const uint16_t never = connector::kSlotPairs | connector::kSlotCombine | connector::kSlotShutdown;
  return gather_ && !in.claimed && !in.shutdown() && !(in.header.flags & never) &&
         in.header.num_tokens > 0;
}

void AsyncFfnWorker::Received(const connector::ReceivedSlot& in) {
  if (gather_ && !in.shutdown() && !in.claimed) {  // the pace matters only when gathering
    lockstep_.Arrived(in.header.sender, in.header.stage, in.header.layer, NowUs());
  }
}

void AsyncFfnWorker::CollectArrivals(const std::vector<bool>& done) {
  const int stages = connector_.layout().ring_depth;
  for (int s = 0; s < static_cast<int>(done.size()); ++s) {
    if (done[s]) continue;
    for (int stage = 0; stage < stages; ++stage) {
      if (std::optional<connector::ReceivedSlot> in = connector_.TryReceive(s, stage)) {
        Received(*in);
        pending_.push_back(std::move(*in));
      }
    }
  }
}

AsyncFfnWorker::Group AsyncFfnWorker::Gather(const std::vector<bool>& done) {
  const int wait_us = world_.config().async_options.ffn_gather_wait_us;
  const int A = static_cast<int>(done.size());
  while (true) {
    CollectArrivals(done);
    const connector::SlotHeader first = pending_.front().header;
    const auto fits = [&](const connector::ReceivedSlot& in, const connector::SlotHeader& to) {
      return Gatherable(in) && in.header.stage == to.stage && in.header.flags == to.flags;
    };
    // The candidate: the arrived item furthest behind `first` (it is served first, `first`
    // held while it catches up), else `first`.
    connector::SlotHeader cand = first;
    int behind = 0;
    for (const connector::ReceivedSlot& in : pending_) {
      const connector::SlotHeader& h = in.header;
      if (!fits(in, first) || h.sender == first.sender ||
          !lockstep_.Behind(h.layer, h.sender, first.layer, first.sender)) {
        continue;
      }
      if (const int d = lockstep_.Distance(h.layer, first.layer); d > behind) {
        behind = d;
        cand = h;
      }
    }
    // Who has an item here (pending, not yet served), and who has ended.
    std::vector<bool> has(A, false), ended(done);
    for (const connector::ReceivedSlot& in : pending_) {
      if (in.shutdown()) ended[in.header.sender] = true;
      if (in.header.stage == cand.stage) has[in.header.sender] = true;
    }
    // Senders expected at cand's layer (next) or behind it, with nothing arrived yet.
    std::vector<int> awaited;
    for (int s = 0; s < A && wait_us > 0; ++s) {
      if (!ended[s] && !has[s] &&
          lockstep_.Lag(s, cand.stage, cand.layer, cand.flags, cand.sender) >= 0) {
        awaited.push_back(s);
      }
    }
    bool redecide = false;
    if (!awaited.empty()) {
      const int64_t now = NowUs();
      std::vector<int64_t> until;
      for (int s : awaited) until.push_back(lockstep_.WaitUntil(s, cand.stage, now, wait_us));
      while (!awaited.empty() && !redecide) {
        const int64_t t = NowUs();
        for (size_t i = 0; i < awaited.size();) {
          const int s = awaited[i];
          if (std::optional<connector::ReceivedSlot> in = connector_.TryReceive(s, cand.stage)) {
            Received(*in);
            // At cand's layer: it joins the group; else it is behind (or other work): decide
            // again with it.
            if (!fits(*in, cand) || in->header.layer != cand.layer) redecide = true;
            pending_.push_back(std::move(*in));
          } else if (t < until[i]) {
            ++i;
            continue;
          } else {
            lockstep_.Missed(s);
          }
          awaited.erase(awaited.begin() + static_cast<std::ptrdiff_t>(i));
          until.erase(until.begin() + static_cast<std::ptrdiff_t>(i));
        }
        if (!awaited.empty() && !redecide) std::this_thread::yield();
      }
      if (redecide) continue;
    }
    // The group: cand and the arrived items of its (layer, stage, flags), out of pending_.
    Group group;
    for (auto it = pending_.begin(); it != pending_.end();) {
      const connector::SlotHeader& h = it->header;
      const bool is_cand = h.sender == cand.sender && h.stage == cand.stage && h.seq == cand.seq;
      if (is_cand || (fits(*it, cand) && h.layer == cand.layer)) {
        group.push_back(h);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    std::sort(group.begin(), group.end(),
              [](const connector::SlotHeader& x, const connector::SlotHeader& y) {
                return x.sender < y.sender;
              });
    return group;
  }
}

void AsyncFfnWorker::Serve(const Group& group) {
  AFD_CHECK(!ahead_,
            "FFN rank {}: a work item of attention rank {} (layer {}) arrived while the "
            "next one was claimed ahead",
            world_.self().rank, group.front().sender, group.front().layer);
  bool tokens = true;
  for (const connector::SlotHeader& h : group) {
    Validate(h);
    rows_served_ += h.num_tokens;
    tokens = tokens && h.num_tokens > 0;
    lockstep_.Served(h.sender, h.stage, h.layer, h.flags);
  }
  if (group.size() > 1) {
    gathered_items_ += static_cast<int64_t>(group.size());
    ++groups_;
  }
  // The group's rows, as the monolithic layer loop declares a step's (a GPU backend's launch
  // choices, e.g. programmatic dependent launch for small steps; a graph keeps the choice it
  // was captured with).
  int64_t rows = 0;
  for (const connector::SlotHeader& h : group) rows += h.num_tokens;
  model_.backend().SetStepRows(rows);
  if (graphs_ && (group.front().flags & connector::kSlotGraph) && tokens) {
    ServeFromGraph(group);
    return;
  }
  ws_.Reset();
  Compute(group, ws_);
}

void AsyncFfnWorker::ServeFromGraph(const Group& group) {
  const Key key = KeyOf(group);
  int64_t tokens = 0;
  for (const connector::SlotHeader& h : group) tokens += h.num_tokens;
  if (graphs_->Serve(key, tokens, [&](Workspace& ws) { Compute(group, ws); }) ==
      Graphs::Served::kReplayed) {
    graph_items_ += static_cast<int64_t>(group.size());
    FollowAhead(key);
  }
}

void AsyncFfnWorker::Compute(std::span<const connector::SlotHeader> group, Workspace& ws) {
  const model::ModelConfig& c = model_.config();
  kernels::Backend& backend = model_.backend();
  const int64_t H = c.hidden_size, k = c.num_experts_per_tok, local = end_ - begin_;
  const connector::SlotHeader& h0 = group.front();
  const bool pairs = (h0.flags & connector::kSlotPairs) != 0;
  AFD_CHECK(!pairs || group.size() == 1, "per-pair replies are served one item at a time");
  const DType wire = (h0.flags & connector::kSlotFp8Rows)    ? DType::kF8E4M3
                     : (h0.flags & connector::kSlotBf16Rows) ? DType::kBF16
                                                             : DType::kF32;
  const Device dev = backend.device();
  // Each member's rows and routing, read in place in this rank's window; its outputs are
  // written straight into its sender's slot (PeerSlot). In the concatenation its first S rows
  // (this rank's share for the shared experts) go to [a, a + S), the rest to [b, b + n - S):
  // the shared experts then run over the first sum-of-S rows at once.
  struct Member {
    connector::AsyncConnector::RowViews mine, reply;
    int64_t n, S, a, b;
  };
  std::vector<Member> members;
  int64_t N = 0, S_all = 0;
  for (const connector::SlotHeader& h : group) {
    N += h.num_tokens;
    S_all += h.shared_rows;
  }
  int64_t a = 0, b = S_all;
  for (const connector::SlotHeader& h : group) {
    members.push_back({connector_.RowsOf(h.sender, h.stage), connector_.PeerSlot(h.sender, h.stage),
                       h.num_tokens, h.shared_rows, a, b});
    a += h.shared_rows;
    b += h.num_tokens - h.shared_rows;
  }
  const auto ids_of = [&](const Member& m) {
    return Tensor(m.mine.table, DType::kI32, {m.n, k}, dev);
  };
  const auto weights_of = [&](const Member& m) {
    return Tensor(m.mine.table + m.n * k, DType::kF32, {m.n, k}, dev);
  };
  const bool one = members.size() == 1;
  Tensor x, ids;
  if (one && wire == DType::kF32) {  // used in place
    x = Tensor(members[0].mine.routed, DType::kF32, {N, H}, dev);
    ids = ids_of(members[0]);
  } else {
    x = ws.Take(DType::kF32, {N, H});
    ids = one ? ids_of(members[0]) : ws.Take(DType::kI32, {N, k});
    for (const Member& m : members) {
      const Tensor rows(m.mine.routed, wire, {m.n, H}, dev);
      const Tensor scales = wire == DType::kF8E4M3 ? Tensor(m.mine.row_scales, DType::kF32,
                                                            {m.n, AfdFp8Groups(H)}, dev)
                                                   : Tensor();
      // Rows [from, from + count) of the member to rows [to, ...) of the concatenation, in f32.
      const auto place = [&](int64_t from, int64_t count, int64_t to) {
        if (count == 0) return;
        const Tensor dst = x.Rows(to, count), src = rows.Rows(from, count);
        if (wire == DType::kF8E4M3) {
          backend.DequantFp8Rows(src, scales.Rows(from, count), dst);
        } else if (wire == DType::kF32) {
          backend.Copy(dst, src);
        } else {
          backend.Convert(dst, src);
        }
        if (!one) backend.Copy(ids.Rows(to, count), ids_of(m).Rows(from, count));
      };
      if (m.b == m.a + m.S) {
        place(0, m.n, m.a);
      } else {
        place(0, m.S, m.a);
        place(m.S, m.n - m.S, m.b);
      }
    }
  }
  // The expert pass over the concatenation (rows past a sender's tokens for this rank carry ids
  // -1), the shared experts of the first S_all rows beside it; with per-pair replies its outputs
  // are written straight into the reply slot.
  const int64_t m_pairs = N * std::min(k, local);  // pairs this rank can own
  const connector::AsyncConnector::RowViews& reply0 = members[0].reply;
  model::MoeModel::ExpertPassArgs pass;
  pass.rows = x;
  pass.ids = ids;
  pass.shared_rows = S_all;
  if (pairs) {
    pass.row_of_slot = Tensor(reply0.table, DType::kI32, {N, k}, dev);
    pass.pair_out = Tensor(reply0.routed, DType::kF32, {m_pairs, H}, dev);
    pass.shared_out = Tensor(reply0.shared, DType::kF32, {S_all, H}, dev);
  }
  const model::MoeModel::ExpertPassOutputs done = model_.ExpertPass(h0.layer, pass, ws);
  const Tensor& y = done.pair_out;
  const Tensor& row_of_slot = done.row_of_slot;
  const Tensor& shared_out = done.shared_out;
  if (!pairs) {
    // One partial sum per row: the model's combine over the row's slots here, ascending, from
    // zero (+ the shared experts for the first S rows), as the monolithic MoE adds them.
    for (const Member& m : members) {
      const Tensor out(m.reply.routed, DType::kF32, {m.n, H}, dev);
      const Tensor weights = weights_of(m);
      if (m.S > 0) {
        backend.MoeCombineAdd(y, row_of_slot.Rows(m.a, m.S), weights.Rows(0, m.S),
                              shared_out.Rows(m.a, m.S), out.Rows(0, m.S));
      }
      if (m.n > m.S) {
        backend.MoeCombine(y, row_of_slot.Rows(m.b, m.n - m.S), weights.Rows(m.S, m.n - m.S),
                           /*accumulate=*/false, out.Rows(m.S, m.n - m.S));
      }
    }
  }
  // The replies' flags once the outputs are written: on the stream with device flags, else
  // after a host wait.
  if (!connector_.device_flags()) backend.Synchronize();
  for (size_t i = 0; i < members.size(); ++i) {
    const connector::SlotHeader& h = group[i];
    const int64_t n = h.num_tokens, S = h.shared_rows;
    connector::SlotPayload r;
    r.layer = h.layer;
    r.stage = h.stage;
    r.num_tokens = h.num_tokens;
    r.flags = static_cast<uint16_t>(connector::kSlotCombine | (pairs ? connector::kSlotPairs : 0));
    r.echo_seq = h.seq;
    r.echo_received = connector_.device_sequenced();  // a graph's echo is read on the device
    r.in_place = true;
    r.routed_count = pairs ? m_pairs : n;
    r.shared_count = pairs ? S : 0;
    r.table_entries = pairs ? n * k : 0;
    r.payload_bytes = 4 * H * (r.routed_count + r.shared_count) + 4 * r.table_entries;
    connector_.Send(h.sender, r);
  }
}

int64_t AsyncFfnWorker::Run() {
  const int A = world_.topology().num_attention();
  const int timeout_ms = world_.config().async_options.recv_poll_timeout_ms;
  std::vector<bool> done(A, false);
  int remaining = A;
  int64_t served = 0;
  while (remaining > 0) {
    std::optional<connector::ReceivedSlot> in;
    if (!pending_.empty()) {  // received while gathering
      in = std::move(pending_.front());
      pending_.pop_front();
    } else {
      in = connector_.Poll(timeout_ms);
      connector_.CheckDevice();  // a claimed slot's device check that failed, named
      if (!in) continue;         // Poll checked for an abort and for exited peers
      Received(*in);
    }
    const int sender = in->header.sender;
    AFD_CHECK(!done[sender], "attention rank {} sent a work item after its shutdown", sender);
    if (in->shutdown()) {
      done[sender] = true;
      --remaining;
      continue;
    }
    if (in->claimed) {
      ServeClaimed(*in);
      ++served;
      continue;
    }
    if (!Gatherable(*in)) {
      Serve(Group{in->header});
      ++served;
      continue;
    }
    pending_.push_front(std::move(*in));
    const Group group = Gather(done);
    Serve(group);
    served += static_cast<int64_t>(group.size());
  }
  connector_.AnnounceShutdown();
  return served;
}

}  // namespace afd::roles
