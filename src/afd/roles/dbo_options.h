// Dual-batch overlap (DBO, vLLM's --enable-dbo) of the AFD attention role: a step whose tokens
// reach a threshold runs as two micro-batches, so that one micro-batch attends while the other's
// MoE is away at the FFN role. The rule lives here once; the attention replica and the P2P
// step's shared decision (DecideP2pStep) ask it.
// Thread safety: a plain value.
#pragma once

#include <algorithm>
#include <cstdint>

namespace afd::roles {

// vLLM's DBO settings: micro-batching is used when a step's tokens reach the threshold.
struct DboOptions {
  bool enabled = false;
  int64_t decode_token_threshold = 32;    // decode-only steps
  int64_t prefill_token_threshold = 512;  // steps with prefill tokens
  // Micro-batches of every step whatever the thresholds (the async connector's
  // async_moe_ubatching: async_moe_num_ubatches); 0: the DBO rule.
  int fixed_stages = 0;

  // Whether a step of n tokens (prefill: it carries prompt tokens) runs as two micro-batches:
  // DBO on and n at its kind's threshold -- and at least 2, so both halves have tokens.
  bool Splits(int64_t n, bool prefill) const {
    const int64_t threshold = prefill ? prefill_token_threshold : decode_token_threshold;
    return enabled && n >= std::max<int64_t>(threshold, 2);
  }
  // The micro-batches of a step of n tokens: fixed_stages (at most n, at least 1), else 2 when
  // Splits, else 1.
  int Stages(int64_t n, bool prefill) const {
    if (fixed_stages > 0) {
      return static_cast<int>(std::clamp<int64_t>(n, 1, fixed_stages));
    }
    return Splits(n, prefill) ? 2 : 1;
  }
};

}  // namespace afd::roles
