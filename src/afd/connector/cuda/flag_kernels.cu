#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "afd/connector/async_slot.h"
#include "afd/connector/cuda/flag_kernels.h"

namespace afd::connector {

namespace {

// One thread: every earlier write of this stream (kernels and copies ended before this kernel
// started) is made visible system-wide, then the flag is stored.
__global__ void StoreFlag(volatile unsigned long long* flag, unsigned long long value) {
  __threadfence_system();
  *flag = value;
}

__device__ unsigned long long GlobalNanos() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread polls the flag (host-mapped memory, read through the bus each time) until it
// reaches `value`; kernels after it on the stream start once it ends. Bounded: after
// timeout_ns (0: none) it gives up, says so, and ends (the host, which checks every flag with
// its own deadline and names the peer, then fails the step).
__global__ void AwaitFlag(const volatile unsigned long long* flag, unsigned long long value,
                          unsigned long long timeout_ns) {
  const unsigned long long start = GlobalNanos();
  while (*flag < value) {
    if (timeout_ns != 0 && GlobalNanos() - start > timeout_ns) {
      printf("afd: a CUDA stream's flag wait gave up after %llu ms (flag %llu, awaited %llu)\n",
             timeout_ns / 1000000ull, *flag, value);
      break;
    }
    __nanosleep(200);
  }
  __threadfence_system();
}

// A slot header as seven 8-byte words (SlotHeader: seq is word 5, echo_seq word 6).
struct HeaderWords {
  unsigned long long w[7];
};
static_assert(sizeof(HeaderWords) == sizeof(SlotHeader), "a slot header is seven words");

__global__ void PublishSlot(volatile unsigned long long* header_dst,
                            volatile unsigned long long* flag_dst,
                            volatile unsigned long long* dev_header_dst,
                            volatile unsigned long long* dev_flag_dst, HeaderWords h,
                            unsigned long long* counter,
                            const volatile unsigned long long* echo_src) {
  const unsigned long long seq = *counter + 1;
  *counter = seq;
  h.w[5] = seq;
  if (echo_src != nullptr) h.w[6] = *echo_src;
  __threadfence_system();  // the rows (earlier kernels and copies of this stream) first
  for (int i = 0; i < 7; ++i) header_dst[i] = h.w[i];
  if (dev_header_dst != nullptr) {
    for (int i = 0; i < 7; ++i) dev_header_dst[i] = h.w[i];
  }
  __threadfence_system();
  if (dev_flag_dst != nullptr) *dev_flag_dst = seq;
  *flag_dst = seq;
}

// Records the first failure (the code last, so that a host reading the code after the stream
// finished sees the rest).
__device__ void Fail(DeviceSlotStatus* status, uint32_t code, int region, int ring, int layer,
                     unsigned long long flag, unsigned long long awaited, int field, long long got,
                     long long want) {
  volatile DeviceSlotStatus* s = status;
  if (s->code != 0) return;
  s->region = region;
  s->ring = ring;
  s->layer = layer;
  s->flag = flag;
  s->awaited = awaited;
  s->field = field;
  s->got = got;
  s->want = want;
  __threadfence_system();
  atomicCAS_system(reinterpret_cast<unsigned int*>(&status->code), 0u, code);
  __threadfence_system();
}

__global__ void AwaitSlot(const volatile unsigned long long* flag, const volatile char* header,
                          unsigned long long* seen, unsigned long long seq,
                          const unsigned long long* echo_counter, DeviceSlotExpect e,
                          DeviceSlotStatus* status, int region, int ring,
                          unsigned long long timeout_ns) {
  volatile DeviceSlotStatus* vs = status;
  const unsigned long long want = seen != nullptr ? *seen + 1 : seq;
  if (seen != nullptr) *seen = want;
  // Counted on every way out, so that the host knows whether a wait may still be pending.
  struct Done {
    volatile DeviceSlotStatus* s;
    __device__ ~Done() {
      __threadfence_system();
      s->waits_done = s->waits_done + 1;
    }
  } done{vs};
  if (vs->code != 0) return;  // the step has failed already: pass
  const unsigned long long start = GlobalNanos();
  unsigned long long v = *flag;
  // The status lives in host-mapped memory (a bus round trip a load): looked at every 16th
  // poll of the flag, which is in device memory when the slots are mirrored there.
  for (unsigned polls = 0; v < want; ++polls) {
    if ((polls & 15) == 15) {
      if (vs->code != 0) return;
      if (timeout_ns != 0 && GlobalNanos() - start > timeout_ns) {
        Fail(status, DeviceSlotStatus::kTimeout, region, ring, e.layer, v, want, 0, 0, 0);
        return;
      }
    }
    __nanosleep(64);
    v = *flag;
  }
  __threadfence_system();
  if (v != want) {
    Fail(status, DeviceSlotStatus::kJump, region, ring, e.layer, v, want, 0, 0, 0);
    return;
  }
  // The header's seven words loaded at once, before any is looked at: the header sits in
  // host-mapped memory, where each load is a bus round trip (~1 us), and loads taken one by one
  // between the checks cost one round trip each (measured: ~12 us of a reply's ~16 us hop).
  unsigned long long words[7];
  const volatile unsigned long long* src =
      reinterpret_cast<const volatile unsigned long long*>(header);
#pragma unroll
  for (int i = 0; i < 7; ++i) words[i] = src[i];
  const auto u32 = [&](int off) {
    return static_cast<uint32_t>(words[off / 8] >> (8 * (off % 8)));
  };
  const auto i32 = [&](int off) { return static_cast<int32_t>(u32(off)); };
  const auto u64 = [&](int off) { return words[off / 8]; };
  const auto check = [&](int field, long long got, long long expected) {
    if (got == expected) return true;
    Fail(status, DeviceSlotStatus::kHeader, region, ring, e.layer, v, want, field, got, expected);
    return false;
  };
  const uint32_t word1 = u32(4);
  if (!check(kFieldMagic, u32(0), kSlotMagic) ||
      !check(kFieldVersion, word1 & 0xffff, kSlotVersion) ||
      !check(kFieldFlags, word1 >> 16, e.flags) || !check(kFieldSender, i32(8), e.sender) ||
      !check(kFieldLayer, i32(12), e.layer) || !check(kFieldStage, i32(16), e.stage) ||
      !check(kFieldTokens, i32(20), e.num_tokens) ||
      !check(kFieldRoutedRows, i32(24), e.routed_rows) ||
      !check(kFieldSharedRows, i32(28), e.shared_rows) ||
      !check(kFieldTableEntries, i32(36), e.table_entries) ||
      !check(kFieldSeq, static_cast<long long>(u64(40)), static_cast<long long>(want))) {
    return;
  }
  if (echo_counter != nullptr) {
    check(kFieldEcho, static_cast<long long>(u64(48)), static_cast<long long>(*echo_counter));
  }
}

}  // namespace

const char* DeviceSlotFieldName(int32_t field) {
  static const char* const kNames[] = {"magic",       "version",       "flags",      "sender",
                                       "layer",       "stage",         "num_tokens", "routed_rows",
                                       "shared_rows", "table_entries", "seq",        "echo_seq"};
  return field >= 0 && field <= kFieldEcho ? kNames[field] : "?";
}

bool LaunchPublishSlot(void* stream, void* header_dst, uint64_t* flag_dst, void* dev_header_dst,
                       uint64_t* dev_flag_dst, const void* header, uint64_t* counter,
                       const uint64_t* echo_src) {
  HeaderWords h;
  std::memcpy(&h, header, sizeof(h));
  PublishSlot<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<volatile unsigned long long*>(header_dst),
      reinterpret_cast<volatile unsigned long long*>(flag_dst),
      static_cast<volatile unsigned long long*>(dev_header_dst),
      reinterpret_cast<volatile unsigned long long*>(dev_flag_dst), h,
      reinterpret_cast<unsigned long long*>(counter),
      reinterpret_cast<const volatile unsigned long long*>(echo_src));
  return cudaGetLastError() == cudaSuccess;
}

