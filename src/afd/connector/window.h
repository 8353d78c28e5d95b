// A symmetric window (the asynchronous connector's): every rank of a deployment allocates a window
// of the same size; each rank maps the copies of the peers it talks to and writes into them
// one-sided; a rank only ever reads its own copy. Delivery is signalled by 8-byte flags inside the
// receiver's copy: the sender writes its payload, then the flag (ordered after the payload:
// release); the receiver reads the flag (acquire) and then the payload.
//
// Implementations: ShmWindow (POSIX shared memory, CPU processes of one host). The interface is
// what CUDA IPC, NCCL device-API or NVSHMEM windows need too: a device copy for Write, a device
// flag store for WriteFlag, a flag fetch for ReadFlags.
//
// Peers are world ranks. Thread safety: one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "afd/common/deadline.h"

namespace afd::connector {

class Window {
 public:
  virtual ~Window() = default;

  // Bytes of every rank's copy.
  virtual size_t bytes() const = 0;
  // This rank's copy: peers write into it; only this rank reads it.
  virtual char* local() const = 0;
  // Copies `bytes` bytes from this process's memory into `peer`'s copy at `offset`. Returns once
  // `src` may be reused. Throws afd::Error when the range is outside the window or the peer is
  // not mapped.
  virtual void Write(int peer, size_t offset, const void* src, size_t bytes) = 0;
  // Waits until every earlier Write has landed in the peer's copy (device windows copy
  // asynchronously; host windows are done at once).
  virtual void Flush() {}
  // Stores `value` into the 8-byte flag at `offset` (8-aligned) of `peer`'s copy, ordered after
  // every earlier Write of this rank to that peer.
  virtual void WriteFlag(int peer, size_t offset, uint64_t value) = 0;
  // out[i] = flag i of `out.size()` consecutive flags at `offset` of this rank's copy; payload
  // written before a flag is visible once the flag is read.
  virtual void ReadFlags(size_t offset, std::span<uint64_t> out) const = 0;
  // True when `peer`'s process is known to have exited (false when the window cannot tell).
  virtual bool PeerExited(int peer) const = 0;
  // What the window is, for errors: "POSIX shared memory /afd.127.0.0.1.1239.w2".
  virtual std::string Describe(int peer) const = 0;
};

// Waits until some flag i of `seen.size()` flags at `offset` of w's copy differs from seen[i];
// returns the first such i scanning from `start` (wrapping), or -1 when none changed before
// `deadline`. Spins briefly, then yields and sleeps (the host's cores are shared). Calls
// `on_idle` about every `idle_period_s` while waiting (liveness checks; it may throw).
int WaitForFlags(const Window& w, size_t offset, std::span<const uint64_t> seen, int start,
                 const Deadline& deadline, const std::function<void()>& on_idle,
                 double idle_period_s = 0.05);

}  // namespace afd::connector
