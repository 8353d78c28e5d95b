// RoPE, the MLA cache write and absorbed MLA decode (mla.cu), and the expanded MLA prefill
// (mla_prefill.cu).
// Launchers: raw device pointers and a stream in (launch.cuh has the conventions).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "afd/kernels/cuda/attention_args.cuh"

namespace afd::kernels::cuda {

// mla.cu
// x: [n, heads, width], rotates dims [offset, offset + dr) of each head.
void LaunchRope(float* x, int64_t n, int64_t heads, int64_t width, int64_t offset,
                const int64_t* positions, const RopeArgs& rope, cudaStream_t s);
void LaunchMlaCacheWrite(const float* ckv, int64_t n, int64_t kvr, const float* norm_w, float eps,
                         const PagedArgs& t, const RopeArgs& rope, void* cache, bool bf16_cache,
                         cudaStream_t s);
// Absorbed MLA decode core: o_lat[t, h] = softmax_j(q_lat·c_j + q_pe·pe_j)·c_j over each
// token's positions, the context split over `splits` blocks (flash-decoding). q: [n, heads,
// dn + dr] (q_pe read from it), q_lat: [n, nh, kvr] (W_kᵀ·q_nope of heads [h0, h1)), o_lat:
// [n, nh, kvr]; partial: device scratch of MlaPartialFloats(...) floats. cache: rows of f32, or
// of bf16 when bf16_cache (MlaCacheWrite rounds them so). tf32: the scores and
// P·V on TF32 tensor cores where the shapes allow (Backend::AllowTf32), else exact fp32.
// The W_k / W_v products around it for n <= kMlaSmallBatch tokens (kvr % 4 == 0; kv_b 16-byte
// aligned): q_lat [n, nh, kvr] from q's q_nope, and out [n, nh * dv] from o_lat.
inline constexpr int64_t kMlaSmallBatch = 32;
bool MlaProjectionsFit(int64_t n, int64_t dn, int64_t kvr);
void LaunchMlaQLat(const float* q, int64_t n, int64_t heads, int64_t dn, int64_t dr, int64_t dv,
                   const float* kv_b, int64_t h0, int64_t h1, int64_t kvr, float* q_lat,
                   cudaStream_t s);
void LaunchMlaOut(const float* o_lat, int64_t n, int64_t dn, int64_t dv, const float* kv_b,
                  int64_t h0, int64_t h1, int64_t kvr, float* out, cudaStream_t s);
// The tiled bf16 kernel runs for kvr 512 + dr 64, a bf16 cache and tf32 (bf16 models): q and P
// then rounded to bf16 like the model's own tensors (AFD_MLA_TILES=0 turns it off, to compare).
bool MlaTilesFit(int64_t kvr, int64_t dr, bool bf16_cache, bool tf32);
// Context splits per (token, head group) for the kernel that will run (`tiles`: MlaTilesFit);
// forced > 0: that many (at most one per tile or chunk, at most 64), to measure the choice
// against others (Backend::FormOverrides).
int64_t MlaSplits(int64_t n, int64_t nh, int64_t max_context, bool tiles, int sm_count,
                  int64_t forced = 0);
int64_t MlaPartialFloats(int64_t n, int64_t nh, int64_t splits, int64_t kvr);
// counters: MlaCounters(...) ints, zero before the first launch (the kernels leave them zero).
int64_t MlaCounters(int64_t n, int64_t nh);
// cache_rows: the layer cache's rows (slots). forced_bufs 1 or 2: the tiled kernel's tile
// buffers (Backend::FormOverrides); 0: chosen by the grid.
void LaunchMlaAttention(const float* q, int64_t n, int64_t heads, const float* q_lat, int64_t kvr,
                        int64_t dn, int64_t dr, const PagedArgs& t, const void* cache,
                        int64_t cache_rows, bool bf16_cache, int64_t h0, int64_t h1, float scale,
                        int64_t max_context, int64_t splits, bool tf32, float* partial,
                        int* counters, float* o_lat, int sm_count, int64_t forced_bufs,
                        cudaStream_t s);

// mla_prefill.cu: MLA for a step of mostly new tokens in the expanded form (k_nope, v
// decompressed once per context row and head; flash attention over 128 + 64 / 128 dims), for a
// bf16 model with a bf16 cache. MlaPrefillFits: the shapes (dn 128, dr 64, dv 128), at least
// kMlaPrefillMinTokens tokens and two a sequence, seqs x max_context context rows at most 4 per
// token and their decompressed form under 2 GiB; AFD_MLA_PREFILL=0 keeps the absorbed form.
inline constexpr int64_t kMlaPrefillMinTokens = 256;
bool MlaPrefillFits(int64_t n, int64_t seqs, int64_t max_context, int64_t dn, int64_t dr,
                    int64_t dv, int64_t kvr, int64_t nh);
// out: [seqs x max_context, width] bf16, row s·max_context + j = the cache row of position j of
// block-table row s (zeros where the table has no block, or one outside [0, num_blocks)).
void LaunchMlaGatherContext(const int32_t* block_tables, int64_t seqs, int64_t max_blocks,
                            int64_t block_size, int64_t num_blocks, int64_t max_context,
                            const void* cache, int64_t width, void* out, cudaStream_t s);
// out [n, nh·128] f32 of heads [h0, h0 + nh): q [n, heads, 192] f32 (rope applied), kv
// [rows, nh·256] bf16 (per head: k_nope 128 | v 128), ctx the gathered rows (k_pe at column
// kvr), both with row seq_index[t]·max_context + j for position j.
void LaunchMlaPrefill(const float* q, int64_t n, int64_t heads, int64_t h0, int64_t nh,
                      const int64_t* positions, const int32_t* seq_index, const void* kv,
                      const void* ctx, int64_t width, int64_t kvr, int64_t max_context, float scale,
                      float* out, cudaStream_t s);

}  // namespace afd::kernels::cuda
