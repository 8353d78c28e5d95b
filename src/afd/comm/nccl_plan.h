// Bookkeeping of the NCCL communicator that needs no GPU (so it is unit-tested on CPU builds):
// which of a group's two NCCL communicators carries a message, how the ncclUniqueId travels
// through the rendezvous store, the check that no two ranks of a group share a GPU, and whether
// the NCCL library loaded at run time can serve the NCCL this binary was built against.
//
// A group's NcclCommunicator holds two NCCL communicators, as the P2P connector guide describes:
// one for attention-to-FFN traffic and one for FFN-to-attention traffic. Point-to-point messages
// pick one by the direction bit of their tag (bit 31, set for attention -> FFN, as the P2P
// connector writes it); collectives use the first.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace afd::comm {

inline constexpr int kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES, checked in the CUDA build

// 0: attention -> FFN (tag bit 31 set), 1: FFN -> attention; collectives (reserved tags) use 0.
int NcclCommIndexForTag(uint32_t tag);

// Store key of the unique id of communicator `index` (0 or 1) of a group.
std::string NcclUniqueIdKey(int index);

// Checks the bytes of a unique id read from the store; throws afd::Error naming the group.
void CheckNcclUniqueId(const std::string& bytes, const std::string& group);

// Given each group rank's GPU identity ("host/PCI bus id"), returns the error to report when two
// ranks share a GPU (NCCL refuses that), naming both ranks and the device; nullopt otherwise.
std::optional<std::string> FindSharedGpu(const std::vector<std::string>& devices,
                                         const std::vector<std::string>& labels,
                                         const std::string& group);

// NCCL_VERSION_CODE (major * 10000 + minor * 100 + patch since 2.9) as "2.28.9".
std::string NcclVersionText(int code);

// The oldest NCCL 2 library this runtime's host calls run on (ncclGetLastError, comm abort and
// non-blocking init are older than it).
inline constexpr int kMinNcclVersion = 21900;

// nullopt when the library loaded at run time (`loaded`, ncclGetVersion) can serve a binary built
// against `built`: the same major version and at least kMinNcclVersion; otherwise the error
// naming both versions and the remedy.
std::optional<std::string> NcclLibraryMismatch(int built, int loaded);

// The NCCL window of the async connector reads NCCL's device-side window struct
// (ncclGetLsaPointer from nccl_device.h, compiled into this binary), whose layout may change
// between any two releases: it runs only on the exact version it was built against. nullopt when
// `loaded` equals `built`; otherwise the error naming both and the remedy.
std::optional<std::string> NcclDeviceApiMismatch(int built, int loaded);

}  // namespace afd::comm
