// The KV transfer's TCP transport (pd/kv_transport.h): rows served by a producer and pulled
// by a consumer arrive whole and are released once; the join secret, the model and the cache
// layout are checked on both sides, each failure named; a silent producer costs the consumer
// its timeout, not a hang; a stalled client does not wedge the producer. End to end: a prefill
// engine's held rows pulled over TCP into a decode engine give the colocated run's tokens.
#include "afd/pd/kv_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/model/loader.h"
#include "afd/runtime/engine.h"

namespace afd::pd {
namespace {

const std::string kSecret = "a secret of more than sixteen bytes";

runtime::KvRows SomeRows(int64_t positions) {
  runtime::KvRows r;
  r.num_layers = 3;
  r.row_width = 40;
  r.positions = positions;
  r.dtype = DType::kF32;
  r.bytes.resize(r.expected_bytes());
  for (size_t i = 0; i < r.bytes.size(); ++i) r.bytes[i] = static_cast<char>(i * 7 + 3);
  return r;
}
runtime::KvLayout LayoutOf(const runtime::KvRows& r, std::string model = "m") {
  return {std::move(model), r.num_layers, r.row_width, r.dtype};
}

// A producer holding request 11's rows.
// With `on_device`, a consumer that takes device rows gets them described (as a GPU producer
// with the cuda_ipc transport gives them).
struct Producer {
  runtime::KvRows rows = SomeRows(70);
  bool on_device = false;
  std::mutex mu;
  std::vector<uint64_t> released;
  std::vector<bool> device_ok_seen;
  KvTransferServer server;
  explicit Producer(std::optional<std::string> secret = kSecret, std::string model = "m")
      : server(
            "127.0.0.1", 0, std::move(secret), std::move(model),
            [this](uint64_t id, bool device_ok) {
              AFD_CHECK(id == 11, "request {} holds no KV rows", id);
              {
                std::lock_guard<std::mutex> lock(mu);
                device_ok_seen.push_back(device_ok);
              }
              if (!device_ok || !on_device) return std::make_shared<const runtime::KvRows>(rows);
              auto d = std::make_shared<runtime::KvRows>(rows);
              d->bytes.clear();
              d->device = runtime::KvDeviceRows{std::string(64, '\x5a'), 4096, 64, {7, 3}};
              return std::shared_ptr<const runtime::KvRows>(d);
            },
            [this](uint64_t id) {
              std::lock_guard<std::mutex> lock(mu);
              released.push_back(id);
            },
            2.0) {}
};

std::string FetchError(int port, uint64_t id, const runtime::KvLayout& layout,
                       const std::optional<std::string>& secret, double timeout = 3.0) {
  try {
    FetchKvRows("127.0.0.1", port, id, layout, secret, timeout);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(KvTransport, RowsArriveWholeAndAreReleasedOnce) {
  Producer p;
  const runtime::KvRows got =
      FetchKvRows("127.0.0.1", p.server.port(), 11, LayoutOf(p.rows), kSecret, 5);
  EXPECT_EQ(got.positions, 70);
  EXPECT_EQ(got.bytes, p.rows.bytes);
  for (int i = 0; i < 200 && p.server.transfers_done() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the release follows the DONE
  }
  std::lock_guard<std::mutex> lock(p.mu);
  EXPECT_EQ(p.released, std::vector<uint64_t>{11});
}

// The cuda_ipc transport: a consumer on this host that takes device rows gets their place in
// the producer's GPU cache, not their bytes, and the producer keeps them (the consumer releases
// them once copied); a consumer that takes bytes gets bytes from the same producer.
TEST(KvTransport, DeviceRowsAreDescribedAndStayHeldUntilReleased) {
  Producer p;
  p.on_device = true;
  const runtime::KvRows got =
      FetchKvRows("127.0.0.1", p.server.port(), 11, LayoutOf(p.rows), kSecret, 5, true);
  ASSERT_TRUE(got.device.has_value());
  EXPECT_TRUE(got.bytes.empty());
  EXPECT_EQ(got.positions, 70);
  EXPECT_EQ(got.device->ipc_handle, std::string(64, '\x5a'));
  EXPECT_EQ(got.device->num_slots, 4096);
  EXPECT_EQ(got.device->block_size, 64);
  EXPECT_EQ(got.device->blocks, (std::vector<int32_t>{7, 3}));
  for (int i = 0; i < 200 && p.server.device_transfers() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(p.server.device_transfers(), 1);
  {
    std::lock_guard<std::mutex> lock(p.mu);
    EXPECT_TRUE(p.released.empty());  // still held: the consumer has not copied them yet
  }
  ReleaseKvRows("127.0.0.1", p.server.port(), 11, kSecret, 5);
  const runtime::KvRows bytes =
      FetchKvRows("127.0.0.1", p.server.port(), 11, LayoutOf(p.rows), kSecret, 5);
  EXPECT_FALSE(bytes.device.has_value());
  EXPECT_EQ(bytes.bytes, p.rows.bytes);
  for (int i = 0; i < 200 && p.server.transfers_done() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard<std::mutex> lock(p.mu);
  EXPECT_EQ(p.device_ok_seen, (std::vector<bool>{true, false}));
  EXPECT_EQ(p.released, (std::vector<uint64_t>{11, 11}));
}

// A release without a pull (the decode leg will not come): the rows are freed at once; only a
// client with the secret may ask.
TEST(KvTransport, ReleaseWithoutAPullFreesTheRows) {
  Producer p;
  EXPECT_THROW(
      ReleaseKvRows("127.0.0.1", p.server.port(), 11, std::string("another secret, also long"), 5),
      Error);
  {
    std::lock_guard<std::mutex> lock(p.mu);
    EXPECT_TRUE(p.released.empty());
  }
  ReleaseKvRows("127.0.0.1", p.server.port(), 11, kSecret, 5);
  std::lock_guard<std::mutex> lock(p.mu);
  EXPECT_EQ(p.released, std::vector<uint64_t>{11});
  EXPECT_EQ(p.server.transfers_done(), 0);  // nothing was transferred
}

TEST(KvTransport, EveryMismatchIsNamed) {
  Producer p;
  const int port = p.server.port();
  EXPECT_NE(FetchError(port, 12, LayoutOf(p.rows), kSecret).find("request 12 holds no KV rows"),
            std::string::npos);
  EXPECT_NE(FetchError(port, 11, LayoutOf(p.rows), std::string("another secret, also long"))
                .find("different secrets"),
            std::string::npos);
  EXPECT_NE(FetchError(port, 11, LayoutOf(p.rows), std::nullopt).find("requires the join secret"),
            std::string::npos);
  EXPECT_NE(FetchError(port, 11, LayoutOf(p.rows, "other"), kSecret)
                .find("the producer serves model 'm', the consumer 'other'"),
            std::string::npos);
  runtime::KvLayout wide = LayoutOf(p.rows);
  wide.row_width = 41;
  const std::string e = FetchError(port, 11, wide, kSecret);
  EXPECT_NE(e.find("40-wide float32 rows, this instance's cache has 3 layers of 41-wide"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e;
  std::lock_guard<std::mutex> lock(p.mu);
  EXPECT_TRUE(p.released.empty());  // nothing was delivered
}

TEST(KvTransport, ASilentProducerCostsTheTimeoutNotAHang) {
  comm::Socket listener = comm::Listen("127.0.0.1", 0);  // accepts (backlog), never speaks
  const auto start = std::chrono::steady_clock::now();
  const std::string e =
      FetchError(comm::LocalPort(listener), 11, LayoutOf(SomeRows(1)), kSecret, 0.3);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(e.find("timed out"), std::string::npos) << e;
  EXPECT_LT(s, 5.0);
}

// A producer that dies mid-transfer (announces the rows, sends half, closes): the consumer's
// pull fails at once naming it, and nothing of the half is kept.
TEST(KvTransport, AProducerDyingMidTransferFailsThePull) {
  comm::Socket listener = comm::Listen("127.0.0.1", 0);
  const int port = comm::LocalPort(listener);
  const runtime::KvRows rows = SomeRows(70);
  std::thread producer([&] {
    const Deadline d = Deadline::In(5);
    comm::Socket s = comm::Accept(listener, d, "the consumer");
    auto frame = [&](uint8_t code, const std::vector<std::string>& fields) {
      std::string body(1, static_cast<char>(code));
      for (const std::string& f : fields) {
        const uint32_t len = static_cast<uint32_t>(f.size());
        body.append(reinterpret_cast<const char*>(&len), 4).append(f);
      }
      const uint32_t header[2] = {0x4b444641u, static_cast<uint32_t>(body.size())};
      s.SendAll(header, sizeof(header), d, "the consumer");
      s.SendAll(body.data(), body.size(), d, "the consumer");
    };
    auto skip_frame = [&] {
      uint32_t header[2];
      s.RecvAll(header, sizeof(header), d, "the consumer");
      std::string body(header[1], '\0');
      s.RecvAll(body.data(), body.size(), d, "the consumer");
    };
    frame(1, {std::string(32, 'n'), std::string(1, '\0')});  // CHALLENGE, no secret
    skip_frame();                                            // AUTH
    frame(3, {""});                                          // AUTH_OK
    skip_frame();                                            // FETCH
    frame(6, {"3", "40", "float32", "70", std::to_string(rows.bytes.size())});  // ROWS
    s.SendAll(rows.bytes.data(), rows.bytes.size() / 2, d, "the consumer");
    s.Close();  // dies
  });
  const auto start = std::chrono::steady_clock::now();
  const std::string e = FetchError(port, 11, LayoutOf(rows), std::nullopt, 10);
  producer.join();
  EXPECT_NE(e.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e;
  EXPECT_NE(e.find("closed the connection"), std::string::npos) << e;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5);
}

TEST(KvTransport, AStalledClientDoesNotWedgeTheProducer) {
  Producer p;
  comm::Socket stalled =
      comm::Connect("127.0.0.1", p.server.port(), Deadline::In(2), "the producer");
  // It never answers the challenge; another client is served meanwhile.
  const runtime::KvRows got =
      FetchKvRows("127.0.0.1", p.server.port(), 11, LayoutOf(p.rows), kSecret, 5);
  EXPECT_EQ(got.bytes, p.rows.bytes);
}

TEST(KvTransport, HeldEngineRowsOverTcpGiveTheColocatedTokens) {
  kernels::cpu::CpuBackend cpu;
  std::unique_ptr<model::MoeModel> model =
      model::OpenModel("preset:tiny-qwen3", model::OpenOptions{}, cpu);
  runtime::LocalStepRunner runner(*model);
  runtime::RequestParams params;
  params.prompt = {4, 8, 15, 16, 23, 42, 108, 3, 7, 9};
  params.max_tokens = 10;
  params.ignore_eos = true;
  auto drain = [](runtime::Engine& e) {
    std::vector<int32_t> ids;
    std::vector<runtime::RequestOutput> last;
    while (e.HasWork()) {
      for (runtime::RequestOutput& o : e.Step()) {
        ids.insert(ids.end(), o.token_ids.begin(), o.token_ids.end());
        last.push_back(std::move(o));
      }
    }
    return std::make_pair(ids, last);
  };
  runtime::Engine colocated(*model, runner, {0, 0, false, 16, 0});
  colocated.Add(1, params);
  const std::vector<int32_t> want = drain(colocated).first;

  runtime::Engine producer(*model, runner, {0, 0, false, 16, 0});
  runtime::RequestParams prefill = params;
  prefill.max_tokens = 1;
  prefill.hold_kv_s = 480;
  producer.Add(11, prefill);
  ASSERT_TRUE(drain(producer).second.back().kv_held);
  // The server's threads reach the engine only while this thread waits in FetchKvRows.
  KvTransferServer server(
      "127.0.0.1", 0, kSecret, "tiny-qwen3",
      [&producer](uint64_t id, bool device_ok) { return producer.ExportHeldKv(id, device_ok); },
      [&producer](uint64_t id) { producer.ReleaseHeldKv(id); }, 2.0);
  const runtime::KvLayout layout{"tiny-qwen3", model->config().num_hidden_layers,
                                 producer.kv_row_width(), producer.kv_dtype()};
  runtime::RequestParams decode = params;
  // A CPU producer has no device rows to describe: the cuda_ipc consumer gets bytes.
  decode.imported_kv = std::make_shared<const runtime::KvRows>(
      FetchKvRows("127.0.0.1", server.port(), 11, layout, kSecret, 5, true));
  EXPECT_FALSE(decode.imported_kv->device.has_value());
  for (int i = 0; i < 200 && server.transfers_done() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(producer.stats().kv_held, 0);  // released after the DONE
  runtime::Engine consumer(*model, runner, {0, 0, false, 16, 0});
  consumer.Add(21, decode);
  EXPECT_EQ(drain(consumer).first, want);
}

}  // namespace
}  // namespace afd::pd
