// The `afd` object of --additional-config (the P2P connector guide's fields), parsed and validated
// once at the edge.
//
// Field                        Type                 Default                Rule
// role (alias afd_role)        "attention" | "ffn"  "attention"
// connector (afd_connector)    string               "P2pNcclAFDConnector"  one of kConnectorNames
// host (afd_host)              string               "127.0.0.1"            non-empty, no spaces
// port (afd_port)              integer              1239                   1..65535
// num_attention_ranks          integer              1                      1..kMaxRanksPerRole
// num_ffn_ranks                integer              1                      1..kMaxRanksPerRole
// compute_gate_on_attention    bool                 false (async: true)    async: must be true
// afd_process_group_timeout_s  integer              120                    1..86400
// async_dp (alias async)       bool                 false (async: true)    P2P: false; async: true
// connector_extra_config       object               {}                     connector's own schema
// ("async" = AsyncAFDConnector or GpuAsyncAFDConnector.)
//
// An alias given together with its canonical name must carry the same value. Unknown keys,
// wrong JSON types (no coercion: 1.0 is not an integer, "1" is not a number) and duplicate keys
// are errors. Every error names the field, the value and the rule.
#pragma once

#include <string>
#include <string_view>

#include "afd/topology/topology.h"

namespace afd {

inline constexpr std::string_view kP2pNcclConnector = "P2pNcclAFDConnector";
// The asynchronous window connector: windows chosen by the device (POSIX shared
// memory between CPU processes of one host; CUDA IPC on GPUs).
inline constexpr std::string_view kAsyncConnector = "AsyncAFDConnector";
// The same connector, on cuda only (the seed's name).
inline constexpr std::string_view kGpuAsyncConnector = "GpuAsyncAFDConnector";
// The P2P connector over the host (CPU) communicator: TCP between hosts.
inline constexpr std::string_view kP2pHostConnector = "P2pHostAFDConnector";

// connector_extra_config of the asynchronous connectors. Defaults apply when absent.
struct AsyncOptions {
  int attn_ranks_per_dp = 1;             // 1..num_attention_ranks, must divide it
  bool attn_ranks_per_dp_given = false;  // set in connector_extra_config (else derived)
  int ring_depth = 1;                    // 1..64; default = number of stages; >= number of stages
  bool ring_depth_given = false;         // set in connector_extra_config (else derived)
  double routed_cap_multiplier = 2.0;    // finite, 1.0..1024.0
  int recv_poll_timeout_ms = 1000;       // 1..3600000
  bool async_moe_ubatching = false;
  int async_moe_num_ubatches = 2;           // 2..8
  std::string async_moe_split = "request";  // "request" | "token"
  // Device rows (cuda): the flags are stored and awaited by the CUDA streams (no host
  // synchronization in a round trip); false: the host stores them after a stream sync and polls.
  bool device_flags = true;
  // Where device rows live (cuda): "cuda_ipc" -- CUDA IPC memory, processes of one node, several
  // may share a GPU; "nccl" -- NCCL symmetric memory (ncclMemAlloc + ncclCommWindowRegister),
  // one GPU per rank, peers reached over NVLink (LSA). CPU ranks refuse "nccl".
  std::string window = "cuda_ipc";
  // The MoE dispatch's token rows on the wire: "auto" -- the model's activation dtype (bf16 for a
  // bf16 model on a GPU, else f32: the exact path); "fp8" -- OCP E4M3 with one f32 scale per 128
  // elements of a row (DeepEP's FP8 dispatch: H + H / 32 bytes a row instead of 2 H), lossy.
  std::string dispatch_dtype = "auto";
  // FFN ranks: serve the work items of several attention ranks for the same MoE layer together
  // (one expert pass, the weights read once; partial-sum replies only, i.e. not the CPU's
  // per-pair replies with several FFN ranks). It waits for an attention rank expected at the
  // same layer and serves one behind first, holding the item ahead, so that ranks fall into
  // step; each wait: two of the rank's usual gaps between items + ffn_gather_wait_us
  // (0..1000000; 0: no waiting), at most max(it, 10 ms) (roles/ffn_gather.h).
  bool ffn_gather = true;
  int ffn_gather_wait_us = 200;

  // Number of MoE stages in flight per peer.
  int num_stages() const { return async_moe_ubatching ? async_moe_num_ubatches : 1; }
};

struct AfdConfig {
  Role role = Role::kAttention;
  std::string connector = std::string(kP2pNcclConnector);
  std::string host = "127.0.0.1";
  int port = 1239;
  int num_attention_ranks = 1;
  int num_ffn_ranks = 1;
  bool compute_gate_on_attention = false;
  int afd_process_group_timeout_s = 120;
  bool async_dp = false;
  AsyncOptions async_options;  // meaningful only when is_async()

  bool is_p2p() const { return connector == kP2pNcclConnector || connector == kP2pHostConnector; }
  bool is_async() const { return connector == kAsyncConnector || connector == kGpuAsyncConnector; }
  Topology topology() const { return Topology(num_attention_ranks, num_ffn_ranks); }
};

// Parses JSON text that is either a bare afd object or a whole --additional-config object with
// an "afd" key (other keys of a whole config belong to others and are left alone), applies
// defaults and validates. Throws afd::Error naming the field, value and rule.
AfdConfig ParseAfdConfig(std::string_view json_text);

// The normalized config: canonical names, every default filled in, as a JSON object text.
// connector_extra_config holds the connector's options ({} for the P2P connectors).
std::string AfdConfigToJson(const AfdConfig& config, int indent = 2);

// The asynchronous connectors' options that follow from a rank's flags, where
// connector_extra_config left them out (no effect on the P2P connectors):
//  * ring_depth at least 2 with --enable-dbo, which runs a step as two micro-batches, each in its
//    own ring slot per peer (the windows take the deepest ring any rank asks for, so an FFN
//    rank started without the flag pairs up);
//  * attn_ranks_per_dp = `attention_tp`, the attention role's tensor-parallel size, on attention
//    ranks (0: unknown here, e.g. on an FFN rank, which does not use it).
void DeriveConnectorOptions(bool dbo_enabled, int attention_tp, AfdConfig& config);

// Cross-field rules (connector vs. async_dp, extra config, gate placement). ParseAfdConfig calls
// it; exposed for configs built in code. Throws afd::Error.
void ValidateAfdConfig(const AfdConfig& config);

}  // namespace afd
