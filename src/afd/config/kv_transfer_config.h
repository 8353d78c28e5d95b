// `--kv-transfer-config` (vLLM's flag) for prefill/decode disaggregation (docs/pd.md):
//   {"kv_connector": "AfdKvConnector", "kv_role": "kv_producer" | "kv_consumer" | "kv_both",
//    "kv_ip": "127.0.0.1", "kv_port": 14579, "engine_id": "...",
//    "kv_connector_extra_config": {"hold_timeout_s": 480, "transfer_timeout_s": 60,
//                                  "transport": "tcp" | "cuda_ipc"}}
// Unknown fields, connectors and roles are refused by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace afd {

struct KvTransferConfig {
  enum class Role { kProducer, kConsumer, kBoth };
  Role role = Role::kBoth;
  // Where a producer's KV server listens, announced to consumers as remote_host.
  std::string kv_ip = "127.0.0.1";
  int kv_port = 14579;               // vLLM NixlConnector's default side channel port
  std::string engine_id;             // remote_engine_id a producer announces ("" : generated)
  double hold_timeout_s = 480.0;     // held rows freed after this (vLLM's abort timeout)
  double transfer_timeout_s = 60.0;  // a consumer's pull, connect to last byte
  // How rows travel. tcp: through host memory over the KV server's socket (any hosts).
  // cuda_ipc: a producer keeps a request's rows in its GPU cache until they are read; a
  // consumer on the producer's host (GPU engines on both sides) copies them device to device
  // over CUDA IPC, any other consumer gets them over tcp.
  enum class Transport { kTcp, kCudaIpc };
  Transport transport = Transport::kTcp;
  // kv_load_failure_policy (vLLM's): a consumer whose pull fails ends the request with a 502
  // (fail, vLLM's default) or computes the whole prompt itself (recompute).
  enum class LoadFailurePolicy { kFail, kRecompute };
  LoadFailurePolicy load_failure_policy = LoadFailurePolicy::kFail;
  // vLLM keys accepted for its recipes but meaningless for this connector (kv_buffer_device,
  // kv_buffer_size, kv_rank, kv_parallel_size, enable_permute_local_kv), each with why: the
  // server logs them as ignored.
  std::vector<std::string> ignored;

  bool produces() const { return role != Role::kConsumer; }
  bool consumes() const { return role != Role::kProducer; }
};

// Parses the flag's JSON; throws afd::Error naming the field ("kv_transfer_config.kv_role: ...").
KvTransferConfig ParseKvTransferConfig(const std::string& json_text);

}  // namespace afd
