#include "afd/connector/p2p_connector.h"

#include "afd/common/error.h"

namespace afd::connector {

namespace {

std::unique_ptr<comm::Communicator> MakeSubgroup(comm::AfdWorld& world) {
  const Topology& t = world.topology();
  const int g = t.SubgroupOf(world.self());
  return world.CreateGroup(fmt::format("afd_subgroup_{}", g), t.SubgroupMembers(g));
}

}  // namespace

// The data plane forms before the control plane on every rank, so group creation never waits
// in a cycle.
P2pConnector::P2pConnector(comm::AfdWorld& world)
    : world_(world), subgroup_(MakeSubgroup(world)), control_plane_(world) {}

std::vector<int> P2pConnector::Peers() const {
  const Topology& t = world_.topology();
  const RoleRank me = world_.self();
  const int g = t.SubgroupOf(me);
  const int num_ffn = t.FfnRanksOf(g).size();
  const int num_attn = t.AttentionRanksOf(g).size();
  std::vector<int> peers;
  if (me.role == Role::kAttention) {
    // Talk to every FFN member: one when FFN is the hub, several when this rank is the hub.
    for (int i = 0; i < num_ffn; ++i) peers.push_back(i);
  } else if (t.HubRole() == Role::kFfn) {
    for (int i = 0; i < num_attn; ++i) peers.push_back(num_ffn + i);
  } else {
    peers.push_back(num_ffn);  // the attention hub
  }
  return peers;
}

uint32_t P2pConnector::Tag(bool to_ffn, int channel, int layer, int stage) const {
  AFD_CHECK(layer >= 0 && layer < kMaxLayers, "connector: layer {} is outside 0..{}", layer,
            kMaxLayers - 1);
  AFD_CHECK(stage >= 0 && stage < kMaxStagesPerLayer, "connector: stage {} is outside 0..{}", stage,
            kMaxStagesPerLayer - 1);
  AFD_CHECK(channel >= 0 && channel < kMaxChannels, "connector: channel {} is outside 0..{}",
            channel, kMaxChannels - 1);
  // bit 31: direction, bits 28..30: channel, bits 8..27: layer, bits 0..7: stage.
  return (to_ffn ? 1u << 31 : 0u) | (static_cast<uint32_t>(channel) << 28) |
         (static_cast<uint32_t>(layer) << 8) | static_cast<uint32_t>(stage);
}

void P2pConnector::Record(int layer, uint64_t messages, uint64_t bytes,
                          std::chrono::steady_clock::time_point start) {
  LayerTransferStats& s = stats_[layer];
  s.messages += messages;
  s.bytes += bytes;
  if (group_depth_ == 0) {  // inside a group, GroupEnd charges the time
    s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
}

void P2pConnector::GroupStart() {
  if (group_depth_++ == 0) group_start_ = std::chrono::steady_clock::now();
  subgroup_->GroupStart();
}

void P2pConnector::GroupEnd(int layer) {
  AFD_CHECK(group_depth_ > 0, "connector: GroupEnd without GroupStart");
  subgroup_->GroupEnd();
  if (--group_depth_ == 0) {
    stats_[layer].seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - group_start_).count();
  }
}

void P2pConnector::SendToFfn(int layer, int stage, int channel, const RowFormat& fmt,
                             const void* rows, int64_t num_rows) {
  AFD_CHECK(world_.self().role == Role::kAttention, "connector: SendToFfn on an FFN rank");
  AFD_CHECK(num_rows >= 0, "connector: negative row count {}", num_rows);
  const auto start = std::chrono::steady_clock::now();
  const uint32_t tag = Tag(true, channel, layer, stage);
  const std::vector<int> peers = Peers();
  const int m = static_cast<int>(peers.size());
  const char* base = static_cast<const char*>(rows);
  subgroup_->GroupStart();
  for (int i = 0; i < m; ++i) {
    const int64_t offset = SplitOffset(num_rows, m, i);
    const int64_t count = SplitSize(num_rows, m, i);
    subgroup_->Send(base + offset * fmt.row_bytes(), count * fmt.elems_per_row, fmt.dtype, peers[i],
                    tag);
  }
  subgroup_->GroupEnd();
  Record(layer, m, num_rows * fmt.row_bytes(), start);
}

void P2pConnector::RecvFromFfn(int layer, int stage, const RowFormat& fmt, void* out,
                               int64_t num_rows) {
  AFD_CHECK(world_.self().role == Role::kAttention, "connector: RecvFromFfn on an FFN rank");
  const auto start = std::chrono::steady_clock::now();
  const uint32_t tag = Tag(false, 0, layer, stage);
  const std::vector<int> peers = Peers();
  const int m = static_cast<int>(peers.size());
  char* base = static_cast<char*>(out);
  subgroup_->GroupStart();
  for (int i = 0; i < m; ++i) {
    subgroup_->Recv(base + SplitOffset(num_rows, m, i) * fmt.row_bytes(),
                    SplitSize(num_rows, m, i) * fmt.elems_per_row, fmt.dtype, peers[i], tag);
  }
  subgroup_->GroupEnd();
  Record(layer, m, num_rows * fmt.row_bytes(), start);
}

std::vector<int64_t> P2pConnector::IncomingRowCounts(const StepMetadata& meta, int stage) const {
  const Topology& t = world_.topology();
  const RoleRank me = world_.self();
  AFD_CHECK(me.role == Role::kFfn, "connector: IncomingRowCounts on an attention rank");
  AFD_CHECK(stage >= 0 && stage < meta.num_stages, "connector: stage {} is outside 0..{}", stage,
            meta.num_stages - 1);
  AFD_CHECK(meta.num_attention_ranks == t.num_attention(),
            "connector: metadata for {} attention ranks, topology has {}", meta.num_attention_ranks,
            t.num_attention());
  const int g = t.SubgroupOf(me);
  const RankRange attn = t.AttentionRanksOf(g);
  std::vector<int64_t> counts;
  if (t.HubRole() == Role::kFfn) {
    for (int a = attn.begin; a < attn.end; ++a) counts.push_back(meta.tokens(stage, a));
  } else {
    const RankRange ffn = t.FfnRanksOf(g);
    counts.push_back(SplitSize(meta.tokens(stage, attn.begin), ffn.size(), me.rank - ffn.begin));
  }
  return counts;
}

void P2pConnector::RecvFromAttention(int layer, int stage, int channel, const RowFormat& fmt,
                                     const StepMetadata& meta, void* rows) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> counts = IncomingRowCounts(meta, stage);
  const std::vector<int> peers = Peers();
  const uint32_t tag = Tag(true, channel, layer, stage);
  char* base = static_cast<char*>(rows);
  int64_t offset = 0;
  subgroup_->GroupStart();
  for (size_t i = 0; i < peers.size(); ++i) {
    subgroup_->Recv(base + offset * fmt.row_bytes(), counts[i] * fmt.elems_per_row, fmt.dtype,
                    peers[i], tag);
    offset += counts[i];
  }
  subgroup_->GroupEnd();
  Record(layer, peers.size(), offset * fmt.row_bytes(), start);
}

