// The FFN role's loop over the asynchronous window connector: no control plane. It
// polls its window and serves work items -- one MoE layer of one micro-batch of one attention
// replica -- in arrival order, whichever replica and layer they belong to. A work item arrives
// already routed and grouped by local expert, so nothing is routed here: the rows run through
// this rank's experts unweighted (GroupedExpertMlp), its round-robin share of tokens through the
// shared experts, and both go back to the sender, which weights and combines them. FFN ranks do
// not talk to each other.
//
// A poll that finds nothing returns after recv_poll_timeout_ms, checking for an abort and for
// exited peers; the loop ends once every attention rank has sent its shutdown slot, and then
// announces its own to every attention rank.
//
// Gathering (connector_extra_config.ffn_gather, several attention ranks): the items of several
// senders for the same (layer, stage, flags) are served together -- their rows concatenated
// (each sender's share for the shared experts first), one MoePermute and one expert pass, so
// the routed experts' weights are read once, then each sender's partial sums combined straight
// into its reply slot. Items already there are taken at once; a sender expected to send the
// same layer next is awaited, and a sender behind is served first while the item ahead of it is
// held, so that ranks out of step fall into step (roles/ffn_gather.h; every wait bounded by
// the sender's own pace and ffn_gather_wait_us).
// Partial-sum replies only (per-pair replies, the CPU's exact mode with several FFN ranks,
// stay per item). Every row's result is the same as served alone on the CPU (its ops are
// batch-invariant), so the CPU stays byte-identical to the monolithic model.
//
// CUDA graphs (a GPU backend with graphs and a device-sequenced connector): a work item (or a
// gathered group) whose header carries kSlotGraph -- sent by a graph replay of the attention's
// decode step -- is served from a graph of this rank keyed by (stage, layer, flags, and each
// member's sender and tokens): the first item of a key runs eagerly (sizing the memory), the
// second is captured and replayed, later ones replay (one launch instead of ~15 per sender; the
// replies' headers and flags are written by the graph, their echoes read on the device). An
// item without kSlotGraph (a prefill, an eager step) always runs eagerly, whatever its token
// count.
//
// The next item ahead (one attention rank, one ring slot: no micro-batches): a graphed decode
// step of the attention sends every MoE layer in order with the same token count, so once the
// host has launched layer l's graph it enqueues, behind it on the stream, a device wait for the
// slot's next message (AsyncConnector::Claim: its header -- layer l', tokens, flags,
// counts, seq -- checked on the device, the failure named by the host) and the graph of the
// next MoE layer l' with the same key. The stream then starts layer l' the moment its rows land,
// without the host's poll-and-launch hop; the host sees the claimed slot later and enqueues the
// one after. The step's last MoE layer is not followed ahead (the next step may differ), so the
// host launches each step's first layer itself.
//
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/connector/async_connector.h"
#include "afd/model/model.h"
#include "afd/roles/ffn_gather.h"
#include "afd/roles/ffn_graph_cache.h"
#include "afd/roles/ffn_role.h"

namespace afd::roles {

class AsyncFfnWorker : public FfnRole {
 public:
  // `model` must hold this rank's routed experts [expert_begin, expert_end) of the connector
  // and the shared experts. All arguments must outlive the worker.
  AsyncFfnWorker(const model::MoeModel& model, comm::AfdWorld& world,
                 connector::AsyncConnector& connector, bool graphs = true);
  ~AsyncFfnWorker() override;

  // Serves work items until every attention rank has shut down. Returns the number served.
  int64_t Run() override;
  ExpertRange experts() const override { return {begin_, end_}; }
  // rows, graph_items, items_ahead, gathered_items, groups, graph_captures.
  std::vector<std::pair<std::string, int64_t>> Counters() const override;

  int64_t rows_served() const { return rows_served_; }
  int64_t graph_items() const { return graph_items_; }  // work items replayed from graphs
  int64_t items_ahead() const { return items_ahead_; }  // of those: enqueued ahead of their rows
  int64_t num_captures() const { return graphs_ ? graphs_->num_captures() : 0; }
  int64_t gathered_items() const { return gathered_items_; }  // served in a group of several
  int64_t groups() const { return groups_; }                  // such groups
  int64_t expert_begin() const { return begin_; }
  int64_t expert_end() const { return end_; }

 private:
  using Group = std::vector<connector::SlotHeader>;  // one item per sender, by sender
  // Throws naming the sender when `h` is not a work item this rank can serve.
  void Validate(const connector::SlotHeader& h) const;
  // Whether `in` may be served together with other senders' items.
  bool Gatherable(const connector::ReceivedSlot& in) const;
  // Book-keeping of an item received (its arrival time, SenderLockstep).
  void Received(const connector::ReceivedSlot& in);
  // Every item that has arrived from a sender not `done`, appended to pending_.
  void CollectArrivals(const std::vector<bool>& done);
  // The group to serve next, taken out of pending_, whose front is a gatherable item: that
  // item, or an arrived one behind it (roles/ffn_gather.h), with the arrived items of the
  // same layer, stage and flags, after the bounded waits for senders expected there.
  Group Gather(const std::vector<bool>& done);
  void Serve(const Group& group);
  // The group's ops and replies, enqueued (scratch from ws).
  void Compute(std::span<const connector::SlotHeader> group, Workspace& ws);
  // Serves a kSlotGraph group: from its graph, captured on its key's second item (the first
  // runs eagerly in the graphs' memory, sizing it).
  void ServeFromGraph(const Group& group);

  const model::MoeModel& model_;
  comm::AfdWorld& world_;
  connector::AsyncConnector& connector_;
  int64_t begin_, end_;
  Workspace ws_;  // reset every work item
  bool gather_ = false;
  SenderLockstep lockstep_;
  std::deque<connector::ReceivedSlot> pending_;  // received while gathering, not served yet
  struct Key {
    int stage = 0, layer = 0, flags = 0;
    std::vector<std::pair<int, int>> members;  // (sender, tokens), by sender
    auto operator<=>(const Key&) const = default;
  };
  static Key KeyOf(const Group& group);
  // The item graphs, pooled by the group's tokens; null: every item eager.
  using Graphs = FfnGraphCache<connector::AsyncConnector, Key>;
  std::unique_ptr<Graphs> graphs_;
  // After `key`'s item was enqueued: the next MoE layer's item of the same sender and stage
  // claimed on the device and its graph enqueued behind the claim, when that graph exists.
  void FollowAhead(const Key& key);
  // A slot the device served ahead (Poll's claimed slot): its bookkeeping, and the next one.
  void ServeClaimed(const connector::ReceivedSlot& in);
  bool follow_ahead_ = false;  // one attention rank, ring depth 1, graphs
  struct Ahead {
    Key key;
    uint64_t seq = 0;
  };
  std::optional<Ahead> ahead_;  // the item claimed on the device and enqueued, if any
  int64_t rows_served_ = 0, graph_items_ = 0, items_ahead_ = 0;
  int64_t gathered_items_ = 0, groups_ = 0;
};

}  // namespace afd::roles
