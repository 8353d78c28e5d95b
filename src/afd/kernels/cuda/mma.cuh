// Tensor-core mma.sync, ldmatrix and cp.async wrappers shared by the kernels (moe.cu: bf16
// grouped experts; mla.cu: TF32 and bf16 MLA decode). Fragment layouts are in the PTX ISA
// ("Matrix fragments for mma.m16n8k16" / "mma.m16n8k8"); lane = 4 gid + t, gid = lane / 4,
// t = lane % 4.
#pragma once

#include <cstdint>

namespace afd::kernels::cuda {

// c += a · b, m16n8k16, bf16 in (two per .b32 register, lower index in the low half), fp32
// accumulate:
//   A (16x16, row): a0, a1 (gid, 2t + {0, 1}), a2, a3 (gid + 8, 2t + {0, 1}),
//                   a4, a5 (gid, 2t + 8 + {0, 1}), a6, a7 (gid + 8, 2t + 8 + {0, 1})
//   B (16x8, col):  b0, b1 (k = 2t + {0, 1}, n = gid), b2, b3 (k = 2t + 8 + {0, 1}, n = gid)
//   C (16x8):       c0, c1 (gid, 2t + {0, 1}), c2, c3 (gid + 8, 2t + {0, 1})
__device__ __forceinline__ void MmaBf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c += a · b, m16n8k32, E4M3 in (four per .b32 register, the lowest index in the low byte),
// fp32 accumulate (sm_89+):
//   A (16x32, row): a0 (gid, 4t + {0..3}), a1 (gid + 8, 4t + {0..3}),
//                   a2 (gid, 4t + 16 + {0..3}), a3 (gid + 8, 4t + 16 + {0..3})
//   B (32x8, col):  b0 (k = 4t + {0..3}, n = gid), b1 (k = 4t + 16 + {0..3}, n = gid)
//   C (16x8):       c0, c1 (gid, 2t + {0, 1}), c2, c3 (gid + 8, 2t + {0, 1})
__device__ __forceinline__ void MmaFp8(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // no e4m3 mma before sm_89 (the build targets sm_90a)
#endif
}

// fp32 -> tf32 (round to nearest, ties away), as a .b32 mma operand.
__device__ __forceinline__ uint32_t Tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// c += a · b, m16n8k8, tf32 in, fp32 accumulate:
//   A (16x8, row): a0 (gid, t), a1 (gid + 8, t), a2 (gid, t + 4), a3 (gid + 8, t + 4)
//   B (8x8, col):  b0 (k = t, n = gid), b1 (k = t + 4, n = gid)
//   C (16x8):      c0, c1 (gid, 2t + {0, 1}), c2, c3 (gid + 8, 2t + {0, 1})
__device__ __forceinline__ void MmaTf32(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices from shared memory: lanes 8i .. 8i + 7 give the row addresses of matrix
// i (16 bytes each), and register i of lane (gid, t) gets row gid, columns 2t, 2t + 1 of matrix
// i (Ldsm4T: of its transpose, i.e. rows 2t, 2t + 1 of column gid).
__device__ __forceinline__ void Ldsm4(uint32_t (&r)[4], const void* row) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void Ldsm4T(uint32_t (&r)[4], const void* row) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// 16 bytes global -> shared, through L2 only (cp.async.cg); CopyAsync16Or0 writes 16 zero bytes
// instead when !valid (gmem is then not read).
__device__ __forceinline__ void CopyAsync16(void* smem, const void* gmem) {
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void CopyAsync16Or0(void* smem, const void* gmem, bool valid) {
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}
// 4 bytes global -> shared (cp.async.ca: the only form below 16 bytes).
__device__ __forceinline__ void CopyAsync4(void* smem, const void* gmem) {
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(gmem));
}
// Closes the group of copies issued so far; CopyAsyncWait waits until at most kPending groups
// are still in flight (this thread's copies: a barrier makes them visible to the block).
__device__ __forceinline__ void CopyAsyncCommit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CopyAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void CopyAsyncWaitAll() {
  CopyAsyncCommit();
  CopyAsyncWait<0>();
}

// ---- mbarriers and bulk copies (the TMA engine; sm_90+: guard uses with AFD_HAS_BULK) --------
// A bulk copy moves one contiguous run of bytes (a multiple of 16, both ends 16-byte aligned)
// global -> shared and counts its bytes against an mbarrier's expected transaction bytes; the
// barrier's phase completes once its arrivals are in and every expected byte has landed (the
// bytes may land before they are expected: the count goes negative meanwhile).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define AFD_HAS_BULK 1
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(arrivals)
               : "memory");
}
// After the inits, before the barrier that publishes them to the block (and the async proxy).
__device__ __forceinline__ void MbarInitFence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival that also expects `bytes` more transaction bytes this phase.
__device__ __forceinline__ void MbarArriveExpect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}
// Waits until the barrier's phase of this parity (0 for its first phase, then 1, 0, ...) is
// complete; the bytes that phase counted are then visible to the waiting thread.
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}
__device__ __forceinline__ void BulkCopyToShared(void* smem, const void* gmem, uint32_t bytes,
                                                 uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(SmemAddr(smem)),
      "l"(gmem), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}
