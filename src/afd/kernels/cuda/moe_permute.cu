// MoePermute on the GPU: device-side expert counts and offsets, tokens ascending within an
// expert (moe.cuh).
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "afd/common/cuda_check.h"
#include "afd/kernels/cuda/bf16_vec.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mma.cuh"
#include "afd/kernels/cuda/moe.cuh"
#include "afd/kernels/cuda/moe_forms.cuh"
#include "afd/kernels/cuda/pdl.cuh"

namespace afd::kernels::cuda {

namespace {

// One block, deterministic and graph-safe: counts each local expert's slots, a prefix sum over
// experts, then places the slots in slot order, so tokens stay ascending within an expert. Up
// to kFastPermuteExperts local experts, slots are placed in parallel (see below); above, thread
// e owns local expert e (and e + blockDim, ...) and scans the ids, staged through shared
// memory in tiles.
constexpr int kPermuteThreads = 1024, kPermuteTile = 4096, kMaxLocalExperts = 4096;
constexpr int kFastPermuteExperts = 128;  // per-warp counts in shared memory: 16 KB
// From this many tiles of kPermuteThreads slots on (over 7168 slots: prefill; decode stays at
// one block and one launch), blocks of one tile each (PermuteCount + PermutePlace below).
constexpr int64_t kPermuteMultiMinChunks = 8;

__global__ void Permute(const int32_t* ids, int64_t n, int64_t k, int64_t begin, int64_t local,
                        int32_t* offsets, int32_t* src_row, int32_t* row_of_slot) {
  PdlStart();
  __shared__ int32_t tile[kPermuteTile];
  __shared__ int32_t count[kMaxLocalExperts];
  const int64_t slots = n * k;
  for (int64_t e = threadIdx.x; e < local; e += blockDim.x) count[e] = 0;
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    src_row[s] = 0;
    const int64_t e = ids[s] - begin;
    row_of_slot[s] = -1;
    if (e >= 0 && e < local) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t total = 0;
    for (int64_t e = 0; e < local; ++e) {
      offsets[e] = total;
      const int32_t c = count[e];
      count[e] = total;  // becomes the expert's cursor
      total += c;
    }
    offsets[local] = total;
  }
  __syncthreads();
  if (local <= kFastPermuteExperts) {
    // Slots in tiles of one per thread: a slot's place is its expert's cursor + the same-expert
    // slots of earlier warps in the tile (a prefix over per-warp counts) + those of lower lanes
    // in its warp (__match_any_sync), so slot order is kept without a serial scan.
    __shared__ int32_t warp_count[kPermuteThreads / 32][kFastPermuteExperts];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t e = threadIdx.x; e < (kPermuteThreads / 32) * local; e += blockDim.x) {
      warp_count[e / local][e % local] = 0;
    }
    for (int64_t t0 = 0; t0 < slots; t0 += kPermuteThreads) {
      const int64_t s = t0 + threadIdx.x;
      const int64_t e = s < slots ? ids[s] - begin : -1;
      const bool mine = e >= 0 && e < local;
      const int key = mine ? static_cast<int>(e) : -1;
      const unsigned peers = __match_any_sync(0xffffffffu, key);
      const int below = __popc(peers & ((1u << lane) - 1));
      __syncthreads();
      if (mine && below == 0) warp_count[warp][e] = __popc(peers);
      __syncthreads();
      for (int64_t x = threadIdx.x; x < local; x += blockDim.x) {
        int32_t running = count[x];
        for (int w = 0; w < kPermuteThreads / 32; ++w) {
          const int32_t c = warp_count[w][x];
          warp_count[w][x] = running;
          running += c;
        }
        count[x] = running;
      }
      __syncthreads();
      if (mine) {
        const int32_t pos = warp_count[warp][e] + below;
        src_row[pos] = static_cast<int32_t>(s / k);
        row_of_slot[s] = pos;
      }
      __syncthreads();
      for (int64_t x = threadIdx.x; x < (kPermuteThreads / 32) * local; x += blockDim.x) {
        warp_count[x / local][x % local] = 0;
      }
    }
    return;
  }
  for (int64_t t0 = 0; t0 < slots; t0 += kPermuteTile) {
    const int64_t len = min(static_cast<int64_t>(kPermuteTile), slots - t0);
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) tile[i] = ids[t0 + i];
    __syncthreads();
    for (int64_t e = threadIdx.x; e < local; e += blockDim.x) {
      const int32_t id = static_cast<int32_t>(begin + e);
      int32_t cursor = count[e];
      for (int64_t i = 0; i < len; ++i) {
        if (tile[i] != id) continue;
        const int64_t s = t0 + i;
        src_row[cursor] = static_cast<int32_t>(s / k);
        row_of_slot[s] = cursor++;
      }
      count[e] = cursor;
    }
    __syncthreads();
  }
}