bool LaunchAwaitSlot(void* stream, const uint64_t* flag, const void* header, uint64_t* seen,
                     uint64_t seq, const uint64_t* echo_counter, const DeviceSlotExpect& expect,
                     DeviceSlotStatus* status, int region, int ring, double timeout_s) {
  const auto timeout_ns = static_cast<unsigned long long>(timeout_s > 0 ? timeout_s * 1e9 : 0);
  AwaitSlot<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const volatile unsigned long long*>(flag),
      static_cast<const volatile char*>(header), reinterpret_cast<unsigned long long*>(seen), seq,
      reinterpret_cast<const unsigned long long*>(echo_counter), expect, status, region, ring,
      timeout_ns);
  return cudaGetLastError() == cudaSuccess;
}

bool LaunchStoreFlag(void* stream, uint64_t* device_flag, uint64_t value) {
  StoreFlag<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<volatile unsigned long long*>(device_flag), value);
  return cudaGetLastError() == cudaSuccess;
}

bool LaunchAwaitFlag(void* stream, const uint64_t* device_flag, uint64_t value, double timeout_s) {
  const auto timeout_ns = static_cast<unsigned long long>(timeout_s > 0 ? timeout_s * 1e9 : 0);
  AwaitFlag<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const volatile unsigned long long*>(device_flag), value, timeout_ns);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace afd::connector
