// Where `afd connector-test` keeps the rows it moves: host memory (TCP communicator) or device
// memory (NCCL communicator, CUDA build). Rows are built and checked on the host either way.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace afd::diag {

class RowIo {
 public:
  virtual ~RowIo() = default;
  // A buffer of at least `bytes` for the connector; `slot` 0 and 1 are distinct buffers.
  virtual void* Buffer(size_t bytes, int slot) = 0;
  virtual void Upload(void* dst, const std::vector<char>& src) = 0;
  virtual void Download(std::vector<char>& dst, const void* src, size_t bytes) = 0;
  // Waits for every transfer issued so far (bounded by timeout_s for device work).
  virtual void Synchronize(double timeout_s) = 0;
  // Stream-side timing (device rows): Mark(0) and Mark(1) record events on the stream;
  // MarkedMicros, after a Synchronize, the microseconds between them (negative on the host).
  virtual void Mark(int) {}
  virtual double MarkedMicros() { return -1; }
  // Device rows: work enqueued after Hold starts on the GPU only at Release (as when a decode
  // step's host runs ahead of its stream), so that marks time the GPU's side alone. No-ops on
  // the host.
  virtual void Hold() {}
  virtual void Release() {}
  // The known FFN function y = 3x + 1 on the raw bits of `count` elements of `width` bytes.
  virtual void ApplyFfnFunction(void* data, size_t count, size_t width) = 0;
};

std::unique_ptr<RowIo> MakeHostRowIo();
// Device rows on `cuda_device`, work on `stream` (a cudaStream_t). Throws afd::Error in builds
// without CUDA and NCCL.
std::unique_ptr<RowIo> MakeDeviceRowIo(int cuda_device, void* stream);

}  // namespace afd::diag
