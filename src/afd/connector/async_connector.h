// The asynchronous window connector: no control plane, metadata in band, one-sided
// writes into symmetric windows (window.h), slots as in async_slot.h.
//
// Each rank owns one window. Attention rank a dispatches a micro-batch's rows for FFN rank f by
// writing slot (region a, ring stage) of f's window and then its flag; f serves it whenever it
// polls it and answers into slot (region f, ring stage) of a's window, echoing the dispatch's
// seq. Per (sender, ring slot) at most one message is in flight -- an attention rank sends a
// stage's next dispatch only after the previous one's reply, and an FFN rank replies only to a
// dispatch -- so ring_depth = number of stages suffices; a flag that jumps by more than one (a
// slot overwritten before it was read) is an error, as is a header whose seq is not the flag's.
// The receiver keeps a mirror of the flags it has seen (ABA-safe: seqs only grow).
//
// Capacities are agreed at construction: the token capacity is the largest
// max_num_batched_tokens of the attention ranks (published in the rendezvous store), routed_cap
// follows from it (async_slot.h). A slot that would not fit is an error naming the capacity, the
// sender and the receiver, never a truncation.
//
// Liveness: every wait has a deadline (afd_process_group_timeout_s for a reply; the poll
// timeout for the FFN loop), checks the deployment's abort key and whether a peer process has
// exited (the peer is named) about every 50 ms.
//
// Device sequencing (AsyncConnectorOptions::device_sequenced, GPU ranks whose device can map
// host memory): every in-place send and every wait for a reply is a one-thread kernel on the
// caller's stream whose sequence number is a counter in device memory (flag_kernels.h): the
// sender's kernel writes the header and then the flag, the receiver's kernel awaits the flag
// and checks the header (magic, version, seq, echo_seq, layer, counts) on the device. Nothing in
// a step waits for the host or is written by it, so a CUDA graph of the step replays with the
// right numbers every time; the host keeps a mirror of the counters (captures are counted by
// Replayed). The first failure of a device wait -- a timeout, a slot overwritten, a header that
// does not match, a peer that exited (seen by a watchdog thread, which fails the waits at once)
// -- is recorded in host-mapped memory and thrown by CheckDevice, naming the peer. A wait's own
// bound is 0.75 of afd_process_group_timeout_s, so that a host blocked on the stream whose
// check calls CheckDevice (Backend::WatchWaits) reports the device's cause first. The kernels
// write each header and flag twice -- into the host window, which host readers poll, and into
// the same offsets of the device window (whose flag and header areas the rows leave unused),
// which the wait kernels poll: device memory, so a poll costs no bus round trip.
//
// Thread safety: one thread at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/common/thread_annotations.h"
#include "afd/connector/async_slot.h"
#include "afd/connector/p2p_connector.h"
#include "afd/connector/shm_window.h"
#include "afd/connector/window.h"

#ifdef AFD_WITH_CUDA
#include "afd/connector/cuda/stream_flags.h"
#else
namespace afd::connector {
class StreamFlags {};  // device flags exist only in CUDA builds
}  // namespace afd::connector
#endif

