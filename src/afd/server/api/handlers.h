// The endpoint handlers of the ApiServer, one file each. They throw ApiError for a bad request;
// api_server.cpp turns it into the error response. A generation handler answers with a
// GenerationResponse (http_util.h), which then owns one of ctx->in_flight.
//
// Thread safety: called on the HTTP server's worker threads, concurrently.
#pragma once

#include <memory>

#include "afd/server/api/http_types.h"
#include "afd/server/api/server_context.h"

namespace afd::server::api {

HandlerResult HandleCompletions(const std::shared_ptr<ServerContext>& ctx, const HttpRequest& req);
HandlerResult HandleChatCompletions(const std::shared_ptr<ServerContext>& ctx,
                                    const HttpRequest& req);
HttpResponse HandleTokenize(const ServerContext& ctx, const HttpRequest& req);
HttpResponse HandleDetokenize(const ServerContext& ctx, const HttpRequest& req);

}  // namespace afd::server::api