void P2pConnector::SendToAttention(int layer, int stage, const RowFormat& fmt,
                                   const StepMetadata& meta, const void* rows) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> counts = IncomingRowCounts(meta, stage);
  const std::vector<int> peers = Peers();
  const uint32_t tag = Tag(false, 0, layer, stage);
  const char* base = static_cast<const char*>(rows);
  int64_t offset = 0;
  subgroup_->GroupStart();
  for (size_t i = 0; i < peers.size(); ++i) {
    subgroup_->Send(base + offset * fmt.row_bytes(), counts[i] * fmt.elems_per_row, fmt.dtype,
                    peers[i], tag);
    offset += counts[i];
  }
  subgroup_->GroupEnd();
  Record(layer, peers.size(), offset * fmt.row_bytes(), start);
}

void P2pConnector::BeginCapture() {
  AFD_CHECK(!before_capture_, "connector: BeginCapture while capturing");
  before_capture_ = stats_;
}

P2pConnector::Captured P2pConnector::EndCapture() {
  AFD_CHECK(before_capture_.has_value(), "connector: EndCapture without BeginCapture");
  Captured added;
  for (const auto& [layer, s] : stats_) {
    const auto it = before_capture_->find(layer);
    const LayerTransferStats b = it == before_capture_->end() ? LayerTransferStats{} : it->second;
    if (s.messages == b.messages && s.bytes == b.bytes) continue;
    added[layer] = {s.messages - b.messages, s.bytes - b.bytes, 0, 0};
  }
  stats_ = std::move(*before_capture_);
  before_capture_.reset();
  return added;
}

void P2pConnector::Replayed(const Captured& added) {
  for (const auto& [layer, a] : added) {
    LayerTransferStats& s = stats_[layer];
    s.messages += a.messages;
    s.bytes += a.bytes;
  }
}

void P2pConnector::Shutdown() {
  if (subgroup_) subgroup_->Shutdown();
  control_plane_.Shutdown();
}

}  // namespace afd::connector
