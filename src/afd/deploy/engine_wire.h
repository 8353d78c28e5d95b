// The engine channel between the OpenAI frontend (server/replica_engine_client.h) and the
// attention replicas it feeds (deploy/replica_serve.h): one TCP connection per replica, frames
// of [u32 little-endian body length][JSON body][optional: NUL, binary attachment (KV rows)].
// docs/wire_formats.md lists the messages. Frontend -> replica: challenge (once, on accept),
// then submit (with imported KV rows attached, for a KV consumer), abort, export_kv and
// release_kv (a KV producer's held rows), shutdown, or refused (a hello that did not prove the
// join secret). Replica -> frontend: hello (once, after the challenge), step (the outputs of one
// engine step and the replica's load), kv_rows (the answer to export_kv).
// Thread safety: FrameConnection's Send may be called from several threads (it locks); Poll
// from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "afd/comm/socket.h"
#include "afd/runtime/request.h"

namespace afd::deploy {

// Large enough for the KV rows of a long prompt (DeepSeek-V2-Lite's bf16 rows: 31 KB per token).
inline constexpr uint32_t kMaxEngineFrameBytes = 1u << 30;
// The largest KV rows a frame carries (the rest of the frame's room: its JSON, a prompt's ids).
inline constexpr size_t kMaxKvAttachmentBytes = kMaxEngineFrameBytes - (size_t{32} << 20);

// A framed connection with a receive buffer.
class FrameConnection {
 public:
  FrameConnection(comm::Socket socket, std::string peer);
  // Sends one frame; throws afd::Error naming the peer when the connection is lost or the
  // frame cannot leave within timeout_s.
  void Send(const std::string& body, double timeout_s);
  // The next whole frame, waiting up to timeout_s (0: only what has arrived); nullopt when none
  // arrived in time. Throws afd::Error naming the peer on EOF, reset or a malformed frame.
  std::optional<std::string> Poll(double timeout_s);
  const std::string& peer() const { return peer_; }
  // The largest frame Poll accepts (kMaxEngineFrameBytes by default); a larger one is an error
  // before its bytes are buffered. A listener lowers it until the peer has authenticated.
  void set_max_frame_bytes(uint32_t bytes) { max_frame_bytes_ = bytes; }
  int fd() const { return socket_.fd(); }
  void Close() { socket_.Close(); }

 private:
  std::optional<std::string> TakeFrame();
  comm::Socket socket_;
  std::string peer_;
  std::mutex send_mu_;
  std::string buffer_;
  uint32_t max_frame_bytes_ = kMaxEngineFrameBytes;
};

// Frontend -> replica, first frame on every connection: a fresh nonce the replica's hello must
// prove the join secret over (EngineHelloProof), and whether the frontend has a secret.
struct EngineChallenge {
  std::string nonce;  // hex
  bool secret = false;
};

// The proof a replica's hello carries: hex HMAC-SHA256(secret, "afd engine hello" | nonce |
// dp_rank); "" without a secret.
std::string EngineHelloProof(const std::optional<std::string>& secret, const std::string& nonce,
                             int dp_rank);

// Replica -> frontend, first frame.
struct ReplicaHello {
  int dp_rank = 0;
  std::string proof;  // EngineHelloProof of the challenge's nonce
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
  std::vector<int32_t> eos_token_ids;
  int64_t kv_blocks = 0;
  runtime::KvLayout kv_layout;  // what imported KV rows must be (model fingerprint, rows)
};

// Per-MoE-layer connector round trips since the previous report: counts in fixed buckets.
struct RoundTripReport {
  std::vector<int64_t> bucket_counts;  // kRoundTripBounds.size() + 1
  double sum_s = 0;
  int64_t count = 0;
};
// Upper bounds (seconds) of the round-trip histogram buckets; the last bucket is +Inf.
const std::vector<double>& RoundTripBounds();

struct EngineMessage {
  // challenge / refused: frontend -> replica, before and instead of serving it.
  enum class Kind {
    kSubmit,
    kAbort,
    kShutdown,
    kHello,
    kStep,
    kChallenge,
    kRefused,
    kExportKv,   // frontend -> replica: send the rows request `id` holds
    kReleaseKv,  // frontend -> replica: free them (the consumer has them)
    kKvRows,     // replica -> frontend: the rows (kv), or why there are none (why)
  };
  Kind kind = Kind::kSubmit;
  uint64_t id = 0;                            // submit, abort, export_kv, release_kv, kv_rows
  runtime::RequestParams params;              // submit (imported_kv attached)
  std::shared_ptr<const runtime::KvRows> kv;  // kv_rows (null: see why)
  bool device_ok = false;  // export_kv: rows in the GPU cache may be described (KvRows::device)
  ReplicaHello hello;      // hello
  std::vector<runtime::RequestOutput> outputs;  // step
  runtime::EngineStats stats;                   // step
  RoundTripReport round_trips;                  // step
  EngineChallenge challenge;                    // challenge
  std::string why;                              // refused, kv_rows without rows
};

const char* EngineMessageKindName(EngineMessage::Kind kind);  // "submit", ...
std::string EncodeEngineMessage(const EngineMessage& m);
// Throws afd::Error naming `from` for malformed input.
EngineMessage DecodeEngineMessage(const std::string& body, const std::string& from);

}  // namespace afd::deploy
