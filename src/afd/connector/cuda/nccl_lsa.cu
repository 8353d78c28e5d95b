#ifdef AFD_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include "afd/connector/cuda/nccl_lsa.h"

namespace afd::connector {

namespace {

__global__ void LsaPointers(ncclWindow_t window, const int* lsa_ranks, int n, char** out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<char*>(ncclGetLsaPointer(window, 0, lsa_ranks[i]));
}

}  // namespace

int NcclLsaRank(ncclComm_t comm, int peer) {
  const ncclTeam_t lsa = ncclTeamLsa(comm), world = ncclTeamWorld(comm);
  if (peer < 0 || peer >= world.nRanks || !ncclTeamRankIsMember(lsa, world, peer)) return -1;
  return ncclTeamRankToTeam(lsa, world, peer);
}

int NcclLsaTeamSize(ncclComm_t comm) { return ncclTeamLsa(comm).nRanks; }

cudaError_t NcclLsaPointers(ncclWindow_t window, const std::vector<int>& lsa_ranks,
                            std::vector<char*>& out) {
  const int n = static_cast<int>(lsa_ranks.size());
  out.assign(n, nullptr);
  if (n == 0) return cudaSuccess;
  int* d_ranks = nullptr;
  char** d_out = nullptr;
  cudaError_t e = cudaMalloc(&d_ranks, n * sizeof(int));
  if (e == cudaSuccess) e = cudaMalloc(&d_out, n * sizeof(char*));
  if (e == cudaSuccess)
    e = cudaMemcpy(d_ranks, lsa_ranks.data(), n * sizeof(int), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    LsaPointers<<<(n + 127) / 128, 128>>>(window, d_ranks, n, d_out);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess)
    e = cudaMemcpy(out.data(), d_out, n * sizeof(char*), cudaMemcpyDeviceToHost);
  cudaFree(d_ranks);
  cudaFree(d_out);
  return e;
}

}  // namespace afd::connector
#endif  // AFD_WITH_NCCL
