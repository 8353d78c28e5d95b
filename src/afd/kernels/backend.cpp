#include "afd/kernels/backend.h"

#include <algorithm>
#include <cstring>

#include "afd/common/error.h"
#include "afd/kernels/cpu/cpu_backend.h"
#include "afd/kernels/cpu/sample.h"

#if AFD_WITH_CUDA
#include "afd/kernels/cuda/cuda_backend.h"
#endif

namespace afd::kernels {

void Backend::BeginCapture() { AFD_THROW("{}: no graph capture on this backend", name()); }

std::unique_ptr<OpGraph> Backend::EndCapture() {
  AFD_THROW("{}: no graph capture on this backend", name());
}

void Backend::SetKernelTrace(bool on) {
  AFD_CHECK(!on, "{}: no kernel trace on this backend (it runs no device kernels)", name());
}

std::vector<KernelSpan> Backend::TakeKernelTrace() {
  AFD_THROW("{}: no kernel trace on this backend (it runs no device kernels)", name());
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

int64_t Backend::OpenCopyTicket(int& slot) {
  if (copy_tickets_.empty()) copy_tickets_.assign(kMaxCopiesToHost, -1);
  const auto free = std::find(copy_tickets_.begin(), copy_tickets_.end(), -1);
  AFD_CHECK(free != copy_tickets_.end(),
            "StartCopyToHost: {} copies to the host are unfinished already (at most {})",
            kMaxCopiesToHost, kMaxCopiesToHost);
  slot = static_cast<int>(free - copy_tickets_.begin());
  *free = next_copy_ticket_;
  return next_copy_ticket_++;
}

int Backend::CopySlot(int64_t ticket) const {
  const auto it = std::find(copy_tickets_.begin(), copy_tickets_.end(), ticket);
  AFD_CHECK(ticket >= 0 && it != copy_tickets_.end(),
            "FinishCopyToHost: ticket {} is not an unfinished copy", ticket);
  return static_cast<int>(it - copy_tickets_.begin());
}

std::string Backend::IpcHandle(const Tensor& t) {
  (void)t;
  AFD_THROW("{}: no CUDA IPC (KV rows stay in host memory on this device)", name());
}

void Backend::CopyFromIpc(const Tensor& dst, const std::string& handle, int64_t offset) {
  (void)dst;
  (void)handle;
  (void)offset;
  AFD_THROW("{}: cannot read another process's device memory (no CUDA IPC on this device)", name());
}

int64_t Backend::StartCopyToHost(const Tensor& src) {
  int slot = 0;
  const int64_t ticket = OpenCopyTicket(slot);
  if (copies_to_host_.empty()) copies_to_host_.resize(kMaxCopiesToHost);
  std::vector<char>& buf = copies_to_host_[slot];
  buf.resize(src.nbytes());
  try {
    CopyToHost(buf.data(), src);
  } catch (...) {
    CloseCopySlot(slot);
    throw;
  }
  return ticket;
}

void Backend::FinishCopyToHost(int64_t ticket, void* dst) {
  const int slot = CopySlot(ticket);
  const std::vector<char>& buf = copies_to_host_[slot];
  if (!buf.empty()) std::memcpy(dst, buf.data(), buf.size());
  CloseCopySlot(slot);
}

double HostLogSumExp(const float* logits, int64_t vocab) { return cpu::LogSumExp(logits, vocab); }

std::unique_ptr<Backend> MakeBackend(Device device) {
  if (device.is_cpu()) return std::make_unique<cpu::CpuBackend>();
#if AFD_WITH_CUDA
  return std::make_unique<cuda::CudaBackend>(device.index);
#else
  AFD_THROW("device {}: this build has no CUDA backend (built without nvcc)", device.ToString());
#endif
}

}  // namespace afd::kernels
