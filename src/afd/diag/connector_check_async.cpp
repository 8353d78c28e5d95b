// `afd connector-test` with the asynchronous window connector (AsyncAFDConnector): the check
// and the round-trip benchmark of connector_check.cpp over windows instead of the P2P API.
//
// Check: attention rank a routes each token of (step, layer, stage) to two experts by a fixed
// rule, dispatches it (connector/dispatch_plan.h); every row encodes (sender, token, layer,
// stage), so the FFN rank checks where each routed and shared row came from and that it owns the
// row's expert, applies y = 3x + 1 and replies; the attention rank checks every returned row.
// Bench: n rows split over the FFN ranks (one local expert each), echoed back; time per layer
// round trip.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "afd/common/error.h"
#include "afd/connector/async_connector.h"
#include "afd/connector/dispatch_plan.h"
#include "afd/diag/connector_check.h"

namespace afd::diag {

namespace {

using connector::AsyncConnector;
using connector::ReceivedSlot;
using connector::SlotPayload;

constexpr int kTopk = 2;

int64_t TestRows(const ConnectorTestArgs& args, int step, int stage, int a) {
  return (step * 7 + stage * 3 + a * 5 + 1) % (args.max_rows + 1);
}

int64_t TestExperts(int F) { return 2 * F + 1; }

uint32_t Encode(int sender, int64_t token, int layer, int stage, int64_t c) {
  switch (c) {
    case 0:
      return sender;
    case 1:
      return static_cast<uint32_t>(token);
    case 2:
      return layer;
    case 3:
      return stage;
    default:
      return static_cast<uint32_t>(sender * 131 + token * 31 + c * 7 + layer * 17 + stage * 5);
  }
}

// Rows of raw integers of the wire dtype's width (2: bf16 bits, 4: f32 bits).
struct Rows {
  std::vector<char> bytes;
  size_t width;
  int64_t elems;
  uint32_t mask() const { return width == 2 ? 0xFFFFu : 0xFFFFFFFFu; }
  static uint32_t Get(const char* p, size_t width, int64_t i) {
    if (width == 2) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  void Set(int64_t i, uint32_t v) {
    if (width == 2) {
      const uint16_t h = static_cast<uint16_t>(v);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
  }
};

// Row `t` of (sender, layer, stage) encoded into rows.
Rows TokenRows(int sender, int64_t n, int layer, int stage, int64_t elems, size_t width) {
  Rows r{std::vector<char>(n * elems * width), width, elems};
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < elems; ++c) {
      r.Set(t * elems + c, Encode(sender, t, layer, stage, c) & r.mask());
    }
  }
  return r;
}

std::vector<int32_t> TestRouting(int a, int64_t n, int layer, int64_t experts) {
  std::vector<int32_t> ids(n * kTopk);
  for (int64_t t = 0; t < n; ++t) {
    // Two distinct experts, ascending.
    const int32_t e0 = static_cast<int32_t>((t * kTopk + a + layer) % experts);
    const int32_t e1 = static_cast<int32_t>((e0 + 1 + t % (experts - 1)) % experts);
    ids[t * kTopk] = std::min(e0, e1);
    ids[t * kTopk + 1] = std::max(e0, e1);
  }
  return ids;
}

void CheckRow(const char* row, size_t width, int64_t elems, int sender, int64_t token, int layer,
              int stage, bool transformed, const std::string& where) {
  const uint32_t mask = width == 2 ? 0xFFFFu : 0xFFFFFFFFu;
  for (int64_t c = 0; c < elems; ++c) {
    uint32_t want = Encode(sender, token, layer, stage, c) & mask;
    if (transformed) want = (3 * want + 1) & mask;
    const uint32_t got = Rows::Get(row, width, c);
    AFD_CHECK(got == want,
              "{}: element {} is {:#x}; expected {:#x} (token {} of attention rank "
              "{}, layer {}, stage {})",
              where, c, got, want, token, sender, layer, stage);
  }
}

void RunAttention(const ConnectorTestArgs& args, comm::AfdWorld& world, AsyncConnector& conn,
                  nlohmann::json& report) {
  const int me = world.self().rank, F = world.topology().num_ffn();
  const size_t width = DTypeSize(world.dtype());
  const int64_t elems = world.hidden_size(), E = TestExperts(F);
  const size_t row = width * elems;
  int64_t checked = 0;
  for (int step = 0; step < args.steps; ++step) {
    if (step == args.die_at_step) raise(SIGKILL);
    for (int layer = 0; layer < args.layers; ++layer) {
      // All stages in flight at once (one ring slot each), then every reply.
      std::vector<connector::DispatchPlan> plans(args.stages);
      std::vector<std::vector<uint64_t>> seqs(args.stages, std::vector<uint64_t>(F, 0));
      std::vector<Rows> inputs;
      for (int stage = 0; stage < args.stages; ++stage) {
        const int64_t n = TestRows(args, step, stage, me);
        inputs.push_back(TokenRows(me, n, layer, stage, elems, width));
        if (n == 0) continue;  // an empty micro-batch sends nothing
        const std::vector<int32_t> ids = TestRouting(me, n, layer, E);
        plans[stage] = connector::PlanDispatch(ids.data(), n, kTopk, E, F, true);
        const connector::DispatchPlan& p = plans[stage];
        for (int f = 0; f < F; ++f) {
          if (!p.HasWork(f)) continue;
          std::vector<char> routed, shared;
          for (int64_t i = p.segment[f]; i < p.segment[f + 1]; ++i) {
            const char* r = inputs.back().bytes.data() + p.token_at[i] * row;
            routed.insert(routed.end(), r, r + row);
          }
          for (int32_t t : p.shared_tokens[f]) {
            const char* r = inputs.back().bytes.data() + t * row;
            shared.insert(shared.end(), r, r + row);
          }
          SlotPayload s;
          s.layer = layer;
          s.stage = stage;
          s.num_tokens = static_cast<int>(n);
          s.expert_counts = p.expert_counts[f];
          s.route = std::span<const int32_t>(p.token_at.data() + p.segment[f],
                                             p.segment[f + 1] - p.segment[f]);
          s.routed_rows = routed.data();
          s.shared_index = p.shared_tokens[f];
          s.shared_rows = shared.data();
          seqs[stage][f] = conn.Send(f, s);
        }
      }
      for (int stage = 0; stage < args.stages; ++stage) {
        for (int f = 0; f < F; ++f) {
          if (seqs[stage][f] == 0) continue;
          const connector::DispatchPlan& p = plans[stage];
          const ReceivedSlot r =
              conn.Receive(f, stage, [&] { return fmt::format("the reply to layer {}", layer); });
          AFD_CHECK(!r.shutdown() && r.header.echo_seq == seqs[stage][f] &&
                        r.header.routed_rows == p.segment[f + 1] - p.segment[f] &&
                        r.header.shared_rows == static_cast<int>(p.shared_tokens[f].size()),
                    "step {} layer {} stage {}: FFN rank {} answered seq {} with {} routed and {} "
                    "shared rows, expected seq {}",
                    step, layer, stage, f, r.header.echo_seq, r.header.routed_rows,
                    r.header.shared_rows, seqs[stage][f]);
          for (int64_t i = 0; i < r.header.routed_rows; ++i) {
            CheckRow(r.routed_rows + i * row, width, elems, me, p.token_at[p.segment[f] + i], layer,
                     stage, true, fmt::format("reply of FFN rank {} routed row {}", f, i));
          }
          for (int64_t i = 0; i < r.header.shared_rows; ++i) {
            CheckRow(r.shared_rows + i * row, width, elems, me, p.shared_tokens[f][i], layer, stage,
                     true, fmt::format("reply of FFN rank {} shared row {}", f, i));
          }
          checked += r.header.routed_rows + r.header.shared_rows;
        }
      }
    }
  }
  conn.AnnounceShutdown();
  report["rows_checked"] = checked;
}

void RunFfn(const ConnectorTestArgs& args, comm::AfdWorld& world, AsyncConnector& conn,
            nlohmann::json& report) {
  const int me = world.self().rank, A = world.topology().num_attention();
  const size_t width = DTypeSize(world.dtype());
  const int64_t elems = world.hidden_size();
  const size_t row = width * elems;
  const int64_t begin = conn.expert_begin(me), local = conn.num_local_experts(me);
  int remaining = A;
  int64_t checked = 0, items = 0;
  while (remaining > 0) {
    std::optional<ReceivedSlot> in = conn.Poll(world.config().async_options.recv_poll_timeout_ms);
    if (!in) continue;
    const connector::SlotHeader& h = in->header;
    if (in->shutdown()) {
      --remaining;
      continue;
    }
    if (args.die_at_step >= 0 && items == static_cast<int64_t>(args.die_at_step) * args.layers) {
      raise(SIGKILL);
    }
    ++items;
    AFD_CHECK(h.num_experts == local,
              "attention rank {} sent {} expert counts, FFN rank {} has "
              "{} experts",
              h.sender, h.num_experts, me, local);
    std::vector<char> routed(in->routed_rows, in->routed_rows + h.routed_rows * row);
    std::vector<char> shared(in->shared_rows, in->shared_rows + h.shared_rows * row);
    const std::vector<int32_t> ids =
        TestRouting(h.sender, h.num_tokens, h.layer, TestExperts(world.topology().num_ffn()));
    int64_t i = 0;
    for (int64_t e = 0; e < local; ++e) {
      for (int32_t j = 0; j < in->expert_counts[e]; ++j, ++i) {
        AFD_CHECK(i < h.routed_rows, "attention rank {}: expert counts exceed the routed rows",
                  h.sender);
        const std::string where = fmt::format("routed row {} from attention rank {}", i, h.sender);
        CheckRow(routed.data() + i * row, width, elems, h.sender, in->route[i], h.layer, h.stage,
                 false, where);
        // The row's token must be routed to this local expert by the test's rule.
        const int32_t t = in->route[i];
        AFD_CHECK(ids[t * kTopk] == begin + e || ids[t * kTopk + 1] == begin + e,
                  "{}: token {} is not routed to expert {}", where, t, begin + e);
      }
    }
    for (int64_t s = 0; s < h.shared_rows; ++s) {
      AFD_CHECK(in->shared_index[s] % world.topology().num_ffn() == me,
                "shared row {} from attention rank {}: token {} belongs to another FFN rank", s,
                h.sender, in->shared_index[s]);
      CheckRow(shared.data() + s * row, width, elems, h.sender, in->shared_index[s], h.layer,
               h.stage, false, fmt::format("shared row {} from attention rank {}", s, h.sender));
    }
    const uint32_t mask = width == 2 ? 0xFFFFu : 0xFFFFFFFFu;
    for (std::vector<char>* rows : {&routed, &shared}) {
      Rows r{std::move(*rows), width, elems};
      for (int64_t x = 0; x < static_cast<int64_t>(r.bytes.size() / width); ++x) {
        r.Set(x, (3 * Rows::Get(r.bytes.data(), width, x) + 1) & mask);
      }
      *rows = std::move(r.bytes);
    }
    SlotPayload reply;
    reply.layer = h.layer;
    reply.stage = h.stage;
    reply.num_tokens = h.num_tokens;
    reply.flags = connector::kSlotCombine;
    reply.echo_seq = h.seq;
    reply.expert_counts = std::span<const int32_t>(in->expert_counts, h.num_experts);
    reply.route = std::span<const int32_t>(in->route, h.routed_rows);
    reply.routed_rows = routed.data();
    reply.shared_index = std::span<const int32_t>(in->shared_index, h.shared_rows);
    reply.shared_rows = shared.data();
    conn.Send(h.sender, reply);
    checked += h.routed_rows + h.shared_rows;
  }
  conn.AnnounceShutdown();
  report["steps"] = items;
  report["rows_checked"] = checked;
}

// Bench: n rows per layer round trip, split over the FFN ranks, echoed unchanged.
void RunBench(const ConnectorTestArgs& args, comm::AfdWorld& world, AsyncConnector& conn, RowIo& io,
              nlohmann::json& report) {
  const int F = world.topology().num_ffn();
  const size_t row = DTypeSize(world.dtype()) * world.hidden_size();
  nlohmann::json results = nlohmann::json::array();
  if (world.self().role == Role::kFfn) {
    int remaining = world.topology().num_attention();
    while (remaining > 0) {
      std::optional<ReceivedSlot> in = conn.Poll(world.config().async_options.recv_poll_timeout_ms);
      if (!in) continue;
      if (in->shutdown()) {
        --remaining;
        continue;
      }
      const connector::SlotHeader& h = in->header;
      SlotPayload reply;
      reply.layer = h.layer;
      reply.num_tokens = h.num_tokens;
      reply.flags = connector::kSlotCombine;
      reply.echo_seq = h.seq;
      reply.expert_counts = std::span<const int32_t>(in->expert_counts, h.num_experts);
      reply.route = std::span<const int32_t>(in->route, h.routed_rows);
      reply.routed_rows = in->routed_rows;
      conn.Send(h.sender, reply);
    }
    conn.AnnounceShutdown();
    report["bench"] = results;
    return;
  }
  for (int64_t n : BenchRowCounts(args)) {
    // The rows live where the connector's rows do (host or device memory); the last round
    // trip's echo is checked on the host.
    std::vector<char> in(n * row), out(n * row);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<char>(i * 7 + 1);
    char* dev_in = static_cast<char*>(io.Buffer(n * row, 0));
    io.Upload(dev_in, in);
    io.Synchronize(world.config().afd_process_group_timeout_s);
    std::vector<int32_t> route(n);
    for (int64_t t = 0; t < n; ++t) route[t] = static_cast<int32_t>(t);
    // Pass 0: the host's round trip (from its first send to seeing the replies; with device
    // flags, to the stream being past its waits). Pass 1, device flags with device rows: the
    // stream's own round trip, from the rows' copy starting on the GPU to the stream passing
    // the waits, everything enqueued while the stream is held (what a decode step's stream
    // stalls per layer when its host runs ahead).
    const int passes = conn.device_flags() && conn.device_rows() ? 2 : 1;
    std::vector<double> us, stream_us;
    for (int pass = 0; pass < passes; ++pass) {
      const bool held = pass == 1;
      for (int it = 0; it < args.iters + 2; ++it) {
        const auto start = std::chrono::steady_clock::now();
        // Released below, or on the way out of an error (the connector's destructor then
        // drains this stream).
        struct Hold {
          RowIo* io;
          ~Hold() {
            if (io) io->Release();
          }
        } hold{held ? &io : nullptr};
        if (held) {
          io.Hold();
          io.Mark(0);
        }
        std::vector<uint64_t> seqs(F, 0);
        for (int f = 0; f < F; ++f) {
          const int64_t b = SplitOffset(n, F, f), m = SplitSize(n, F, f);
          if (m == 0) continue;
          std::vector<int32_t> counts(conn.num_local_experts(f), 0);
          counts[0] = static_cast<int32_t>(m);
          SlotPayload s;
          s.num_tokens = static_cast<int>(n);
          s.expert_counts = counts;
          s.route = std::span<const int32_t>(route.data() + b, m);
          s.routed_rows = dev_in + b * row;
          seqs[f] = conn.Send(f, s);
        }
        // Device flags: the stream waits for each reply (as the attention runner's combine
        // does), the host checks the replies, and the round trip ends when the stream is past
        // them.
        for (int f = 0; f < F && conn.device_flags(); ++f) {
          if (seqs[f] != 0) conn.EnqueueWait(f, 0);
        }
        if (held) {
          io.Mark(1);
          io.Release();
          hold.io = nullptr;
        }
        for (int f = 0; f < F; ++f) {
          if (seqs[f] == 0) continue;
          const ReceivedSlot r = conn.Receive(f, 0, "a bench reply");
          AFD_CHECK(r.header.echo_seq == seqs[f], "bench: FFN rank {} answered seq {}, expected {}",
                    f, r.header.echo_seq, seqs[f]);
          if (it == args.iters + 1 && pass == 0) {
            std::vector<char> echoed;
            io.Download(echoed, r.routed_rows, r.header.routed_rows * row);
            io.Synchronize(world.config().afd_process_group_timeout_s);
            std::memcpy(out.data() + SplitOffset(n, F, f) * row, echoed.data(), echoed.size());
          }
        }
        if (conn.device_flags()) io.Synchronize(world.config().afd_process_group_timeout_s);
        const double t =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count();
        if (it < 2) continue;  // two warm-up iterations
        if (held) {
          stream_us.push_back(io.MarkedMicros());
        } else {
          us.push_back(t);
        }
      }
    }
    AFD_CHECK(in == out, "bench: the echoed rows differ from the rows sent");
    std::sort(us.begin(), us.end());
    nlohmann::json r = {{"rows", n},
                        {"bytes_each_way", n * row},
                        {"median_us", us[us.size() / 2]},
                        {"p10_us", us[us.size() / 10]},
                        {"p90_us", us[us.size() * 9 / 10]}};
    if (!stream_us.empty()) {
      std::sort(stream_us.begin(), stream_us.end());
      r["stream_median_us"] = stream_us[stream_us.size() / 2];
      r["stream_p10_us"] = stream_us[stream_us.size() / 10];
      r["stream_p90_us"] = stream_us[stream_us.size() * 9 / 10];
    }
    results.push_back(std::move(r));
  }
  conn.AnnounceShutdown();
  report["bench"] = results;
}

}  // namespace

void RunAsyncConnectorTest(const ConnectorTestArgs& args, comm::AfdWorld& world,
                           nlohmann::json& report, int cuda_device, void* cuda_stream, RowIo& io) {
  const int F = world.topology().num_ffn();
  connector::AsyncConnectorOptions o;
  o.row = {world.hidden_size(), world.dtype()};
  o.cuda_device = cuda_device;
  o.cuda_stream = cuda_device >= 0 ? cuda_stream : nullptr;
  if (args.bench) {
    int64_t most = 1;
    for (int64_t n : BenchRowCounts(args)) most = std::max(most, n);
    o.token_cap = world.self().role == Role::kAttention ? most : 0;
    o.topk = 1;
    o.num_experts = F;
  } else {
    AFD_CHECK(args.stages <= world.config().async_options.ring_depth,
              "--stages {} needs connector_extra_config.ring_depth >= {} (one ring slot per stage)",
              args.stages, args.stages);
    o.token_cap = world.self().role == Role::kAttention ? std::max(1, args.max_rows) : 0;
    o.topk = kTopk;
    o.num_experts = TestExperts(F);
  }
  AsyncConnector conn(world, o);
  if (args.bench) {
    RunBench(args, world, conn, io, report);
  } else if (world.self().role == Role::kAttention) {
    RunAttention(args, world, conn, report);
  } else {
    RunFfn(args, world, conn, report);
  }
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& [layer, s] : conn.stats()) {
    layers.push_back(
        {{"layer", layer}, {"messages", s.messages}, {"bytes", s.bytes}, {"seconds", s.seconds}});
  }
  report["layers"] = layers;
}

}  // namespace afd::diag
