#include "afd/kernels/cpu/gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "afd/common/dtype_convert.h"
#include "afd/common/env_switches.h"
#include "afd/common/error.h"

namespace afd::kernels::cpu {

namespace {

constexpr int64_t kNr = 16;   // columns of a packed panel (one zmm, two ymm)
constexpr int64_t kKc = 256;  // k chunk: a panel chunk is kKc x 16 floats (16 KB)
constexpr int64_t kNc = 128;  // columns per parallel task (8 panels)

// Packs W rows [o0, o0 + cols) x k range [k0, k0 + kc) into panels of 16 columns, k-major:
// packed[(p·kc + kk)·16 + j] = W[o0 + 16p + j][k0 + kk], zero for columns past `cols`.
// The weight matrix of one Gemm call.
struct Weights {
  const void* data;
  DType dtype;
  int64_t k;
};

void PackPanels(const Weights& w, int64_t o0, int64_t cols, int64_t k0, int64_t kc, float* packed) {
  const int64_t k = w.k;
  const int64_t panels = (cols + kNr - 1) / kNr;
  std::fill(packed, packed + panels * kc * kNr, 0.0f);
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t p = c / kNr, j = c % kNr;
    float* dst = packed + p * kc * kNr + j;
    if (w.dtype == DType::kF32) {
      const float* src = static_cast<const float*>(w.data) + (o0 + c) * k + k0;
      for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kNr] = src[kk];
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + (o0 + c) * k + k0;
      for (int64_t kk = 0; kk < kc; ++kk) dst[kk * kNr] = Bf16ToF32(src[kk]);
    }
  }
}

// c[r, j] (row stride ldc) for r < mr, j < 16: continue each chain over kc terms of x and the
// packed panel. `first`: chains start at 0 (c is not read).
void KernelPortable(int mr, const float* x, int64_t ldx, const float* panel, int64_t kc, float* c,
                    int64_t ldc, bool first) {
  for (int r = 0; r < mr; ++r) {
    float acc[kNr];
    for (int j = 0; j < kNr; ++j) acc[j] = first ? 0.0f : c[r * ldc + j];
    for (int64_t kk = 0; kk < kc; ++kk) {
      const float a = x[r * ldx + kk];
      for (int j = 0; j < kNr; ++j) acc[j] = std::fma(a, panel[kk * kNr + j], acc[j]);
    }
    std::memcpy(c + r * ldc, acc, sizeof acc);
  }
}

template <int MR>
__attribute__((target("avx2,fma"))) void KernelAvx2(const float* x, int64_t ldx, const float* panel,
                                                    int64_t kc, float* c, int64_t ldc, bool first) {
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + r * ldc);
    acc[r][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + r * ldc + 8);
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(panel + kk * kNr);
    const __m256 b1 = _mm256_loadu_ps(panel + kk * kNr + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + kk);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(c + r * ldc, acc[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
  }
}

template <int MR>
__attribute__((target("avx512f"))) void KernelAvx512(const float* x, int64_t ldx,
                                                     const float* panel, int64_t kc, float* c,
                                                     int64_t ldc, bool first) {
  __m512 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc);
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m512 b = _mm512_loadu_ps(panel + kk * kNr);
    for (int r = 0; r < MR; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + kk]), b, acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r) _mm512_storeu_ps(c + r * ldc, acc[r]);
}

using KernelFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, bool);

template <int MR>
struct Avx2 {
  static constexpr KernelFn fn = &KernelAvx2<MR>;
};
template <int MR>
struct Avx512 {
  static constexpr KernelFn fn = &KernelAvx512<MR>;
};

constexpr KernelFn kAvx2Kernels[] = {Avx2<1>::fn, Avx2<2>::fn, Avx2<3>::fn,
                                     Avx2<4>::fn, Avx2<5>::fn, Avx2<6>::fn};
constexpr int kAvx2Mr = 6;
constexpr KernelFn kAvx512Kernels[] = {
    Avx512<1>::fn, Avx512<2>::fn, Avx512<3>::fn, Avx512<4>::fn,  Avx512<5>::fn,  Avx512<6>::fn,
    Avx512<7>::fn, Avx512<8>::fn, Avx512<9>::fn, Avx512<10>::fn, Avx512<11>::fn, Avx512<12>::fn};
constexpr int kAvx512Mr = 12;
constexpr int kPortableMr = 4;

// Runs one micro-kernel call on an mr x 16 tile of y whose valid columns are `cols` (< 16 at the
// right edge: the tile goes through a local buffer so nothing past y's columns is touched).
void Tile(GemmIsa isa, int mr, const float* x, int64_t ldx, const float* panel, int64_t kc,
          float* y, int64_t ldy, int64_t cols, bool first) {
  float tile[kAvx512Mr * kNr];
  float* c = y;
  int64_t ldc = ldy;
  if (cols < kNr) {
    c = tile;
    ldc = kNr;
    if (!first) {
      for (int r = 0; r < mr; ++r) std::memcpy(c + r * kNr, y + r * ldy, cols * sizeof(float));
    }
  }
  switch (isa) {
    case GemmIsa::kAvx512:
      kAvx512Kernels[mr - 1](x, ldx, panel, kc, c, ldc, first);
      break;
    case GemmIsa::kAvx2:
      kAvx2Kernels[mr - 1](x, ldx, panel, kc, c, ldc, first);
      break;
    default:
      KernelPortable(mr, x, ldx, panel, kc, c, ldc, first);
  }
  if (c == tile) {
    for (int r = 0; r < mr; ++r) std::memcpy(y + r * ldy, c + r * kNr, cols * sizeof(float));
  }
}

