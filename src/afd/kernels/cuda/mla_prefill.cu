// MLA prefill in the expanded (non-absorbed) form, for a bf16 model with a bf16 latent cache:
// when a step's tokens are mostly new prompt tokens, decompressing each context row once per
// head (k_nope = W_k·c, v = W_v·c, one GEMM over the context) and running flash attention over
// 128 + 64 key dims and 128 value dims costs ~3.4x fewer FLOPs than the absorbed form's 512 +
// 64 / 512 per (token, position, head), which reads every prefix from the latent cache per query.
//
// The pieces (the backend runs them in this order, the GEMM on cuBLAS between 2 and 3):
//   1. MlaGatherContext: the cache rows of every sequence's positions [0, max_context) into a
//      dense bf16 buffer, row s·max_context + j for position j of block-table row s (zeros where
//      the block table has no block).
//   2. the fp32 kv_b rows of the heads -> bf16 (a bf16 checkpoint's values, exactly), then
//      kv[r, h·(dn + dv) + ...] = ctx[r, :kvr] · kv_b_hᵀ on cuBLAS (bf16 out, fp32 accumulate).
//   3. FlashMlaPrefill: per block, a window of 128 consecutive tokens of the step and one head;
//      tokens of one sequence in the window (a run) attend that sequence's rows 0 .. their
//      position, in 64-row tiles through a 3-stage cp.async pipeline (each tile serves the
//      window's 128 query rows); q rounded to bf16 (as the model's own q is), scores and P·V on
//      bf16 tensor cores (mma.sync m16n8k16, fp32 accumulate), online softmax in fp32. 8 warps
//      of 16 query rows, one block per SM.
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "afd/common/cuda_check.h"
#include "afd/common/error.h"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mla.cuh"
#include "afd/kernels/cuda/mma.cuh"
#include "afd/kernels/cuda/pdl.cuh"

