#include "afd/server/api/kv_pulls.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "afd/common/error.h"
#include "afd/pd/kv_transport.h"
#include "afd/server/api/api_error.h"
#include "afd/server/api/http_util.h"

namespace afd::server::api {

namespace {
// A release of held rows is best effort: a producer gone or slow keeps them to its timeout.
constexpr double kReleaseTimeoutSeconds = 2;
}  // namespace

DeferredResponse::DeferredResponse(std::shared_ptr<ServerContext> ctx, bool streamed)
    : ctx_(std::move(ctx)), streamed_(streamed) {}

DeferredResponse::~DeferredResponse() {
  bool release;
  {
    MutexLock lock(mu_);
    release = owns_count_ && result_.pending == nullptr;
  }
  if (release) --ctx_->in_flight;  // (else the generation it became holds the count)
}

void DeferredResponse::TakeInFlightCount() {
  MutexLock lock(mu_);
  owns_count_ = true;
}

void DeferredResponse::SetWaker(std::function<void()> wake) {
  MutexLock lock(mu_);
  wake_ = std::move(wake);
}

bool DeferredResponse::gone() const {
  MutexLock lock(mu_);
  return gone_;
}

void DeferredResponse::Become(HandlerResult result) {
  std::function<void()> wake;
  std::shared_ptr<PendingResponse> inner;
  bool gone;
  {
    MutexLock lock(mu_);
    result_ = std::move(result);
    ready_ = true;
    wake = wake_;
    inner = result_.pending;
    gone = gone_;
  }
  if (gone) {
    // The client left meanwhile: its connection no longer pumps this; end the generation here.
    if (inner) inner->ClientGone();
    return;
  }
  if (wake) wake();
}

void DeferredResponse::ClientGone() {
  std::shared_ptr<PendingResponse> inner;
  {
    MutexLock lock(mu_);
    gone_ = true;
    inner = result_.pending;
  }
  if (inner) inner->ClientGone();
}

bool DeferredResponse::Pump(std::string* out, HttpResponse* response) {
  std::shared_ptr<PendingResponse> inner;
  std::function<void()> wake;
  HttpResponse whole;
  {
    MutexLock lock(mu_);
    if (!ready_) return false;
    inner = result_.pending;
    wake = wake_;
    if (!inner) whole = result_.response;
  }
  if (inner) {
    if (!inner_started_) {
      inner_started_ = true;
      AFD_CHECK(inner->streamed() == streamed_, "a deferred {} response became a {} one",
                streamed_ ? "streamed" : "whole", inner->streamed() ? "streamed" : "whole");
      inner->SetWaker(std::move(wake));
    }
    return inner->Pump(out, response);
  }
  if (!streamed_) {
    *response = std::move(whole);
    return true;
  }
  // A stream already answered 200: its error as an event (vLLM's error chunk), then the end.
  *out += "data: " + whole.body + "\n\n" + "data: [DONE]\n\n";
  return true;
}

void ReleaseUnpulled(ServerContext& ctx, const SamplingRequest& r) {
  if (ctx.kv_pulls == nullptr) return;
  ctx.kv_pulls->Post([host = r.kv.remote_host, port = r.kv.remote_port, id = r.kv.remote_request_id,
                      secret = ctx.options().kv_secret] {
    try {
      pd::ReleaseKvRows(host, port, id, secret, kReleaseTimeoutSeconds);
    } catch (const Error&) {
    }
  });
}

std::shared_ptr<const runtime::KvRows> PullKvRows(ServerContext& ctx, const SamplingRequest& r) {
  const ApiServerOptions& o = ctx.options();
  const runtime::KvLayout expect = ctx.engine().kv_cache_layout();
  try {
    const auto start = std::chrono::steady_clock::now();
    const bool accept_device = o.kv_transfer->transport == KvTransferConfig::Transport::kCudaIpc;
    auto rows = std::make_shared<runtime::KvRows>(
        pd::FetchKvRows(r.kv.remote_host, r.kv.remote_port, r.kv.remote_request_id, expect,
                        o.kv_secret, o.kv_transfer->transfer_timeout_s, accept_device));
    const int64_t bytes =
        rows->device ? rows->expected_bytes() : static_cast<int64_t>(rows->bytes.size());
    if (rows->device) {
      // Left in the producer's GPU cache: released when the engine has copied them (or the
      // request ends without), i.e. when the last copy of the rows goes.
      rows->release_token = std::shared_ptr<void>(
          nullptr, [host = r.kv.remote_host, port = r.kv.remote_port, id = r.kv.remote_request_id,
                    secret = o.kv_secret](void*) {
            std::thread([host, port, id, secret] {
              try {
                pd::ReleaseKvRows(host, port, id, secret, kReleaseTimeoutSeconds);
              } catch (const Error&) {  // the producer frees them at its hold timeout
              }
            }).detach();
          });
    }
    ctx.metrics().OnKvPull(
        bytes, rows->positions,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
        rows->device.has_value());
    return rows;
  } catch (const Error& e) {
    ctx.metrics().OnKvPullFailed();
    ReleaseUnpulled(ctx, r);
    throw ApiError(502,
                   fmt::format("the KV transfer from the prefill instance failed: {}", e.what()),
                   "kv_transfer_params");
  }
}

HandlerResult RunWithKvRows(const std::shared_ptr<ServerContext>& ctx, const SamplingRequest& r,
                            size_t num_prompts, WithKvRows finish) {
  if (!r.kv.remote_prefill) return finish(nullptr);
  if (num_prompts != 1) {
    ThrowBadRequest("kv_transfer_params", "KV transfers take one prompt, got {}", num_prompts);
  }
  WorkQueue* pool = ctx->kv_pulls;
  AFD_CHECK(pool != nullptr, "a decode leg on a server that is not a KV consumer");
  auto deferred = std::make_shared<DeferredResponse>(ctx, r.stream);
  std::weak_ptr<DeferredResponse> weak = deferred;
  const bool queued = pool->Post([ctx, r, finish = std::move(finish), weak] {
    const std::shared_ptr<DeferredResponse> d = weak.lock();
    if (!d || d->gone()) {  // the client left before its pull started
      ReleaseUnpulled(*ctx, r);
      return;
    }
    HandlerResult result;
    try {
      if (ctx->shutting_down) throw ApiError(503, "the server is shutting down");
      std::shared_ptr<const runtime::KvRows> rows;
      try {
        rows = PullKvRows(*ctx, r);
      } catch (const ApiError& e) {
        // kv_load_failure_policy recompute: the whole prompt here instead (no rows).
        if (e.status() != 502 || ctx->options().kv_transfer->load_failure_policy !=
                                     KvTransferConfig::LoadFailurePolicy::kRecompute) {
          throw;
        }
        std::fprintf(stderr, "afd serve: %s; recomputing the prompt (kv_load_failure_policy)\n",
                     e.what());
      }
      if (d->gone()) return;
      result = finish(std::move(rows));
    } catch (const ApiError& e) {
      result = {ErrorResponse(e, ctx->options().retry_after_s), nullptr};
    } catch (const std::exception& e) {
      result = {ErrorResponse(ApiError(500, std::string("internal error: ") + e.what()),
                              ctx->options().retry_after_s),
                nullptr};
    }
    d->Become(std::move(result));
  });
  if (!queued) throw ApiError(503, "too many KV transfers are waiting; retry");
  deferred->TakeInFlightCount();
  return {{}, std::move(deferred)};
}

}  // namespace afd::server::api
