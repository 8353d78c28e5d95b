// The argument checks every backend runs before an op (kernels/backend.h states the shapes):
// each tensor on the backend's device and contiguous, dtypes and shapes as the op's contract
// says. Each check throws afd::Error naming the op and the tensor, and returns the sizes the op
// needs. Checks that read tensor contents (ids in range, slots inside the cache) are the CPU
// backend's own: a GPU backend cannot read device memory without waiting for it.
#pragma once

#include <cstdint>
#include <vector>

#include "afd/kernels/backend.h"

namespace afd::kernels {

// `t` (unless empty) lives on `device` and is contiguous.
void CheckOnDevice(const char* op, const Tensor& t, Device device);

struct RowsShape {
  int64_t n = 0;  // rows
  int64_t d = 0;  // row width
};

RowsShape CheckEmbedding(Device dev, const Tensor& table, const Tensor& ids, const Tensor& out);
struct LinearShape {
  int64_t n = 0, k = 0, m = 0;  // x: [n, k], w: [m, k], y: [n, m]
};
LinearShape CheckLinear(Device dev, const Tensor& x, const Tensor& w, const Tensor& y);
RowsShape CheckRmsNorm(Device dev, const Tensor& x, const Tensor& w, const Tensor& out);
void CheckAdd(Device dev, const Tensor& y, const Tensor& x);
RowsShape CheckSiluMul(Device dev, const Tensor& gate_up, const Tensor& out);  // d: I
struct RopeShape {
  int64_t n = 0, heads = 0, width = 0;
};
RopeShape CheckRope(Device dev, const Tensor& x, int64_t offset, const Tensor& positions,
                    const RopeSpec& rope);
RowsShape CheckGatherRows(Device dev, const Tensor& x, const Tensor& index,
                          const Tensor& out);  // n: gathered rows
struct CacheWriteShape {
  int64_t n = 0, kvr = 0, width = 0;
};
CacheWriteShape CheckMlaCacheWrite(Device dev, const Tensor& ckv, const Tensor& norm_w,
                                   const AttentionTokens& tokens, const RopeSpec& rope,
                                   const Tensor& cache);
struct AttentionShape {
  int64_t n = 0, heads = 0, kvr = 0, dr = 0;
};
AttentionShape CheckMlaAttention(Device dev, const Tensor& q, const Tensor& kv_b,
                                 const AttentionTokens& tokens, const Tensor& cache,
                                 int64_t head_begin, int64_t head_end, int64_t dn, int64_t dv,
                                 const Tensor& out);
struct GqaShape {
  int64_t n = 0, heads = 0, kv_heads = 0, d = 0;
};
GqaShape CheckGqaCacheWrite(Device dev, const Tensor& qkv, const Tensor& q_norm,
                            const Tensor& k_norm, const AttentionTokens& tokens,
                            const RopeSpec& rope, const Tensor& q, const Tensor& cache);
GqaShape CheckGqaAttention(Device dev, const Tensor& q, const AttentionTokens& tokens,
                           const Tensor& cache, int64_t num_kv_heads, int64_t head_begin,
                           int64_t head_end, const Tensor& out);
RowsShape CheckRouterTopk(Device dev, const Tensor& logits, const Tensor& bias,
                          const RouterSpec& spec, const Tensor& ids,
                          const Tensor& weights);  // d: experts
RowsShape CheckMoePermute(Device dev, const Tensor& ids, int64_t num_local, const Tensor& offsets,
                          const Tensor& src_row, const Tensor& row_of_slot);  // d: k
RowsShape CheckGroupedExpertMlp(Device dev, const Tensor& x, const Tensor& offsets,
                                const ExpertWeights& experts, const Tensor& out);  // x: [n, d]
struct CombineShape {
  int64_t n = 0, k = 0, h = 0;
};
CombineShape CheckMoeCombine(Device dev, const Tensor& y, const Tensor& row_of_slot,
                             const Tensor& weights, const Tensor& out);
RowsShape CheckLogSoftmaxAt(Device dev, const Tensor& logits, const Tensor& ids,
                            const Tensor& out);  // d: vocab
RowsShape CheckSample(Device dev, const Tensor& logits, const std::vector<SampleRow>& rows,
                      const Tensor& ids);  // d: vocab
// Returns n (the ids taken), after checking from: [k] i32, source and ids: [n] i32.
int64_t CheckTakeIds(Device dev, const Tensor& from, const Tensor& source, const Tensor& ids);
struct AfdShape {
  int64_t n = 0, k = 0, h = 0;
  int ranks = 0;
};
AfdShape CheckAfdDispatch(Device dev, const Tensor& hidden, const Tensor& ids,
                          const Tensor& weights, int64_t num_experts,
                          const std::vector<Tensor>& rows, const std::vector<Tensor>& scales,
                          const std::vector<Tensor>& tables, const Tensor& send_row);
// Returns {m, H} after checking q: [m, H] f8e4m3, scales: [m, AfdFp8Groups(H)] f32, out: [m, H]
// f32.
RowsShape CheckDequantFp8Rows(Device dev, const Tensor& q, const Tensor& scales, const Tensor& out);
AfdShape CheckAfdSumPartials(Device dev, const std::vector<Tensor>& partials,
                             const Tensor& send_row, const Tensor& out);
AfdShape CheckAfdPairIndex(Device dev, const Tensor& ids, int64_t num_experts,
                           const Tensor& send_row, const std::vector<Tensor>& row_of_slot,
                           const std::vector<int64_t>& base,
                           const std::vector<int64_t>& shared_base, const Tensor& idx,
                           const Tensor& shared_idx);
int64_t CheckConvert(Device dev, const Tensor& dst, const Tensor& src);  // returns numel

}  // namespace afd::kernels