namespace afd::connector {

struct AsyncConnectorOptions {
  // Attention: the most tokens of one micro-batch (its max_num_batched_tokens); FFN: 0 (the
  // capacity is the attention ranks' largest).
  int64_t token_cap = 0;
  int64_t topk = 1;         // experts per token
  int64_t num_experts = 1;  // routed experts, sharded over the F ranks by ExpertRangeOf
  RowFormat row{1, DType::kF32};
  // >= 0: the rows live in device memory of this CUDA device (a row window of CUDA IPC or NCCL
  // symmetric memory, as connector_extra_config.window says, next to the host window, which
  // keeps the flags, headers and indices); -1: everything in the host window.
  int cuda_device = -1;
  // With device rows: the caller's cudaStream_t that produces the rows it sends and consumes the
  // rows it receives. Given (and the device can run stream memory operations), the flags are
  // device-side: Send enqueues the row copies and then the flag store on this stream and returns
  // without a host wait, and EnqueueWait makes the stream itself wait for a reply's flag
  // (stream_flags.h). Null: the rows are copied on the window's stream, which Send
  // synchronizes before the host stores the flag (the caller synchronizes its own stream first).
  void* cuda_stream = nullptr;
  // Host rows (CPU ranks): the same stream-ordered protocol with the calling thread as the
  // "stream" (the CPU backend runs ops inline): EnqueueWait waits on the host at once and the
  // reply is received and checked later, as on a GPU -- one runner path, exercised on the CPU.
  bool inline_flags = false;
  // With cuda_stream: device sequencing (above), when the device can map host memory (else the
  // host flags). Sends are in place (or a shutdown); replies are awaited by EnqueueWait with
  // what they must say, and checked on the device.
  bool device_sequenced = false;
};

// What an awaited slot's header must say (device sequencing; sender and stage are the wait's).
struct ExpectedSlot {
  uint16_t flags = 0;
  int layer = 0;
  int num_tokens = 0;
  int64_t routed_rows = 0, shared_rows = 0, table_entries = 0;
};

// What a sender writes into one slot (copied before Send returns): indices in host memory, rows
// in host memory or, with device rows, in device memory of the connector's CUDA device. Or, with
// `in_place`, only the header: the index table and the rows were written straight into the
// peer's slot (PeerSlot) by the sender's own ops -- the MoE exchange, whose counts stay on the
// device -- and the counts below say how much of each region the receiver may read.
struct SlotPayload {
  int layer = 0;
  int stage = 0;
  int num_tokens = 0;
  uint16_t flags = 0;  // kSlotCombine for replies
  uint64_t echo_seq = 0;
  std::span<const int32_t> expert_counts;  // routed rows per local expert of the FFN rank
  std::span<const int32_t> route;          // token index of each routed row
  const void* routed_rows = nullptr;       // [route.size(), row]
  std::span<const int32_t> shared_index;   // token index of each shared row
  const void* shared_rows = nullptr;       // [shared_index.size(), row]
  bool in_place = false;
  int64_t table_entries = 0, routed_count = 0, shared_count = 0;  // in_place only
  int64_t payload_bytes = 0;  // in_place: the bytes written into the slot (the stats)
  // Device sequencing, replies: echo_seq is read on the device from the header of the slot
  // being answered (this rank's slot (peer, stage)) when the send runs, not given here.
  bool echo_received = false;
};

// A slot received in this rank's window: views valid until its sender writes that slot again
// (for a dispatch: until the reply is sent; for a reply: until the next dispatch of the stage).
struct ReceivedSlot {
  SlotHeader header{};
  const int32_t* expert_counts = nullptr;  // [header.num_experts]
  const int32_t* route = nullptr;          // [header.routed_rows]
  char* routed_rows = nullptr;             // [header.routed_rows, row] (device memory with
                                           // device rows)
  const int32_t* shared_index = nullptr;   // [header.shared_rows]
  char* shared_rows = nullptr;             // [header.shared_rows, row]
  // Poll: a slot claimed by a device wait (AsyncConnector::Claim): only the header's
  // sender, stage and seq are set, nothing else is read.
  bool claimed = false;
  bool shutdown() const { return !claimed && (header.flags & kSlotShutdown) != 0; }
};

class AsyncConnector {
 public:
  // Collective over the world: agrees on the capacities, creates and maps the windows.
  AsyncConnector(comm::AfdWorld& world, const AsyncConnectorOptions& options);
  ~AsyncConnector();

  const SlotLayout& layout() const { return layout_; }
  const Topology& topology() const { return world_.topology(); }
  const Window& window() const { return *window_; }
  bool device_rows() const { return data_window_ != nullptr; }
  // Routed experts of FFN rank f: ExpertRangeOf(E, F, f) (topology/expert_range.h).
  int64_t expert_begin(int ffn_rank) const;
  int64_t num_local_experts(int ffn_rank) const;

