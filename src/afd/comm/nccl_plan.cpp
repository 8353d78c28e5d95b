#include "afd/comm/nccl_plan.h"

#include <map>

#include "afd/comm/communicator.h"
#include "afd/common/error.h"

namespace afd::comm {

int NcclCommIndexForTag(uint32_t tag) {
  if (tag >= kReservedTagBase) return 0;
  return (tag >> 31) ? 0 : 1;
}

std::string NcclUniqueIdKey(int index) {
  AFD_CHECK(index == 0 || index == 1, "NCCL communicator index {} is not 0 or 1", index);
  return index == 0 ? "nccl_id/attention_to_ffn" : "nccl_id/ffn_to_attention";
}

void CheckNcclUniqueId(const std::string& bytes, const std::string& group) {
  AFD_CHECK(static_cast<int>(bytes.size()) == kNcclUniqueIdBytes,
            "group {}: the NCCL unique id in the store has {} bytes, expected {} (ranks built "
            "against different NCCL versions?)",
            group, bytes.size(), kNcclUniqueIdBytes);
}

std::optional<std::string> FindSharedGpu(const std::vector<std::string>& devices,
                                         const std::vector<std::string>& labels,
                                         const std::string& group) {
  std::map<std::string, size_t> first;
  for (size_t i = 0; i < devices.size(); ++i) {
    auto [it, inserted] = first.emplace(devices[i], i);
    if (!inserted) {
      return fmt::format(
          "group {}: {} and {} are on the same GPU ({}); NCCL cannot put two ranks of one "
          "communicator on one GPU -- give every rank its own GPU (--cuda-device / "
          "--cuda-devices), or let ranks share GPUs through AsyncAFDConnector's CUDA IPC windows",
          group, labels[it->second], labels[i], devices[i]);
    }
  }
  return std::nullopt;
}

std::string NcclVersionText(int code) {
  if (code >= 20900) return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, code / 100 % 10, code % 100);  // before 2.9
}

std::optional<std::string> NcclLibraryMismatch(int built, int loaded) {
  const int built_major = built >= 20900 ? built / 10000 : built / 1000;
  const int loaded_major = loaded >= 20900 ? loaded / 10000 : loaded / 1000;
  if (loaded_major == built_major && loaded >= kMinNcclVersion) return std::nullopt;
  return fmt::format(
      "the NCCL library loaded at run time is {} but this afd was built against NCCL {} and "
      "needs {}.x, at least {}: put a matching libnccl.so.2 first on LD_LIBRARY_PATH",
      NcclVersionText(loaded), NcclVersionText(built), built_major,
      NcclVersionText(kMinNcclVersion));
}

std::optional<std::string> NcclDeviceApiMismatch(int built, int loaded) {
  if (loaded == built) return std::nullopt;
  return fmt::format(
      "the NCCL window (connector_extra_config.window \"nccl\") is compiled against the device "
      "API of NCCL {} and runs only on that exact version, but the library loaded at run time is "
      "{}: put libnccl.so.2 of NCCL {} first on LD_LIBRARY_PATH, or use window \"cuda_ipc\"",
      NcclVersionText(built), NcclVersionText(loaded), NcclVersionText(built));
}

}  // namespace afd::comm
