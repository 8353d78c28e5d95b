// Checks of what an attention rank sends on the control plane, apart from the transport so that
// fuzz/ can drive them without sockets.
#include "afd/common/error.h"
#include "afd/connector/control_plane.h"

namespace afd::connector {

void ValidateControlHeader(const ControlHeader& h, int num_attention_ranks, int source) {
  AFD_CHECK(h.magic == kControlMagic && h.version == kControlVersion,
            "control plane: attention rank {} sent a header with magic {:#x} version {} "
            "(expected {:#x} version {})",
            source, h.magic, h.version, kControlMagic, kControlVersion);
  AFD_CHECK(h.num_stages >= 1 && h.num_stages <= kMaxStages &&
                h.num_attention_ranks == static_cast<uint32_t>(num_attention_ranks),
            "control plane: attention rank {} sent {} stages for {} attention ranks; expected "
            "1..{} stages for {} ranks",
            source, h.num_stages, h.num_attention_ranks, kMaxStages, num_attention_ranks);
  AFD_CHECK((h.flags & ~kKnownStepFlags) == 0,
            "control plane: attention rank {} sent unknown step flags {:#x} (known: {:#x})", source,
            h.flags & ~kKnownStepFlags, kKnownStepFlags);
}

void ValidateTokenCounts(const std::vector<int64_t>& counts, int source) {
  for (size_t i = 0; i < counts.size(); ++i) {
    AFD_CHECK(counts[i] >= 0 && counts[i] <= kMaxTokensPerStage,
              "control plane: attention rank {} sent token count {} (entry {}); each must be in "
              "0..{}",
              source, counts[i], i, kMaxTokensPerStage);
  }
}

}  // namespace afd::connector
