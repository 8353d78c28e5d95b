// The decode leg of a KV transfer (prefill/decode disaggregation, docs/pd.md) off the endpoint
// workers: a request with kv_transfer_params.do_remote_prefill is answered at once with a
// DeferredResponse; a thread of the server's pull queue (ServerContext::kv_pulls, a WorkQueue)
// pulls its rows from the producer and then runs
// the rest of the endpoint (the submission and its response), which the DeferredResponse
// becomes. The workers go on parsing and tokenizing other requests meanwhile, however long the
// pulls take.
//
// Thread safety: a DeferredResponse is driven by its connection's strand (PendingResponse's
// contract); Become and gone() from any thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "afd/common/thread_annotations.h"
#include "afd/runtime/request.h"
#include "afd/server/api/http_types.h"
#include "afd/server/api/sampling_request.h"
#include "afd/server/api/server_context.h"

namespace afd::server::api {

// A response whose endpoint has not finished yet: not ready until Become. Streamed (as the
// request asked): once it became a generation, that one's events; an error as one error event,
// then [DONE]. Whole: the response it became. Once handed to the server (TakeInFlightCount) it
// owns the request's ctx->in_flight count, unless it became a pending response (which owns it
// then).
class DeferredResponse : public PendingResponse {
 public:
  DeferredResponse(std::shared_ptr<ServerContext> ctx, bool streamed);
  ~DeferredResponse() override;
  bool streamed() const override { return streamed_; }
  void SetWaker(std::function<void()> wake) override;
  bool Pump(std::string* out, HttpResponse* response) override;
  void ClientGone() override;
  // What the endpoint answered: a response, or a pending one (which must be streamed as this).
  void Become(HandlerResult result);
  // The client left (nothing is to be submitted for it any more).
  bool gone() const;
  void TakeInFlightCount();

 private:
  std::shared_ptr<ServerContext> ctx_;
  const bool streamed_;
  mutable Mutex mu_;
  std::function<void()> wake_ AFD_GUARDED_BY(mu_);
  bool ready_ AFD_GUARDED_BY(mu_) = false;
  bool gone_ AFD_GUARDED_BY(mu_) = false;
  bool owns_count_ AFD_GUARDED_BY(mu_) = false;
  HandlerResult result_ AFD_GUARDED_BY(mu_);
  bool inner_started_ = false;  // on the strand: the inner response has its waker
};

// The rest of an endpoint once the request's imported rows are known (null: none).
using WithKvRows = std::function<HandlerResult(std::shared_ptr<const runtime::KvRows> rows)>;

// finish(nullptr) at once when `r` is not a decode leg; else a DeferredResponse, its rows pulled
// on ctx's pull queue (503 when too many pulls wait). num_prompts: the request's prompts (a KV
// transfer takes one: 400 naming kv_transfer_params otherwise).
HandlerResult RunWithKvRows(const std::shared_ptr<ServerContext>& ctx, const SamplingRequest& r,
                            size_t num_prompts, WithKvRows finish);

// The decode leg's pull of r's rows from its producer (502 naming kv_transfer_params when it
// fails, after ReleaseUnpulled), counted in the metrics.
std::shared_ptr<const runtime::KvRows> PullKvRows(ServerContext& ctx, const SamplingRequest& r);
// Asks r's producer to free the rows this instance will not take, now rather than at its hold
// timeout (a RELEASE queued on ctx's pull threads; best effort, 2 s: a producer that is gone
// has nothing to free).
void ReleaseUnpulled(ServerContext& ctx, const SamplingRequest& r);

}  // namespace afd::server::api
