// What the OpenAI frontend (server/api) needs from the engines behind it: submit a sequence,
// get its outputs as they are produced, abort it, and read load figures. Implemented in process
// (LocalEngineClient: one runtime::Engine on a thread) and over the attention replicas of a
// deployment (ReplicaEngineClient: DP replicas in worker processes, least outstanding work).
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "afd/runtime/request.h"

namespace afd::server {

// What the frontend must know of the model behind the engines.
struct EngineModelInfo {
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;  // prompt + new tokens at most
  std::vector<int32_t> eos_token_ids;
};

// Per-MoE-layer connector round trips (attention -> FFN -> attention) observed since start, as
// cumulative histogram buckets (Prometheus style); empty without a connector.
struct ConnectorRoundTrips {
  std::vector<double> bucket_bounds_s;  // upper bounds, ascending; +Inf implied
  std::vector<int64_t> bucket_counts;   // cumulative, bucket_bounds_s.size() + 1 entries
  int64_t count = 0;
  double sum_s = 0.0;
};

struct EngineLoad {
  runtime::EngineStats total;                 // summed over the engines
  std::vector<runtime::EngineStats> engines;  // one per engine (DP replica)
  ConnectorRoundTrips connector;
  // An engine in this process (LocalEngineClient), since it started: seconds its thread spent
  // in engine steps, and in handing their outputs to the front end (the requests' callbacks):
  // what the front end costs the engine. 0 where not measured (replicas in other processes).
  double step_seconds = 0;
  double delivery_seconds = 0;
};

class EngineClient {
 public:
  // Called on an engine thread, in order, once per produced output; the last one has
  // finished = true (also for an abort or an error). Must not block for long.
  using OutputCallback = std::function<void(const runtime::RequestOutput&)>;

  virtual ~EngineClient() = default;
  virtual const EngineModelInfo& model_info() const = 0;
  // Queues a sequence under a caller-chosen id unique among live requests. Parameters are
  // checked by the engine: a bad one ends the request with an error output, never a throw here.
  virtual void Submit(uint64_t id, runtime::RequestParams params, OutputCallback on_output) = 0;
  // Ends a live request (its final output has reason kAbort); unknown or finished ids are
  // ignored. Its KV blocks are freed.
  virtual void Abort(uint64_t id) = 0;
  // total.num_waiting counts the submitted sequences no engine has scheduled yet, those
  // still on their way to an engine included.
  virtual EngineLoad Load() const = 0;
  // True when every process of the deployment has joined and the engines run.
  virtual bool Ready() const = 0;
  // Empty while healthy; else why the engines stopped (a process died, ...). Requests in flight
  // then get error outputs.
  virtual std::string Failure() const = 0;

  // KV transfers (prefill/decode disaggregation, docs/pd.md): whether this client's engines can
  // hold and export rows (an engine in this process and a deployment's replicas can), the rows
  // a finished request with hold_kv_s > 0 keeps (read on the engine's thread within timeout_s;
  // throws afd::Error naming the request when it holds none), their release, and the model
  // and cache layout imported rows must have (valid once Ready()). device_ok: rows left in a
  // GPU cache may come as KvRows::device (a consumer on this host reads them over CUDA IPC).
  virtual bool SupportsKvTransfer() const { return false; }
  virtual std::shared_ptr<const runtime::KvRows> ExportHeldKv(uint64_t id, double timeout_s,
                                                              bool device_ok = false);
  virtual void ReleaseHeldKv(uint64_t id);
  virtual runtime::KvLayout kv_cache_layout() const;
};

}  // namespace afd::server
