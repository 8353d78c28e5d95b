// Launchers of the CUDA backend's kernels: raw device pointers and a stream in, nothing else
// (no Tensors, no CUDA types beyond cudaStream_t). Each .cu file implements one op family;
// shapes follow kernels/backend.h. A launcher checks its launch (cudaGetLastError) and throws
// afd::Error on failure.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace afd::kernels::cuda {

// afd.cu: the AFD exchange ops (kernels/backend.h). Per-rank pointers by value (at most
// Backend::kMaxAfdRanks = 64 ranks).
struct AfdRankPtrs {
  void* p[64];
};
struct AfdRankInts {
  int64_t v[64];
};
// bf16_mask bit f: rank f's rows are bf16 (else f32).
void LaunchAfdDispatch(const float* hidden, const int32_t* ids, const float* weights, int64_t n,
                       int64_t k, int64_t h, int64_t num_experts, int num_ranks,
                       const AfdRankPtrs& rows, uint64_t bf16_mask, const AfdRankPtrs& tables,
                       int32_t* send_row, bool shared, cudaStream_t s);
void LaunchAfdSumPartials(const AfdRankPtrs& partials, const int32_t* send_row, int64_t n,
                          int64_t h, int num_ranks, float* out, cudaStream_t s);
// shared_idx may be null.
void LaunchAfdPairIndex(const int32_t* ids, int64_t n, int64_t k, int64_t num_experts,
                        int num_ranks, const int32_t* send_row, const AfdRankPtrs& row_of_slot,
                        const AfdRankInts& base, const AfdRankInts& shared_base, int32_t* idx,
                        int32_t* shared_idx, cudaStream_t s);
void LaunchBf16ToF32(const uint16_t* x, int64_t n, float* out, cudaStream_t s);

// elementwise.cu
// Programmatic dependent launch (pdl.cuh): whether this thread's launches carry the attribute
// (the current device is sm_90+, AFD_PDL is not 0, and SetPdlForThread(true) was the last call
// on this thread; off until then).
bool PdlEnabled();
void SetPdlForThread(bool on);
// What the code the device runs was built for: __CUDA_ARCH__ (900 for sm_90 / sm_90a code, 800
// for compute_80 PTX whatever the device) and whether it has sm_90a's features (wgmma). A probe
// kernel launched and read back once, at the first call (CudaBackend's constructor makes it,
// outside any capture; the process's first device is the one probed).
struct RunningCode {
  int arch = 0;
  bool sm90a = false;
};
RunningCode ProbeRunningCode();
void LaunchFill(float* x, int64_t n, float value, cudaStream_t s);
void LaunchAdd(float* y, const float* x, int64_t n, cudaStream_t s);
void LaunchSiluMul(const float* gate_up, int64_t n, int64_t inter, float* out, cudaStream_t s);
void LaunchToBf16(const float* x, int64_t n, uint16_t* out, cudaStream_t s);
// table: [V, H] f32 (bf16 = false) or bf16 bits.
void LaunchEmbedding(const void* table, bool bf16, const int32_t* ids, int64_t n, int64_t h,
                     float* out, cudaStream_t s);
void LaunchGatherRows(const float* x, const int32_t* index, int64_t m, int64_t h, float* out,
                      cudaStream_t s);
void LaunchRmsNorm(const float* x, int64_t n, int64_t d, const float* w, float eps, float* out,
                   cudaStream_t s);
// y += x, then out = RmsNorm(y) in one pass over the rows (the same values as LaunchAdd then
// LaunchRmsNorm).
void LaunchAddRmsNorm(float* y, const float* x, int64_t n, int64_t d, const float* w, float eps,
                      float* out, cudaStream_t s);

// gemv.cu: y[n, N] = x[n, K] · wᵀ for n <= kMaxGemvRows rows (K % 8 == 0), x f32 (rounded to
// bf16 as it is read; 16-byte aligned), w bf16 [N, K], y f32.
inline constexpr int kMaxGemvRows = 8;
bool GemvFits(int64_t n, int64_t k);
void LaunchGemvBf16(const float* x, int64_t n, int64_t k, const void* w, int64_t m, float* y,
                    cudaStream_t s);
// fp32 Linear of many rows (512+) and few columns (<= 256: the router gate at prefill), 64 x 64
// tiles on the CUDA cores (fp32 exact, one summation order).
bool SkinnyF32Fits(int64_t n, int64_t k, int64_t m);
void LaunchSkinnyF32(const float* x, int64_t n, int64_t k, const float* w, int64_t m, float* y,
                     cudaStream_t s);
