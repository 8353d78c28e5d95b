// The row window of the asynchronous connector on GPUs of one node (CUDA IPC): every rank
// allocates `bytes` of device memory, publishes its IPC handle in the rendezvous store
// ("async_dwindow/<world rank>"), and opens the handles of the peers it writes to -- processes
// on the same GPU or on GPUs with peer access. Write is a device-to-device copy into the peer's
// memory on the window's own stream; Flush waits for those copies, after which the sender
// publishes the slot's flag in the host window (ShmWindow): a receiver that sees the flag can
// run kernels on the rows at once. Flags live in host shared memory, so WriteFlag/ReadFlags are
// not used here (they throw).
//
// Copies run on the window's own stream unless UseStream names another (the backend's): then
// they are ordered after the kernels that produced `src` on it without a host wait, and the
// flag follows on the same stream (StreamFlags). Otherwise the caller synchronizes its stream
// before a send. Thread safety: one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/connector/window.h"

namespace afd::connector {

class CudaIpcWindow : public Window {
 public:
  // Collective over every world rank (each with the same `bytes`): allocates on `cuda_device`
  // and opens the copies of `peers` (world ranks). Throws afd::Error naming the rank and the
  // CUDA error (e.g. no peer access between the GPUs).
  static std::unique_ptr<CudaIpcWindow> Create(comm::AfdWorld& world, size_t bytes,
                                               const std::vector<int>& peers, int cuda_device);
  ~CudaIpcWindow() override;

  size_t bytes() const override { return bytes_; }
  char* local() const override { return maps_[self_]; }  // device memory
  void Write(int peer, size_t offset, const void* src, size_t bytes) override;
  // Waits for every copy enqueued so far (on the stream in use).
  void Flush() override;
  // Enqueues the copies on `stream` (a cudaStream_t of this window's device) from now on.
  void UseStream(void* stream) { copy_stream_ = stream; }
  void* stream() const { return copy_stream_ ? copy_stream_ : stream_; }
  void WriteFlag(int peer, size_t offset, uint64_t value) override;
  void ReadFlags(size_t offset, std::span<uint64_t> out) const override;
  bool PeerExited(int) const override { return false; }  // the host window tells
  std::string Describe(int peer) const override;

 private:
  CudaIpcWindow(size_t bytes, int world_size, int self, int device);

  size_t bytes_;
  int self_, device_;
  std::vector<char*> maps_;      // [world size] device pointers, null when not opened
  void* stream_ = nullptr;       // cudaStream_t of the copies (owned)
  void* copy_stream_ = nullptr;  // UseStream's stream (not owned), or null
};

}  // namespace afd::connector
