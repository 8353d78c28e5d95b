#include "afd/server/api/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "afd/common/error.h"
#include "afd/common/thread_annotations.h"

namespace afd::server::api {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

std::string HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k.size() == name.size() && std::equal(k.begin(), k.end(), name.begin(), [](char a, char b) {
          return a == std::tolower(static_cast<unsigned char>(b));
        })) {
      return v;
    }
  }
  return "";
}

void HttpServerOptions::Validate() const {
  AFD_CHECK(port >= 0 && port <= 65535, "http server: port {} is not in [0, 65535]", port);
  AFD_CHECK(io_threads >= 1, "http server: io_threads {} must be at least 1", io_threads);
  AFD_CHECK(work_threads >= 1, "http server: work_threads {} must be at least 1", work_threads);
  AFD_CHECK(header_timeout_s > 0 && body_timeout_s > 0 && write_timeout_s > 0,
            "http server: the header, body and write timeouts must be positive");
  AFD_CHECK(max_header_bytes >= 1024, "http server: max_header_bytes {} is below 1024",
            max_header_bytes);
  AFD_CHECK(max_body_bytes >= 1, "http server: max_body_bytes must be positive");
  AFD_CHECK(max_connections >= 1, "http server: max_connections must be positive");
  AFD_CHECK(pump_tick_ms >= 1, "http server: pump_tick_ms must be positive");
}

namespace {

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

}  // namespace

class Session;

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  HttpServerOptions o;
  HttpHandlers h;
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> guard;
  // The listener's operations (accept, retry, close) run on one strand of their own.
  net::strand<net::io_context::executor_type> accept_strand{net::make_strand(ioc)};
  tcp::acceptor acceptor{accept_strand};
  net::steady_timer accept_retry{accept_strand};
  std::unique_ptr<net::thread_pool> work;
  std::vector<std::thread> threads;
  std::atomic<int64_t> connections{0};
  std::atomic<bool> stopping{false};
  std::mutex work_mu;  // `stopping` is set, and the pool posted to, under it
  Mutex sessions_mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions AFD_GUARDED_BY(sessions_mu);
  int port = 0;
  std::mutex mu;
  bool started = false, stopped = false;

  void Accept();
  void Reject(tcp::socket socket, int status, const std::string& message);
};