// The GEMV with fp32 x and w (K % 4 == 0; x and w 16-byte aligned): up to kMaxGemvRows rows, or
// up to kMaxGemvF32Rows (in chunks of kMaxGemvRows, one launch) of at most
// kMaxGemvF32ChunkedCols columns (the router gate at decode batch 9-16).
inline constexpr int64_t kMaxGemvF32Rows = 16, kMaxGemvF32ChunkedCols = 256;
bool GemvF32Fits(int64_t n, int64_t k, int64_t m);
void LaunchGemvF32(const float* x, int64_t n, int64_t k, const float* w, int64_t m, float* y,
                   cudaStream_t s);

// mla.cu
struct RopeArgs {
  const float* inv_freq;  // [dr/2]
  int64_t dim;            // dr
  float factor;
  bool interleave;
};
struct PagedArgs {
  const int64_t* positions;
  const int32_t* seq_index;
  const int64_t* slot_mapping;
  const int32_t* block_tables;
  int64_t max_blocks;
  int64_t block_size;
};
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
// A kernel choice turned off by the environment: NAME=0 (AFD_MLA_TILES, AFD_MOE_HALVES,
// AFD_SIDE_STREAM), to measure a form against the one it replaced in the same run.
bool ChoiceOff(const char* name);
// A form forced by the environment: NAME=c, a whole number from 1 to max (AFD_MLA_SPLITS,
// AFD_MLA_BUFS); 0 when NAME is unset or empty. Anything else is an error naming NAME.
int64_t ChoiceCount(const char* name, int64_t max);
// The tiled bf16 kernel runs for kvr 512 + dr 64, a bf16 cache and tf32 (bf16 models): q and P
// then rounded to bf16 like the model's own tensors (AFD_MLA_TILES=0 turns it off, to compare).
bool MlaTilesFit(int64_t kvr, int64_t dr, bool bf16_cache, bool tf32);
// Context splits per (token, head group) for the kernel that will run (`tiles`: MlaTilesFit).
int64_t MlaSplits(int64_t n, int64_t nh, int64_t max_context, bool tiles, int sm_count);
int64_t MlaPartialFloats(int64_t n, int64_t nh, int64_t splits, int64_t kvr);
// counters: MlaCounters(...) ints, zero before the first launch (the kernels leave them zero).
int64_t MlaCounters(int64_t n, int64_t nh);
// cache_rows: the layer cache's rows (slots).
void LaunchMlaAttention(const float* q, int64_t n, int64_t heads, const float* q_lat, int64_t kvr,
                        int64_t dn, int64_t dr, const PagedArgs& t, const void* cache,
                        int64_t cache_rows, bool bf16_cache, int64_t h0, int64_t h1, float scale,
                        int64_t max_context, int64_t splits, bool tf32, float* partial,
                        int* counters, float* o_lat, int sm_count, cudaStream_t s);

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

// gqa.cu: GQA over the paged key/value cache (kernels/backend.h GqaCacheWrite, GqaAttention);
// head_dim <= kGqaMaxHeadDim.
inline constexpr int64_t kGqaMaxHeadDim = 256;
void LaunchGqaCacheWrite(const float* qkv, int64_t n, int64_t heads, int64_t kvh, int64_t d,
                         const float* q_norm, const float* k_norm, float eps, const PagedArgs& t,
                         const RopeArgs& rope, float* q, void* cache, bool bf16_cache,
                         cudaStream_t s);
// Which kernel runs. tensor_cores: the bf16 tensor-core form (q and P rounded to bf16, as a
// bf16 model's tensors; fp32 accumulation), for a bf16 model (tf32: Backend::AllowTf32) with a
// bf16 cache and head_dim 64, 128 or 256; otherwise the fp32 CUDA-core kernels (exact up to
// summation order). pairs: with tensor cores, two consecutive tokens of one sequence share a
// block's tile (and the sequence's k / v rows): chosen for steps of >= 2 tokens a sequence
// (prefill; seqs: the block tables' rows), head_dim <= 128.
struct GqaForm {
  bool tensor_cores = false;
  bool pairs = false;
};
GqaForm GqaChooseForm(int64_t d, bool bf16_cache, bool tf32, int64_t n, int64_t seqs);
// Context splits for n tokens over heads [h0, h1) of a max_context-long context (fixed in a
// captured graph; each token's own length is split the same way on the device).
int64_t GqaSplits(int64_t n, int64_t heads, int64_t kvh, int64_t h0, int64_t h1,
                  int64_t max_context, const GqaForm& form, int sm_count);
