#include "afd/kernels/backend.h"

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"

#if AFD_WITH_CUDA
#include "afd/kernels/cuda/cuda_backend.h"
#endif

namespace afd::kernels {

void Backend::BeginCapture() { AFD_THROW("{}: no graph capture on this backend", name()); }

std::unique_ptr<OpGraph> Backend::EndCapture() {
  AFD_THROW("{}: no graph capture on this backend", name());
}

void Backend::BeginTimedSpan() { span_begin_ = std::chrono::steady_clock::now(); }

void Backend::EndTimedSpan() {
  span_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - span_begin_).count();
}

double Backend::TakeTimedSeconds() {
  const double s = span_seconds_;
  span_seconds_ = 0.0;
  return s;
}

std::unique_ptr<Backend> MakeBackend(Device device) {
  if (device.is_cpu()) return std::make_unique<cpu::CpuBackend>();
#if AFD_WITH_CUDA
  return std::make_unique<cuda::CudaBackend>(device.index);
#else
  AFD_THROW("device {}: this build has no CUDA backend (built without nvcc)", device.ToString());
#endif
}

}  // namespace afd::kernels
