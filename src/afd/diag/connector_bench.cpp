// `afd connector-test --bench`: time per layer round trip for several row counts.
#include <algorithm>
#include <chrono>
#include <numeric>
#include <sstream>

#include "afd/common/error.h"
#include "afd/diag/connector_check.h"

namespace afd::diag {

using connector::P2pConnector;
using connector::RowFormat;
using connector::StepMetadata;

std::vector<int64_t> BenchRowCounts(const ConnectorTestArgs& args) {
  std::vector<int64_t> sizes;
  std::stringstream ss(args.bench_rows);
  for (std::string item; std::getline(ss, item, ',');) {
    AFD_CHECK(!item.empty() && item.size() <= 9 &&
                  item.find_first_not_of("0123456789") == std::string::npos,
              "--bench-rows \"{}\": \"{}\" is not a row count", args.bench_rows, item);
    sizes.push_back(std::stoll(item));
  }
  return sizes;
}

void RunConnectorBench(const ConnectorTestArgs& args, comm::AfdWorld& world, P2pConnector& conn,
                       RowIo& io, nlohmann::json& report) {
  const double timeout = world.config().afd_process_group_timeout_s;
  const std::vector<int64_t> sizes = BenchRowCounts(args);
  const RowFormat fmt = conn.hidden_format();
  const int A = world.topology().num_attention();
  nlohmann::json results = nlohmann::json::array();
  uint64_t step = 0;
  const bool attention = world.self().role == Role::kAttention;
  if (args.raw) {
    AFD_CHECK(A == 1 && world.topology().num_ffn() == 1,
              "--raw times one attention rank and one FFN rank exchanging rows; the topology "
              "has {} and {}",
              A, world.topology().num_ffn());
  }
  const int raw_peer = args.raw ? conn.DataPlanePeers().at(0) : -1;
  // The communicators pick their direction by tag bit 31 (set: attention -> FFN).
  constexpr uint32_t kToFfnTag = 0x80000001u, kToAttentionTag = 1;
  for (int64_t n : sizes) {
    std::vector<double> us;
    const size_t elems = static_cast<size_t>(n * fmt.elems_per_row);
    for (int it = 0; it < args.iters + 2; ++it, ++step) {
      if (args.raw) {
        comm::Communicator& c = conn.data_plane();
        void* in = io.Buffer(n * fmt.row_bytes(), 0);
        void* out = io.Buffer(n * fmt.row_bytes(), 1);
        const auto start = std::chrono::steady_clock::now();
        if (attention) {
          c.Send(in, elems, fmt.dtype, raw_peer, kToFfnTag);
          c.Recv(out, elems, fmt.dtype, raw_peer, kToAttentionTag);
        } else {
          c.Recv(in, elems, fmt.dtype, raw_peer, kToFfnTag);
          c.Send(in, elems, fmt.dtype, raw_peer, kToAttentionTag);
        }
        io.Synchronize(timeout);
        const double t =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count();
        if (attention && it >= 2) us.push_back(t);
        continue;
      }
      StepMetadata meta;
      meta.step = step;
      meta.num_stages = 1;
      meta.num_attention_ranks = A;
      meta.token_counts.assign(A, n);
      if (world.self().role == Role::kAttention) {
        void* in = io.Buffer(n * fmt.row_bytes(), 0);
        void* out = io.Buffer(n * fmt.row_bytes(), 1);
        conn.control_plane().Send(meta);
        const auto start = std::chrono::steady_clock::now();
        conn.SendToFfn(0, 0, 0, fmt, in, n);
        conn.RecvFromFfn(0, 0, fmt, out, n);
        io.Synchronize(timeout);
        const double t =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count();
        if (it >= 2) us.push_back(t);  // two warm-up iterations
      } else {
        std::optional<StepMetadata> m =
            conn.control_plane().Recv(world.config().afd_process_group_timeout_s);
        AFD_CHECK(m.has_value(), "bench: no metadata arrived");
        const std::vector<int64_t> counts = conn.IncomingRowCounts(*m, 0);
        void* rows = io.Buffer(
            std::accumulate(counts.begin(), counts.end(), int64_t{0}) * fmt.row_bytes(), 0);
        conn.RecvFromAttention(0, 0, 0, fmt, *m, rows);
        conn.SendToAttention(0, 0, fmt, *m, rows);
        io.Synchronize(timeout);
      }
    }
    if (!us.empty()) {
      std::sort(us.begin(), us.end());
      results.push_back({{"rows", n},
                         {"bytes_each_way", n * fmt.row_bytes()},
                         {"median_us", us[us.size() / 2]},
                         {"p10_us", us[us.size() / 10]},
                         {"p90_us", us[us.size() * 9 / 10]}});
    }
  }
  if (args.raw) {
    // No control plane was used: nothing to stop.
  } else if (attention) {
    StepMetadata stop;
    stop.step = step;
    stop.flags = connector::kShutdown;
    stop.num_attention_ranks = A;
    stop.token_counts.assign(A, 0);
    conn.control_plane().Send(stop);
  } else {
    std::optional<StepMetadata> m =
        conn.control_plane().Recv(world.config().afd_process_group_timeout_s);
    AFD_CHECK(m && m->has(connector::kShutdown), "bench: expected the shutdown step");
  }
  report["bench"] = results;
}

}  // namespace afd::diag
