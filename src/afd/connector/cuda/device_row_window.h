// The row window of the asynchronous connector on GPUs: every rank holds `bytes` of device
// memory and a device pointer to the copy of each peer it writes to; how the memory is allocated
// and the peers' copies are mapped is the subclass's (CudaIpcWindow: CUDA IPC handles through the
// rendezvous store; NcclWindow: NCCL symmetric memory). Write is a device-to-device copy into the
// peer's memory on the window's stream; Flush waits for those copies, after which the sender
// publishes the slot's flag in the host window (ShmWindow): a receiver that sees the flag can run
// kernels on the rows at once. Flags live in host shared memory, so WriteFlag/ReadFlags are not
// used here (they throw).
//
// Copies run on the window's own stream unless UseStream names another (the backend's): then
// they are ordered after the kernels that produced `src` on it without a host wait, and the flag
// follows on the same stream (StreamFlags). Otherwise the caller synchronizes its stream before a
// send. Thread safety: one thread at a time.
#pragma once

#include <string>
#include <vector>

#include "afd/connector/window.h"

namespace afd::connector {

class DeviceRowWindow : public Window {
 public:
  ~DeviceRowWindow() override;

  size_t bytes() const override { return bytes_; }
  char* local() const override { return maps_[self_]; }  // device memory
  // The device pointer of `world_rank`'s copy (null when not mapped): kernels write it directly.
  char* mapping(int world_rank) const { return maps_.at(world_rank); }
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

 protected:
  // `kind` names the memory in messages ("CUDA IPC", "NCCL symmetric").
  DeviceRowWindow(std::string kind, size_t bytes, int world_size, int self, int device);
  // Creates the window's own copy stream on the device (the subclass calls it once).
  void CreateStream();
  // Waits for the window's own stream (subclass destructors, before freeing the memory).
  void DrainStream();

  std::string kind_;
  size_t bytes_;
  int self_, device_;
  std::vector<char*> maps_;  // [world size] device pointers, null when not mapped

 private:
  void* stream_ = nullptr;       // cudaStream_t of the copies (owned)
  void* copy_stream_ = nullptr;  // UseStream's stream (not owned), or null
};

}  // namespace afd::connector
