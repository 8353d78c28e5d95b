// `afd connector-test`: one role process of a connector round trip (P2P or asynchronous) (checks
// every row's origin and order end to end), or its round-trip benchmark.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/config/afd_config.h"
#include "afd/connector/p2p_connector.h"
#include "afd/diag/row_io.h"

namespace afd::diag {

struct ConnectorTestArgs {
  std::string additional_config;
  int role_rank = 0;
  int layers = 3;
  int stages = 2;
  int steps = 3;
  int64_t hidden = 64;
  std::string dtype = "f32";
  int max_rows = 13;
  int die_at_step = -1;
  bool bench = false;
  std::string bench_rows = "1,16,128,512";
  int iters = 20;
  std::string device = "cpu";
  int cuda_device = -1;
  bool host_flags = false;  // async connector on cuda: flags by the host, not the stream
  bool raw = false;         // --bench of a P2P connector: its transport's send/recv alone
};

// Joins the deployment of `config` as role rank args.role_rank, runs the check (or --bench),
// waits for every rank, and returns this rank's JSON report. Throws afd::Error after
// publishing an abort so the other ranks stop too.
nlohmann::json RunConnectorTest(const ConnectorTestArgs& args, const AfdConfig& config);

// The row counts of --bench-rows ("1,16,128"); throws afd::Error naming a bad item.
std::vector<int64_t> BenchRowCounts(const ConnectorTestArgs& args);

// The check or bench of `args` over the asynchronous window connector (AsyncAFDConnector),
// after the join; fills `report` ("rows_checked" or "bench", "layers"). With cuda_device >= 0
// (--bench only) the rows live in device memory (CUDA IPC windows; `io` is the device's and
// `cuda_stream` its stream, on which the flags are stored and awaited unless args.host_flags).
void RunAsyncConnectorTest(const ConnectorTestArgs& args, comm::AfdWorld& world,
                           nlohmann::json& report, int cuda_device, void* cuda_stream, RowIo& io);

// Round-trip latency per layer for each row count (--bench); the FFN side echoes rows
// unchanged. With args.raw (1A1F only) the rows go through the data-plane communicator's
// Send/Recv alone (ncclSend/ncclRecv on cuda, TCP on the CPU): no metadata, no connector. Adds
// "bench": [{rows, bytes_each_way, median_us, p10_us, p90_us}] to `report`.
void RunConnectorBench(const ConnectorTestArgs& args, comm::AfdWorld& world,
                       connector::P2pConnector& conn, RowIo& io, nlohmann::json& report);

}  // namespace afd::diag