// Many slots (prefill): the same grouping over blocks of kPermuteThreads slots each, in two
// launches. PermuteCount: each block's per-expert counts of its slots (chunk_count [blocks,
// local]). PermutePlace: each block sums the counts of the blocks before it and of all blocks
// (its experts' bases and the offsets; block 0 writes those), then places its slots as the fast
// path above does one tile (warp prefix + __match_any_sync): chunks in order, warps and lanes in
// order within one, so the output is the one-block kernel's exactly. local <= kFastPermuteExperts.
__global__ void PermuteCount(const int32_t* ids, int64_t slots, int64_t begin, int64_t local,
                             int32_t* chunk_count) {
  PdlStart();
  __shared__ int32_t count[kFastPermuteExperts];
  for (int64_t e = threadIdx.x; e < local; e += blockDim.x) count[e] = 0;
  __syncthreads();
  const int64_t s = int64_t(blockIdx.x) * kPermuteThreads + threadIdx.x;
  if (s < slots) {
    const int64_t e = ids[s] - begin;
    if (e >= 0 && e < local) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < local; e += blockDim.x) {
    chunk_count[blockIdx.x * local + e] = count[e];
  }
}

__global__ void PermutePlace(const int32_t* ids, int64_t n, int64_t k, int64_t begin, int64_t local,
                             const int32_t* chunk_count, int32_t* offsets, int32_t* src_row,
                             int32_t* row_of_slot) {
  PdlStart();
  __shared__ int32_t base[kFastPermuteExperts], start[kFastPermuteExperts + 1];
  __shared__ int32_t warp_count[kPermuteThreads / 32][kFastPermuteExperts];
  const int64_t slots = n * k, b = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t e = threadIdx.x; e < local; e += blockDim.x) {
    int32_t before = 0, total = 0;
    for (int64_t c = 0; c < gridDim.x; ++c) {
      const int32_t v = chunk_count[c * local + e];
      before += c < b ? v : 0;
      total += v;
    }
    base[e] = before;
    start[e] = total;
  }
  for (int64_t x = threadIdx.x; x < (kPermuteThreads / 32) * local; x += blockDim.x) {
    warp_count[x / local][x % local] = 0;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // experts' first rows: an exclusive sum of their totals
    int32_t run = 0;
    for (int64_t e = 0; e < local; ++e) {
      const int32_t t = start[e];
      start[e] = run;
      run += t;
    }
    start[local] = run;
  }
  __syncthreads();
  if (b == 0) {
    for (int64_t e = threadIdx.x; e <= local; e += blockDim.x) offsets[e] = start[e];
  }
  const int64_t s = b * kPermuteThreads + threadIdx.x;
  const int64_t e = s < slots ? ids[s] - begin : -1;
  const bool mine = e >= 0 && e < local;
  const int key = mine ? static_cast<int>(e) : -1;
  const unsigned peers = __match_any_sync(0xffffffffu, key);
  const int below = __popc(peers & ((1u << lane) - 1));
  if (mine && below == 0) warp_count[warp][e] = __popc(peers);
  __syncthreads();
  for (int64_t x = threadIdx.x; x < local; x += blockDim.x) {
    int32_t running = start[x] + base[x];
    for (int w = 0; w < kPermuteThreads / 32; ++w) {
      const int32_t c = warp_count[w][x];
      warp_count[w][x] = running;
      running += c;
    }
  }
  __syncthreads();
  if (s < slots) {
    // Rows past the last expert's are 0 (as the one-block kernel leaves them); placed rows are
    // below start[local], so the two writes never meet.
    if (s >= start[local]) src_row[s] = 0;
    if (mine) {
      const int32_t pos = warp_count[warp][e] + below;
      src_row[pos] = static_cast<int32_t>(s / k);
      row_of_slot[s] = pos;
    } else {
      row_of_slot[s] = -1;
    }
  }
}

}  // namespace

int64_t MoePermuteScratchInts(int64_t n, int64_t k, int64_t num_local) {
  const int64_t chunks = (n * k + kPermuteThreads - 1) / kPermuteThreads;
  return chunks >= kPermuteMultiMinChunks && num_local <= kFastPermuteExperts ? chunks * num_local
                                                                              : 0;
}

void LaunchMoePermute(const int32_t* ids, int64_t n, int64_t k, int64_t begin, int64_t num_local,
                      int32_t* offsets, int32_t* src_row, int32_t* row_of_slot, int32_t* scratch,
                      cudaStream_t s) {
  AFD_CHECK(num_local <= kMaxLocalExperts, "MoePermute on cuda: {} local experts, at most {}",
            num_local, kMaxLocalExperts);
  if (MoePermuteScratchInts(n, k, num_local) > 0) {
    AFD_CHECK(scratch != nullptr, "MoePermute on cuda: {} slots need the counts' scratch", n * k);
    const auto chunks = static_cast<unsigned>((n * k + kPermuteThreads - 1) / kPermuteThreads);
    LaunchPdl(PermuteCount, chunks, kPermuteThreads, 0, s, ids, n * k, begin, num_local, scratch);
    LaunchPdl(PermutePlace, chunks, kPermuteThreads, 0, s, ids, n, k, begin, num_local,
              static_cast<const int32_t*>(scratch), offsets, src_row, row_of_slot);
    CheckLaunch("MoePermute (blocks)");
    return;
  }
  LaunchPdl(Permute, 1, kPermuteThreads, 0, s, ids, n, k, begin, num_local, offsets, src_row,
            row_of_slot);
  CheckLaunch("MoePermute");
}

}  // namespace afd::kernels::cuda
