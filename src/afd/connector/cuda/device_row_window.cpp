#include "afd/connector/cuda/device_row_window.h"

#include <cuda_runtime.h>

#include "afd/common/cuda_check.h"
#include "afd/common/error.h"

namespace afd::connector {

DeviceRowWindow::DeviceRowWindow(std::string kind, size_t bytes, int world_size, int self,
                                 int device)
    : kind_(std::move(kind)),
      bytes_(bytes),
      self_(self),
      device_(device),
      maps_(world_size, nullptr) {}

DeviceRowWindow::~DeviceRowWindow() {
  if (stream_) {
    cudaSetDevice(device_);
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
}

void DeviceRowWindow::CreateStream() {
  cudaStream_t stream = nullptr;
  AFD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
}

void DeviceRowWindow::DrainStream() {
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
}

void DeviceRowWindow::Write(int peer, size_t offset, const void* src, size_t bytes) {
  if (bytes == 0) return;
  AFD_CHECK(peer >= 0 && peer < static_cast<int>(maps_.size()) && maps_[peer] != nullptr,
            "{} window: world rank {} is not mapped here", kind_, peer);
  AFD_CHECK(offset + bytes <= bytes_, "{} window: write of {} bytes at {} exceeds {}", kind_, bytes,
            offset, bytes_);
  AFD_CUDA_CHECK(cudaMemcpyAsync(maps_[peer] + offset, src, bytes, cudaMemcpyDefault,
                                 static_cast<cudaStream_t>(stream())));
}

void DeviceRowWindow::Flush() {
  AFD_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream())));
}

void DeviceRowWindow::WriteFlag(int, size_t, uint64_t) {
  AFD_THROW("{} window: flags live in the host window", kind_);
}

void DeviceRowWindow::ReadFlags(size_t, std::span<uint64_t>) const {
  AFD_THROW("{} window: flags live in the host window", kind_);
}

std::string DeviceRowWindow::Describe(int peer) const {
  return fmt::format("the {} row window of world rank {} (cuda:{})", kind_, peer, device_);
}

}  // namespace afd::connector
