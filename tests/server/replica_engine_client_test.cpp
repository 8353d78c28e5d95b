// The engine channel and the frontend's client of the attention replicas, against replicas
// played by the test over real sockets: frames survive any split, requests go to the replica
// with the fewest live ones, outputs reach their callbacks, and a replica that vanishes ends
// every live request with an error naming it. KV transfers: held rows are exported by the
// replica that holds them and released there; imported rows travel attached to the submit.
#include "afd/server/replica_engine_client.h"

#include <gtest/gtest.h>

#include <cmath>
#include <future>

#include "afd/common/error.h"
#include "afd/deploy/engine_wire.h"
#include "afd/deploy/replica_serve.h"

namespace afd::server {
namespace {

using deploy::EngineMessage;
using Kind = deploy::EngineMessage::Kind;

TEST(EngineWire, EveryMessageRoundTrips) {
  EngineMessage submit;
  submit.kind = Kind::kSubmit;
  submit.id = 1ull << 60;
  submit.params.prompt = {1, 2, 3};
  submit.params.max_tokens = 9;
  submit.params.sampling = {0.5f, 7, 0.9f, 42};
  submit.params.sampler_stream = 3;
  submit.params.stop_token_ids = {5};
  submit.params.ignore_eos = true;
  submit.params.logprobs = 2;
  submit.params.prompt_logprobs = 1;
  const EngineMessage s = deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(submit), "t");
  EXPECT_EQ(s.kind, Kind::kSubmit);
  EXPECT_EQ(s.id, submit.id);
  EXPECT_EQ(s.params.prompt, submit.params.prompt);
  EXPECT_EQ(s.params.max_tokens, 9);
  EXPECT_EQ(s.params.sampling.temperature, 0.5f);
  EXPECT_EQ(s.params.sampling.top_k, 7);
  EXPECT_EQ(s.params.sampling.top_p, 0.9f);
  EXPECT_EQ(s.params.sampling.seed, 42u);
  EXPECT_EQ(s.params.sampler_stream, 3);
  EXPECT_EQ(s.params.stop_token_ids, submit.params.stop_token_ids);
  EXPECT_TRUE(s.params.ignore_eos);
  EXPECT_EQ(s.params.logprobs, 2);
  EXPECT_EQ(s.params.prompt_logprobs, 1);

  EngineMessage step;
  step.kind = Kind::kStep;
  runtime::RequestOutput o;
  o.request_id = 7;
  o.token_ids = {11};
  o.logprobs = {{-0.25f, {{11, -0.25f}, {3, -2.5f}}}};
  o.prompt_logprobs = {{std::nanf(""), {}}, {-1.5f, {{4, -1.0f}}}};
  o.num_prompt_tokens = 2;
  o.finished = true;
  o.finish_reason = runtime::FinishReason::kStop;
  o.stop_token_id = 11;
  step.outputs = {o, runtime::RequestOutput::Rejected(8, "prompt token id 9 is outside")};
  step.stats = {1, 2, 3, 4, 5, 6};
  step.round_trips = {{0, 1, 2}, 0.5, 3};
  const EngineMessage t = deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(step), "t");
  ASSERT_EQ(t.outputs.size(), 2u);
  EXPECT_FALSE(t.outputs[0].rejected);
  EXPECT_TRUE(t.outputs[1].rejected);  // refused for its input: the frontend answers 400
  EXPECT_EQ(t.outputs[1].error, "prompt token id 9 is outside");
  EXPECT_EQ(t.outputs[1].finish_reason, runtime::FinishReason::kError);
  const runtime::RequestOutput& r = t.outputs[0];
  EXPECT_EQ(r.request_id, 7u);
  EXPECT_EQ(r.token_ids, o.token_ids);
  ASSERT_EQ(r.logprobs.size(), 1u);
  EXPECT_EQ(r.logprobs[0].logprob, -0.25f);
  ASSERT_EQ(r.logprobs[0].top.size(), 2u);
  EXPECT_EQ(r.logprobs[0].top[1].id, 3);
  EXPECT_TRUE(std::isnan(r.prompt_logprobs[0].logprob));
  EXPECT_EQ(r.prompt_logprobs[1].top[0].logprob, -1.0f);
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(r.finish_reason, runtime::FinishReason::kStop);
  EXPECT_EQ(r.stop_token_id, 11);
  EXPECT_EQ(t.stats.kv_blocks_total, 4);
  EXPECT_EQ(t.round_trips.bucket_counts, step.round_trips.bucket_counts);

