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

}  // namespace afd::kernels::cuda