  // Writes `p` into slot (this rank, p.stage) of `peer`'s window (peer: role rank of the other
  // role), then its flag. Returns the slot's seq. Throws when it does not fit. With device flags
  // the rows may still be in production on the stream: copies and flag follow them there.
  uint64_t Send(int peer, const SlotPayload& p);
  // True when flags are awaited in stream order (AsyncConnectorOptions::cuda_stream, or
  // inline_flags on the CPU): the receiver calls EnqueueWait, then Receive later.
  bool device_flags() const { return stream_flags_ != nullptr || options_.inline_flags; }
  // Device flags only: enqueues on the stream a wait for `peer`'s next slot in ring `stage`
  // (the reply to the dispatch just sent); work enqueued after it may read that slot's rows
  // (RowsOf). The host still calls Receive for the slot later, which checks it (bounded by the
  // timeout, naming a dead peer); a wait still pending when the connector is destroyed is
  // released so that the stream drains. Inline flags (CPU): waits here, bounded the same way.
  void EnqueueWait(int peer, int stage, const ExpectedSlot& expect = {});
  // Device sequencing: sends and waits are device kernels (see above).
  bool device_sequenced() const { return device_seqs_ != nullptr; }
  // For the log of a failed deployment: per peer and ring, the seqs this rank sent and consumed
  // (host counters; with device sequencing the device's counters too), the flag the peer stored
  // here and the one this rank stored there (shared memory; and the device mirrors), and
  // whether this rank's stream is idle. Device reads are bounded (a second): never hangs.
  std::string DescribeState() const;
  // Device sequencing: throws the first failure of a device wait, naming the peer (call after
  // the stream has passed the waits, e.g. after a step's results reached the host).
  void CheckDevice() const;
  // Device sequencing: the sends and waits enqueued between BeginCapture and EndCapture are
  // being captured into a CUDA graph, not run: the host's mirror of the sequence numbers and the
  // stats are left as they were, and EndCapture returns what one replay adds to them, which the
  // caller passes to Replayed after every replay.
  struct Captured {
    std::vector<uint64_t> sends, waits;  // per (peer, ring)
    struct Stat {
      int layer;
      uint64_t bytes, tokens;
    };
    std::vector<Stat> stats;
  };
  void BeginCapture();
  Captured EndCapture();
  void Replayed(const Captured& captured);
  bool capturing() const { return capturing_; }
  // Where the rows of slot (region, ring) of this rank's window are (device memory with device
  // rows), known before the slot arrives.
  // With device rows the index table of an in-place payload lives there too (table).
  struct RowViews {
    char* routed = nullptr;
    char* shared = nullptr;
    int32_t* table = nullptr;
    float* row_scales = nullptr;  // the routed rows' FP8 group scales (kSlotFp8Rows)
  };
  RowViews RowsOf(int region, int ring) const;
  // Where this rank writes an in-place payload for `peer` in ring `ring`: slot (this rank,
  // ring) of the peer's copy (device memory with device rows, else the shared host window).
  RowViews PeerSlot(int peer, int ring) const;
  // Waits for `peer`'s next slot in ring `stage` (bounded by afd_process_group_timeout_s);
  // `what` says what is awaited, for errors: called only to word one (no formatting on the
  // round trip's path). A shutdown slot is returned as such.
  using Describe = std::function<std::string()>;
  ReceivedSlot Receive(int peer, int stage, const Describe& what);
  ReceivedSlot Receive(int peer, int stage, const std::string& what) {
    return Receive(peer, stage, Describe([&what] { return what; }));
  }
  // The next new slot from any peer (scan start rotates), or nullopt when none arrived within
  // timeout_ms (after checking for an abort and for exited peers).
  std::optional<ReceivedSlot> Poll(int timeout_ms);
  // The next slot of `peer` in ring `stage` if it has arrived (its flag moved past the one
  // consumed), else nullopt at once: no wait (the FFN gathering the senders' items of one layer).
  // Not for a slot claimed by a device wait.
  std::optional<ReceivedSlot> TryReceive(int peer, int stage);
  // The receiver of dispatches (an FFN rank), device sequencing: enqueues on the stream a
  // bounded wait for the message of seq `seq` (the one after the last consumed: SeenSeq + 1) in
  // slot (peer, stage) and the device check of its header against `expect` (flags, layer,
  // counts; sender, stage and seq are the claim's). Work enqueued after it runs when that
  // message lands: the host is not on its path. Poll then returns the slot as `claimed`
  // without reading it (the device checked it, and its sender may have overwritten it with its
  // next message by then). One claim per slot at a time; not while capturing. Inline flags
  // (CPU): the same with the calling thread as the stream -- waits here (bounded, naming the
  // peer) and checks the header on the host; a mismatch throws naming the field.
  void Claim(int peer, int stage, uint64_t seq, const ExpectedSlot& expect);
  // The seq of the last message consumed from slot (peer, stage) (received, polled or waited
  // for).
  uint64_t SeenSeq(int peer, int stage) const;
  // Sends a shutdown slot to every peer of the other role (ring 0).
  void AnnounceShutdown();

  // Marks `peer` as gone on purpose (it sent its shutdown): its exit is no longer an error.
  void PeerFinished(int peer);
  const std::map<int, LayerTransferStats>& stats() const { return stats_; }
  // Seconds spent waiting for replies, per layer, are charged by Receive.

