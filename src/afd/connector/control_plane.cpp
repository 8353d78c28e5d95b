#include "afd/connector/control_plane.h"

#include "afd/common/error.h"

namespace afd::connector {

namespace {
constexpr uint32_t kHeaderTag = 0x10;
constexpr uint32_t kCountsTag = 0x11;
}  // namespace

ControlPlane::ControlPlane(comm::AfdWorld& world) : world_(world) {
  const Topology& t = world.topology();
  if (t.ControlPlaneRank(world.self()).has_value()) {
    comm_ = world.CreateGroup("p2p", t.ControlPlaneMembers());
  }
}

void ControlPlane::Send(const StepMetadata& meta) {
  const Topology& t = world_.topology();
  AFD_CHECK(world_.self().role == Role::kAttention, "control plane: only attention ranks send");
  AFD_CHECK(meta.num_attention_ranks == t.num_attention(),
            "control plane: metadata for {} attention ranks, but the topology has {}",
            meta.num_attention_ranks, t.num_attention());
  AFD_CHECK(meta.num_stages >= 1 && meta.num_stages <= kMaxStages,
            "control plane: {} stages is outside 1..{}", meta.num_stages, kMaxStages);
  AFD_CHECK(
      meta.token_counts.size() == static_cast<size_t>(meta.num_stages) * meta.num_attention_ranks,
      "control plane: {} token counts, expected {} stages x {} ranks", meta.token_counts.size(),
      meta.num_stages, meta.num_attention_ranks);
  for (int64_t n : meta.token_counts) {
    AFD_CHECK(n >= 0 && n <= kMaxTokensPerStage, "control plane: token count {} is outside 0..{}",
              n, kMaxTokensPerStage);
  }
  AFD_CHECK((meta.flags & ~kKnownStepFlags) == 0, "control plane: unknown step flags {:#x}",
            meta.flags & ~kKnownStepFlags);
  if (!comm_) return;
  const ControlHeader h{kControlMagic,
                        kControlVersion,
                        static_cast<uint16_t>(meta.num_stages),
                        meta.flags,
                        static_cast<uint32_t>(meta.num_attention_ranks),
                        meta.step};
  const std::vector<int> targets = t.ControlRouteTargets(world_.self().rank);
  comm_->GroupStart();
  for (int f : targets) {
    const int peer = *t.ControlPlaneRank({Role::kFfn, f});
    comm_->Send(&h, sizeof(h), DType::kU8, peer, kHeaderTag);
    comm_->Send(meta.token_counts.data(), meta.token_counts.size(), DType::kI64, peer, kCountsTag);
  }
  comm_->GroupEnd();
}

std::optional<StepMetadata> ControlPlane::Recv(double timeout_s) {
  const Topology& t = world_.topology();
  AFD_CHECK(world_.self().role == Role::kFfn, "control plane: only FFN ranks receive");
  const int source = t.ControlRouteSource(world_.self().rank);
  const int peer = *t.ControlPlaneRank({Role::kAttention, source});
  if (!comm_->WaitReadable(peer, timeout_s)) return std::nullopt;
  ControlHeader h;
  comm_->Recv(&h, sizeof(h), DType::kU8, peer, kHeaderTag);
  ValidateControlHeader(h, t.num_attention(), source);
  StepMetadata meta;
  meta.step = h.step;
  meta.flags = h.flags;
  meta.num_stages = h.num_stages;
  meta.num_attention_ranks = t.num_attention();
  meta.token_counts.resize(static_cast<size_t>(meta.num_stages) * meta.num_attention_ranks);
  comm_->Recv(meta.token_counts.data(), meta.token_counts.size(), DType::kI64, peer, kCountsTag);
  ValidateTokenCounts(meta.token_counts, source);
  return meta;
}

}  // namespace afd::connector