// A box of a 2D tensor map (c0: the inner coordinate, c1: the outer) into shared memory, its
// bytes counted on bar; tmap: the address of a __grid_constant__ kernel parameter.
__device__ __forceinline__ void TmaLoad2d(void* smem, const void* tmap, int c0, int c1,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];" ::"r"(SmemAddr(smem)),
      "l"(tmap), "r"(c0), "r"(c1), "r"(SmemAddr(bar))
      : "memory");
}
// This thread's earlier generic-proxy shared memory accesses ordered before its later
// async-proxy ones (a bulk copy into a buffer the block just read, or wgmma operands it wrote).
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
#endif

// ---- wgmma (sm_90a only: guard uses with AFD_HAS_WGMMA) ------------------------------------
// Warpgroup MMA with both operands in shared memory, K-major bf16 tiles in the 128-byte swizzle
// (rows of 128 bytes in 8-row atoms of 1024 bytes, 16-byte chunk c of row r at c ^ (r % 8); the
// atoms 1024-byte aligned). The accumulator of m64nNk16 (per warp w of the warpgroup, lane =
// 4 gid + t): d[4j], d[4j + 1] at row 16w + gid, columns 8j + 2t + {0, 1}; d[4j + 2], d[4j + 3]
// at row 16w + gid + 8.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define AFD_HAS_WGMMA 1
#endif

// The matrix descriptor of such a tile at `smem`: start address / 16 (bits 0-13), leading byte
// offset / 16 (16-29; unused by this layout, 1), stride byte offset / 16 between 8-row atoms
// (32-45: 1024 bytes), swizzle mode 128 B (bits 62-63 = 1). Step along K inside the 128-byte
// rows by adding bytes / 16 to it (a k16 step of bf16: +2).
__device__ __forceinline__ uint64_t Sw128Desc(const void* smem) {
  const uint64_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return ((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

#ifdef AFD_HAS_WGMMA
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// d (64 x 16, fp32) = A (64 x 16) · B (16 x 16)ᵀ-as-stored (+ d when accumulate != 0; both
// K-major, by descriptor).
__device__ __forceinline__ void Wgmma64x16Bf16(float (&d)[8], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "l"(a), "l"(b), "r"(accumulate));
}
// d (64 x 128, fp32) += A (64 x 16) · B (16 x 128)ᵀ-as-stored (both K-major, by descriptor).
__device__ __forceinline__ void Wgmma64x128Bf16(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(a), "l"(b), "r"(1));
}
#endif

}  // namespace afd::kernels::cuda