// One connection: reads a request, answers it (at once, from the worker pool, or pumped as it
// is produced), then the next one. Every handler runs on the connection's strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<HttpServer::Impl> server)
      : stream_(std::move(socket)),
        server_(std::move(server)),
        tick_(stream_.get_executor()),
        read_deadline_(stream_.get_executor()),
        o_(server_->o) {}

  ~Session() {
    if (pending_) pending_->ClientGone();
    --server_->connections;
    MutexLock lock(server_->sessions_mu);
    server_->sessions.erase(this);
  }

  void Start() {
    beast::error_code ec;
    stream_.socket().set_option(tcp::no_delay(true), ec);
    if (server_->stopping) {  // accepted while Stop ran
      net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Gone(); });
      return;
    }
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->ReadHeader(); });
  }

  // From Stop(): ends the connection now (a response being produced is abandoned).
  void Shutdown() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->Gone(); });
  }

 private:
  void ReadHeader() {
    if (closed_) return;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(o_.max_header_bytes));
    parser_->body_limit(static_cast<uint64_t>(o_.max_body_bytes));
    ArmReadDeadline(o_.header_timeout_s);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return OnReadError(ec, /*in_body=*/false);
    EndReadDeadline();
    const auto& req = parser_->get();
    if (beast::iequals(req[http::field::expect], "100-continue") && !parser_->is_done()) {
      stream_.expires_after(Seconds(o_.write_timeout_s));
      net::async_write(stream_, net::buffer(kContinue.data(), kContinue.size()),
                       [self = shared_from_this()](beast::error_code ec, size_t) {
                         if (ec) return self->Gone();
                         self->ReadBody();
                       });
      return;
    }
    ReadBody();
  }

  // The read deadlines are a timer of their own (tcp_stream's would close the socket, leaving
  // no way to answer 408): on expiry the read is cancelled and answered.
  void ArmReadDeadline(double seconds) {
    stream_.expires_never();
    read_timed_out_ = false;
    const uint64_t generation = ++read_generation_;
    read_deadline_.expires_after(Seconds(seconds));
    read_deadline_.async_wait([self = shared_from_this(), generation](beast::error_code ec) {
      if (ec || generation != self->read_generation_ || self->closed_) return;
      self->read_timed_out_ = true;
      beast::error_code e;
      self->stream_.socket().cancel(e);
    });
  }
  void EndReadDeadline() {
    ++read_generation_;
    read_deadline_.cancel();
  }

  void ReadBody() {
    ArmReadDeadline(o_.body_timeout_s);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(beast::error_code ec) {
    if (ec) return OnReadError(ec, /*in_body=*/true);
    EndReadDeadline();
    Dispatch();
  }

  void OnReadError(beast::error_code ec, bool in_body) {
    const bool timed_out = read_timed_out_;
    EndReadDeadline();
    if (timed_out) ec = beast::error::timeout;
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted ||
        ec == net::error::bad_descriptor) {
      return Gone();
    }
    if (ec == beast::error::timeout) {
      const bool idle = !in_body && !parser_->got_some() && buffer_.size() == 0;
      if (idle) return Gone();  // an idle keep-alive (or silent) connection: closed
      std::string what;
      if (in_body) {
        const auto length = parser_->content_length();
        what = fmt::format(
            "the request body did not arrive within {} s of its headers ({} of {} bytes came)",
            o_.body_timeout_s, parser_->get().body().size(),
            length ? std::to_string(*length) : std::string("the chunked"));
      } else {
        what = fmt::format("the request headers did not arrive whole within {} s",
                           o_.header_timeout_s);
      }
      return WriteError(408, what);
    }
    if (ec == http::error::header_limit) {
      return WriteError(431,
                        fmt::format("the request headers exceed {} bytes", o_.max_header_bytes));
    }
    if (ec == http::error::body_limit) {
      return WriteError(413, fmt::format("the request body exceeds the server's limit of {} "
                                         "bytes (--max-request-body-bytes)",
                                         o_.max_body_bytes));
    }
    WriteError(400, "malformed HTTP request: " + ec.message());
  }

  void Dispatch() {
    auto& req = parser_->get();
    HttpRequest r;
    r.method = std::string(req.method_string());
    const std::string_view target(req.target().data(), req.target().size());
    r.path = std::string(target.substr(0, target.find('?')));
    r.body = std::move(req.body());
    for (const auto& field : req) {
      r.headers.emplace_back(
          Lower(std::string_view(field.name_string().data(), field.name_string().size())),
          std::string(field.value()));
    }
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    HandlerResult result;
    bool answered = false;
    try {
      answered = server_->h.inline_route(r, &result);
    } catch (const std::exception& e) {
      result = {server_->h.error(500, std::string("internal error: ") + e.what()), nullptr};
      answered = true;
    }
    if (answered) return Respond(std::move(result));
    // Under work_mu: Stop sets `stopping` under it too, so nothing is posted to the pool after
    // it has been joined.
    std::unique_lock<std::mutex> posting(server_->work_mu);
    if (server_->stopping) {
      posting.unlock();
      return WriteError(503, "the server is shutting down");
    }
    net::post(*server_->work, [self = shared_from_this(), r = std::move(r)]() mutable {
      HandlerResult res;
      try {
        res = self->server_->h.work(r);
      } catch (const std::exception& e) {
        res = {self->server_->h.error(500, std::string("internal error: ") + e.what()), nullptr};
      }
      net::post(self->stream_.get_executor(),
                [self, res = std::move(res)]() mutable { self->Respond(std::move(res)); });
    });
  }

  void Respond(HandlerResult result) {
    if (closed_) {
      if (result.pending) result.pending->ClientGone();
      return;
    }
    if (!result.pending) return WriteWhole(std::move(result.response), /*close=*/false);
    pending_ = std::move(result.pending);
    streamed_ = pending_->streamed();
    std::weak_ptr<Session> weak = shared_from_this();
    pending_->SetWaker([weak] {
      if (auto s = weak.lock()) s->Wake();
    });
    ArmTick();
    if (streamed_) {
      StartStream();
    } else {
      WatchClient();
    }
    Pump();
  }

  void Wake() {
    if (wake_posted_.exchange(true)) return;
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      self->wake_posted_ = false;
      self->Pump();
    });
  }

  void ArmTick() {
    tick_.expires_after(std::chrono::milliseconds(o_.pump_tick_ms));
    tick_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->pending_) return;
      self->Pump();
      if (self->pending_) self->ArmTick();
    });
  }

  void Pump() {
    if (!pending_ || closed_) return;
    std::string out;
    HttpResponse whole;
    bool done = false;
    try {
      done = pending_->Pump(&out, &whole);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "afd server: a response failed: %s\n", e.what());
      return Gone();
    }
    if (streamed_) {
      outbox_ += out;
      if (done) {
        stream_done_ = true;
        finishing_ = std::move(pending_);  // held (in flight) until its last byte is written
        tick_.cancel();
      }
      return FlushStream();
    }
    if (!done) return;
    finishing_ = std::move(pending_);
    tick_.cancel();
    beast::error_code ec;
    stream_.socket().cancel(ec);  // the client watch
    WriteWhole(std::move(whole), /*close=*/false);
  }

  // A non-streamed response is being produced: a client that closes its end is gone. Bytes of a
  // pipelined next request end the watch (that request is read after this one is answered).
  void WatchClient() {
    if (buffer_.size() > 0) return;
    stream_.socket().async_wait(
        tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
          if (ec || !self->pending_ || self->closed_) return;
          char c;
          const ssize_t n =
              ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
          if (n > 0) return;
          if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            return self->Gone();
          }
          self->WatchClient();
        });
  }

  void StartStream() {
    head_.emplace(http::status::ok, version_);
    head_->set(http::field::content_type, "text/event-stream");
    head_->set(http::field::cache_control, "no-cache");
    // HTTP/1.0 has no chunked encoding: the stream's bytes go as they are and its end is the
    // connection's close.
    chunked_ = version_ >= 11;
    if (!chunked_) keep_alive_ = false;
    head_->keep_alive(keep_alive_);
    head_->chunked(chunked_);
    head_serializer_.emplace(*head_);
    writing_ = true;
    stream_.expires_after(Seconds(o_.write_timeout_s));
    http::async_write_header(stream_, *head_serializer_,
                             [self = shared_from_this()](beast::error_code ec, size_t) {
                               self->writing_ = false;
                               if (ec) return self->Gone();
                               self->FlushStream();
                             });
  }

  void FlushStream() {
    if (writing_ || closed_ || !head_serializer_) return;
    if (!outbox_.empty()) {
      wbuf_.swap(outbox_);
      outbox_.clear();
      writing_ = true;
      stream_.expires_after(Seconds(o_.write_timeout_s));
      auto done = [self = shared_from_this()](beast::error_code ec, size_t) {
        self->writing_ = false;
        if (ec) return self->Gone();
        self->FlushStream();
      };
      if (chunked_) {
        net::async_write(stream_, http::make_chunk(net::buffer(wbuf_)), std::move(done));
      } else {
        net::async_write(stream_, net::buffer(wbuf_), std::move(done));
      }
      return;
    }
    if (!stream_done_) return;
    if (!chunked_) {  // HTTP/1.0: the close ends the body
      stream_.expires_never();
      head_serializer_.reset();
      head_.reset();
      stream_done_ = false;
      finishing_.reset();
      return LingerClose();
    }
    writing_ = true;
    stream_.expires_after(Seconds(o_.write_timeout_s));
    net::async_write(stream_, http::make_chunk_last(),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       if (ec) return self->Gone();
                       self->stream_.expires_never();
                       self->head_serializer_.reset();
                       self->head_.reset();
                       self->stream_done_ = false;
                       self->finishing_.reset();
                       self->NextRequest(self->keep_alive_);
                     });
  }

  void WriteError(int status, const std::string& message) {
    keep_alive_ = false;
    WriteWhole(server_->h.error(status, message), /*close=*/true);
  }

  void WriteWhole(HttpResponse r, bool close) {
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(r.status), version_ == 0 ? 11 : version_);
    res->set(http::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) res->set(k, v);
    res->body() = std::move(r.body);
    res->keep_alive(keep_alive_ && !close && !server_->stopping);
    res->prepare_payload();
    writing_ = true;
    stream_.expires_after(Seconds(o_.write_timeout_s));
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res](beast::error_code ec, size_t) {
                        self->writing_ = false;
                        if (ec) return self->Gone();
                        self->stream_.expires_never();
                        self->finishing_.reset();
                        self->NextRequest(res->keep_alive());
                      });
  }

  void NextRequest(bool keep_alive) {
    if (!keep_alive || server_->stopping) return LingerClose();
    ReadHeader();
  }

  // Half-close, then drain what the client still sends for a moment before closing, so that it
  // reads the response (an immediate close with unread bytes would reset the connection).
  void LingerClose() {
    if (closed_) return;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(2));
    drain_.resize(4096);
    stream_.async_read_some(net::buffer(drain_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->Gone();
                              self->LingerClose2();
                            });
  }
  void LingerClose2() {
    stream_.async_read_some(net::buffer(drain_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->Gone();
                              self->LingerClose2();
                            });
  }

  void Gone() {
    if (pending_) {
      pending_->ClientGone();
      pending_.reset();
    }
    finishing_.reset();
    if (closed_) return;
    closed_ = true;
    tick_.cancel();
    EndReadDeadline();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  std::shared_ptr<HttpServer::Impl> server_;
  net::steady_timer tick_;
  net::steady_timer read_deadline_;
  uint64_t read_generation_ = 0;
  bool read_timed_out_ = false;
  const HttpServerOptions& o_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool keep_alive_ = true;
  unsigned version_ = 11;
  std::shared_ptr<PendingResponse> pending_;
  std::shared_ptr<PendingResponse> finishing_;  // produced, its bytes still being written
  bool streamed_ = false;
  std::atomic<bool> wake_posted_{false};
  std::optional<http::response<http::empty_body>> head_;
  std::optional<http::response_serializer<http::empty_body>> head_serializer_;
  std::string outbox_, wbuf_;
  std::vector<char> drain_;
  bool writing_ = false, stream_done_ = false, closed_ = false, chunked_ = true;
};

