// Whom an FFN rank waits for when it gathers the work items of one MoE layer from several
// attention ranks (AsyncFfnWorker, connector_extra_config.ffn_gather). The FFN serves the items
// of several senders for the same (layer, stage, flags) as one expert pass -- the routed
// experts' weights read once instead of once per sender -- but senders only meet at a layer if
// they run in step, and nothing else puts them in step: two attention ranks whose decode steps
// started apart stay apart for good (measured: 2A1F on one H200, the two ranks 18 of 26 MoE
// layers apart, every item served alone). So the FFN steers them:
// * a sender whose next item is for the same layer is waited for (bounded);
// * a sender that is behind -- its next item is for a layer it reaches in under half a step
//   (exactly half: the lower sender is behind) -- is served first, and an item ahead of it is
//   held, bounded, while it catches up; then they meet and are gathered from then on.
// Every wait is bounded by WaitUntil (the sender's own pace, from the gaps between its items),
// and a wait that runs out stops the waiting for that sender until it is served again (a sender
// that went idle costs one wait). Pure bookkeeping, no connector: tested on its own.
//
// Thread safety: none (the FFN worker's one thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace afd::roles {

class SenderLockstep {
 public:
  // `moe_layers`: the model's MoE layers, ascending (not empty); `num_stages`: ring slots per
  // sender.
  SenderLockstep(std::vector<int> moe_layers, int num_senders, int num_stages);

  // An item of (sender, stage) for `layer` was received at `now_us` (a steady clock).
  void Arrived(int sender, int stage, int layer, int64_t now_us);
  // An item of (sender, stage) for `layer` with `flags` was served.
  void Served(int sender, int stage, int layer, int flags);
  // A wait for `sender` ran out: no more waits for it until one of its items is served.
  void Missed(int sender);

  // The MoE layer after `layer` (the first after the last).
  int NextMoeLayer(int layer) const;
  // MoE layers from `from` forward to `to`, cyclic (0 when equal).
  int Distance(int from, int to) const;
  // Whether a sender at MoE layer `from` is behind one at `to`: it reaches `to` in under half a
  // step (exactly half: the lower sender is behind).
  bool Behind(int from, int from_sender, int to, int to_sender) const;
  // How many more items `sender` sends in `stage` before its item for `layer`, when that is
  // expected soon: 0 -- its next item is for `layer`; n > 0 -- it is behind `leader`'s `layer`
  // by n; -1 -- nothing expected: none of its items served yet, a missed wait, its last item
  // had other flags, or it is not behind.
  int Lag(int sender, int stage, int layer, int flags, int leader) const;
  // When a wait (from `now_us`) for `sender`'s next item in `stage` should end: two of its
  // usual gaps between items after its last arrival, plus `wait_us`; at least now + wait_us,
  // at most now + max(wait_us, kMaxWaitUs). wait_us 0: now (no waiting).
  int64_t WaitUntil(int sender, int stage, int64_t now_us, int64_t wait_us) const;

  static constexpr int64_t kMaxWaitUs = 10000;

 private:
  size_t At(int sender, int stage) const;
  int Position(int layer) const;  // index in moe_layers_

  std::vector<int> moe_layers_;
  int num_senders_, num_stages_;
  struct Track {
    int last_served = -1, last_flags = 0;  // layer, -1 none
    int last_arrived = -1;
    int64_t arrived_us = 0;
    double gap_us = 0;  // moving average of the gaps between items of consecutive layers
  };
  std::vector<Track> tracks_;  // [sender * num_stages + stage]
  std::vector<bool> missed_;   // [sender]
};

}  // namespace afd::roles
