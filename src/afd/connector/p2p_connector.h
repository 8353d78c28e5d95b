// The P2P hub/spoke connector (seeds 000, 001), written once against comm::Communicator.
//
// Each data-plane subgroup is one hub plus spokes (Topology::HubRole()):
//  * A >= F: the FFN rank is the hub. Each attention spoke sends its n rows to it; the FFN rank
//    receives from all its attention peers in one group (lengths from the step's metadata),
//    concatenated in subgroup order, runs the FFN once, and sends each peer its slice back.
//  * A < F: the attention rank is the hub. It splits its n rows over its FFN members by
//    SplitSizes(n, m) (earlier members get the larger share), sends every share -- a zero-row
//    share is still an (empty) message, so nobody waits forever -- and concatenates the results.
// Rows are `RowFormat`s: hidden states, or extra per-row channels such as router outputs.
// Message tags encode direction, channel, layer and stage so the host transport can check them.
//
// Thread safety: one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/connector/control_plane.h"

namespace afd::connector {

struct RowFormat {
  int64_t elems_per_row;
  DType dtype;
  size_t row_bytes() const { return static_cast<size_t>(elems_per_row) * DTypeSize(dtype); }
};

// Per-layer transfer counters, for logs and the demo.
struct LayerTransferStats {
  uint64_t messages = 0;
  uint64_t bytes = 0;
  uint64_t tokens = 0;  // the messages' tokens (async connector: bytes / tokens per message)
  double seconds = 0;   // wall time spent inside transfers
};

inline constexpr int kMaxChannels = 8;
inline constexpr int kMaxLayers = 1 << 20;
inline constexpr int kMaxStagesPerLayer = 256;

class P2pConnector {
 public:
  // Collective over the world: forms this rank's data-plane subgroup and the control plane.
  explicit P2pConnector(comm::AfdWorld& world);

  ControlPlane& control_plane() { return control_plane_; }
  const Topology& topology() const { return world_.topology(); }
  RowFormat hidden_format() const { return {world_.hidden_size(), world_.dtype()}; }

  // ---- Attention side ----
  // Sends num_rows rows ([num_rows, fmt.elems_per_row]) of one layer/stage/channel to the FFN
  // side. num_rows must equal this rank's entry in the step's metadata.
  void SendToFfn(int layer, int stage, int channel, const RowFormat& fmt, const void* rows,
                 int64_t num_rows);
  // Receives the FFN output for the same rows, in the same order, into out [num_rows, ...].
  void RecvFromFfn(int layer, int stage, const RowFormat& fmt, void* out, int64_t num_rows);

  // ---- FFN side ----
  // Row counts this rank receives in `stage`, one entry per sending peer in subgroup order.
  std::vector<int64_t> IncomingRowCounts(const StepMetadata& meta, int stage) const;
  // Receives every peer's rows of one layer/stage/channel, concatenated in subgroup order into
  // rows [sum(IncomingRowCounts), fmt.elems_per_row].
  void RecvFromAttention(int layer, int stage, int channel, const RowFormat& fmt,
                         const StepMetadata& meta, void* rows);
  // Sends the FFN output rows (same order and counts as received) back to their senders.
  void SendToAttention(int layer, int stage, const RowFormat& fmt, const StepMetadata& meta,
                       const void* rows);

  // Between GroupStart() and GroupEnd(layer) the transfers above are only posted; GroupEnd runs
  // them concurrently (e.g. send micro-batch 1 while receiving micro-batch 0's results, so
  // neither side can block the other) and charges the elapsed time to `layer`'s counters.
  void GroupStart();
  void GroupEnd(int layer);

  const std::map<int, LayerTransferStats>& stats() const { return stats_; }
  // CUDA graphs (a device transport): between BeginCapture and EndCapture the transfers are only
  // recorded into the graph (nothing moves); EndCapture puts the counters back as they were and
  // returns what one replay adds to them (messages, bytes; no time), which the caller passes to
  // Replayed after every replay.
  using Captured = std::map<int, LayerTransferStats>;
  void BeginCapture();
  Captured EndCapture();
  void Replayed(const Captured& added);
  // The data-plane subgroup communicator and this rank's peers on it, in subgroup order (for
  // `afd connector-test --bench --raw`: the transport without the connector).
  comm::Communicator& data_plane() { return *subgroup_; }
  std::vector<int> DataPlanePeers() const { return Peers(); }
  // Closes the data and control planes so blocked peers fail fast.
  void Shutdown();

 private:
  // Subgroup ranks of the peers this rank exchanges rows with, in subgroup order.
  std::vector<int> Peers() const;
  uint32_t Tag(bool to_ffn, int channel, int layer, int stage) const;
  void Record(int layer, uint64_t messages, uint64_t bytes,
              std::chrono::steady_clock::time_point start);

  comm::AfdWorld& world_;
  std::unique_ptr<comm::Communicator> subgroup_;
  ControlPlane control_plane_;
  std::map<int, LayerTransferStats> stats_;
  std::optional<std::map<int, LayerTransferStats>> before_capture_;  // stats_ when capture began
  int group_depth_ = 0;
  std::chrono::steady_clock::time_point group_start_;
};

}  // namespace afd::connector
