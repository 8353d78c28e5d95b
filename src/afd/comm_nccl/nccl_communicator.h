// Communicator over NCCL (CUDA build only): device buffers, the caller's CUDA stream, and two
// NCCL communicators per group -- attention-to-FFN and FFN-to-attention (the P2P connector's two),
// picked by the tag's direction bit (nccl_plan.h). The ncclUniqueId travels through the group's
// store.
//
// Differences from TcpCommunicator's contract (communicator.h):
//  * Operations are enqueued on the stream and complete in stream order; Synchronize() waits for
//    them, bounded by the group's timeout (then the NCCL communicators are aborted and the error
//    names the group).
//  * Host buffers are rejected with afd::Error naming the peer; NCCL cannot check sizes or tags,
//    so the P2P connector's shapes come from the control plane, which stays on the host
//    transport (WaitReadable is not available here).
//  * Two ranks of one group on one GPU are refused before NCCL is asked, naming both ranks.
// Set NCCL_NVLS_ENABLE=0 (done at creation unless already set): NVLink multicast stays off.
//
// Thread safety: one thread at a time.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "afd/comm/communicator.h"
#include "afd/comm/store.h"
#include "afd/comm/tcp_communicator.h"

namespace afd::comm_nccl {

class NcclCommunicator : public comm::Communicator {
 public:
  // Collective over the group. `device`: this rank's CUDA device; `stream`: where operations go
  // (0: the legacy default stream). Throws afd::Error naming the group and ranks on failure.
  static std::unique_ptr<NcclCommunicator> Create(comm::Store& store, const comm::GroupSpec& spec,
                                                  int device, cudaStream_t stream);
  ~NcclCommunicator() override;

  int rank() const override { return spec_.rank; }
  int size() const override { return spec_.size; }
  const std::string& name() const override { return spec_.name; }
  std::string DescribeRank(int rank) const override;

  void Send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) override;
  void Recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) override;
  void GroupStart() override;
  void GroupEnd() override;
  bool WaitReadable(int peer, double timeout_s) override;
  void Barrier() override;
  void AllReduce(void* buf, size_t count, DType dtype, comm::ReduceOp op) override;
  void AllToAllV(const void* send, const std::vector<size_t>& send_counts, void* recv,
                 const std::vector<size_t>& recv_counts, DType dtype) override;
  void Shutdown() override;

  cudaStream_t stream() const { return stream_; }
  // Waits for everything enqueued on the stream, bounded by the group's timeout.
  void Synchronize();

 private:
  explicit NcclCommunicator(comm::GroupSpec spec) : spec_(std::move(spec)) {}
  void CheckDeviceBuffer(const void* buf, size_t count, int peer, const char* what) const;
  void Check(ncclResult_t r, const char* call) const;

  comm::GroupSpec spec_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comms_[2] = {nullptr, nullptr};
  float* scratch_ = nullptr;  // one float on the device, for Barrier
  bool shut_down_ = false;
};

// Waits for `stream` to finish, polling, until `timeout_s`; throws afd::Error naming `what`.
void SynchronizeStream(cudaStream_t stream, double timeout_s, const std::string& what);

// "host/PCI bus id" of a CUDA device: two ranks with the same identity share a GPU.
std::string GpuIdentity(int device);

// Before a rank of `group` creates NCCL communicators: NVLink multicast off (NCCL_NVLS_ENABLE=0
// unless set), the loaded NCCL checked against the one built against, `device` made current,
// and no two of the `size` ranks on one GPU (each publishes its GPU under "gpu/<rank>" of
// `store`, a store of the group's own). Throws afd::Error naming the ranks (`labels`).
void CheckNcclRankSetup(comm::Store& store, int rank, int size,
                        const std::vector<std::string>& labels, int device, double timeout_s,
                        const std::string& group);

// Unique id `index` of a group: rank 0 makes it and publishes it in `store`; every rank reads it.
ncclUniqueId ShareNcclUniqueId(comm::Store& store, int index, int rank, double timeout_s,
                               const std::string& group);

// One NCCL communicator per id (in one NCCL group), this rank being `rank` of `size`, bounded by
// `timeout_s` (a rank that never joins); throws afd::Error naming `what`.
std::vector<ncclComm_t> InitNcclComms(const std::vector<ncclUniqueId>& ids, int size, int rank,
                                      int device, double timeout_s, const std::string& what);

// "NCCL 2.28.9 (built), 2.28.3 (loaded)": for `afd --version` and error reports.
std::string DescribeNcclVersions();

}  // namespace afd::comm_nccl