void HttpServer::Impl::Reject(tcp::socket socket, int status, const std::string& message) {
  const HttpResponse r = h.error(status, message);
  std::string extra;
  for (const auto& [k, v] : r.headers) extra += k + ": " + v + "\r\n";  // Retry-After
  const auto reason = http::obsolete_reason(static_cast<http::status>(status));
  const std::string text = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n{}",
      status, std::string_view(reason.data(), reason.size()), r.content_type, r.body.size(), extra,
      r.body);
  beast::error_code ec;
  socket.non_blocking(true, ec);
  socket.write_some(net::buffer(text), ec);
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

void HttpServer::Impl::Accept() {
  acceptor.async_accept(
      net::make_strand(ioc), [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
        if (!self->acceptor.is_open() || ec == net::error::operation_aborted) return;
        if (self->stopping) return;  // the socket closes as it goes
        if (ec) {
          // Out of file descriptors (or a transient error): retry shortly, never spin.
          static std::once_flag logged;
          std::call_once(logged, [&] {
            std::fprintf(stderr, "afd server: accepting a connection failed: %s\n",
                         ec.message().c_str());
          });
          self->accept_retry.expires_after(std::chrono::milliseconds(50));
          self->accept_retry.async_wait([self](beast::error_code e) {
            if (!e) self->Accept();
          });
          return;
        }
        if (self->connections.load() >= self->o.max_connections) {
          self->Reject(std::move(socket), 503,
                       fmt::format("the server has {} connections open, its limit: retry later",
                                   self->connections.load()));
        } else {
          ++self->connections;
          auto session = std::make_shared<Session>(std::move(socket), self);
          {
            MutexLock lock(self->sessions_mu);
            self->sessions[session.get()] = session;
          }
          session->Start();
        }
        self->Accept();
      });
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandlers handlers)
    : impl_(std::make_shared<Impl>()) {
  options.Validate();
  impl_->o = std::move(options);
  impl_->h = std::move(handlers);
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Start() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  AFD_CHECK(!impl_->started, "http server: Start called twice");
  Impl& s = *impl_;
  // Every connection is a descriptor: take the hard limit (thousands of idle or streaming
  // clients must not exhaust the default soft limit of 1024).
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 1 << 20);
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  beast::error_code ec;
  net::ip::address address = net::ip::make_address(s.o.host, ec);
  if (ec) {
    tcp::resolver resolver(s.ioc);
    const auto results = resolver.resolve(s.o.host, std::to_string(s.o.port), ec);
    AFD_CHECK(!ec && !results.empty(), "api server: cannot resolve host {}: {}", s.o.host,
              ec.message());
    address = results.begin()->endpoint().address();
  }
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(s.o.port));
  s.acceptor.open(endpoint.protocol(), ec);
  AFD_CHECK(!ec, "api server: cannot open a socket for {}:{}: {}", s.o.host, s.o.port,
            ec.message());
  // SO_REUSEADDR only (never SO_REUSEPORT, under which a second server would bind a port in
  // use and the kernel would split the connections between the two).
  s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  s.acceptor.bind(endpoint, ec);
  AFD_CHECK(!ec, "api server: cannot bind {}:{} (address in use, or not an address of this host)",
            s.o.host, s.o.port);
  // Connections waiting to be accepted (the kernel caps it at net.core.somaxconn); uvicorn,
  // which serves vLLM, uses 2048.
  s.acceptor.listen(2048, ec);
  AFD_CHECK(!ec, "api server: cannot listen on {}:{}: {}", s.o.host, s.o.port, ec.message());
  s.port = s.acceptor.local_endpoint().port();
  s.work = std::make_unique<net::thread_pool>(static_cast<size_t>(s.o.work_threads));
  s.guard.emplace(net::make_work_guard(s.ioc));
  net::post(s.accept_strand, [impl = impl_] { impl->Accept(); });
  for (int i = 0; i < s.o.io_threads; ++i) {
    s.threads.emplace_back([impl = impl_] { impl->ioc.run(); });
  }
  s.started = true;
}

