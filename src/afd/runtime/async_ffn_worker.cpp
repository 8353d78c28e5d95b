#include "afd/runtime/async_ffn_worker.h"

#include <vector>

#include "afd/common/error.h"

namespace afd::runtime {

AsyncFfnWorker::AsyncFfnWorker(const model::DeepseekModel& model, comm::AfdWorld& world,
                               connector::AsyncConnector& connector)
    : model_(model), world_(world), connector_(connector), ws_(model.backend()) {
  AFD_CHECK(world.self().role == Role::kFfn, "AsyncFfnWorker on an attention rank");
  AFD_CHECK(model.backend().device().is_cpu() != connector.device_rows(),
            "{}: the FFN role runs on {} but the connector's rows are in {} memory",
            world.config().connector, model.backend().name(),
            connector.device_rows() ? "device" : "host");
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

void AsyncFfnWorker::Serve(const connector::ReceivedSlot& in) {
  const model::ModelConfig& c = model_.config();
  kernels::Backend& backend = model_.backend();
  const connector::SlotHeader& h = in.header;
  const int64_t H = c.hidden_size, local = end_ - begin_;
  const int64_t R = h.routed_rows, S = h.shared_rows;
  // Worded only for an error (a work item formats nothing on its way).
  const auto from = [&] {
    return fmt::format("work item of attention rank {} (layer {}, stage {})", h.sender, h.layer,
                       h.stage);
  };
  AFD_CHECK(!(h.flags & connector::kSlotCombine), "{}: a reply sent to an FFN rank", from());
  AFD_CHECK(h.layer < c.num_hidden_layers && c.IsMoeLayer(h.layer),
            "{}: layer {} is not a MoE "
            "layer of this model",
            from(), h.layer);
  AFD_CHECK(h.num_experts == local, "{}: {} expert counts, this rank has {} experts", from(),
            h.num_experts, local);
  std::vector<int32_t> offsets(local + 1, 0);
  for (int64_t e = 0; e < local; ++e) {
    AFD_CHECK(in.expert_counts[e] >= 0, "{}: expert count {} of local expert {}", from(),
              in.expert_counts[e], e);
    offsets[e + 1] = offsets[e] + in.expert_counts[e];
  }
  AFD_CHECK(offsets[local] == R, "{}: expert counts sum to {}, {} routed rows arrived", from(),
            offsets[local], R);
  for (int64_t i = 0; i < R; ++i) {
    AFD_CHECK(in.route[i] >= 0 && in.route[i] < h.num_tokens,
              "{}: routed row {} names token {} "
              "of {}",
              from(), i, in.route[i], h.num_tokens);
  }
  for (int64_t i = 0; i < S; ++i) {
    AFD_CHECK(in.shared_index[i] >= 0 && in.shared_index[i] < h.num_tokens,
              "{}: shared row {} names token {} of {}", from(), i, in.shared_index[i],
              h.num_tokens);
  }
  ws_.Reset();
  // Views into this rank's window (read in place); outputs in the workspace.
  // The shared experts' rows beside the routed ones (Backend::Beside: a second stream on a GPU).
  const Tensor routed_out = ws_.Take(DType::kF32, {R, H});
  const Tensor shared_out = ws_.Take(DType::kF32, {S, H});
  if (S > 0) {
    backend.Beside(
        [&] {
          const Tensor x(in.shared_rows, DType::kF32, {S, H}, backend.device());
          model_.SharedExperts(h.layer, x, shared_out, ws_);
        },
        S);
  }
  if (R > 0) {
    const Tensor x(in.routed_rows, DType::kF32, {R, H}, backend.device());
    const Tensor offsets_t = ws_.Take(DType::kI32, {local + 1});
    backend.CopyToDevice(offsets_t, offsets.data());
    backend.GroupedExpertMlp(x, offsets_t, model_.weights().layers[h.layer].moe.experts,
                             routed_out);
  }
  backend.JoinBeside();
  connector::SlotPayload reply;
  reply.layer = h.layer;
  reply.stage = h.stage;
  reply.num_tokens = h.num_tokens;
  reply.flags = connector::kSlotCombine;
  reply.echo_seq = h.seq;
  reply.expert_counts = std::span<const int32_t>(in.expert_counts, local);
  reply.route = std::span<const int32_t>(in.route, R);
  reply.routed_rows = routed_out.data();
  reply.shared_index = std::span<const int32_t>(in.shared_index, S);
  reply.shared_rows = shared_out.data();
  // The window copies the outputs once computed: on the stream with device flags, else after a
  // host wait.
  if (!connector_.device_flags()) backend.Synchronize();
  connector_.Send(h.sender, reply);
  rows_served_ += R + S;
}

int64_t AsyncFfnWorker::Run() {
  const int A = world_.topology().num_attention();
  const int timeout_ms = world_.config().async_options.recv_poll_timeout_ms;
  std::vector<bool> done(A, false);
  int remaining = A;
  int64_t served = 0;
  while (remaining > 0) {
    std::optional<connector::ReceivedSlot> in = connector_.Poll(timeout_ms);
    if (!in) continue;  // Poll checked for an abort and for exited peers
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