int64_t GqaPartialFloats(int64_t n, int64_t nh, int64_t splits, int64_t d);
// partial: GqaPartialFloats(...) floats of device scratch (unused for one split).
void LaunchGqaAttention(const float* q, int64_t n, int64_t heads, int64_t kvh, int64_t d,
                        const PagedArgs& t, const void* cache, bool bf16_cache, int64_t h0,
                        int64_t h1, float scale, int64_t splits, const GqaForm& form,
                        float* partial, float* out, cudaStream_t s);

// router.cu: one warp per token; num_experts <= kMaxRouterExperts.
inline constexpr int kMaxRouterExperts = 512;
struct RouterArgs {
  bool sigmoid;
  bool group_limited;
  int64_t top_k, n_group, topk_group;
  bool norm_topk_prob;
  float norm_eps;
  float scaling;
};
void LaunchRouterTopk(const float* logits, int64_t n, int64_t num_experts, const float* bias,
                      const RouterArgs& args, int32_t* ids, float* weights, cudaStream_t s);
// The router gate (fp32 GEMV, LaunchGemvF32's arithmetic) and the top-k in one launch, for up
// to 8 tokens: logits [n, num_experts] written on the way; counter: one zeroed unsigned int the
// kernel leaves zeroed. permute.offsets non-null (RouterPermuteFits): the routed slots are also
// grouped over local experts [begin, begin + local) exactly as LaunchMoePermute groups them.
struct PermuteArgs {
  int64_t begin = 0;
  int local = 0;
  int32_t* offsets = nullptr;      // [local + 1]
  int32_t* src_row = nullptr;      // [n·k]
  int32_t* row_of_slot = nullptr;  // [n, k]
};
bool RouterGateTopkFits(int64_t n, int64_t k, int64_t num_experts, const RouterArgs& args);
// The router gate and the top-k in one launch for kMinRouterRowsTokens .. kMaxRouterRowsTokens
// tokens (decode batch 65+, prefill chunks under 512): blocks of 8 tokens x 8 experts, every
// logit summed in one fixed order whatever the batch (not GemvF32's nor cuBLAS's: a token's
// logits may differ in the last bits between batches on either side of a bound). counters:
// RouterRowsCounters(n) zeroed unsigned ints the kernel leaves zeroed. Not below 65 tokens: at
// decode batch 16-64 the step measured as fast or faster without it (batch 64: 12.26 vs 10.14
// ms: the MoE block's router and grouping took 21 us instead of 42, but the routed experts'
// kernels then ran ~35% slower, presumably beside the shared experts' GEMMs still on the side
// stream; kernel trace, twentieth session); at 128 it saves 0.2 ms.
inline constexpr int64_t kMinRouterRowsTokens = 65, kMaxRouterRowsTokens = 511;
bool RouterRowsFits(int64_t n, int64_t k, int64_t num_experts, const RouterArgs& args);
int64_t RouterRowsCounters(int64_t n);
void LaunchRouterRows(const float* x, int64_t n, int64_t k, const float* w, int64_t num_experts,
                      float* logits, const float* bias, const RouterArgs& args, int32_t* ids,
                      float* weights, unsigned int* counters, cudaStream_t s);
bool RouterPermuteFits(int64_t n, const RouterArgs& args, int64_t num_local);
void LaunchRouterGateTopk(const float* x, int64_t n, int64_t k, const float* w, int64_t num_experts,
                          float* logits, const float* bias, const RouterArgs& args, int32_t* ids,
                          float* weights, const PermuteArgs& permute, unsigned int* counter,
                          cudaStream_t s);

// moe.cu
// MoePermute's scratch (ints) for n x k slots: 0 when one block groups them (decode sizes), else
// per-block counts (AFD_PERMUTE_BLOCKS=0: one block always). scratch: at least that many ints.
int64_t MoePermuteScratchInts(int64_t n, int64_t k, int64_t num_local);
void LaunchMoePermute(const int32_t* ids, int64_t n, int64_t k, int64_t begin, int64_t num_local,
                      int32_t* offsets, int32_t* src_row, int32_t* row_of_slot, int32_t* scratch,
                      cudaStream_t s);
