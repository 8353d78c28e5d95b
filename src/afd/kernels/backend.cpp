#include "afd/kernels/backend.h"

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"

namespace afd::kernels {

std::unique_ptr<Backend> MakeBackend(Device device) {
  if (device.is_cpu()) return std::make_unique<cpu::CpuBackend>();
  AFD_THROW("device {}: this build has no CUDA backend yet (the CPU backend is the only one)",
            device.ToString());
}

}  // namespace afd::kernels