  EngineMessage challenge;
  challenge.kind = Kind::kChallenge;
  challenge.challenge = {"00ff", true};
  const EngineMessage c = deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(challenge), "t");
  EXPECT_EQ(c.kind, Kind::kChallenge);
  EXPECT_EQ(c.challenge.nonce, "00ff");
  EXPECT_TRUE(c.challenge.secret);
  EngineMessage refused;
  refused.kind = Kind::kRefused;
  refused.why = "no";
  EXPECT_EQ(deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(refused), "t").why, "no");
  EngineMessage hello;
  hello.kind = Kind::kHello;
  hello.hello.dp_rank = 3;
  hello.hello.proof = deploy::EngineHelloProof(std::string("s3cret-s3cret-s3cret"), "ab", 3);
  EXPECT_EQ(hello.hello.proof.size(), 64u);
  EXPECT_NE(hello.hello.proof,
            deploy::EngineHelloProof(std::string("s3cret-s3cret-s3cret"), "ab", 4));
  EXPECT_EQ(deploy::EngineHelloProof(std::nullopt, "ab", 3), "");
  EXPECT_EQ(deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(hello), "t").hello.proof,
            hello.hello.proof);

  EXPECT_EQ(
      deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(hello), "t").hello.kv_layout.dtype,
      DType::kF32);

  EXPECT_THROW(deploy::DecodeEngineMessage("{\"kind\": \"submit\"}", "replica 3"), Error);
  EXPECT_THROW(deploy::DecodeEngineMessage("not json", "replica 3"), Error);
  try {
    deploy::DecodeEngineMessage("{\"kind\": \"dance\"}", "replica 3");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("replica 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(deploy::ParseEndpoint("localhost", "--engine-endpoint"), Error);
  EXPECT_THROW(deploy::ParseEndpoint("h:70000", "--engine-endpoint"), Error);
  EXPECT_EQ(deploy::ParseEndpoint("127.0.0.1:5", "x").second, 5);
}

runtime::KvRows Rows(int64_t positions) {
  runtime::KvRows kv;
  kv.num_layers = 2;
  kv.row_width = 3;
  kv.positions = positions;
  kv.dtype = DType::kBF16;
  kv.bytes.resize(kv.expected_bytes());
  for (size_t i = 0; i < kv.bytes.size(); ++i) kv.bytes[i] = static_cast<char>(i * 37);  // NULs too
  return kv;
}

std::string Why(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(EngineWire, KvRowsTravelAttachedToTheirMessages) {
  EngineMessage submit;
  submit.kind = Kind::kSubmit;
  submit.id = 5;
  submit.params.prompt = {1, 2, 3, 4, 5};
  submit.params.hold_kv_s = 12.5;
  submit.params.imported_kv = std::make_shared<const runtime::KvRows>(Rows(4));
  const std::string frame = deploy::EncodeEngineMessage(submit);
  const EngineMessage s = deploy::DecodeEngineMessage(frame, "t");
  EXPECT_EQ(s.params.hold_kv_s, 12.5);
  ASSERT_TRUE(s.params.imported_kv);
  EXPECT_EQ(s.params.imported_kv->positions, 4);
  EXPECT_EQ(s.params.imported_kv->num_layers, 2);
  EXPECT_EQ(s.params.imported_kv->row_width, 3);
  EXPECT_EQ(s.params.imported_kv->dtype, DType::kBF16);
  EXPECT_EQ(s.params.imported_kv->bytes, submit.params.imported_kv->bytes);
  submit.params.imported_kv.reset();
  submit.params.hold_kv_s = 0;
  const EngineMessage plain = deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(submit), "t");
  EXPECT_FALSE(plain.params.imported_kv);
  EXPECT_EQ(plain.params.hold_kv_s, 0);

  for (Kind k : {Kind::kExportKv, Kind::kReleaseKv}) {
    EngineMessage m;
    m.kind = k;
    m.id = 77;
    const EngineMessage d = deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(m), "t");
    EXPECT_EQ(d.kind, k);
    EXPECT_EQ(d.id, 77u);
  }
  EngineMessage rows;
  rows.kind = Kind::kKvRows;
  rows.id = 8;
  rows.kv = std::make_shared<runtime::KvRows>(Rows(6));
  const EngineMessage r = deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(rows), "t");
  ASSERT_TRUE(r.kv);
  EXPECT_EQ(r.kv->bytes, rows.kv->bytes);
  EngineMessage none;
  none.kind = Kind::kKvRows;
  none.id = 8;
  none.why = "request 8 holds no KV rows";
  const EngineMessage n = deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(none), "t");
  EXPECT_FALSE(n.kv);
  EXPECT_EQ(n.why, none.why);

  // A frame whose attachment is not the size its layout says, or that nothing reads, is refused
  // naming the sender.
  const std::string good = deploy::EncodeEngineMessage(rows);
  EXPECT_NE(Why([&] {
              deploy::DecodeEngineMessage(good.substr(0, good.size() - 1), "replica 2");
            }).find("replica 2"),
            std::string::npos);
  EXPECT_NE(Why([&] { deploy::DecodeEngineMessage(good + "x", "r"); }).find("need 72 bytes"),
            std::string::npos);
  std::string stray = deploy::EncodeEngineMessage(none);
  stray += std::string("\0abc", 4);
  EXPECT_NE(Why([&] { deploy::DecodeEngineMessage(stray, "r"); }).find("does not use"),
            std::string::npos);
  const std::string bad_dtype =
      R"({"kind": "kv_rows", "id": 1, "kv": {"layers": 1, "width": 1, "positions": 1, "dtype": 9}})";
  EXPECT_NE(Why([&] {
              deploy::DecodeEngineMessage(bad_dtype + std::string(1, '\0') + "ab", "r");
            }).find("dtype 9"),
            std::string::npos);
  const std::string huge =
      R"({"kind": "kv_rows", "id": 1, "kv": {"layers": 2147483647, "width": 2147483647, )"
      R"("positions": 2147483647, "dtype": 5}})";
  EXPECT_THROW(deploy::DecodeEngineMessage(huge + std::string(1, '\0'), "r"), Error);
}

