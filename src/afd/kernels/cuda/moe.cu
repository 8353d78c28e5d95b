// MoE on the GPU: permute (device-side expert counts and offsets, tokens ascending within an
// expert), grouped expert GEMMs reading the per-expert row ranges on the device (no host loop
// over experts, no host sync), weighted combine in slot order.
// The kernels are one family per file: moe_permute.cu, moe_gemv.cu, moe_mma.cu, moe_tiled.cu,
// moe_wmma.cu, moe_combine.cu (forms in moe_forms.cuh); this file converts rows to bf16 and
// chooses the form of each grouped GEMM by shape.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "afd/common/cuda_check.h"
#include "afd/common/fp8_rows.h"
#include "afd/kernels/cuda/bf16_vec.cuh"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mma.cuh"
#include "afd/kernels/cuda/moe.cuh"
#include "afd/kernels/cuda/moe_forms.cuh"
#include "afd/kernels/cuda/pdl.cuh"

namespace afd::kernels::cuda {

namespace {

__global__ void RowsToBf16(const float* x, int64_t n, __nv_bfloat16* out) {
  PdlStart();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(x[i]);
  }
}

// Block r: out[r] = x[index[r]] rounded to bf16 (4 values per thread step; h % 4 == 0, x
// 16-byte aligned, out 8-byte aligned).
__global__ void GatherRowsToBf16(const float* x, const int32_t* index, int64_t h,
                                 __nv_bfloat16* out) {
  PdlStart();
  const float4* src = reinterpret_cast<const float4*>(x + int64_t(index[blockIdx.x]) * h);
  auto* dst = reinterpret_cast<uint2*>(out + int64_t(blockIdx.x) * h);
  for (int64_t i = threadIdx.x; i < h / 4; i += blockDim.x) {
    const float4 v = src[i];
    uint2 packed;
    *reinterpret_cast<__nv_bfloat162*>(&packed.x) = __floats2bfloat162_rn(v.x, v.y);
    *reinterpret_cast<__nv_bfloat162*>(&packed.y) = __floats2bfloat162_rn(v.z, v.w);
    dst[i] = packed;
  }
}

// Block r: row r of x (x[index[r]] with an index) as E4M3 codes with a float32 scale per group of
// 128 (common/fp8_rows.h: the AFD dispatch's rules, the same bytes as its CPU reference), a warp
// per group, 4 consecutive values a lane (h % 4 == 0; the last group may be partial).
__global__ void RowsToFp8(const float* x, const int32_t* index, int64_t h, uint8_t* q,
                          float* scales) {
  PdlStart();
  const int64_t r = blockIdx.x;
  const float* xr = x + (index != nullptr ? int64_t(index[r]) : r) * h;
  const int lane = threadIdx.x & 31;
  const int64_t groups = AfdFp8Groups(h);
  for (int64_t g = threadIdx.x >> 5; g < groups; g += blockDim.x >> 5) {
    const int64_t c = g * kAfdFp8Group + 4 * lane;
    float v[4] = {};
    if (c < h) {
      for (int i = 0; i < 4; ++i) v[i] = xr[c + i];
    }
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float a = AfdFp8Clamp(amax), mul = AfdFp8Mul(a);
    if (c < h) {
      uint32_t packed = 0;
      for (int i = 0; i < 4; ++i) {
        const __nv_fp8_storage_t b =
            __nv_cvt_float_to_fp8(__fmul_rn(v[i], mul), __NV_SATFINITE, __NV_E4M3);
        packed |= uint32_t(b) << (8 * i);
      }
      *reinterpret_cast<uint32_t*>(q + r * h + c) = packed;
    }
    if (lane == 0) scales[r * groups + g] = AfdFp8Scale(a);
  }
}

// FP8 experts dequantized for the tiled form (DequantFp8Experts): expert blockIdx.y's codes
// [rows, cols] as bf16(fp32(code) * scale) -- the mma form's and the dequantizing load's values.
// Rows from `split` on start new block rows (gate_up: up_proj's).
__global__ void DequantFp8ExpertsKernel(const void* const* codes, const void* const* scales,
                                        int64_t rows, int64_t cols, int64_t split,
                                        __nv_bfloat16* out) {
  PdlStart();
  const int64_t e = blockIdx.y;
  const auto* q = static_cast<const __nv_fp8_storage_t*>(codes[e]);
  const auto* sc = static_cast<const float*>(scales[e]);
  __nv_bfloat16* o = out + e * rows * cols;
  const int64_t block_cols = (cols + 127) / 128, split_blocks = (split + 127) / 128;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const int64_t br = r < split ? r / 128 : split_blocks + (r - split) / 128;
    const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3)));
    o[i] = __float2bfloat16_rn(__fmul_rn(v, sc[br * block_cols + c / 128]));
  }
}

}  // namespace

