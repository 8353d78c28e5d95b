// `afd connector-test` (deploy side): runs one role process of a P2P connector round trip, like
// nccl-tests: every row encodes (sender rank, token index, layer, stage, step), the FFN side checks
// where each row came from and in which order, applies a known function, and the attention side
// checks the result. With --bench it times round trips instead (docs/perf.md).
#include "afd/diag/connector_check.h"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "afd/comm/afd_world.h"
#include "afd/common/error.h"
#include "afd/config/afd_config.h"
#include "afd/connector/p2p_connector.h"
#include "afd/deploy/device_context.h"
#include "afd/deploy/transport.h"
#include "afd/diag/row_io.h"

namespace afd::diag {

using deploy::CheckConnectorImplemented;
using deploy::DeviceContext;
using deploy::MakeDeviceContext;

namespace {

using connector::P2pConnector;
using connector::RowFormat;
using connector::StepMetadata;

using Args = ConnectorTestArgs;

// Rows that attention rank a sends in (step, stage): deterministic, includes zeros.
int64_t TestRows(const Args& args, int step, int stage, int a) {
  return (step * 7 + stage * 3 + a * 5 + 1) % (args.max_rows + 1);
}

// Element c of the row (sender, token) of (step, layer, stage), as a raw integer of the wire
// dtype's width. The FFN function is y = 3x + 1 (mod 2^bits), exact for any width.
uint32_t Encode(int sender, int64_t token, int step, int layer, int stage, int64_t c) {
  switch (c) {
    case 0:
      return sender;
    case 1:
      return static_cast<uint32_t>(token);
    case 2:
      return layer;
    case 3:
      return stage;
    case 4:
      return step;
    default:
      return static_cast<uint32_t>(sender * 131 + token * 31 + c * 7 + layer * 17 + stage * 5);
  }
}
uint32_t FfnFunction(uint32_t x) { return 3 * x + 1; }

// Typed access to raw rows of width 2 (bf16 bits) or 4 (f32 bits) bytes.
struct RawRows {
  char* data;
  size_t width;
  uint32_t mask() const { return width == 2 ? 0xFFFFu : 0xFFFFFFFFu; }
  uint32_t get(int64_t i) const {
    if (width == 2) return reinterpret_cast<uint16_t*>(data)[i];
    return reinterpret_cast<uint32_t*>(data)[i];
  }
  void set(int64_t i, uint32_t v) const {
    if (width == 2) {
      reinterpret_cast<uint16_t*>(data)[i] = static_cast<uint16_t>(v);
    } else {
      reinterpret_cast<uint32_t*>(data)[i] = v;
    }
  }
};

StepMetadata MakeMetadata(const Args& args, int step, int num_attention, uint32_t flags) {
  StepMetadata m;
  m.step = step;
  m.flags = flags;
  m.num_stages = args.stages;
  m.num_attention_ranks = num_attention;
  for (int s = 0; s < args.stages; ++s) {
    for (int a = 0; a < num_attention; ++a) {
      m.token_counts.push_back(flags & connector::kShutdown ? 0 : TestRows(args, step, s, a));
    }
  }
  return m;
}

nlohmann::json StatsJson(const P2pConnector& c) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& [layer, s] : c.stats()) {
    layers.push_back(
        {{"layer", layer}, {"messages", s.messages}, {"bytes", s.bytes}, {"seconds", s.seconds}});
  }
  return layers;
}

