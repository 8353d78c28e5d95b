#include "afd/roles/ffn_gather.h"

#include <algorithm>

#include "afd/common/error.h"

namespace afd::roles {

SenderLockstep::SenderLockstep(std::vector<int> moe_layers, int num_senders, int num_stages)
    : moe_layers_(std::move(moe_layers)), num_senders_(num_senders), num_stages_(num_stages) {
  AFD_CHECK(!moe_layers_.empty() && std::is_sorted(moe_layers_.begin(), moe_layers_.end()),
            "SenderLockstep: the MoE layers must be ascending and not empty");
  AFD_CHECK(num_senders > 0 && num_stages > 0, "SenderLockstep: {} senders, {} stages", num_senders,
            num_stages);
  tracks_.resize(static_cast<size_t>(num_senders) * num_stages);
  missed_.assign(num_senders, false);
}

size_t SenderLockstep::At(int sender, int stage) const {
  AFD_CHECK(sender >= 0 && sender < num_senders_ && stage >= 0 && stage < num_stages_,
            "SenderLockstep: sender {} stage {} out of range", sender, stage);
  return static_cast<size_t>(sender) * num_stages_ + stage;
}

int SenderLockstep::Position(int layer) const {
  const auto it = std::lower_bound(moe_layers_.begin(), moe_layers_.end(), layer);
  AFD_CHECK(it != moe_layers_.end() && *it == layer, "SenderLockstep: layer {} is not a MoE layer",
            layer);
  return static_cast<int>(it - moe_layers_.begin());
}

void SenderLockstep::Arrived(int sender, int stage, int layer, int64_t now_us) {
  Track& t = tracks_[At(sender, stage)];
  // Only the gaps inside a step: the one across a step's end also holds the host's step work.
  if (t.last_arrived >= 0 && layer != moe_layers_.front() &&
      layer == NextMoeLayer(t.last_arrived)) {
    const double gap = static_cast<double>(std::max<int64_t>(now_us - t.arrived_us, 0));
    t.gap_us = t.gap_us == 0 ? gap : 0.75 * t.gap_us + 0.25 * gap;
  }
  t.last_arrived = layer;
  t.arrived_us = now_us;
}

void SenderLockstep::Served(int sender, int stage, int layer, int flags) {
  Track& t = tracks_[At(sender, stage)];
  t.last_served = layer;
  t.last_flags = flags;
  missed_[sender] = false;
}

void SenderLockstep::Missed(int sender) { missed_.at(sender) = true; }

int SenderLockstep::NextMoeLayer(int layer) const {
  const auto it = std::upper_bound(moe_layers_.begin(), moe_layers_.end(), layer);
  return it == moe_layers_.end() ? moe_layers_.front() : *it;
}

int SenderLockstep::Distance(int from, int to) const {
  const int m = static_cast<int>(moe_layers_.size());
  return ((Position(to) - Position(from)) % m + m) % m;
}

bool SenderLockstep::Behind(int from, int from_sender, int to, int to_sender) const {
  const int d = Distance(from, to), m = static_cast<int>(moe_layers_.size());
  return d > 0 && (2 * d < m || (2 * d == m && from_sender < to_sender));
}

int SenderLockstep::Lag(int sender, int stage, int layer, int flags, int leader) const {
  const Track& t = tracks_[At(sender, stage)];
  if (t.last_served < 0 || missed_[sender] || t.last_flags != flags) return -1;
  const int next = NextMoeLayer(t.last_served);
  if (next == layer) return 0;
  return Behind(next, sender, layer, leader) ? Distance(next, layer) : -1;
}

int64_t SenderLockstep::WaitUntil(int sender, int stage, int64_t now_us, int64_t wait_us) const {
  if (wait_us <= 0) return now_us;
  const Track& t = tracks_[At(sender, stage)];
  int64_t until = now_us + wait_us;
  if (t.last_arrived >= 0 && t.gap_us > 0) {
    until = std::max(until, t.arrived_us + static_cast<int64_t>(2 * t.gap_us) + wait_us);
  }
  return std::min(until, now_us + std::max(wait_us, kMaxWaitUs));
}

}  // namespace afd::roles