namespace afd::kernels::cuda {

namespace {

constexpr int kPfDn = 128, kPfDr = 64, kPfDv = 128, kPfQk = kPfDn + kPfDr;
constexpr int kPfWarps = 8;              // 16 query rows each
constexpr int kPfQRows = 16 * kPfWarps;  // query tokens per block
constexpr int kPfRows = 64;              // context rows per tile
constexpr int kPfStages = 3;             // tiles in shared memory (two in flight)
constexpr int kPfQkStride = kPfQk + 8;   // bf16; 400 bytes ≡ 16 (mod 128): conflict-free ldmatrix
constexpr int kPfVStride = kPfDv + 8;    // 272 bytes ≡ 16 (mod 128)
constexpr size_t kPfSmemBytes =
    sizeof(__nv_bfloat16) *
    (kPfQRows * kPfQkStride + kPfStages * kPfRows * (kPfQkStride + kPfVStride));
constexpr int kGatherRows = 16;  // context rows per block of MlaGatherContext

__global__ void MlaGatherContext(const int32_t* block_tables, int64_t max_blocks,
                                 int64_t block_size, int64_t num_blocks, int64_t max_context,
                                 const __nv_bfloat16* cache, int64_t width, __nv_bfloat16* out) {
  PdlStart();
  const int64_t s = blockIdx.y;
  const int64_t chunks = width / 8;  // 16-byte pieces of a row
  for (int64_t i = threadIdx.x; i < kGatherRows * chunks; i += blockDim.x) {
    const int64_t j = int64_t(blockIdx.x) * kGatherRows + i / chunks, c = i % chunks;
    if (j >= max_context) break;
    const int64_t b = j / block_size;
    const int64_t block = b < max_blocks ? block_tables[s * max_blocks + b] : -1;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (block >= 0 && block < num_blocks) {
      v = reinterpret_cast<const uint4*>(cache + (block * block_size + j % block_size) * width)[c];
    }
    reinterpret_cast<uint4*>(out + (s * max_context + j) * width)[c] = v;
  }
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// grid: (windows of kPfQRows tokens, heads nh). kv: [rows, nh·(dn + dv)] bf16 (k_nope | v per
// head), ctx: [rows, width] bf16 (the gathered cache rows: k_pe at column kvr), row
// seq·max_context + j. out: [n, nh·dv] f32.
__global__ void __launch_bounds__(kPfWarps * 32, 1)
    FlashMlaPrefill(const float* q, int64_t n, int64_t heads, int64_t h0, const int64_t* positions,
                    const int32_t* seq_index, const __nv_bfloat16* kv, int64_t nh,
                    const __nv_bfloat16* ctx, int64_t width, int64_t kvr, int64_t max_context,
                    float scale_log2, float* out) {
  extern __shared__ __align__(16) unsigned char pf_smem[];
  auto* qs = reinterpret_cast<__nv_bfloat16*>(pf_smem);        // [kPfQRows][kPfQkStride]
  __nv_bfloat16* ks = qs + kPfQRows * kPfQkStride;             // [stages][kPfRows][kPfQkStride]
  __nv_bfloat16* vs = ks + kPfStages * kPfRows * kPfQkStride;  // [stages][kPfRows][kPfVStride]
  __shared__ int row_seq[kPfQRows];
  __shared__ int64_t row_pos[kPfQRows];
  __shared__ int64_t run_max;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, t4 = lane & 3;
  // Windows with the latest tokens (the longest causal spans) first.
  const int64_t t0 = (int64_t(gridDim.x) - 1 - blockIdx.x) * kPfQRows;
  const int64_t hh = blockIdx.y;
  const int64_t ldkv = nh * (kPfDn + kPfDv);
  PdlStart();
  if (threadIdx.x < kPfQRows) {
    const int64_t t = t0 + threadIdx.x;
    row_seq[threadIdx.x] = t < n ? seq_index[t] : -1;
    row_pos[threadIdx.x] = t < n ? positions[t] : -1;
  }
  // q rows of this head, rounded to bf16 (zeros past n): every thread's loads issued before
  // any is used (one round trip, not kQLoads).
  constexpr int kQLoads = kPfQRows * kPfQk / 4 / (kPfWarps * 32);
  static_assert(kQLoads * kPfWarps * 32 == kPfQRows * kPfQk / 4, "q loads per thread");
  float4 qv[kQLoads];
#pragma unroll
  for (int u = 0; u < kQLoads; ++u) {
    const int i = threadIdx.x + u * kPfWarps * 32, r = i / (kPfQk / 4), c = i % (kPfQk / 4);
    const int64_t t = t0 + r;
    qv[u] = t < n ? reinterpret_cast<const float4*>(q + (t * heads + h0 + hh) * kPfQk)[c]
                  : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int u = 0; u < kQLoads; ++u) {
    const int i = threadIdx.x + u * kPfWarps * 32, r = i / (kPfQk / 4), c = i % (kPfQk / 4);
    auto* dst = reinterpret_cast<uint32_t*>(qs + r * kPfQkStride + 4 * c);
    dst[0] = PackBf16(qv[u].x, qv[u].y);
    dst[1] = PackBf16(qv[u].z, qv[u].w);
  }
  __syncthreads();
  // This warp's A fragments of q (rows 16 warp .. +16, 12 k16 steps), kept in registers.
  uint32_t qf[kPfQk / 16][4];
#pragma unroll
  for (int kk = 0; kk < kPfQk / 16; ++kk) {
    Ldsm4(qf[kk], qs + (16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * kPfQkStride + 16 * kk +
                      (lane >> 4) * 8);
  }
  const int rows = static_cast<int>(n - t0 < kPfQRows ? n - t0 : kPfQRows);
  const int ra = 16 * warp + gid, rb = ra + 8;  // this lane's two query rows
  int r0 = 0;
  while (r0 < rows) {
    // The run [r0, r1) of tokens of one sequence.
    const int seq = row_seq[r0];
    int r1 = r0 + 1;
    while (r1 < rows && row_seq[r1] == seq) ++r1;
    if (threadIdx.x == 0) {
      int64_t m = -1;
      for (int r = r0; r < r1; ++r) m = row_pos[r] > m ? row_pos[r] : m;
      run_max = m;
    }
    __syncthreads();
    const int64_t last = run_max < max_context ? run_max : max_context - 1;  // positions 0 .. last
    const int64_t pa = (ra >= r0 && ra < r1) ? row_pos[ra] : -1;
    const int64_t pb = (rb >= r0 && rb < r1) ? row_pos[rb] : -1;
    const int64_t base = int64_t(seq) * max_context;
    const int tiles = static_cast<int>(last / kPfRows + 1);
    const auto load_tile = [&](int tile, int buf) {
      __nv_bfloat16* kb = ks + buf * kPfRows * kPfQkStride;
      __nv_bfloat16* vb = vs + buf * kPfRows * kPfVStride;
      for (int i = threadIdx.x; i < kPfRows * (kPfQk + kPfDv) / 8; i += blockDim.x) {
        const int r = i / ((kPfQk + kPfDv) / 8), c = i % ((kPfQk + kPfDv) / 8);
        const int64_t j = int64_t(tile) * kPfRows + r;
        const bool valid = j <= last;
        const int64_t row = base + (valid ? j : 0);
        if (c < kPfDn / 8) {  // k_nope
          CopyAsync16Or0(kb + r * kPfQkStride + 8 * c,
                         kv + row * ldkv + hh * (kPfDn + kPfDv) + 8 * c, valid);
        } else if (c < kPfQk / 8) {  // k_pe
          const int cc = c - kPfDn / 8;
          CopyAsync16Or0(kb + r * kPfQkStride + kPfDn + 8 * cc, ctx + row * width + kvr + 8 * cc,
                         valid);
        } else {  // v
          const int cc = c - kPfQk / 8;
          CopyAsync16Or0(vb + r * kPfVStride + 8 * cc,
                         kv + row * ldkv + hh * (kPfDn + kPfDv) + kPfDn + 8 * cc, valid);
        }
      }
    };
    float o[kPfDv / 8][4] = {};
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
    // One group of copies per tile (empty past the last), so tile i's group is complete once
    // at most kPfStages - 1 are pending.
#pragma unroll
    for (int i = 0; i < kPfStages - 1; ++i) {
      if (i < tiles) load_tile(i, i);
      CopyAsyncCommit();
    }
    for (int tile = 0; tile < tiles; ++tile) {
      if (tile + kPfStages - 1 < tiles) {
        load_tile(tile + kPfStages - 1, (tile + kPfStages - 1) % kPfStages);
      }
      CopyAsyncCommit();
      CopyAsyncWait<kPfStages - 1>();
      __syncthreads();
      const __nv_bfloat16* kb = ks + (tile % kPfStages) * kPfRows * kPfQkStride;
      const __nv_bfloat16* vb = vs + (tile % kPfStages) * kPfRows * kPfVStride;
      // Scores of this warp's 16 rows x the tile's 64 rows.
      const __nv_bfloat16* krow =
          kb + ((lane & 7) + (lane >> 4) * 8) * kPfQkStride + ((lane >> 3) & 1) * 8;
      float sc[kPfRows / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < kPfQk / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < kPfRows / 16; ++np) {
          uint32_t b[4];
          Ldsm4(b, krow + 16 * np * kPfQkStride + 16 * kk);
          MmaBf16(sc[2 * np], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[0], b[1]);
          MmaBf16(sc[2 * np + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[2], b[3]);
        }
      }
      // Each row's last unmasked column of the tile, clamped to [-1, kPfRows] (32-bit compares).
      const int64_t j0 = int64_t(tile) * kPfRows;
      const int lim_a = static_cast<int>(pa - j0 < -1 ? -1 : pa - j0 > kPfRows ? kPfRows : pa - j0);
      const int lim_b = static_cast<int>(pb - j0 < -1 ? -1 : pb - j0 > kPfRows ? kPfRows : pb - j0);
      // Row maxima and sums as trees over the lane's 16 values (a serial chain of 16 dependent
      // fmax / add per row was the kernel's top stall).
      float ta[kPfRows / 8], tb[kPfRows / 8];
#pragma unroll
      for (int j = 0; j < kPfRows / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * j + 2 * t4 + e;
          sc[j][e] = col <= lim_a ? sc[j][e] * scale_log2 : -INFINITY;
          sc[j][2 + e] = col <= lim_b ? sc[j][2 + e] * scale_log2 : -INFINITY;
        }
        ta[j] = fmaxf(sc[j][0], sc[j][1]);
        tb[j] = fmaxf(sc[j][2], sc[j][3]);
      }
#pragma unroll
      for (int w = kPfRows / 16; w >= 1; w /= 2) {
#pragma unroll
        for (int j = 0; j < w; ++j)
          ta[j] = fmaxf(ta[j], ta[j + w]), tb[j] = fmaxf(tb[j], tb[j + w]);
      }
      float mx_a = fmaxf(m_a, ta[0]), mx_b = fmaxf(m_b, tb[0]);
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
      // A row with nothing unmasked yet keeps max -inf: shift by 0 instead (every p is 0).
      const float use_a = mx_a == -INFINITY ? 0.f : mx_a, use_b = mx_b == -INFINITY ? 0.f : mx_b;
      const float alpha_a = exp2f(m_a - use_a), alpha_b = exp2f(m_b - use_b);
      m_a = mx_a, m_b = mx_b;
#pragma unroll
      for (int j = 0; j < kPfRows / 8; ++j) {
        sc[j][0] = exp2f(sc[j][0] - use_a), sc[j][1] = exp2f(sc[j][1] - use_a);
        sc[j][2] = exp2f(sc[j][2] - use_b), sc[j][3] = exp2f(sc[j][3] - use_b);
        ta[j] = sc[j][0] + sc[j][1];
        tb[j] = sc[j][2] + sc[j][3];
      }
#pragma unroll
      for (int w = kPfRows / 16; w >= 1; w /= 2) {
#pragma unroll
        for (int j = 0; j < w; ++j) ta[j] += ta[j + w], tb[j] += tb[j + w];
      }
      const float sum_a = ta[0], sum_b = tb[0];
      l_a = l_a * alpha_a + sum_a;
      l_b = l_b * alpha_b + sum_b;
#pragma unroll
      for (int d = 0; d < kPfDv / 8; ++d) {
        o[d][0] *= alpha_a, o[d][1] *= alpha_a, o[d][2] *= alpha_b, o[d][3] *= alpha_b;
      }
      // O += P · V: P's C fragments are the A fragments of the k16 steps over the tile's rows.
#pragma unroll
      for (int kk = 0; kk < kPfRows / 16; ++kk) {
        const uint32_t a0 = PackBf16(sc[2 * kk][0], sc[2 * kk][1]);
        const uint32_t a1 = PackBf16(sc[2 * kk][2], sc[2 * kk][3]);
        const uint32_t a2 = PackBf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
        const uint32_t a3 = PackBf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < kPfDv / 16; ++dp) {
          uint32_t b[4];
          Ldsm4T(b, vb + (16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * kPfVStride + 16 * dp +
                        (lane >> 4) * 8);
          MmaBf16(o[2 * dp], a0, a1, a2, a3, b[0], b[1]);
          MmaBf16(o[2 * dp + 1], a0, a1, a2, a3, b[2], b[3]);
        }
      }
      __syncthreads();  // the buffer is refilled kPfStages - 1 tiles on
    }
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    const float inv_a = pa >= 0 ? 1.f / l_a : 0.f, inv_b = pb >= 0 ? 1.f / l_b : 0.f;
#pragma unroll
    for (int d = 0; d < kPfDv / 8; ++d) {
      const int64_t col = hh * kPfDv + 8 * d + 2 * t4;
      if (pa >= 0) {
        *reinterpret_cast<float2*>(out + (t0 + ra) * nh * kPfDv + col) =
            make_float2(o[d][0] * inv_a, o[d][1] * inv_a);
      }
      if (pb >= 0) {
        *reinterpret_cast<float2*>(out + (t0 + rb) * nh * kPfDv + col) =
            make_float2(o[d][2] * inv_b, o[d][3] * inv_b);
      }
    }
    r0 = r1;
    __syncthreads();  // run_max and the tile buffers are reused by the next run
  }
}

}  // namespace

bool MlaPrefillFits(int64_t n, int64_t seqs, int64_t max_context, int64_t dn, int64_t dr,
                    int64_t dv, int64_t kvr, int64_t nh) {
  static const bool disabled = ChoiceOff("AFD_MLA_PREFILL");
  if (disabled || dn != kPfDn || dr != kPfDr || dv != kPfDv || kvr % 8 != 0) return false;
  // Mostly new tokens: at least two a sequence (a decode step, one a sequence, never takes it,
  // captured or eager alike), the context rows decompressed (seqs x max_context, all of them
  // whatever the positions) at most 4 per query token, and the decompressed rows under 2 GiB.
  const int64_t rows = seqs * max_context;
  return n >= kMlaPrefillMinTokens && n >= 2 * seqs && rows <= 4 * n &&
         rows * (nh * (dn + dv) + kvr + dr) * 2 <= (int64_t{2} << 30);
}

void LaunchMlaGatherContext(const int32_t* block_tables, int64_t seqs, int64_t max_blocks,
                            int64_t block_size, int64_t num_blocks, int64_t max_context,
                            const void* cache, int64_t width, void* out, cudaStream_t s) {
  AFD_CHECK(width % 8 == 0, "MlaGatherContext: row width {} is not a multiple of 8", width);
  const dim3 grid(static_cast<unsigned>((max_context + kGatherRows - 1) / kGatherRows),
                  static_cast<unsigned>(seqs));
  LaunchPdl(MlaGatherContext, grid, 256, 0, s, block_tables, max_blocks, block_size, num_blocks,
            max_context, static_cast<const __nv_bfloat16*>(cache), width,
            static_cast<__nv_bfloat16*>(out));
  CheckLaunch("MlaGatherContext");
}

void LaunchMlaPrefill(const float* q, int64_t n, int64_t heads, int64_t h0, int64_t nh,
                      const int64_t* positions, const int32_t* seq_index, const void* kv,
                      const void* ctx, int64_t width, int64_t kvr, int64_t max_context, float scale,
                      float* out, cudaStream_t s) {
  if (n == 0) return;
  AFD_CHECK(reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0,
            "MlaPrefill: q must be 16-byte and out 8-byte aligned");
  constexpr float kLog2e = 1.4426950408889634f;
  const dim3 grid(static_cast<unsigned>((n + kPfQRows - 1) / kPfQRows), static_cast<unsigned>(nh));
  static const bool raised = [] {
    AFD_CUDA_CHECK(cudaFuncSetAttribute(FlashMlaPrefill,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kPfSmemBytes)));
    return true;
  }();
  (void)raised;
  LaunchPdl(FlashMlaPrefill, grid, kPfWarps * 32, kPfSmemBytes, s, q, n, heads, h0, positions,
            seq_index, static_cast<const __nv_bfloat16*>(kv), nh,
            static_cast<const __nv_bfloat16*>(ctx), width, kvr, max_context, scale * kLog2e, out);
  CheckLaunch("MlaPrefill");
}

}  // namespace afd::kernels::cuda