void RunAttention(const Args& args, comm::AfdWorld& world, P2pConnector& conn, RowIo& io,
                  nlohmann::json& report) {
  const double timeout = world.config().afd_process_group_timeout_s;
  const RowFormat fmt = conn.hidden_format();
  const RawRows probe{nullptr, DTypeSize(fmt.dtype)};
  const int me = world.self().rank;
  const int A = world.topology().num_attention();
  int64_t checked = 0;
  for (int step = 0; step < args.steps; ++step) {
    if (step == args.die_at_step) raise(SIGKILL);
    const StepMetadata meta = MakeMetadata(args, step, A, 0);
    conn.control_plane().Send(meta);
    for (int layer = 0; layer < args.layers; ++layer) {
      for (int stage = 0; stage < args.stages; ++stage) {
        const int64_t n = meta.tokens(stage, me);
        const size_t bytes = n * fmt.row_bytes();
        std::vector<char> in(bytes), out;
        const RawRows rin{in.data(), probe.width};
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t c = 0; c < fmt.elems_per_row; ++c) {
            rin.set(t * fmt.elems_per_row + c, Encode(me, t, step, layer, stage, c) & rin.mask());
          }
        }
        void* din = io.Buffer(bytes, 0);
        void* dout = io.Buffer(bytes, 1);
        io.Upload(din, in);
        conn.SendToFfn(layer, stage, 0, fmt, din, n);
        conn.RecvFromFfn(layer, stage, fmt, dout, n);
        io.Synchronize(timeout);
        io.Download(out, dout, bytes);
        const RawRows rout{out.data(), probe.width};
        for (int64_t i = 0; i < n * fmt.elems_per_row; ++i) {
          const uint32_t want = FfnFunction(rin.get(i)) & rin.mask();
          AFD_CHECK(rout.get(i) == want,
                    "step {} layer {} stage {}: output row {} element {} is {:#x}, expected "
                    "{:#x}",
                    step, layer, stage, i / fmt.elems_per_row, i % fmt.elems_per_row, rout.get(i),
                    want);
        }
        checked += n;
      }
    }
  }
  conn.control_plane().Send(MakeMetadata(args, args.steps, A, connector::kShutdown));
  report["rows_checked"] = checked;
}

void RunFfn(const Args& args, comm::AfdWorld& world, P2pConnector& conn, RowIo& io,
            nlohmann::json& report) {
  const double timeout = world.config().afd_process_group_timeout_s;
  const Topology& t = world.topology();
  const RowFormat fmt = conn.hidden_format();
  const size_t width = DTypeSize(fmt.dtype);
  const int g = t.SubgroupOf(world.self());
  const RankRange attn = t.AttentionRanksOf(g), ffn = t.FfnRanksOf(g);
  int64_t checked = 0;
  int steps = 0;
  Deadline idle_deadline = Deadline::In(world.config().afd_process_group_timeout_s);
  while (true) {
    std::optional<StepMetadata> meta = conn.control_plane().Recv(0.2);
    if (!meta) {
      world.CheckAbort();
      AFD_CHECK(!idle_deadline.expired(), "no step metadata arrived within {}s",
                world.config().afd_process_group_timeout_s);
      continue;
    }
    idle_deadline = Deadline::In(world.config().afd_process_group_timeout_s);
    if (meta->has(connector::kShutdown)) break;
    if (static_cast<int>(meta->step) == args.die_at_step) raise(SIGKILL);
    ++steps;
    for (int layer = 0; layer < args.layers; ++layer) {
      for (int stage = 0; stage < meta->num_stages; ++stage) {
        const std::vector<int64_t> counts = conn.IncomingRowCounts(*meta, stage);
        const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
        std::vector<char> rows;
        void* drows = io.Buffer(total * fmt.row_bytes(), 0);
        conn.RecvFromAttention(layer, stage, 0, fmt, *meta, drows);
        io.Synchronize(timeout);
        io.Download(rows, drows, total * fmt.row_bytes());
        const RawRows r{rows.data(), width};
        // Which (sender, token) each row must be, in subgroup order.
        int64_t row = 0;
        for (size_t p = 0; p < counts.size(); ++p) {
          int sender = attn.begin + static_cast<int>(p);
          int64_t first_token = 0;
          if (t.HubRole() == Role::kAttention) {
            sender = attn.begin;
            first_token =
                SplitOffset(meta->tokens(stage, sender), ffn.size(), world.self().rank - ffn.begin);
          }
          for (int64_t k = 0; k < counts[p]; ++k, ++row) {
            for (int64_t c = 0; c < fmt.elems_per_row; ++c) {
              const uint32_t want =
                  Encode(sender, first_token + k, static_cast<int>(meta->step), layer, stage, c) &
                  r.mask();
              AFD_CHECK(r.get(row * fmt.elems_per_row + c) == want,
                        "step {} layer {} stage {}: row {} element {} is {:#x}; expected token "
                        "{} of attention rank {} ({:#x})",
                        meta->step, layer, stage, row, c, r.get(row * fmt.elems_per_row + c),
                        first_token + k, sender, want);
            }
          }
        }
        io.ApplyFfnFunction(drows, total * fmt.elems_per_row, width);
        conn.SendToAttention(layer, stage, fmt, *meta, drows);
        io.Synchronize(timeout);
        checked += total;
      }
    }
  }
  report["steps"] = steps;
  report["rows_checked"] = checked;
}

}  // namespace

