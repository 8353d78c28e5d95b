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
