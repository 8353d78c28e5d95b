// The DP-metadata control plane of the P2P connector: before each step, attention
// rank r < G sends the step's metadata to FFN ranks r, r+G, ... (Topology::ControlRouteTargets);
// every FFN rank blocks on it and derives every stage's shapes from it.
//
// Wire format (docs/wire_formats.md, "Control plane"): one ControlHeader message, then one
// message of num_stages x num_attention_ranks int64 token counts (stage-major).
//
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "afd/comm/afd_world.h"

namespace afd::connector {

// Flags of a step, as the attention side decides them.
enum StepFlags : uint32_t {
  kGraphCapture = 1u << 0,
  kGraphReplay = 1u << 1,
  kWarmup = 1u << 2,
  kShutdown = 1u << 3,  // no more steps: the FFN worker loop ends cleanly
};

struct StepMetadata {
  uint64_t step = 0;
  uint32_t flags = 0;
  int num_stages = 1;
  int num_attention_ranks = 1;
  // token_counts[stage * num_attention_ranks + attention_rank]: rows that attention rank sends
  // in that stage of every MoE layer of this step.
  std::vector<int64_t> token_counts;

  int64_t tokens(int stage, int attention_rank) const {
    return token_counts[static_cast<size_t>(stage) * num_attention_ranks + attention_rank];
  }
  bool has(StepFlags f) const { return (flags & f) != 0; }
};

struct ControlHeader {
  uint32_t magic;    // kControlMagic
  uint16_t version;  // kControlVersion
  uint16_t num_stages;
  uint32_t flags;
  uint32_t num_attention_ranks;
  uint64_t step;
};
static_assert(sizeof(ControlHeader) == 24, "ControlHeader is 24 bytes on the wire");
inline constexpr uint32_t kControlMagic = 0x43444641;  // "AFDC"
inline constexpr uint16_t kControlVersion = 1;
inline constexpr int kMaxStages = 64;
inline constexpr uint32_t kKnownStepFlags = kGraphCapture | kGraphReplay | kWarmup | kShutdown;
// Rows one attention rank may send in one stage: bounds what a received count can make the FFN
// side allocate.
inline constexpr int64_t kMaxTokensPerStage = int64_t{1} << 24;

// Checks a received header (from attention rank `source`) against a topology of
// num_attention_ranks attention ranks: magic, version, known flags, stage and rank counts.
// Throws afd::Error naming the source and the field.
void ValidateControlHeader(const ControlHeader& h, int num_attention_ranks, int source);
// Checks received token counts: each in 0..kMaxTokensPerStage. Throws naming the source.
void ValidateTokenCounts(const std::vector<int64_t>& counts, int source);

class ControlPlane {
 public:
  // Collective: every FFN rank and attention ranks 0..G-1 form the "p2p" group; other attention
  // ranks get a ControlPlane whose Send is a no-op.
  explicit ControlPlane(comm::AfdWorld& world);

  // Attention side: sends `meta` on this rank's control routes (no-op for ranks >= G).
  // Throws afd::Error when meta's shape does not fit the topology.
  void Send(const StepMetadata& meta);

  // FFN side: waits up to timeout_s for the next step's metadata. nullopt when none arrived in
  // time (an idle deployment); throws when the sender died or sent something malformed.
  std::optional<StepMetadata> Recv(double timeout_s);

  bool is_member() const { return comm_ != nullptr; }
  // Closes the control-plane connections so a blocked peer fails fast.
  void Shutdown() {
    if (comm_) comm_->Shutdown();
  }

 private:
  comm::AfdWorld& world_;
  std::unique_ptr<comm::Communicator> comm_;  // null when not a member
};

}  // namespace afd::connector
