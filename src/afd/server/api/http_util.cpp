#include "afd/server/api/http_util.h"

#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>

namespace afd::server::api {

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

json ErrorBody(int status, const std::string& message, const std::string& param) {
  return {{"error",
           {{"message", message},
            {"type", ApiError::TypeForStatus(status)},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", status}}}};
}

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void SendError(httplib::Response& res, const ApiError& error) {
  SendJson(res, error.status(), ErrorBody(error.status(), error.what(), error.param()));
}

ApiError RunError(const ServerContext& ctx, const RequestRun& run) {
  if (run.rejected()) return ApiError(400, run.error());
  return ApiError(ctx.shutting_down ? 503 : 500, run.error());
}

json Usage(const RequestRun& run, size_t num_prompts, int64_t n) {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t p = 0; p < num_prompts; ++p) {
    prompt_tokens += static_cast<int64_t>(run.prompt(p * static_cast<size_t>(n)).size());
  }
  for (size_t i = 0; i < run.num_choices(); ++i) {
    completion_tokens += static_cast<int64_t>(run.choice(i).token_ids().size());
  }
  return {{"prompt_tokens", prompt_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"completion_tokens", completion_tokens}};
}

namespace {

struct StreamState {
  std::shared_ptr<ServerContext> ctx;
  std::shared_ptr<RequestRun> run;
  StreamFormat format;
  bool include_usage = false;
  bool started = false;
  bool ended = false;  // [DONE] written
};

bool WriteEvent(httplib::DataSink& sink, const std::string& data) {
  const std::string event = "data: " + data + "\n\n";
  return sink.write(event.data(), event.size());
}

}  // namespace

void StreamRun(httplib::Response& res, std::shared_ptr<ServerContext> ctx,
               std::shared_ptr<RequestRun> run, StreamFormat format, bool include_usage) {
  auto state = std::make_shared<StreamState>();
  state->ctx = std::move(ctx);
  state->run = std::move(run);
  state->format = std::move(format);
  state->include_usage = include_usage;
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [state](size_t /*offset*/, httplib::DataSink& sink) -> bool {
        RequestRun& run = *state->run;
        if (!state->started) {
          state->started = true;
          for (const auto& chunk : state->format.initial()) {
            if (!WriteEvent(sink, Dump(chunk))) return false;
          }
        }
        if (auto delta = run.NextDelta(std::chrono::milliseconds(100))) {
          for (const auto& chunk : state->format.delta(delta->first, delta->second)) {
            if (!WriteEvent(sink, Dump(chunk))) return false;
          }
        }
        const std::string error = run.error();
        if (!error.empty()) {
          run.Abort();  // the other choices end too: the stream is over
          const ApiError e = RunError(*state->ctx, run);
          if (!WriteEvent(sink, Dump(ErrorBody(e.status(), e.what())))) return false;
        } else if (!run.done()) {
          return true;
        } else if (state->include_usage) {
          if (!WriteEvent(sink, Dump(state->format.usage()))) return false;
        }
        if (!WriteEvent(sink, "[DONE]")) return false;
        state->ended = true;
        sink.done();
        return true;
      },
      [state](bool /*success*/) {
        // The client went away (or the server stopped) before the end: free the sequences.
        if (!state->ended) state->run->Abort();
        --state->ctx->in_flight;
      });
}

namespace {

// The port of a socket address (IPv4 or IPv6), or -1.
int PortOf(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// The connected socket of this process whose local and peer ports are those given, or -1.
int FindSocket(int local_port, int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || fd < 0 || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (PortOf(local) == local_port && PortOf(peer) == remote_port) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

}  // namespace

std::function<bool()> ClientGoneCheck(const httplib::Request& req) {
  const int fd = FindSocket(req.local_port, req.remote_port);
  if (fd < 0) return [] { return false; };
  return [fd] {
    pollfd p{fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  };
}

std::shared_ptr<RequestRun> SubmitChoices(const std::shared_ptr<ServerContext>& ctx,
                                          const SamplingRequest& r,
                                          const std::vector<PromptInput>& prompts) {
  const uint64_t seed = ctx->RandomSeed();
  std::vector<runtime::RequestParams> params;
  for (const auto& prompt : prompts) {
    for (int64_t j = 0; j < r.n; ++j) params.push_back(MakeRequestParams(r, prompt, j, seed, *ctx));
  }
  auto run = std::make_shared<RequestRun>(ctx, r);
  const std::unique_lock<std::mutex> admitted = ctx->AdmitRequest();
  for (auto& p : params) run->Submit(std::move(p));
  return run;
}

bool AwaitChoices(RequestRun& run, const ServerContext& ctx, const httplib::Request& req,
                  httplib::Response& res) {
  const std::function<bool()> gone = ClientGoneCheck(req);
  while (!run.done()) {
    run.NextDelta(std::chrono::milliseconds(100));
    if (!run.done() && gone()) {
      run.Abort();
      res.status = 499;  // the client closed the request (nginx's code)
      return false;
    }
  }
  if (!run.error().empty()) throw RunError(ctx, run);
  return true;
}

}  // namespace afd::server::api
