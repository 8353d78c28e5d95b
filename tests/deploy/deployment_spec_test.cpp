// The rank processes `afd run --topology` starts: which CUDA device each gets.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>

#include "afd/common/error.h"
#include "afd/deploy/deployment_run.h"
#include "afd/deploy/serve.h"

namespace afd::deploy {
namespace {

std::string DeviceOf(const RankProcessSpec& s) {
  std::string device;
  for (size_t i = 0; i + 1 < s.argv.size(); ++i) {
    if (s.argv[i] == "--cuda-device") device = s.argv[i + 1];  // the last one counts
  }
  return device;
}

std::string ErrorOf(const DeploymentSpec& spec) {
  try {
    DeploymentRankSpecs(spec, "/tmp", "/tmp/prompts.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeploymentSpec, CudaDevicesGoOnePerWorldRankFfnFirst) {
#ifndef AFD_WITH_CUDA
  GTEST_SKIP() << "CPU-only build: a --device cuda deployment is refused before its ranks exist";
#else
  DeploymentSpec spec;
  spec.topology = "2A1F";
  spec.cuda = true;
  spec.worker_flags = {"--model", "preset:tiny", "--device", "cuda"};
  spec.cuda_devices = {2, 0, 1};  // world ranks: FFN 0, attention 0, attention 1
  const std::vector<RankProcessSpec> specs = DeploymentRankSpecs(spec, "/tmp", "/tmp/prompts.json");
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].label, "ffn rank 0 (cuda:2)");
  EXPECT_EQ(DeviceOf(specs[0]), "2");
  EXPECT_EQ(DeviceOf(specs[1]), "0");
  EXPECT_EQ(DeviceOf(specs[2]), "1");
  EXPECT_EQ(specs[2].label, "attention rank 1 (cuda:1)");

  spec.cuda_devices = {0, 1};
  const std::string e = ErrorOf(spec);
  EXPECT_NE(e.find("--cuda-devices: 2 devices for the 3 ranks of 2A1F"), std::string::npos) << e;
  EXPECT_NE(e.find("FFN ranks first"), std::string::npos) << e;
#endif
}

// NCCL cannot put two ranks on one GPU: the NCCL transports need one distinct device per rank.
TEST(DeploymentSpec, NcclTransportsNeedOneGpuPerRank) {
#ifndef AFD_WITH_CUDA
  GTEST_SKIP() << "CPU-only build: a --device cuda deployment is refused before its ranks exist";
#else
  // (The third: no connector given -- a GPU deployment's default, the async one, with the
  // NCCL window.)
  for (const std::string& cfg : {std::string(R"({"afd": {"connector": "AsyncAFDConnector", )"
                                             R"("connector_extra_config": {"window": "nccl"}}})"),
                                 std::string(R"({"afd": {"connector": "P2pNcclAFDConnector"}})"),
                                 std::string(R"({"afd": {"connector_extra_config": )"
                                             R"({"window": "nccl"}}})")}) {
#ifndef AFD_WITH_NCCL
    if (cfg.find("P2pNccl") != std::string::npos) continue;  // refused as not built
#endif
    DeploymentSpec spec;
    spec.topology = "1A1F";
    spec.cuda = true;
    spec.additional_config = cfg;
    spec.worker_flags = {"--model", "preset:tiny", "--device", "cuda"};
    for (const std::vector<int>& devices : {std::vector<int>{}, std::vector<int>{1, 1}}) {
      spec.cuda_devices = devices;
      const std::string e = ErrorOf(spec);
      EXPECT_NE(e.find("one distinct device per world rank (2 here"), std::string::npos)
          << cfg << "\n"
          << e;
    }
    spec.cuda_devices = {1, 0};
    EXPECT_EQ(ErrorOf(spec), "") << cfg;
  }
  // CUDA IPC windows: ranks may share a GPU.
  DeploymentSpec spec;
  spec.topology = "2A1F";
  spec.cuda = true;
  spec.worker_flags = {"--model", "preset:tiny", "--device", "cuda", "--cuda-device", "0"};
  EXPECT_EQ(ErrorOf(spec), "");
#endif
}

// Data-parallel + expert-parallel ranks: one process per rank, "dp-ep-worker" with its rank, a
// shared rendezvous port and its own output; one distinct GPU per rank on cuda (NCCL rows); AFD's
// options refused.
TEST(DeploymentSpec, DataParallelExpertParallelRanks) {
  DeploymentSpec spec;
  spec.expert_parallel_size = 3;
  spec.worker_flags = {"--model", "preset:tiny"};
  const std::vector<RankProcessSpec> specs = DeploymentRankSpecs(spec, "/tmp", "/tmp/p.json");
  ASSERT_EQ(specs.size(), 3u);
  std::string port;
  for (int r = 0; r < 3; ++r) {
    const std::vector<std::string>& a = specs[r].argv;
    EXPECT_EQ(a[1], "dp-ep-worker");
    EXPECT_EQ(specs[r].label, "attention+experts rank " + std::to_string(r));
    const auto value = [&a](const std::string& flag) {
      const auto it = std::find(a.begin(), a.end(), flag);
      return it == a.end() || it + 1 == a.end() ? std::string() : *(it + 1);
    };
    EXPECT_EQ(value("--data-parallel-rank"), std::to_string(r));
    EXPECT_EQ(value("--data-parallel-size"), "3");
    EXPECT_EQ(value("--output-file"), "/tmp/out" + std::to_string(r) + ".jsonl");
    if (r == 0) port = value("--rendezvous-port");
    EXPECT_EQ(value("--rendezvous-port"), port);
    EXPECT_EQ(value("--model"), "preset:tiny");
  }
  DeploymentSpec with_topology = spec;
  with_topology.topology = "1A1F";
  EXPECT_NE(ErrorOf(with_topology).find("leave out --topology"), std::string::npos);
  DeploymentSpec afd_opts = spec;
  afd_opts.additional_config = R"({"afd": {}})";
  EXPECT_NE(ErrorOf(afd_opts).find("takes none"), std::string::npos);
  DeploymentSpec gpus = spec;
  gpus.cuda = true;
  gpus.cuda_devices = {0, 1};
  EXPECT_NE(ErrorOf(gpus).find("2 devices for the 3 data-parallel ranks"), std::string::npos);
  gpus.cuda_devices = {0, 1, 1};
  EXPECT_NE(ErrorOf(gpus).find("one distinct device per rank"), std::string::npos);
  gpus.cuda_devices = {2, 0, 1};
  EXPECT_EQ(ErrorOf(gpus), "");
}

TEST(DeploymentSpec, CudaDevicesNeedCudaRanks) {
  DeploymentSpec spec;
  spec.topology = "1A1F";
  spec.worker_flags = {"--model", "preset:tiny"};
  spec.cuda_devices = {0, 1};
  const std::string e = ErrorOf(spec);
  EXPECT_NE(e.find("--cuda-devices"), std::string::npos) << e;
  EXPECT_NE(e.find("--device cuda"), std::string::npos) << e;
}

}  // namespace
}  // namespace afd::deploy

