// Flags of the async connector's host window written and awaited by a CUDA stream (stream
// memory operations on host-mapped memory), so that neither side of a device-rows round trip
// synchronizes its stream with the host on the critical path:
//   sender:   [kernels producing rows] -> [IPC copies into the peer's row window] -> flag store
//             (a system-scope fence, then the store into the peer's host-window flag), all
//             enqueued on the caller's stream; the host returns at once.
//   receiver: a stream wait (flag >= seq), then the kernels that read the rows: the GPU starts
//             them the moment the flag lands, while the host checks the slot's header later
//             (with a deadline and peer liveness, as for host rows).
// Store and wait are stream memory operations (cuStreamWriteValue64 / cuStreamWaitValue64) where
// the device runs them, else one-thread kernels (flag_kernels.h).
// The host-window pages holding the flags (this rank's copy and every mapped peer's) are
// registered with the device (cudaHostRegister, mapped). The driver entry points are looked up
// through the runtime (no libcuda link). Thread safety: one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "afd/connector/cuda/flag_kernels.h"

namespace afd::connector {

class StreamFlags {
 public:
  // Empty when `device` cannot map host memory (then `why` says why). The kernel form of a wait
  // gives up after wait_timeout_s (<= 0: never); either form is released by the host
  // (AsyncConnector's watchdog) before that.
  static std::unique_ptr<StreamFlags> Create(int device, std::string* why,
                                             double wait_timeout_s = 0);
  ~StreamFlags();
  StreamFlags(const StreamFlags&) = delete;
  StreamFlags& operator=(const StreamFlags&) = delete;

  // Makes [base, base + bytes) of host memory (page-aligned base) visible to the device.
  void Register(char* base, size_t bytes, const std::string& what);
  // Enqueues on `stream`: a fence, then *flag = value (flag inside a registered range).
  void Write(void* stream, uint64_t* flag, uint64_t value) const;
  // Enqueues on `stream`: wait until *flag >= value (flag inside a registered range).
  void Wait(void* stream, const uint64_t* flag, uint64_t value) const;

  // Device sequencing (flag_kernels.h): `n` zeroed u64 counters in device memory, kept while
  // this lives.
  uint64_t* DeviceCounters(size_t n);
  // Enqueues the publication of a 56-byte header and its flag (both inside registered ranges),
  // and of their mirror at dev_header_dst / dev_flag_dst (device pointers; null: none); echo_src:
  // null, or a device pointer (a mirror's header) whose u64 becomes the header's echo_seq.
  void Publish(void* stream, char* header_dst, uint64_t* flag_dst, char* dev_header_dst,
               uint64_t* dev_flag_dst, const void* header, uint64_t* counter,
               const uint64_t* echo_src) const;
  // Enqueues a bounded wait for the next slot of (region, ring) and the check of its header:
  // the slot after the device counter `seen` (which it advances), or, with `seen` null, the
  // slot of seq `seq`. `flag` and `header`: device pointers (a mirror in device memory).
  void AwaitSlot(void* stream, const uint64_t* flag, const char* header, uint64_t* seen,
                 uint64_t seq, const uint64_t* echo_counter, const DeviceSlotExpect& expect,
                 int region, int ring) const;
  // The first failure of a device wait (host-mapped; code kOk while none).
  const DeviceSlotStatus& status() const { return *status_; }
  // Host: fails every pending and later device wait (code kAborted naming `region`), unless one
  // failed already.
  void Abort(int region);

 private:
  StreamFlags() = default;
  struct Range {
    char* host;
    size_t bytes;
    uint64_t device;  // the range's device address
  };
  uint64_t DeviceAddress(const void* host, size_t bytes = 8) const;
  void Store(void* stream, uint64_t device_address, uint64_t value) const;
  void Await(void* stream, uint64_t device_address, uint64_t value) const;

  int device_ = 0;
  void* write_fn_ = nullptr;  // cuStreamWriteValue64
  void* wait_fn_ = nullptr;   // cuStreamWaitValue64
  bool memops_ = false;       // cuStreamWriteValue64 / cuStreamWaitValue64, else flag_kernels.h
  double wait_timeout_s_ = 0;
  std::vector<Range> ranges_;
  DeviceSlotStatus* status_ = nullptr;         // cudaHostAlloc, mapped
  DeviceSlotStatus* status_device_ = nullptr;  // its device address
  std::vector<void*> counters_;                // cudaMalloc
};

}  // namespace afd::connector