 private:
  int OppositeWorldRank(int peer) const;
  int num_peers() const;
  ReceivedSlot Read(int region, int ring, uint64_t seq, const Describe& what);
  void CheckPeers(const std::string& what);
  // Waits on the host until `peer`'s flag of ring `stage` moves past the seen one (bounded by
  // afd_process_group_timeout_s, checking for an abort and exited peers); does not consume it.
  void AwaitFlagOnHost(int peer, int stage, const Describe& what);
  // Device flags (stream_flags.h): the flag store after a send's copies, the stream wait for a
  // reply, and the release of waits left pending at destruction.
  void DeviceStoreFlag(int world_rank, size_t offset, uint64_t seq);
  void DeviceAwaitFlag(size_t offset, uint64_t seq);
  void ReleaseDeviceWaits();
  // The device-wait watchdog (a thread while device flags are in use): a stream wait for a
  // flag that has not come afd_process_group_timeout_s after it was enqueued is released (the
  // awaited value stored into this rank's own flag, so that the stream and any host sync behind
  // it drain) and recorded; the next call on this connector then throws naming the peer.
  void WatchDeviceWaits();
  void ThrowIfDeviceWaitExpired() const;
  // Device sequencing: registers the flag and header pages the kernels touch; the send.
  void RegisterSlotPages(const std::vector<int>& peers);
  void PublishOnDevice(int peer, int world_rank, size_t slot, const std::vector<char>& header,
                       bool echo_received, int ring);
  // Device sequencing: `world_rank`'s device window, whose flag and header areas (unused by the
  // rows) hold a mirror of its host window's flags and headers: the device kernels publish into
  // both and wait on the mirror (device memory: no bus round trip per poll); the host reads the
  // host window.
  char* DeviceMirror(int world_rank) const;
  // Device sequencing: the AwaitSlot kernel for slot (peer, stage) on the stream, polling the
  // mirror: the slot after the counter `seen`, or the slot of `seq` when `seen` is null.
  void AwaitSlotOnDevice(int peer, int stage, uint64_t* seen, uint64_t seq,
                         const uint64_t* echo_counter, const ExpectedSlot& expect);
  std::string PeerName(int peer) const;

  comm::AfdWorld& world_;
  AsyncConnectorOptions options_;
  SlotLayout layout_;
  std::unique_ptr<Window> window_;             // flags, headers, indices (and host rows)
  std::unique_ptr<Window> data_window_;        // device rows (CUDA IPC or NCCL), or null
  ShmWindow* shm_ = nullptr;                   // window_ as the shared-memory window it is
  std::unique_ptr<StreamFlags> stream_flags_;  // device-side flags, or null
  std::vector<uint64_t> device_wait_;  // [region * ring_depth + ring]: seq a stream waits for
                                       // that the host has not received yet, 0 when none
  std::vector<uint64_t> send_seq_;     // [peer * ring_depth + ring]
  std::vector<char> header_;           // Send's header bytes
  std::vector<uint64_t> seen_;         // [region * ring_depth + ring], the flags already consumed
  std::vector<uint64_t> claimed_;      // [region * ring_depth + ring]: Claim's seq, or 0
  std::unique_ptr<std::atomic<bool>[]> finished_;  // [peer] (read by the watchdog)
  // Device sequencing: counters in device memory, [peer * ring_depth + ring] sends then waits.
  uint64_t* device_seqs_ = nullptr;
  bool capturing_ = false;
  std::atomic<uint64_t> waits_enqueued_{0};  // device waits enqueued or replayed (watchdog)
  Captured capture_base_;                    // the mirrors when the capture began
  std::vector<Captured::Stat> captured_stats_;
  int poll_start_ = 0;
  std::map<int, LayerTransferStats> stats_;
  // The watchdog's view of device_wait_ (the seq, and when it was enqueued in steady-clock ns).
  std::unique_ptr<std::atomic<uint64_t>[]> watched_seq_;
  std::unique_ptr<std::atomic<int64_t>[]> watched_since_;
  std::vector<std::string> peer_names_;  // PeerName(p), formatted once for the watchdog
  std::atomic<bool> watchdog_stop_{false};
  std::atomic<bool> device_wait_expired_{false};
  mutable Mutex watchdog_mu_;
  std::condition_variable_any watchdog_cv_;
  std::string device_wait_failure_ AFD_GUARDED_BY(watchdog_mu_);
  std::thread watchdog_;
};

}  // namespace afd::connector
