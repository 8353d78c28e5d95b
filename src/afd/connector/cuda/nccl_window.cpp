#ifdef AFD_WITH_NCCL
#include "afd/connector/cuda/nccl_window.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <functional>
#include <future>
#include <thread>

#include "afd/comm/nccl_plan.h"
#include "afd/comm_nccl/nccl_communicator.h"
#include "afd/common/cuda_check.h"
#include "afd/common/error.h"
#include "afd/connector/cuda/nccl_lsa.h"

namespace afd::connector {

namespace {

// Runs a collective NCCL call that blocks until every rank makes it, bounded by `timeout_s`
// (a rank that died before it). The call runs on its own thread with state it shares, so a
// timed-out call can be left behind without touching freed memory.
ncclResult_t Bounded(std::function<ncclResult_t()> call, int device, double timeout_s,
                     const std::string& what) {
  auto done = std::make_shared<std::promise<ncclResult_t>>();
  std::future<ncclResult_t> result = done->get_future();
  std::thread([done, call = std::move(call), device]() {
    cudaSetDevice(device);
    done->set_value(call());
  }).detach();
  AFD_CHECK(result.wait_for(std::chrono::duration<double>(timeout_s)) == std::future_status::ready,
            "{} did not finish within {}s (a rank that never got there?)", what, timeout_s);
  return result.get();
}

}  // namespace

std::unique_ptr<NcclWindow> NcclWindow::Create(comm::AfdWorld& world, size_t bytes,
                                               const std::vector<int>& peers, int cuda_device) {
  const int self = world.world_rank();
  const int size = world.topology().world_size();
  const std::string me = world.Describe(self);
  const double timeout = world.config().afd_process_group_timeout_s;
  int loaded = 0;
  AFD_CHECK(ncclGetVersion(&loaded) == ncclSuccess, "{}: ncclGetVersion failed", me);
  if (auto mismatch = comm::NcclDeviceApiMismatch(NCCL_VERSION_CODE, loaded)) {
    AFD_THROW("{}: {}", me, *mismatch);
  }
  comm::PrefixStore store(world.store(), "async_nccl_window");
  std::vector<std::string> labels;
  for (int r = 0; r < size; ++r) labels.push_back(world.Describe(r));
  try {
    comm_nccl::CheckNcclRankSetup(store, self, size, labels, cuda_device, timeout,
                                  "the NCCL window");
  } catch (const Error& e) {
    AFD_THROW(
        "{} (connector_extra_config.window \"nccl\" needs one GPU per rank; ranks that "
        "share a GPU use window \"cuda_ipc\")",
        e.what());
  }
  const ncclUniqueId id = comm_nccl::ShareNcclUniqueId(store, 0, self, timeout, "the NCCL window");
  std::unique_ptr<NcclWindow> w(new NcclWindow(bytes, size, self, cuda_device));
  const ncclComm_t comm = comm_nccl::InitNcclComms({id}, size, self, cuda_device, timeout,
                                                   fmt::format("the NCCL window on {}", me))[0];
  w->comm_ = comm;
  auto check = [&](ncclResult_t r, const char* call) {
    AFD_CHECK(r == ncclSuccess, "{} (cuda:{}): {} failed for its {:.1f} MiB NCCL window: {} ({})",
              me, cuda_device, call, bytes / 1048576.0, ncclGetErrorString(r),
              ncclGetLastError(comm));
  };
  void* mem = nullptr;
  check(ncclMemAlloc(&mem, bytes), "ncclMemAlloc");
  w->maps_[self] = static_cast<char*>(mem);
  AFD_CUDA_CHECK(cudaMemset(mem, 0, bytes));
  AFD_CUDA_CHECK(cudaDeviceSynchronize());
  // The registration is collective; a call left behind by a timeout writes into `out`, not here.
  auto out = std::make_shared<ncclWindow_t>(nullptr);
  check(Bounded(
            [comm, mem, bytes, out]() {
              return ncclCommWindowRegister(comm, mem, bytes, out.get(), NCCL_WIN_COLL_SYMMETRIC);
            },
            cuda_device, timeout, fmt::format("{}: ncclCommWindowRegister", me)),
        "ncclCommWindowRegister");
  const ncclWindow_t win = *out;
  w->window_ = win;

  std::vector<int> lsa_ranks;
  for (int p : peers) {
    const int lsa = NcclLsaRank(comm, p);
    AFD_CHECK(lsa >= 0,
              "{}: {} is outside its NVLink domain (NCCL's load/store team has {} ranks): the "
              "NCCL window reaches peers by load/store only -- put-with-signal across nodes "
              "(GIN) is not implemented; run the deployment within one NVLink domain",
              me, world.Describe(p), NcclLsaTeamSize(comm));
    lsa_ranks.push_back(lsa);
  }
  std::vector<char*> ptrs;
  AFD_CUDA_CHECK(NcclLsaPointers(win, lsa_ranks, ptrs));
  for (size_t i = 0; i < peers.size(); ++i) {
    AFD_CHECK(ptrs[i] != nullptr, "{}: NCCL gave no address for the window of {}", me,
              world.Describe(peers[i]));
    w->maps_[peers[i]] = ptrs[i];
  }
  w->CreateStream();
  return w;
}

NcclWindow::~NcclWindow() {
  DrainStream();
  // Abort, not destroy or deregister: both are collective and the peers may be gone. The
  // memory is released after NCCL let go of it; peers' mappings keep theirs alive.
  if (comm_) ncclCommAbort(static_cast<ncclComm_t>(comm_));
  if (maps_[self_]) ncclMemFree(maps_[self_]);
}

}  // namespace afd::connector
#endif  // AFD_WITH_NCCL