// Both projections of a bf16 expert MLP on tensor cores (mma.sync: GroupedMma up to
// kMmaMaxAvgRows rows per expert on average, GroupedTiled above), when both shapes fit (else
// false, nothing launched): x rounded to bf16 once into x_bf16 [m, h], the SwiGLU product
// written as bf16 into act_bf16 [m, inter] by the first GEMM (rounded as the separate
// conversion would: the same bits), then out [m, h] = act · W_down^T. No fp32 intermediate.
// src_row: null, or row r of the rows is x[src_row[r]] (gathered while rounded).
bool LaunchGroupedMlpMma(const float* x, const int32_t* src_row, int64_t m, int64_t h,
                         int64_t inter, const void* const* gate_up, const void* const* down,
                         const int32_t* offsets, int64_t num_local, uint16_t* x_bf16,
                         uint16_t* act_bf16, float* out, cudaStream_t s);
// Dense y[n, m] = x · w^T on the tiled bf16 kernel (GroupedTiled with one weight matrix): x_bf16
// [n, k] (x already rounded), w bf16 [m, k], y fp32. For prefill-sized n, where cuBLAS's choice
// for N off its 128 grid runs at a few % of the tensor cores (kv_a's N = 576).
bool TiledLinearFits(int64_t n, int64_t k, int64_t m);
void LaunchTiledLinear(const uint16_t* x_bf16, int64_t n, int64_t k, const void* w, int64_t m,
                       float* y, cudaStream_t s);
// Grouped y[r] = x[r] · W_e^T for the rows of each expert; weights by pointer table
// (w_ptrs[e], bf16 or f32 [N, K]). swiglu: W is [2N', K] gate|up and y[r, c] =
// silu(gate_c) · up_c for c < N' = n_out. x_bf16: device scratch of m·k bf16 (or null): with
// bf16 weights and decode-sized groups, x is rounded to bf16 there first (as the tensor-core
// path does).
void LaunchGroupedLinear(const float* x, int64_t m, int64_t k, const void* const* w_ptrs, bool bf16,
                         const int32_t* offsets, int64_t num_local, int64_t n_out, bool swiglu,
                         float* y, uint16_t* x_bf16, cudaStream_t s);
// addend: null, or [n, h] added to each output row after its weighted sum.
void LaunchMoeCombine(const float* y, int64_t h, const int32_t* row_of_slot, const float* weights,
                      int64_t n, int64_t k, bool accumulate, const float* addend, float* out,
                      cudaStream_t s);

// sample.cu
// LogSoftmaxAt and ArgMax reduce each row in chunks, then merge the chunks: scratch holds
// SampleReduceBytes(n, v) of device memory for the chunks' partial results.
size_t SampleReduceBytes(int64_t n, int64_t v);
void LaunchLogSoftmaxAt(const float* logits, int64_t n, int64_t v, const int32_t* ids, float* out,
                        void* scratch, cudaStream_t s);
void LaunchArgMax(const float* logits, int64_t n, int64_t v, int32_t* ids, void* scratch,
                  cudaStream_t s);
// ids[t] = from[source[t]] where source[t] >= 0 (Backend::TakeIds).
void LaunchTakeIds(const int32_t* from, const int32_t* source, int64_t n, int32_t* ids,
                   cudaStream_t s);
// Rows with temperature > 0: sorted (keys descending, NaN as -inf) candidates per row, then the
// CPU backend's top-k / top-p / inverse-CDF rule with the row's u. params: [n, 4] f32
// (temperature, top_k, top_p, u as float) ... u kept in double: u: [n] f64.
struct SampleParamsDev {
  const float* temperature;  // [n]
  const int64_t* top_k;      // [n]
  const float* top_p;        // [n]
  const double* u;           // [n]
};
// sorted_logits / sorted_ids: [n, v] each row sorted descending (stable: ties by ascending id).
void LaunchSampleSorted(const float* sorted_logits, const int32_t* sorted_ids, int64_t n, int64_t v,
                        const SampleParamsDev& p, int32_t* ids, cudaStream_t s);
// keys[r, i] = logits[r, i] with NaN -> -inf; vals[r, i] = i; offsets[r] = r·v (n + 1 entries).
void LaunchPrepareSort(const float* logits, int64_t n, int64_t v, float* keys, int32_t* vals,
                       int32_t* offsets, cudaStream_t s);
// Bytes of temporary storage the segmented sort needs, and the sort itself.
size_t SegmentedSortTempBytes(int64_t n, int64_t v);
void SegmentedSortDescending(void* temp, size_t temp_bytes, const float* keys_in, float* keys_out,
                             const int32_t* vals_in, int32_t* vals_out, int64_t n, int64_t v,
                             const int32_t* offsets, cudaStream_t s);

// Throws afd::Error naming `what` when the last launch failed.
void CheckLaunch(const char* what);

}  // namespace afd::kernels::cuda