// The cuda_ipc KV transport on the engine channel: an export that may answer with device rows,
// device rows described (nothing attached) both ways, a producer's hold on the device, and the
// consumer's kv_imported.
TEST(EngineWire, DeviceKvRowsTravelAsTheirDescription) {
  EngineMessage exp;
  exp.kind = Kind::kExportKv;
  exp.id = 3;
  exp.device_ok = true;
  EXPECT_TRUE(deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(exp), "t").device_ok);
  exp.device_ok = false;
  EXPECT_FALSE(deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(exp), "t").device_ok);

  auto device = std::make_shared<runtime::KvRows>(Rows(70));
  device->bytes.clear();
  device->device = runtime::KvDeviceRows{std::string("\0\x01\xff handle", 10), 4096, 64, {9, 2}};
  EngineMessage rows;
  rows.kind = Kind::kKvRows;
  rows.id = 3;
  rows.kv = device;
  const std::string frame = deploy::EncodeEngineMessage(rows);
  EXPECT_EQ(frame.find('\0'), std::string::npos);  // nothing attached
  const EngineMessage r = deploy::DecodeEngineMessage(frame, "t");
  ASSERT_TRUE(r.kv && r.kv->device);
  EXPECT_EQ(r.kv->device->ipc_handle, device->device->ipc_handle);
  EXPECT_EQ(r.kv->device->num_slots, 4096);
  EXPECT_EQ(r.kv->device->block_size, 64);
  EXPECT_EQ(r.kv->device->blocks, (std::vector<int32_t>{9, 2}));
  EXPECT_EQ(r.kv->positions, 70);
  EXPECT_NE(Why([&] {
              deploy::DecodeEngineMessage(frame + std::string("\0ab", 3), "r");
            }).find("device KV rows with 2 bytes attached"),
            std::string::npos);

  EngineMessage submit;
  submit.kind = Kind::kSubmit;
  submit.id = 4;
  submit.params.prompt = {1, 2, 3};
  submit.params.hold_kv_s = 30;
  submit.params.hold_kv_on_device = true;
  submit.params.imported_kv = device;
  const EngineMessage s = deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(submit), "t");
  EXPECT_TRUE(s.params.hold_kv_on_device);
  ASSERT_TRUE(s.params.imported_kv && s.params.imported_kv->device);
  EXPECT_EQ(s.params.imported_kv->device->blocks, (std::vector<int32_t>{9, 2}));

  EngineMessage step;
  step.kind = Kind::kStep;
  runtime::RequestOutput o;
  o.request_id = 4;
  o.kv_imported = true;
  step.outputs = {o};
  const EngineMessage t = deploy::DecodeEngineMessage(deploy::EncodeEngineMessage(step), "t");
  ASSERT_EQ(t.outputs.size(), 1u);
  EXPECT_TRUE(t.outputs[0].kv_imported);
}

