// SIGINT and SIGTERM as requests to stop, for the long-running commands (`afd serve` of either
// role, `afd launch`, `afd worker`): the main thread blocks them before any thread starts (so
// every thread inherits the mask and none is killed by them), then waits for them with a
// timeout between its other checks. Child processes started by afd::Subprocess get an empty
// mask again.
//
// Thread safety: BlockStopSignals before any other thread exists; WaitStopSignal from any one
// thread at a time.
#pragma once

namespace afd {

// Blocks SIGINT and SIGTERM in the calling thread (and the threads it starts later).
void BlockStopSignals();

// The stop signal received within timeout_s (0: only one already pending), or 0. The signals
// must be blocked (BlockStopSignals).
int WaitStopSignal(double timeout_s);

// "SIGTERM", "SIGINT" (the name a log line gives a stop signal).
const char* StopSignalName(int sig);

}  // namespace afd
