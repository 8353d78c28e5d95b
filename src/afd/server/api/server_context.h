// What every endpoint handler of the ApiServer shares: the options, the engine, the tokenizer
// and chat template (either may be null), the metrics, and the bookkeeping of sequences that
// are in the engines (for the waiting-queue limit and for Stop()).
//
// Thread safety: every member function may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>
#include <set>
#include <string>

#include "afd/common/thread_annotations.h"
#include "afd/common/work_queue.h"
#include "afd/server/api/api_server.h"
#include "afd/server/api/serving_metrics.h"
#include "afd/server/engine_client.h"
#include "afd/text/chat_template/chat_template.h"
#include "afd/text/tokenizer/tokenizer.h"

namespace afd::server::api {

class ServerContext {
 public:
  ServerContext(ApiServerOptions options, EngineClient& engine, const text::Tokenizer* tokenizer,
                const text::ChatTemplate* chat_template);

  const ApiServerOptions& options() const { return options_; }
  EngineClient& engine() const { return engine_; }
  const text::Tokenizer* tokenizer() const { return tokenizer_; }
  const text::ChatTemplate* chat_template() const { return chat_template_; }
  ServingMetrics& metrics() { return metrics_; }
  const std::string& model_name() const { return options_.served_model_names.front(); }

  // 404 unless `name` is empty or one of the served model names.
  void CheckModel(const std::string& name) const;

  // A fresh engine sequence id, registered as live.
  uint64_t RegisterSequence();
  // Its final output arrived.
  void SequenceFinished(uint64_t id);
  // Admission: 503 with Retry-After when the engines have failed (EngineClient::Failure), or,
  // under max_waiting_requests, when the engine's waiting count
  // (which includes sequences still on their way to an engine) has reached it. Else returns a
  // lock to hold until the request's sequences are submitted, so that the next request's check
  // counts them; admissions are serialized only when a limit is set (else the lock is empty).
  std::unique_lock<std::mutex> AdmitRequest();
  // Aborts every live sequence in the engine.
  void AbortAll();

  // A random seed (requests without a seed) and a random hex id ("cmpl-<32 hex>").
  uint64_t RandomSeed();
  std::string RandomId(const std::string& prefix);

  std::atomic<bool> shutting_down{false};
  std::atomic<int64_t> in_flight{0};  // requests being answered
  // A KV producer's: the port its transfer server listens on (set by ApiServer::Start) and the
  // engine id its responses announce (kv_transfer_config.engine_id, else a random one).
  std::atomic<int> kv_port{0};
  const std::string& kv_engine_id() const { return kv_engine_id_; }
  // A KV consumer's pull threads (kv_pulls.h; set by ApiServer before it starts, null for other
  // servers).
  WorkQueue* kv_pulls = nullptr;

 private:
  ApiServerOptions options_;
  EngineClient& engine_;
  const text::Tokenizer* tokenizer_;
  const text::ChatTemplate* chat_template_;
  ServingMetrics metrics_;
  std::string kv_engine_id_;

  std::mutex admission_mu_;  // held from a request's admission check to its last Submit
  mutable Mutex mu_;
  uint64_t next_id_ AFD_GUARDED_BY(mu_) = 1;
  std::set<uint64_t> live_ AFD_GUARDED_BY(mu_);
  std::mt19937_64 rng_ AFD_GUARDED_BY(mu_);
};

}  // namespace afd::server::api