// A replica played by the test: connects, says hello, answers as told.
class FakeReplica {
 public:
  FakeReplica(const std::string& endpoint, int dp_rank,
              const std::optional<std::string>& secret = std::nullopt,
              const runtime::KvLayout& layout = {"tiny", 2, 3, DType::kBF16}) {
    const auto [host, port] = deploy::ParseEndpoint(endpoint, "endpoint");
    conn_ = std::make_unique<deploy::FrameConnection>(
        comm::Connect(host, port, Deadline::In(10), "frontend"), "frontend");
    const EngineMessage challenge = Next();
    EXPECT_EQ(challenge.kind, Kind::kChallenge);
    EXPECT_EQ(challenge.challenge.nonce.size(), 64u);
    EngineMessage hello;
    hello.kind = Kind::kHello;
    hello.hello.dp_rank = dp_rank;
    hello.hello.vocab_size = 1000;
    hello.hello.max_model_len = 512;
    hello.hello.eos_token_ids = {2};
    hello.hello.kv_blocks = 64;
    hello.hello.kv_layout = layout;
    hello.hello.proof = deploy::EngineHelloProof(secret, challenge.challenge.nonce, dp_rank);
    conn_->Send(deploy::EncodeEngineMessage(hello), 10);
  }
  EngineMessage Next() {
    const std::optional<std::string> f = conn_->Poll(10);
    if (!f) AFD_THROW("no frame from the frontend within 10 s");
    return deploy::DecodeEngineMessage(*f, "frontend");
  }
  void Reply(std::vector<runtime::RequestOutput> outputs, int64_t running) {
    EngineMessage step;
    step.kind = Kind::kStep;
    step.outputs = std::move(outputs);
    step.stats.num_running = running;
    step.stats.kv_blocks_total = 64;
    step.round_trips = {std::vector<int64_t>(deploy::RoundTripBounds().size() + 1, 0), 0.002, 2};
    step.round_trips.bucket_counts[3] = 2;
    conn_->Send(deploy::EncodeEngineMessage(step), 10);
  }
  void Report(std::vector<runtime::RequestOutput> outputs, const runtime::EngineStats& stats) {
    EngineMessage step;
    step.kind = Kind::kStep;
    step.outputs = std::move(outputs);
    step.stats = stats;
    conn_->Send(deploy::EncodeEngineMessage(step), 10);
  }
  void Send(const EngineMessage& m) { conn_->Send(deploy::EncodeEngineMessage(m), 10); }
  void Close() { conn_->Close(); }

 private:
  std::unique_ptr<deploy::FrameConnection> conn_;
};

runtime::RequestOutput Out(uint64_t id, int32_t token, bool finished) {
  runtime::RequestOutput o;
  o.request_id = id;
  o.token_ids = {token};
  o.finished = finished;
  o.finish_reason = finished ? runtime::FinishReason::kLength : runtime::FinishReason::kNone;
  return o;
}