int MaxRows(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kAvx512:
      return kAvx512Mr;
    case GemmIsa::kAvx2:
      return kAvx2Mr;
    default:
      return kPortableMr;
  }
}

bool Supported(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
    case GemmIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default:
      return true;
  }
}

// Columns [o0, o0 + cols) of y for every row of x.
void ColumnBlock(GemmIsa isa, const float* x, int64_t n, int64_t ldx, const Weights& w, int64_t o0,
                 int64_t cols, float* y, int64_t ldy) {
  thread_local std::vector<float> packed;  // [panels, kc, 16]
  const int64_t k = w.k;
  const int64_t panels = (cols + kNr - 1) / kNr;
  packed.resize(panels * kKc * kNr);
  const int max_rows = MaxRows(isa);
  for (int64_t k0 = 0; k0 < k; k0 += kKc) {
    const int64_t kc = std::min(kKc, k - k0);
    PackPanels(w, o0, cols, k0, kc, packed.data());
    for (int64_t r0 = 0; r0 < n; r0 += max_rows) {
      const int mr = static_cast<int>(std::min<int64_t>(max_rows, n - r0));
      for (int64_t p = 0; p < panels; ++p) {
        Tile(isa, mr, x + r0 * ldx + k0, ldx, packed.data() + p * kc * kNr, kc,
             y + r0 * ldy + o0 + p * kNr, ldy, std::min(kNr, cols - p * kNr), k0 == 0);
      }
    }
  }
}

}  // namespace

GemmIsa BestGemmIsa() {
  static const GemmIsa best = [] {
    // AFD_CPU_GEMM=portable|avx2|avx512 caps the kernel (tests show every cap gives the same
    // bits); anything else, or a kernel this CPU lacks, is refused.
    GemmIsa cap = GemmIsa::kAvx512;
    if (const std::optional<std::string> env = EnvValue("AFD_CPU_GEMM"); env && !env->empty()) {
      const std::string& v = *env;
      AFD_CHECK(v == "portable" || v == "avx2" || v == "avx512",
                "AFD_CPU_GEMM={} is not one of portable, avx2, avx512", v);
      cap = v == "portable" ? GemmIsa::kPortable : v == "avx2" ? GemmIsa::kAvx2 : GemmIsa::kAvx512;
      AFD_CHECK(Supported(cap), "AFD_CPU_GEMM={}: this CPU has no such kernel", v);
    }
    for (GemmIsa isa : {GemmIsa::kAvx512, GemmIsa::kAvx2}) {
      if (static_cast<int>(isa) <= static_cast<int>(cap) && Supported(isa)) return isa;
    }
    return GemmIsa::kPortable;
  }();
  return best;
}

const char* GemmIsaName(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kAuto:
      return "auto";
    case GemmIsa::kPortable:
      return "portable";
    case GemmIsa::kAvx2:
      return "avx2";
    case GemmIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

void Gemm(const float* x, int64_t n, int64_t ldx, const void* w_data, DType w_dtype, int64_t n_out,
          int64_t k, float* y, int64_t ldy, GemmIsa isa) {
  if (isa == GemmIsa::kAuto) isa = BestGemmIsa();
  AFD_CHECK(Supported(isa), "Gemm: this CPU has no {} kernel", GemmIsaName(isa));
  AFD_CHECK(w_dtype == DType::kF32 || w_dtype == DType::kBF16, "Gemm: {} weights",
            DTypeName(w_dtype));
  const Weights w{w_data, w_dtype, k};
  AFD_CHECK(ldx >= k && ldy >= n_out, "Gemm: strides ({}, {}) below the shape ({}, {})", ldx, ldy,
            k, n_out);
  if (n == 0 || n_out == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < n; ++i) std::fill(y + i * ldy, y + i * ldy + n_out, 0.0f);
    return;
  }
  const int64_t blocks = (n_out + kNc - 1) / kNc;
  // Threads only pay off above ~1 MFLOP; the result is the same either way.
  const bool parallel = blocks > 1 && n * n_out * k >= (int64_t{1} << 19);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t o0 = b * kNc;
    ColumnBlock(isa, x, n, ldx, w, o0, std::min(kNc, n_out - o0), y, ldy);
  }
}

void GemmReference(const float* x, int64_t n, const void* w, DType w_dtype, int64_t n_out,
                   int64_t k, float* y) {
  std::vector<float> row(k);
  for (int64_t o = 0; o < n_out; ++o) {
    ConvertToF32(w_dtype, static_cast<const char*>(w) + o * k * DTypeSize(w_dtype), k, row.data());
    for (int64_t i = 0; i < n; ++i) {
      double acc = 0.0;
      for (int64_t j = 0; j < k; ++j) acc += static_cast<double>(x[i * k + j]) * row[j];
      y[i * n_out + o] = static_cast<float>(acc);
    }
  }
}

}  // namespace afd::kernels::cpu
