// Where memory lives and work runs: the host CPU or one CUDA device. Streams and events are
// opaque handles owned by a Backend (kernels/backend.h); this header has no CUDA include.
#pragma once

#include <string>

namespace afd {

enum class DeviceType { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static Device Cpu() { return {}; }
  static Device Cuda(int index) { return {DeviceType::kCuda, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  // "cpu" or "cuda:N".
  std::string ToString() const;
};

// A queue of work on a device (cudaStream_t on CUDA; the CPU backend runs everything inline
// and has one null stream). Non-owning.
struct Stream {
  void* handle = nullptr;
};

// A point in a stream's work that another stream or the host can wait for (cudaEvent_t).
struct Event {
  void* handle = nullptr;
};

}  // namespace afd