int HttpServer::port() const { return impl_->port; }

int64_t HttpServer::num_connections() const { return impl_->connections.load(); }

void HttpServer::Stop() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  if (s.stopped) return;
  s.stopped = true;
  {
    std::lock_guard<std::mutex> posting(s.work_mu);
    s.stopping = true;
  }
  if (!s.started) return;
  // The listener closes on its strand before the connections are listed: none is accepted after.
  auto closed = std::make_shared<std::promise<void>>();
  std::future<void> listener_closed = closed->get_future();
  net::post(s.accept_strand, [impl = impl_, closed] {
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->accept_retry.cancel();
    closed->set_value();
  });
  listener_closed.wait_for(std::chrono::seconds(5));
  std::vector<std::shared_ptr<Session>> open;
  {
    MutexLock l(s.sessions_mu);
    for (auto& [ptr, weak] : s.sessions) {
      if (auto session = weak.lock()) open.push_back(std::move(session));
    }
  }
  for (auto& session : open) session->Shutdown();
  open.clear();
  s.work->join();  // handlers in progress finish (their responses go nowhere)
  s.work.reset();  // and any posted after the join are destroyed with it, their sessions too
  s.guard.reset();
  // With every connection closing and no work guard, the I/O threads return once the last
  // handler has run; a connection that lingers past the deadline is cut by stopping the loop.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (s.connections.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (s.connections.load() > 0) s.ioc.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
  // Handlers a stopped loop still holds (each keeps its connection, and so this server, alive)
  // run now, on closed sockets, and let go.
  s.ioc.restart();
  s.ioc.poll();
}

}  // namespace afd::server::api