// With a join secret, a hello that does not prove it is refused (the replica is told why) and
// dropped; so is a connection that sends garbage. Neither fails the deployment: the replica
// with the right secret joins after them.
TEST(ReplicaEngineClient, HellosMustProveTheJoinSecret) {
  EngineListenOptions listen;
  listen.secret = std::string("the deployment's secret, 32 bytes");
  ReplicaEngineClient client(1, 0, listen);
  {
    FakeReplica impostor(client.endpoint(), 0, std::string("another secret entirely......."));
    const EngineMessage refused = impostor.Next();
    EXPECT_EQ(refused.kind, Kind::kRefused);
    EXPECT_NE(refused.why.find("join secret"), std::string::npos) << refused.why;
  }
  {
    const auto [host, port] = deploy::ParseEndpoint(client.endpoint(), "endpoint");
    comm::Socket junk = comm::Connect(host, port, Deadline::In(10), "frontend");
    const char garbage[] = "GET / HTTP/1.1\r\n\r\n";
    junk.SendAll(garbage, sizeof(garbage), Deadline::In(5), "frontend");
  }
  {
    // A 1 MiB "hello" from a peer that has not authenticated: refused from its length alone.
    const auto [host, port] = deploy::ParseEndpoint(client.endpoint(), "endpoint");
    comm::Socket big = comm::Connect(host, port, Deadline::In(10), "frontend");
    const unsigned char header[4] = {0, 0, 16, 0};  // 1 << 20, little-endian
    big.SendAll(header, sizeof(header), Deadline::In(5), "frontend");
    const std::string filler(64 * 1024, 'x');
    try {
      big.SendAll(filler.data(), filler.size(), Deadline::In(5), "frontend");
    } catch (const Error&) {
      // Dropped before it read it all: what is expected.
    }
  }
  EXPECT_TRUE(client.Failure().empty()) << client.Failure();
  FakeReplica replica(client.endpoint(), 0, listen.secret);
  EXPECT_TRUE(client.WaitReady(10)) << client.Failure();
  EXPECT_TRUE(client.Failure().empty()) << client.Failure();
}

