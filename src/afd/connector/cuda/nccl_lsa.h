// The NCCL device-API pieces of NcclWindow (nccl_lsa.cu, compiled by nvcc with nccl_device.h).
#pragma once

#include <nccl.h>

#include <vector>

namespace afd::connector {

// The LSA (load/store) team rank of world rank `peer` of `comm`, or -1 when `peer` is not in this
// rank's LSA team.
int NcclLsaRank(ncclComm_t comm, int peer);
// Number of ranks of this rank's LSA team.
int NcclLsaTeamSize(ncclComm_t comm);
// The base address, in this process, of the copy of `window` held by each LSA rank in
// `lsa_ranks` (ncclGetLsaPointer on the device, read back once). Returns the CUDA error.
cudaError_t NcclLsaPointers(ncclWindow_t window, const std::vector<int>& lsa_ranks,
                            std::vector<char*>& out);

}  // namespace afd::connector
