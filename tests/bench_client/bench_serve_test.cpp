// `afd bench serve` end to end against an in-test OpenAI-style server on an ephemeral port: it
// streams one chunk per token, the usage chunk and [DONE], and answers prompts "bad" with a 400.
#include "afd/bench_client/bench_serve.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "afd/bench_client/bench_plot.h"
#include "afd/bench_client/png_writer.h"
#include "text/reference.h"

namespace afd::bench_client {
namespace {

using json = nlohmann::json;

class FakeCompletionsServer {
 public:
  explicit FakeCompletionsServer(std::string api_key = "") : api_key_(std::move(api_key)) {
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-listed","root":"fake"}]})",
                      "application/json");
    });
    server_.Post("/v1/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res); });
    server_.Post("/slow/v1/completions", [](const httplib::Request&, httplib::Response& res) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      res.set_content("{}", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeCompletionsServer() {
    server_.stop();
    thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int max_in_flight() const { return max_in_flight_; }
  // Each stream waits (up to 5 s) until this many requests are in flight before its first
  // token, so that a concurrency test does not depend on how fast the machine is.
  void HoldUntilInFlight(int n) { hold_until_ = n; }
  std::vector<json> bodies() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }
  int bad_auth() const { return bad_auth_; }

 private:
  void Handle(const httplib::Request& req, httplib::Response& res) {
    if (!api_key_.empty() && req.get_header_value("Authorization") != "Bearer " + api_key_) {
      ++bad_auth_;
    }
    const json body = json::parse(req.body);
    {
      std::lock_guard<std::mutex> lock(mu_);
      bodies_.push_back(body);
    }
    if (body["prompt"] == "bad") {
      res.status = 400;
      res.set_content(
          R"({"error":{"message":"prompt is bad","type":"BadRequestError","param":null,"code":400}})",
          "application/json");
      return;
    }
    const int now = ++in_flight_;
    int seen = max_in_flight_;
    while (now > seen && !max_in_flight_.compare_exchange_weak(seen, now)) {
    }
    const int64_t max_tokens = body["max_tokens"];
    const int64_t prompt_tokens =
        body["prompt"].is_array() ? static_cast<int64_t>(body["prompt"].size()) : 5;
    auto sent = std::make_shared<int64_t>(0);
    // Left the in-flight count: before the last write, which lets the client send its next
    // request (a releaser running after it would let the count overlap that request).
    auto left = std::make_shared<std::atomic<bool>>(false);
    auto leave = [this, left] {
      if (!left->exchange(true)) --in_flight_;
    };
    res.set_chunked_content_provider(
        "text/event-stream",
        [=, this](size_t, httplib::DataSink& sink) {
          if (*sent == 0) {
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
            while (in_flight_ < hold_until_ && std::chrono::steady_clock::now() < until) {
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          std::string out;
          if (*sent < max_tokens) {
            // Split one event over two writes: the client must join them.
            const std::string event = json{{"id", "cmpl-1"},
                                           {"object", "text_completion"},
                                           {"choices",
                                            {{{"index", 0},
                                              {"text", "t" + std::to_string(*sent)},
                                              {"finish_reason", nullptr}}}}}
                                          .dump();
            const std::string text = "data: " + event + "\n\n";
            sink.write(text.data(), 9);
            sink.write(text.data() + 9, text.size() - 9);
            ++*sent;
            return true;
          }
          out = "data: " +
                json{{"choices", json::array()},
                     {"usage",
                      {{"prompt_tokens", prompt_tokens},
                       {"completion_tokens", max_tokens},
                       {"total_tokens", prompt_tokens + max_tokens}}}}
                    .dump() +
                "\n\ndata: [DONE]\n\n";
          leave();
          sink.write(out.data(), out.size());
          sink.done();
          return true;
        },
        [leave](bool) { leave(); });
  }

  std::string api_key_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  std::atomic<int> hold_until_{0};
  std::atomic<int> bad_auth_{0};
  mutable std::mutex mu_;
  std::vector<json> bodies_;  // GUARDED_BY(mu_)
};

BenchServeOptions Options(const std::string& url) {
  BenchServeOptions o;
  o.base_url = url;
  o.model = "fake";
  o.num_prompts = 12;
  o.random_input_len = 8;
  o.random_output_len = 5;
  o.random_range_ratio = 0.5;
  o.random_vocab_size = 100;
  o.request_timeout_s = 30;
  o.show_progress = false;
  return o;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool HasLine(const std::string& text, const std::string& line) {
  for (const std::string& l : Lines(text)) {
    if (l == line) return true;
  }
  return false;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

uint32_t U32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) |
         (uint32_t(uint8_t(s[at + 2])) << 8) | uint32_t(uint8_t(s[at + 3]));
}

// Checks the PNG structure and returns its decoded RGB pixels (filter 0 rows only).
RgbImage DecodePng(const std::string& png) {
  RgbImage image;
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::string idat;
  std::vector<std::string> types;
  for (size_t at = 8; at + 12 <= png.size();) {
    const uint32_t len = U32(png, at);
    EXPECT_LE(at + 12 + len, png.size());
    const std::string type = png.substr(at + 4, 4);
    const std::string data = png.substr(at + 8, len);
    const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(png.data() + at + 4), 4 + len);
    EXPECT_EQ(U32(png, at + 8 + len), static_cast<uint32_t>(crc)) << type << " CRC";
    types.push_back(type);
    if (type == "IHDR") {
      EXPECT_EQ(len, 13u);
      image.width = static_cast<int>(U32(data, 0));
      image.height = static_cast<int>(U32(data, 4));
      EXPECT_EQ(data.substr(8), std::string("\x08\x02\x00\x00\x00", 5));
    }
    if (type == "IDAT") idat += data;
    at += 12 + len;
  }
  EXPECT_EQ(types.front(), "IHDR");
  EXPECT_EQ(types.back(), "IEND");
  const size_t row = size_t(image.width) * 3 + 1;
  std::string raw(row * size_t(image.height) + 1, '\0');  // one spare byte: must stay unused
  uLongf raw_size = raw.size();
  EXPECT_EQ(uncompress(reinterpret_cast<Bytef*>(raw.data()), &raw_size,
                       reinterpret_cast<const Bytef*>(idat.data()), idat.size()),
            Z_OK);
  EXPECT_EQ(raw_size, row * size_t(image.height));
  for (int y = 0; y < image.height; ++y) {
    EXPECT_EQ(raw[size_t(y) * row], '\0');
    const auto* p = reinterpret_cast<const uint8_t*>(raw.data()) + size_t(y) * row + 1;
    image.rgb.insert(image.rgb.end(), p, p + row - 1);
  }
  return image;
}

TEST(BenchServePng, EncodesPixelsExactly) {
  RgbImage img;
  img.width = 3;
  img.height = 2;
  for (int i = 0; i < 18; ++i) img.rgb.push_back(static_cast<uint8_t>(i * 13));
  const RgbImage back = DecodePng(EncodePng(img));
  EXPECT_EQ(back.width, 3);
  EXPECT_EQ(back.height, 2);
  EXPECT_EQ(back.rgb, img.rgb);
}

TEST(BenchServeCommand, RandomDatasetWithConcurrencyCapReportJsonAndPlot) {
  FakeCompletionsServer server;
  server.HoldUntilInFlight(2);
  BenchServeOptions o = Options(server.url());
  o.max_concurrency = 3;
  o.ignore_eos = true;
  o.result_json = ::testing::TempDir() + "/bench_serve_result.json";
  o.plot = ::testing::TempDir() + "/bench_serve_plot.png";
  std::ostringstream out, err;
  ASSERT_EQ(BenchServeMain(o, out, err), 0) << err.str();

  const std::vector<json> bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 12u);
  int64_t want_input = 0, want_output = 0;
  for (const json& b : bodies) {
    EXPECT_EQ(b["model"], "fake");
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["stream_options"]["include_usage"], true);
    EXPECT_EQ(b["temperature"], 0.0);
    EXPECT_EQ(b["ignore_eos"], true);
    ASSERT_TRUE(b["prompt"].is_array());
    EXPECT_GE(b["prompt"].size(), 4u);
    EXPECT_LE(b["prompt"].size(), 12u);
    want_input += static_cast<int64_t>(b["prompt"].size());
    want_output += b["max_tokens"].get<int64_t>();
  }
  EXPECT_LE(server.max_in_flight(), 3);
  EXPECT_GE(server.max_in_flight(), 2);

  const std::string report = out.str();
  EXPECT_TRUE(HasLine(report, "============ Serving Benchmark Result ============")) << report;
  EXPECT_TRUE(HasLine(report, fmt::format("{:<40} {:<10}", "Successful requests:", 12))) << report;
  EXPECT_TRUE(HasLine(report, fmt::format("{:<40} {:<10}", "Failed requests:", 0)));
  EXPECT_TRUE(HasLine(report, fmt::format("{:<40} {:<10}", "Maximum request concurrency:", 3)));
  EXPECT_TRUE(HasLine(report, fmt::format("{:<40} {:<10}", "Total input tokens:", want_input)));
  EXPECT_TRUE(
      HasLine(report, fmt::format("{:<40} {:<10}", "Total generated tokens:", want_output)));
  EXPECT_TRUE(HasLine(report, "---------------Time to First Token----------------"));
  EXPECT_TRUE(HasLine(report, "-----Time per Output Token (excl. 1st token)------"));
  EXPECT_TRUE(HasLine(report, "---------------Inter-token Latency----------------"));
  EXPECT_TRUE(HasLine(report, "----------------End-to-end Latency----------------"));
  for (const char* label : {"Benchmark duration (s):", "Request throughput (req/s):",
                            "Output token throughput (tok/s):", "Total Token throughput (tok/s):",
                            "Mean TTFT (ms):", "Median TTFT (ms):", "P99 TTFT (ms):",
                            "Mean TPOT (ms):", "P99 ITL (ms):", "Median E2EL (ms):"}) {
    bool found = false;
    for (const std::string& l : Lines(report))
      found |= l.rfind(fmt::format("{:<40} ", label), 0) == 0;
    EXPECT_TRUE(found) << label << "\n" << report;
  }
  EXPECT_EQ(Lines(report).back(), std::string(50, '='));
  EXPECT_TRUE(err.str().empty()) << err.str();

  const json j = json::parse(ReadFile(o.result_json));
  for (const char* key : {"date",
                          "backend",
                          "model_id",
                          "num_prompts",
                          "request_rate",
                          "burstiness",
                          "max_concurrency",
                          "duration",
                          "completed",
                          "failed",
                          "total_input_tokens",
                          "total_output_tokens",
                          "request_throughput",
                          "output_throughput",
                          "total_token_throughput",
                          "input_lens",
                          "output_lens",
                          "ttfts",
                          "itls",
                          "generated_texts",
                          "errors",
                          "mean_ttft_ms",
                          "median_ttft_ms",
                          "std_ttft_ms",
                          "p99_ttft_ms",
                          "mean_tpot_ms",
                          "median_tpot_ms",
                          "std_tpot_ms",
                          "p99_tpot_ms",
                          "mean_itl_ms",
                          "p99_itl_ms",
                          "mean_e2el_ms",
                          "p99_e2el_ms"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["completed"], 12);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["max_concurrency"], 3);
  EXPECT_EQ(j["total_input_tokens"], want_input);
  EXPECT_EQ(j["total_output_tokens"], want_output);
  ASSERT_EQ(j["itls"].size(), 12u);
  // Each request streamed max_tokens chunks: max_tokens - 1 gaps, text "t0t1...".
  for (size_t i = 0; i < 12; ++i) {
    const int64_t n = j["output_lens"][i];
    EXPECT_EQ(j["itls"][i].size(), size_t(n - 1));
    EXPECT_EQ(j["generated_texts"][i].get<std::string>().substr(0, 4), "t0t1");
    EXPECT_EQ(j["errors"][i], "");
    EXPECT_GT(j["ttfts"][i].get<double>(), 0.0);
  }
  EXPECT_GE(j["mean_itl_ms"].get<double>(), 5.0);  // the server waits 10 ms per chunk

  const RgbImage png = DecodePng(ReadFile(o.plot));
  EXPECT_EQ(png.width, kBenchPlotWidth);
  EXPECT_EQ(png.height, kBenchPlotHeight);
  size_t bar_pixels = 0;  // the histogram bars' colour: the plot is not blank
  for (size_t i = 0; i < png.rgb.size(); i += 3) {
    bar_pixels += png.rgb[i] == 70 && png.rgb[i + 1] == 110 && png.rgb[i + 2] == 180;
  }
  EXPECT_GT(bar_pixels, 1000u);
}

TEST(BenchServeCommand, HttpErrorsAreCountedFailuresWithTheirMessage) {
  FakeCompletionsServer server("secret");
  const std::string path = ::testing::TempDir() + "/bench_serve_mixed.jsonl";
  std::ofstream(path) << "{\"prompt\": [1, 2, 3], \"output_len\": 3}\n"
                      << "{\"prompt\": \"hello\", \"max_tokens\": 2}\n"
                      << "{\"prompt\": \"bad\"}\n";
  BenchServeOptions o = Options(server.url());
  o.dataset = path;
  o.num_prompts = 9;
  o.random_output_len = 4;
  o.request_rate = 200;
  o.api_key = "secret";
  o.result_json = ::testing::TempDir() + "/bench_serve_mixed.json";
  std::ostringstream out, err;
  ASSERT_EQ(BenchServeMain(o, out, err), 0) << err.str();
  EXPECT_EQ(server.bad_auth(), 0);
  const std::string report = out.str();
  EXPECT_TRUE(HasLine(report, fmt::format("{:<40} {:<10}", "Successful requests:", 6))) << report;
  EXPECT_TRUE(HasLine(report, fmt::format("{:<40} {:<10}", "Failed requests:", 3)));
  EXPECT_TRUE(
      HasLine(report, fmt::format("{:<40} {:<10.2f}", "Request rate configured (RPS):", 200.0)));
  // Ids count as sent (3); text prompts as the usage chunk reports (5).
  EXPECT_TRUE(HasLine(report, fmt::format("{:<40} {:<10}", "Total input tokens:", 3 * 3 + 3 * 5)));
  EXPECT_TRUE(
      HasLine(report, fmt::format("{:<40} {:<10}", "Total generated tokens:", 3 * 3 + 3 * 2)));
  EXPECT_TRUE(HasLine(report, "Error 0: HTTP 400: prompt is bad")) << report;
  const json j = json::parse(ReadFile(o.result_json));
  EXPECT_EQ(j["failed"], 3);
  EXPECT_EQ(j["errors"][2], "HTTP 400: prompt is bad");
  EXPECT_EQ(j["output_lens"][2], 0);
  EXPECT_EQ(j["burstiness"], 1.0);
  EXPECT_EQ(j["model_id"], "fake");
  for (const json& b : server.bodies()) EXPECT_FALSE(b.contains("ignore_eos"));
}

TEST(BenchServeCommand, EveryRequestFailingExitsNonZero) {
  FakeCompletionsServer server;
  const std::string path = ::testing::TempDir() + "/bench_serve_bad.jsonl";
  std::ofstream(path) << "{\"prompt\": \"bad\"}\n";
  BenchServeOptions o = Options(server.url());
  o.dataset = path;
  o.num_prompts = 4;
  o.model.clear();  // taken from /v1/models
  std::ostringstream out, err;
  EXPECT_EQ(BenchServeMain(o, out, err), 1);
  EXPECT_NE(err.str().find("every request failed (4 of 4)"), std::string::npos) << err.str();
  EXPECT_NE(err.str().find("HTTP 400: prompt is bad"), std::string::npos) << err.str();
  EXPECT_TRUE(HasLine(out.str(), fmt::format("{:<40} {:<10}", "Successful requests:", 0)));
  for (const json& b : server.bodies()) EXPECT_EQ(b["model"], "fake-listed");
}

TEST(BenchServeCommand, RequestTimeoutEndsAHungRequest) {
  FakeCompletionsServer server;
  BenchServeOptions o = Options(server.url());
  o.endpoint = "/slow/v1/completions";
  o.num_prompts = 1;
  o.request_timeout_s = 0.3;
  std::ostringstream out, err;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(BenchServeMain(o, out, err), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1400));
  EXPECT_NE(out.str().find("Error 0: reading the reply from " + server.url() +
                           "/slow/v1/completions failed or timed out"),
            std::string::npos)
      << out.str();
}

TEST(BenchServeCommand, UnreachableServerFailsNamingTheUrl) {
  // A port that was just free (bound, never listened on, closed): connecting is refused.
  int port = 0;
  {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port = ntohs(addr.sin_port);
    close(fd);
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  const test::CommandResult r = test::RunCommand(
      std::string(AFD_BINARY) + " bench serve --base-url " + url +
      " --model m --num-prompts 2 --random-input-len 4 --random-output-len 2 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("cannot reach the server at --base-url " + url + ": cannot connect to " +
                       url + "/v1/models"),
            std::string::npos)
      << r.out;
}

TEST(BenchServeCommand, InvalidFlagsNameTheFlag) {
  const test::CommandResult r = test::RunCommand(
      std::string(AFD_BINARY) + " bench serve --base-url ftp://x --model m --num-prompts 2 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--base-url \"ftp://x\": scheme \"ftp\" is not http or https"),
            std::string::npos)
      << r.out;
  const test::CommandResult rate = test::RunCommand(
      std::string(AFD_BINARY) +
      " bench serve --base-url http://127.0.0.1:9 --model m --request-rate fast 2>&1");
  EXPECT_EQ(rate.exit_code, 2) << rate.out;
  EXPECT_NE(rate.out.find("--request-rate \"fast\": not a number"), std::string::npos) << rate.out;
}

}  // namespace
}  // namespace afd::bench_client