void LaunchGatherRowsToBf16(const float* x, const int32_t* index, int64_t m, int64_t h,
                            __nv_bfloat16* xb, cudaStream_t s) {
  if (m == 0) return;
  AFD_CHECK(h % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
            "GatherRowsToBf16: hidden size {} must be a multiple of 4, x 16-byte aligned", h);
  LaunchPdl(GatherRowsToBf16, static_cast<unsigned>(m), 256, 0, s, x, index, h, xb);
  CheckLaunch("GatherRowsToBf16");
}

void LaunchRowsToFp8(const float* x, const int32_t* index, int64_t m, int64_t h, uint8_t* q,
                     float* scales, cudaStream_t s) {
  if (m == 0) return;
  AFD_CHECK(h % 4 == 0, "RowsToFp8: row width {} must be a multiple of 4", h);
  LaunchPdl(RowsToFp8, static_cast<unsigned>(m), 128, 0, s, x, index, h, q, scales);
  CheckLaunch("RowsToFp8");
}

// x [n] rounded to bf16 into xb (the mma path's input).
void LaunchRowsToBf16(const float* x, int64_t n, __nv_bfloat16* xb, cudaStream_t s) {
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096));
  LaunchPdl(RowsToBf16, blocks, 256, 0, s, x, n, xb);
}

void LaunchGroupedLinear(const float* x, int64_t m, int64_t k, const void* const* w_ptrs, bool bf16,
                         const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                         float* y, uint16_t* x_bf16, cudaStream_t s) {
  if (m == 0 || num_local == 0) return;
  // bf16 experts up to kMmaMaxAvgRows rows each on average (decode and mid-sized groups):
  // mma.sync straight from global memory, each used expert's weights read from memory once (the
  // passes over more rows run side by side in row slices and share them through L2). x is rounded
  // to bf16 once into the x_bf16 scratch [m, k].
  if (bf16 && x_bf16 != nullptr && MmaFits(m, k, n_out, num_local)) {
    auto* xb = reinterpret_cast<__nv_bfloat16*>(x_bf16);
    LaunchRowsToBf16(x, m * k, xb, s);
    LaunchGroupedMma(xb, m, k, w_ptrs, offsets, num_local, n_out, swiglu, false, y, nullptr, s);
    CheckLaunch("GroupedExpertMlp (mma)");
    return;
  }
  // Other bf16 experts with 16+ rows each on average (over kMmaMaxAvgRows, or K not a multiple
  // of 32): WMMA tensor cores (needs K and N multiples of 16).
  if (bf16 && WmmaFits(m, k, n_out, num_local)) {
    LaunchGroupedWmma(x, m, k, w_ptrs, offsets, num_local, n_out, swiglu, y, s);
    CheckLaunch("GroupedExpertMlp (wmma)");
    return;
  }
  // Other bf16 decode sizes: x rounded to bf16 once (x_bf16 scratch [m, k]), 4 weight rows per
  // warp.
  if (bf16 && x_bf16 != nullptr && m <= 32 * num_local && k % 8 == 0) {
    auto* xb = reinterpret_cast<__nv_bfloat16*>(x_bf16);
    LaunchRowsToBf16(x, m * k, xb, s);
    LaunchGroupedGemvBf16(xb, k, w_ptrs, offsets, num_local, n_out, swiglu, y, s);
    CheckLaunch("GroupedExpertMlp (bf16 gemv)");
    return;
  }
  // Decode sizes (up to ~32 rows per expert on average): the per-column path reads each used
  // expert's weights once (row chunks re-read them from L1/L2). Needs K a multiple of 8
  // (16-byte loads). Prefill-sized fp32 groups take the tiled path.
  if (m <= 32 * num_local && k % 8 == 0) {
    LaunchGroupedGemv(x, k, w_ptrs, bf16, offsets, num_local, n_out, swiglu, y, s);
    CheckLaunch("GroupedExpertMlp (gemv)");
    return;
  }
  LaunchGroupedSimt(x, m, k, w_ptrs, bf16, offsets, num_local, n_out, swiglu, y, s);
  CheckLaunch("GroupedExpertMlp");
}