TEST(ReplicaEngineClient, RoutesToTheLeastLoadedReplicaAndDeliversOutputs) {
  ReplicaEngineClient client(2, 4);  // this host serves DP ranks 4 and 5
  EXPECT_FALSE(client.Ready());
  FakeReplica r5(client.endpoint(), 5), r4(client.endpoint(), 4);
  ASSERT_TRUE(client.WaitReady(10));
  EXPECT_EQ(client.model_info().vocab_size, 1000);
  EXPECT_EQ(client.model_info().max_model_len, 512);

  std::vector<std::promise<std::vector<int32_t>>> done(3);
  auto submit = [&](uint64_t id) {
    auto acc = std::make_shared<std::vector<int32_t>>();
    runtime::RequestParams p;
    p.prompt = {1, 2};
    client.Submit(id, p, [acc, &done, id](const runtime::RequestOutput& o) {
      acc->insert(acc->end(), o.token_ids.begin(), o.token_ids.end());
      if (o.finished) done[id].set_value(*acc);
    });
  };
  submit(0);  // both idle: the lowest DP rank (4)
  EngineMessage m = r4.Next();
  EXPECT_EQ(m.kind, Kind::kSubmit);
  EXPECT_EQ(m.id, 0u);
  submit(1);  // replica 4 has one live request: replica 5
  EXPECT_EQ(r5.Next().id, 1u);
  submit(2);  // one each: the lowest again
  EXPECT_EQ(r4.Next().id, 2u);
  r4.Reply({Out(0, 10, false), Out(2, 30, false)}, 2);
  r5.Reply({Out(1, 20, true)}, 0);
  r4.Reply({Out(0, 11, true), Out(2, 31, true)}, 0);
  EXPECT_EQ(done[0].get_future().get(), (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(done[1].get_future().get(), (std::vector<int32_t>{20}));
  EXPECT_EQ(done[2].get_future().get(), (std::vector<int32_t>{30, 31}));
  const EngineLoad load = client.Load();
  EXPECT_EQ(load.engines.size(), 2u);
  EXPECT_EQ(load.connector.count, 6);
  EXPECT_EQ(load.connector.bucket_counts.back(), 6);  // cumulative
  EXPECT_EQ(client.num_live(), 0);

  // An abort goes to the request's replica; a finished id may be reused.
  auto ended = std::make_shared<std::promise<runtime::FinishReason>>();
  runtime::RequestParams p;
  p.prompt = {3};
  client.Submit(0, p, [ended](const runtime::RequestOutput& o) {
    if (o.finished) ended->set_value(o.finish_reason);
  });
  EXPECT_EQ(r4.Next().id, 0u);
  client.Abort(0);
  const EngineMessage abort = r4.Next();
  EXPECT_EQ(abort.kind, Kind::kAbort);
  EXPECT_EQ(abort.id, 0u);

  // Shutdown reaches every replica; new requests are refused with an error output.
  client.Shutdown();
  EXPECT_EQ(r4.Next().kind, Kind::kShutdown);
  EXPECT_EQ(r5.Next().kind, Kind::kShutdown);
  std::promise<runtime::FinishReason> refused;
  client.Submit(99, p,
                [&](const runtime::RequestOutput& o) { refused.set_value(o.finish_reason); });
  EXPECT_EQ(refused.get_future().get(), runtime::FinishReason::kError);
  // The abort was never answered (the replica is gone): it ends with the client.
}

// The load is what the replicas report (running, waiting, KV blocks: their engines' own
// counts), per replica and summed, plus the requests sent that no report has counted yet (as
// waiting) -- what /metrics and admission read, as for an engine in the server's process.
TEST(ReplicaEngineClient, LoadIsWhatTheReplicasReport) {
  ReplicaEngineClient client(2, 0);
  FakeReplica r0(client.endpoint(), 0), r1(client.endpoint(), 1);
  ASSERT_TRUE(client.WaitReady(10));
  std::vector<std::promise<void>> first(4);
  for (uint64_t id = 0; id < 4; ++id) {
    runtime::RequestParams p;
    p.prompt = {1, 2};
    auto seen = std::make_shared<bool>(false);
    client.Submit(id, p, [&first, id, seen](const runtime::RequestOutput&) {
      if (!*seen) first[id].set_value();
      *seen = true;
    });
  }
  // Before any report: all four waiting, on their way.
  EngineLoad load = client.Load();
  EXPECT_EQ(load.total.num_running, 0);
  EXPECT_EQ(load.total.num_waiting, 4);
  EXPECT_EQ(load.total.kv_blocks_total, 128);  // the hellos' blocks
  for (int i = 0; i < 2; ++i) EXPECT_EQ(r0.Next().kind, Kind::kSubmit);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(r1.Next().kind, Kind::kSubmit);
  runtime::EngineStats s0;
  s0.num_running = 1;
  s0.num_waiting = 1;
  s0.kv_blocks_used = 7;
  s0.kv_blocks_total = 64;
  s0.steps = 3;
  r0.Report({Out(0, 5, false)}, s0);
  first[0].get_future().get();
  load = client.Load();
  EXPECT_EQ(load.engines[0].num_running, 1);
  EXPECT_EQ(load.engines[0].num_waiting, 1);
  EXPECT_EQ(load.engines[0].kv_blocks_used, 7);
  EXPECT_EQ(load.total.num_running, 1);
  EXPECT_EQ(load.total.num_waiting, 3);  // replica 0's one + replica 1's two not reported yet
  runtime::EngineStats s1 = s0;
  s1.num_running = 2;
  s1.num_waiting = 0;
  s1.kv_blocks_used = 20;
  r1.Report({Out(2, 6, false)}, s1);
  first[2].get_future().get();
  load = client.Load();
  EXPECT_EQ(load.total.num_running, 3);
  EXPECT_EQ(load.total.num_waiting, 1);
  EXPECT_EQ(load.total.kv_blocks_used, 27);
  EXPECT_EQ(load.total.kv_blocks_total, 128);
  EXPECT_EQ(load.total.steps, 6);
  // Everything finished: nothing running, nothing waiting.
  runtime::EngineStats idle;
  idle.kv_blocks_total = 64;
  std::promise<void> last;
  runtime::RequestParams nine_params;
  nine_params.prompt = {1};
  client.Submit(9, nine_params, [&](const runtime::RequestOutput& o) {
    if (o.finished) last.set_value();
  });
  const EngineMessage nine = r0.Next();  // replica 0: 2 live against replica 1's 2, lower rank
  EXPECT_EQ(nine.id, 9u);
  r1.Report({Out(2, 7, true), Out(3, 8, true)}, idle);
  r0.Report({Out(0, 9, true), Out(1, 9, true), Out(9, 9, true)}, idle);
  last.get_future().get();
  load = client.Load();
  EXPECT_EQ(load.total.num_running, 0);
  EXPECT_EQ(load.total.num_waiting, 0);
  EXPECT_EQ(load.total.kv_blocks_used, 0);
  client.Shutdown();
}

TEST(ReplicaEngineClient, ALostReplicaFailsEveryLiveRequest) {
  ReplicaEngineClient client(1, 0);
  FakeReplica r0(client.endpoint(), 0);
  ASSERT_TRUE(client.WaitReady(10));
  std::promise<runtime::RequestOutput> result;
  runtime::RequestParams p;
  p.prompt = {1};
  client.Submit(9, p, [&](const runtime::RequestOutput& o) {
    if (o.finished) result.set_value(o);
  });
  EXPECT_EQ(r0.Next().id, 9u);
  r0.Close();
  auto f = result.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const runtime::RequestOutput o = f.get();
  EXPECT_EQ(o.finish_reason, runtime::FinishReason::kError);
  EXPECT_NE(o.error.find("attention replica 0"), std::string::npos) << o.error;
  EXPECT_FALSE(client.Ready());
  EXPECT_NE(client.Failure().find("attention replica 0"), std::string::npos);
  // Later submissions fail at once.
  std::promise<runtime::RequestOutput> late;
  client.Submit(10, p, [&](const runtime::RequestOutput& o) { late.set_value(o); });
  EXPECT_EQ(late.get_future().get().finish_reason, runtime::FinishReason::kError);
}

TEST(ReplicaEngineClient, MissingReplicasAreNamedAtTheReadyTimeout) {
  ReplicaEngineClient client(3, 0);
  FakeReplica r1(client.endpoint(), 1);
  EXPECT_FALSE(client.WaitReady(0.5));
  EXPECT_NE(client.Failure().find("replica(s) 0 2"), std::string::npos) << client.Failure();
}

TEST(ReplicaEngineClient, AReplicaWithAnotherDpRankIsRefused) {
  ReplicaEngineClient client(1, 0);
  FakeReplica stranger(client.endpoint(), 3);
  EXPECT_FALSE(client.WaitReady(10));
  EXPECT_NE(client.Failure().find("DP rank 3"), std::string::npos) << client.Failure();
}

// A producer's held rows: the frontend remembers which replica holds a request's rows, asks it
// for them (export_kv, answered kv_rows) and tells it to release them; what a replica answers
// (rows, a reason, nothing) reaches the caller of ExportHeldKv within its timeout.
TEST(ReplicaEngineClient, ExportsHeldRowsFromTheReplicaThatHoldsThem) {
  ReplicaEngineClient client(2, 0);
  FakeReplica r0(client.endpoint(), 0), r1(client.endpoint(), 1);
  ASSERT_TRUE(client.WaitReady(10));
  EXPECT_TRUE(client.SupportsKvTransfer());
  const runtime::KvLayout layout = client.kv_cache_layout();
  EXPECT_EQ(layout.model, "tiny");
  EXPECT_EQ(layout.row_width, 3);
  EXPECT_EQ(layout.dtype, DType::kBF16);

  runtime::RequestParams p;
  p.prompt = {1, 2, 3};
  p.max_tokens = 1;
  client.Submit(20, p, [](const runtime::RequestOutput&) {});  // replica 0, not held
  EXPECT_EQ(r0.Next().id, 20u);
  p.hold_kv_s = 30;
  std::promise<runtime::RequestOutput> prefilled;
  client.Submit(21, p, [&](const runtime::RequestOutput& o) {
    if (o.finished) prefilled.set_value(o);
  });
  const EngineMessage sent = r1.Next();  // the least loaded
  EXPECT_EQ(sent.id, 21u);
  EXPECT_EQ(sent.params.hold_kv_s, 30);
  runtime::RequestOutput done = Out(21, 9, true);
  done.kv_held = true;
  done.kv_positions = 3;
  done.kv_block_ids = {7};
  r1.Reply({done}, 0);
  const runtime::RequestOutput held = prefilled.get_future().get();
  EXPECT_TRUE(held.kv_held);
  EXPECT_EQ(held.kv_positions, 3);
  EXPECT_EQ(held.kv_block_ids, std::vector<int32_t>{7});

  auto exported = std::async(std::launch::async, [&] { return client.ExportHeldKv(21, 10); });
  const EngineMessage ask = r1.Next();
  EXPECT_EQ(ask.kind, Kind::kExportKv);
  EXPECT_EQ(ask.id, 21u);
  EngineMessage rows;
  rows.kind = Kind::kKvRows;
  rows.id = 21;
  rows.kv = std::make_shared<runtime::KvRows>(Rows(3));
  r1.Send(rows);
  EXPECT_EQ(exported.get()->bytes, Rows(3).bytes);

  // The replica's reason, when it holds none (expired there), is the caller's error.
  auto refused =
      std::async(std::launch::async, [&] { return Why([&] { client.ExportHeldKv(21, 10); }); });
  EXPECT_EQ(r1.Next().kind, Kind::kExportKv);
  EngineMessage none;
  none.kind = Kind::kKvRows;
  none.id = 21;
  none.why = "request 21 holds no KV rows (past its hold timeout)";
  r1.Send(none);
  EXPECT_EQ(refused.get(), none.why);

  // A replica that does not answer: the caller's timeout, naming the replica.
  const std::string silent = Why([&] { client.ExportHeldKv(21, 0.2); });
  EXPECT_NE(silent.find("attention replica 1 did not send its KV rows within"), std::string::npos)
      << silent;
  EXPECT_EQ(r1.Next().kind, Kind::kExportKv);

  client.ReleaseHeldKv(21);
  const EngineMessage release = r1.Next();
  EXPECT_EQ(release.kind, Kind::kReleaseKv);
  EXPECT_EQ(release.id, 21u);
  // Released, a request not held, an unknown one: nothing to ask any replica for.
  for (uint64_t id : {21u, 20u, 99u}) {
    EXPECT_NE(Why([&] { client.ExportHeldKv(id, 1); }).find("holds no KV rows"), std::string::npos);
  }

  // Imported rows go to the replica with the submit (replica 1: the least loaded).
  runtime::RequestParams decode;
  decode.prompt = {1, 2, 3, 4};
  decode.imported_kv = std::make_shared<const runtime::KvRows>(Rows(3));
  client.Submit(22, decode, [](const runtime::RequestOutput&) {});
  const EngineMessage with_rows = r1.Next();
  ASSERT_TRUE(with_rows.params.imported_kv);
  EXPECT_EQ(with_rows.params.imported_kv->bytes, Rows(3).bytes);
  client.Shutdown();
}

// Imported rows past what one engine frame carries fail their request alone (a 400 for the API),
// never the deployment.
TEST(ReplicaEngineClient, RowsTooLargeForAFrameFailTheirRequestOnly) {
  ReplicaEngineClient client(1, 0);
  FakeReplica r0(client.endpoint(), 0);
  ASSERT_TRUE(client.WaitReady(10));
  auto huge = std::make_shared<runtime::KvRows>();
  huge->num_layers = 1;
  huge->row_width = 1;
  huge->dtype = DType::kU8;
  huge->positions = static_cast<int64_t>(deploy::kMaxKvAttachmentBytes) + 1;
  huge->bytes.resize(huge->expected_bytes());
  runtime::RequestParams p;
  p.prompt.assign(8, 1);
  p.imported_kv = huge;
  std::promise<runtime::RequestOutput> out;
  client.Submit(5, p, [&](const runtime::RequestOutput& o) { out.set_value(o); });
  const runtime::RequestOutput o = out.get_future().get();
  EXPECT_TRUE(o.rejected);
  EXPECT_NE(o.error.find("exceed"), std::string::npos) << o.error;
  EXPECT_TRUE(client.Failure().empty()) << client.Failure();
  EXPECT_TRUE(client.Ready());
}

TEST(ReplicaEngineClient, AnExportWaitingOnALostReplicaFailsAtOnce) {
  ReplicaEngineClient client(1, 0);
  FakeReplica r0(client.endpoint(), 0);
  ASSERT_TRUE(client.WaitReady(10));
  runtime::RequestParams p;
  p.prompt = {1, 2};
  p.hold_kv_s = 30;
  client.Submit(3, p, [](const runtime::RequestOutput&) {});
  EXPECT_EQ(r0.Next().id, 3u);
  auto exported =
      std::async(std::launch::async, [&] { return Why([&] { client.ExportHeldKv(3, 30); }); });
  EXPECT_EQ(r0.Next().kind, Kind::kExportKv);
  const auto start = std::chrono::steady_clock::now();
  r0.Close();
  const std::string why = exported.get();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_NE(why.find("attention replica 0 lost its engine connection"), std::string::npos) << why;
}

TEST(ReplicaEngineClient, ReplicasWithAnotherKvLayoutAreRefused) {
  ReplicaEngineClient client(2, 0);
  FakeReplica r0(client.endpoint(), 0);
  FakeReplica r1(client.endpoint(), 1, std::nullopt, {"tiny", 2, 3, DType::kF32});
  EXPECT_FALSE(client.WaitReady(10));
  EXPECT_NE(client.Failure().find("keeps its KV cache as \"tiny\" (3-wide"), std::string::npos)
      << client.Failure();
}

}  // namespace
}  // namespace afd::server