namespace afd::deploy {
namespace {

// `afd serve --cuda-devices`: this host's ranks, in rank order, each on its own GPU.
TEST(ServeSpec, CudaDevicesGoToTheLocalRanksInOrder) {
  ServeOptions o;
  o.base.config.role = Role::kAttention;
  o.base.dp = 4;
  o.base.tp = 1;
  o.dp_start = 2;
  o.dp_local = 2;
  o.log_dir = ::testing::TempDir() + "/afd_serve_spec_" + std::to_string(getpid());
  o.worker_flags = {"--model", "preset:tiny", "--device", "cuda"};
  o.cuda_devices = {5, 3};
  std::string dir;
  const std::vector<RankProcessSpec> specs = ServeRankSpecs(o, &dir);
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].label, "attention rank 2 (cuda:5)");
  EXPECT_EQ(DeviceOf(specs[0]), "5");
  EXPECT_EQ(DeviceOf(specs[1]), "3");
  o.cuda_devices = {0};
  try {
    ServeRankSpecs(o, &dir);
    ADD_FAILURE() << "one device for two ranks was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cuda-devices: 1 devices for the 2 attention ranks"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace afd::deploy

namespace afd::deploy {
namespace {

TEST(DeploymentSpec, NumGpusCountsDistinctDevices) {
  DeploymentSpec spec;
  EXPECT_EQ(NumGpus(spec), 0);  // CPU ranks
  spec.cuda = true;
  EXPECT_EQ(NumGpus(spec), 1);  // every rank on --cuda-device
  spec.cuda_devices = {0, 1, 1, 3};
  EXPECT_EQ(NumGpus(spec), 3);
}

}  // namespace
}  // namespace afd::deploy
