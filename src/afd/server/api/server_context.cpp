#include "afd/server/api/server_context.h"

#include <fmt/format.h>

#include <vector>

#include "afd/common/thread_annotations.h"
#include "afd/server/api/api_error.h"

namespace afd::server::api {

ServerContext::ServerContext(ApiServerOptions options, EngineClient& engine,
                             const text::Tokenizer* tokenizer,
                             const text::ChatTemplate* chat_template)
    : options_(std::move(options)),
      engine_(engine),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      metrics_(options_.served_model_names.front(), engine.model_info().max_model_len),
      rng_(std::random_device{}()) {
  if (options_.kv_transfer && !options_.kv_transfer->engine_id.empty()) {
    kv_engine_id_ = options_.kv_transfer->engine_id;
  } else {
    kv_engine_id_ = RandomId("afd-");
  }
}

void ServerContext::CheckModel(const std::string& name) const {
  if (name.empty()) return;
  for (const auto& served : options_.served_model_names) {
    if (served == name) return;
  }
  throw ApiError(404, fmt::format("The model `{}` does not exist.", name), "model");
}

uint64_t ServerContext::RegisterSequence() {
  MutexLock lock(mu_);
  const uint64_t id = next_id_++;
  live_.insert(id);
  return id;
}

void ServerContext::SequenceFinished(uint64_t id) {
  MutexLock lock(mu_);
  live_.erase(id);
}

std::unique_lock<std::mutex> ServerContext::AdmitRequest() {
  // Engines known to have failed (a replica or rank gone): 503 before anything is submitted or
  // a stream starts, as /health says.
  if (const std::string failure = engine_.Failure(); !failure.empty()) {
    throw ApiError(503, "the engines failed: " + failure);
  }
  const int64_t limit = options_.max_waiting_requests;
  if (limit <= 0) return {};
  std::unique_lock<std::mutex> admission(admission_mu_);
  const int64_t waiting = engine_.Load().total.num_waiting;
  if (waiting >= limit) {
    throw ApiError(503, fmt::format("The server is overloaded: {} sequences are waiting (limit "
                                    "--max-waiting-requests {}). Retry later.",
                                    waiting, limit));
  }
  return admission;
}

void ServerContext::AbortAll() {
  std::vector<uint64_t> ids;
  {
    MutexLock lock(mu_);
    ids.assign(live_.begin(), live_.end());
  }
  for (uint64_t id : ids) engine_.Abort(id);
}

uint64_t ServerContext::RandomSeed() {
  MutexLock lock(mu_);
  return rng_();
}

std::string ServerContext::RandomId(const std::string& prefix) {
  MutexLock lock(mu_);
  return prefix + fmt::format("{:016x}{:016x}", rng_(), rng_());
}

}  // namespace afd::server::api
