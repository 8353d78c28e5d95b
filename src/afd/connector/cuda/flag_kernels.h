// One-thread kernels that store and await a flag in host-mapped memory on a stream (the
// kernel form of StreamFlags; stream_flags.h). False when the launch failed.
#pragma once

#include <cstdint>

namespace afd::connector {

bool LaunchStoreFlag(void* stream, uint64_t* device_flag, uint64_t value);
// The wait gives up after timeout_s (<= 0: never), printing that it did, and lets the stream go
// on: the device never spins unbounded (the host's own deadline names the peer).
bool LaunchAwaitFlag(void* stream, const uint64_t* device_flag, uint64_t value, double timeout_s);

}  // namespace afd::connector

namespace afd::connector {

// Device-sequenced slots (async_connector.h, "Device sequencing"): the sequence numbers of a
// rank's sends and waits are counters in device memory, advanced by the kernels below, so that
// a CUDA graph of a step replays with the right numbers every time.

// What an awaited slot's header must say (besides magic, version, seq and echo_seq).
struct DeviceSlotExpect {
  uint32_t flags = 0;
  int32_t sender = 0, layer = 0, stage = 0, num_tokens = 0, routed_rows = 0, shared_rows = 0,
          table_entries = 0;
};

// The first failure of any wait, in host-mapped memory (the host reads it after the step). Once
// code != 0 every later wait returns at once (the step has failed; the host throws).
struct DeviceSlotStatus {
  enum Code : uint32_t { kOk = 0, kTimeout = 1, kJump = 2, kHeader = 3, kAborted = 4 };
  uint32_t code;   // written last by the device (or by the host's watchdog: kAborted)
  int32_t region;  // the slot's region (the sender's role rank) and ring
  int32_t ring;
  int32_t field;  // kHeader: which field (DeviceSlotField)
  int32_t layer;  // the awaited layer
  int32_t pad;
  uint64_t flag, awaited;  // the flag seen and the seq awaited
  int64_t got, want;       // kHeader: the field's value and the expected one
  uint64_t waits_done;     // waits that have ended (one stream: incremented in order)
};
enum DeviceSlotField : int32_t {
  kFieldMagic = 0,
  kFieldVersion,
  kFieldFlags,
  kFieldSender,
  kFieldLayer,
  kFieldStage,
  kFieldTokens,
  kFieldRoutedRows,
  kFieldSharedRows,
  kFieldTableEntries,
  kFieldSeq,
  kFieldEcho,
};
const char* DeviceSlotFieldName(int32_t field);

// One thread: seq = ++*counter; the 56-byte header `header` with seq (and, when echo_src is not
// null, echo_seq = *echo_src read now) is written to `header_dst` (and `dev_header_dst`, when not
// null: a mirror in device memory), then the flag to `flag_dst` (and `dev_flag_dst`), each after
// a system-scope fence (every earlier write of the stream first). All addresses device-visible.
bool LaunchPublishSlot(void* stream, void* header_dst, uint64_t* flag_dst, void* dev_header_dst,
                       uint64_t* dev_flag_dst, const void* header, uint64_t* counter,
                       const uint64_t* echo_src);
// One thread: want = ++*seen (or `seq` when seen is null: a seq the host knows); polls *flag
// until it reaches want (bounded by timeout_s, and by status->code turning non-zero), then
// checks the header at `header` against `expect`, seq == want and echo_seq == *echo_counter
// (when not null); the first failure is recorded in *status.
bool LaunchAwaitSlot(void* stream, const uint64_t* flag, const void* header, uint64_t* seen,
                     uint64_t seq, const uint64_t* echo_counter, const DeviceSlotExpect& expect,
                     DeviceSlotStatus* status, int region, int ring, double timeout_s);

}  // namespace afd::connector