nlohmann::json RunConnectorTest(const ConnectorTestArgs& args, const AfdConfig& config) {
  const std::string who = fmt::format("{} rank {}", RoleName(config.role), args.role_rank);
  // Destruction runs bottom up: rows, then the connector (aborting NCCL), then the world.
  std::unique_ptr<comm::AfdWorld> world;
  std::unique_ptr<P2pConnector> conn;
  std::unique_ptr<RowIo> io;
  try {
    CheckConnectorImplemented(config, args.device == "cuda" && config.is_async());
    AFD_CHECK(!args.raw || (args.bench && config.is_p2p()),
              "--raw times the transport under a P2P connector: it needs --bench and "
              "P2pNcclAFDConnector or P2pHostAFDConnector, not {}",
              config.connector);
    comm::JoinRequest req{
        config, args.role_rank, args.hidden, args.dtype == "bf16" ? DType::kBF16 : DType::kF32, {}};
    DeviceContext device;
    if (args.device == "cuda") {
      const int world_rank =
          config.role == Role::kFfn ? args.role_rank : config.num_ffn_ranks + args.role_rank;
      device = MakeDeviceContext(args.cuda_device, world_rank);
    }
    world = comm::AfdWorld::Join(req, device.factory);
    if (config.is_async()) {
      AFD_CHECK(args.device == "cpu" || args.bench,
                "{} on --device cuda: the row check runs on CPU processes; --bench times device "
                "rows",
                config.connector);
      nlohmann::json report = {{"role", std::string(RoleName(config.role))},
                               {"role_rank", args.role_rank},
                               {"world_rank", world->world_rank()},
                               {"device", args.device}};
      io = args.device == "cuda" ? MakeDeviceRowIo(device.cuda_device, device.stream)
                                 : MakeHostRowIo();
      const bool cuda = args.device == "cuda";
      RunAsyncConnectorTest(args, *world, report, cuda ? device.cuda_device : -1,
                            cuda && !args.host_flags ? device.stream : nullptr, *io);
      world->Barrier("connector-test-done");
      return report;
    }
    conn = std::make_unique<P2pConnector>(*world);
    io = args.device == "cuda" ? MakeDeviceRowIo(device.cuda_device, device.stream)
                               : MakeHostRowIo();
    nlohmann::json report = {{"role", std::string(RoleName(config.role))},
                             {"role_rank", args.role_rank},
                             {"world_rank", world->world_rank()},
                             {"address", world->local_address()},
                             {"device", args.device}};
    if (args.bench) {
      RunConnectorBench(args, *world, *conn, *io, report);
    } else if (config.role == Role::kAttention) {
      RunAttention(args, *world, *conn, *io, report);
    } else {
      RunFfn(args, *world, *conn, *io, report);
    }
    // Everyone finishes together, so a rank that died anywhere is reported everywhere.
    world->Barrier("connector-test-done");
    report["layers"] = StatsJson(*conn);
    return report;
  } catch (const Error& e) {
    // Say why before the connections close, then stop in-flight device work (NCCL abort)
    // before any device memory is freed.
    if (world) world->Abort(fmt::format("{} failed: {}", who, e.what()));
    if (conn) conn->Shutdown();
    throw;
  }
}

}  // namespace afd::diag