bool LaunchGroupedMlpMma(const float* x, const int32_t* src_row, int64_t m, int64_t h,
                         int64_t inter, const void* const* gate_up, const void* const* down,
                         const void* const* gate_up_scale, const void* const* down_scale,
                         const int32_t* offsets, int64_t num_local, uint16_t* x_bf16,
                         uint16_t* act_bf16, float* out, cudaStream_t s) {
  // FP8 experts: the mma form at every size (the tiled form reads bf16 only).
  const bool fp8 = gate_up_scale != nullptr;
  const bool tiled = !fp8 && TiledFits(m, h, inter, num_local) && TiledFits(m, inter, h, num_local);
  if (m == 0 || num_local == 0 ||
      (!tiled &&
       (!MmaFits(m, h, inter, num_local, fp8) || !MmaFits(m, inter, h, num_local, fp8)))) {
    return false;
  }
  if (fp8) {
    // w8a8: x and the SwiGLU product (fp32, in the act scratch) as E4M3 rows with scales per
    // 128 (in the x scratch: codes [m, max(h, inter)], then their scales).
    auto* q = reinterpret_cast<uint8_t*>(x_bf16);
    auto* qs = reinterpret_cast<float*>(q + m * std::max(h, inter));
    auto* act = reinterpret_cast<float*>(act_bf16);
    LaunchRowsToFp8(x, src_row, m, h, q, qs, s);
    LaunchGroupedMmaFp8(q, qs, m, h, gate_up, gate_up_scale, offsets, num_local, inter, true, act,
                        s);
    LaunchRowsToFp8(act, nullptr, m, inter, q, qs, s);
    LaunchGroupedMmaFp8(q, qs, m, inter, down, down_scale, offsets, num_local, h, false, out, s);
    CheckLaunch("GroupedExpertMlp (mma, FP8 experts and rows)");
    return true;
  }
  auto* xb = reinterpret_cast<__nv_bfloat16*>(x_bf16);
  auto* ab = reinterpret_cast<__nv_bfloat16*>(act_bf16);
  if (src_row != nullptr) {
    LaunchGatherRowsToBf16(x, src_row, m, h, xb, s);
  } else {
    LaunchRowsToBf16(x, m * h, xb, s);
  }
  if (tiled) {
    LaunchGroupedTiled(xb, m, h, gate_up, offsets, num_local, inter, true, true, nullptr, ab, s);
    LaunchGroupedTiled(ab, m, inter, down, offsets, num_local, h, false, false, out, nullptr, s);
    CheckLaunch("GroupedExpertMlp (tiled, bf16 intermediate)");
    return true;
  }
  LaunchGroupedMma(xb, m, h, gate_up, offsets, num_local, inter, true, true, nullptr, ab, s);
  LaunchGroupedMma(ab, m, inter, down, offsets, num_local, h, false, false, out, nullptr, s);
  CheckLaunch("GroupedExpertMlp (mma, bf16 intermediate)");
  return true;
}

bool GroupedMlpTiledFits(int64_t m, int64_t h, int64_t inter, int64_t num_local) {
  return TiledFits(m, h, inter, num_local) && TiledFits(m, inter, h, num_local);
}

void LaunchDequantFp8Experts(const void* const* codes, const void* const* scales, int64_t num_local,
                             int64_t rows, int64_t cols, int64_t split, uint16_t* out,
                             cudaStream_t s) {
  if (num_local == 0 || rows * cols == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((rows * cols + 255) / 256, 1024));
  LaunchPdl(DequantFp8ExpertsKernel, dim3(blocks, static_cast<unsigned>(num_local)), 256, 0, s,
            codes, scales, rows, cols, split, reinterpret_cast<__nv_bfloat16*>(out));
  CheckLaunch("DequantFp8Experts");
}

}  // namespace afd::kernels::cuda
