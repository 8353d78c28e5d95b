// The endpoint handlers of the ApiServer, one file each. They throw ApiError for a bad request;
// api_server.cpp turns it into the error response. A generation handler that streams hands the
// response to StreamRun, which then owns the ctx->in_flight decrement (returns true);
// otherwise it returns false.
//
// Thread safety: called on the HTTP threads, concurrently.
#pragma once

#include <httplib.h>

#include <memory>

#include "afd/server/api/server_context.h"

namespace afd::server::api {

bool HandleCompletions(const std::shared_ptr<ServerContext>& ctx, const httplib::Request& req,
                       httplib::Response& res);
bool HandleChatCompletions(const std::shared_ptr<ServerContext>& ctx, const httplib::Request& req,
                           httplib::Response& res);
void HandleTokenize(const ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
void HandleDetokenize(const ServerContext& ctx, const httplib::Request& req,
                      httplib::Response& res);

}  // namespace afd::server::api
