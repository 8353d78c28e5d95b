// The CUDA backend's ops: each one's checks (shapes, dtypes, devices) and its kernel or cuBLAS
// call on the backend's stream (the kernels' launchers: the family headers *.cuh). The state they
// run on: cuda_backend.cpp.
#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "afd/common/cuda_check.h"
#include "afd/common/env_switches.h"
#include "afd/common/error.h"
#include "afd/kernels/cuda/afd.cuh"
#include "afd/kernels/cuda/cuda_backend.h"
#include "afd/kernels/cuda/cuda_backend_state.h"
#include "afd/kernels/cuda/elementwise.cuh"
#include "afd/kernels/cuda/gemv.cuh"
#include "afd/kernels/cuda/gqa.cuh"
#include "afd/kernels/cuda/kernel_trace.h"
#include "afd/kernels/cuda/launch.cuh"
#include "afd/kernels/cuda/mla.cuh"
#include "afd/kernels/cuda/moe.cuh"
#include "afd/kernels/cuda/router.cuh"
#include "afd/kernels/cuda/sample.cuh"
#include "afd/kernels/op_checks.h"

namespace afd::kernels::cuda {

namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

PagedArgs Paged(const AttentionTokens& t) {
  return {t.positions.data_as<const int64_t>(),
          t.seq_index.data_as<const int32_t>(),
          t.slot_mapping.data_as<const int64_t>(),
          t.block_tables.data_as<const int32_t>(),
          t.block_tables.dim(1),
          t.block_size};
}

RopeArgs Rope(const RopeSpec& r) {
  return {r.inv_freq.data_as<const float>(), 2 * r.inv_freq.numel(), r.attention_factor,
          r.interleave};
}

}  // namespace

void CudaBackend::Embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const auto [n, h] = CheckEmbedding(device(), table, ids, out);
  const OpScope scope(*this, "Embedding");
  LaunchEmbedding(table.data(), table.dtype() == DType::kBF16, ids.data_as<const int32_t>(), n, h,
                  out.data_as<float>(), state_->stream);
}

void CudaBackend::Linear(const Tensor& x, const Tensor& w, const Tensor& y) {
  const auto [n, k, m] = CheckLinear(device(), x, w, y);
  if (n == 0) return;
  const OpScope scope(*this, "Linear", {n, k, m});
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major y[n, m] = x[n, k] · w[m, k]ᵀ is column-major yᵀ[m, n] = w · xᵀ.
  if (w.dtype() == DType::kF32) {
    // A few rows (decode; the router gate in every model): cuBLAS picks kernels that take ~50 us
    // for a 1x2048x64 product (~20 us at 16 x 2048 x 64); one warp per output column streams the
    // weights instead (9-16 rows of <= 256 columns: one launch, a block per 8 rows; at 17-64
    // rows cuBLAS was faster in the decode graph, at 9-16 slower).
    if (GemvF32Fits(n, k, m) && Aligned16(x.data()) && Aligned16(w.data())) {
      LaunchGemvF32(x.data_as<const float>(), n, k, w.data_as<const float>(), m, y.data_as<float>(),
                    state_->stream);
      return;
    }
    if (SkinnyF32Fits(n, k, m) && Aligned16(x.data()) && Aligned16(w.data())) {
      LaunchSkinnyF32(x.data_as<const float>(), n, k, w.data_as<const float>(), m,
                      y.data_as<float>(), state_->stream);
      return;
    }
    AFD_CUBLAS_CHECK(cublasSgemm(state_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha,
                                 w.data_as<const float>(), k, x.data_as<const float>(), k, &beta,
                                 y.data_as<float>(), m));
    return;
  }
  if (GemvFits(n, k) && Aligned16(x.data()) && Aligned16(w.data())) {
    // A few rows: stream the weights once, near the copy rate, x rounded to bf16 as it is read.
    LaunchGemvBf16(x.data_as<const float>(), n, k, w.data(), m, y.data_as<float>(), state_->stream);
    return;
  }
  auto* xb = static_cast<uint16_t*>(Scratch(kBf16Input, n * k * 2));
  LaunchToBf16(x.data_as<const float>(), n * k, xb, state_->stream);
  if (TiledLinearFits(n, k, m) && Aligned16(w.data())) {
    LaunchTiledLinear(xb, n, k, w.data(), m, y.data_as<float>(), state_->stream);
    return;
  }
  AFD_CUBLAS_CHECK(cublasGemmEx(state_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w.data(),
                                CUDA_R_16BF, k, xb, CUDA_R_16BF, k, &beta, y.data(), CUDA_R_32F, m,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::RmsNorm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  const auto [n, d] = CheckRmsNorm(device(), x, w, out);
  const OpScope scope(*this, "RmsNorm", {n, d});
  LaunchRmsNorm(x.data_as<const float>(), n, d, w.data_as<const float>(), eps, out.data_as<float>(),
                state_->stream);
}

void CudaBackend::Add(const Tensor& y, const Tensor& x) {
  CheckAdd(device(), y, x);
  const OpScope scope(*this, "Add");
  LaunchAdd(y.data_as<float>(), x.data_as<const float>(), y.numel(), state_->stream);
}

void CudaBackend::AddRmsNorm(const Tensor& y, const Tensor& x, const Tensor& w, float eps,
                             const Tensor& out) {
  CheckAdd(device(), y, x);
  const auto [n, d] = CheckRmsNorm(device(), y, w, out);
  AFD_CHECK(out.data() != y.data() && out.data() != x.data(),
            "AddRmsNorm: out must not alias y or x");
  const OpScope scope(*this, "AddRmsNorm", {n, d});
  LaunchAddRmsNorm(y.data_as<float>(), x.data_as<const float>(), n, d, w.data_as<const float>(),
                   eps, out.data_as<float>(), state_->stream);
}

void CudaBackend::SiluMul(const Tensor& gate_up, const Tensor& out) {
  const auto [n, inter] = CheckSiluMul(device(), gate_up, out);
  const OpScope scope(*this, "SiluMul", {n, inter});
  LaunchSiluMul(gate_up.data_as<const float>(), n, inter, out.data_as<float>(), state_->stream);
}

void CudaBackend::Rope(const Tensor& x, int64_t offset, const Tensor& positions,
                       const RopeSpec& rope) {
  const auto [n, heads, width] = CheckRope(device(), x, offset, positions, rope);
  const OpScope scope(*this, "Rope");
  LaunchRope(x.data_as<float>(), n, heads, width, offset, positions.data_as<const int64_t>(),
             cuda::Rope(rope), state_->stream);
}

void CudaBackend::GatherRows(const Tensor& x, const Tensor& index, const Tensor& out) {
  const auto [m, h] = CheckGatherRows(device(), x, index, out);
  const OpScope scope(*this, "GatherRows", {m, h});
  LaunchGatherRows(x.data_as<const float>(), index.data_as<const int32_t>(), m, h,
                   out.data_as<float>(), state_->stream);
}

void CudaBackend::MlaCacheWrite(const Tensor& ckv, const Tensor& norm_w, float eps,
                                const AttentionTokens& tokens, const RopeSpec& rope,
                                const Tensor& cache) {
  const auto [n, kvr, width] = CheckMlaCacheWrite(device(), ckv, norm_w, tokens, rope, cache);
  const OpScope scope(*this, "MlaCacheWrite");
  LaunchMlaCacheWrite(ckv.data_as<const float>(), n, kvr, norm_w.data_as<const float>(), eps,
                      Paged(tokens), cuda::Rope(rope), cache.data(), cache.dtype() == DType::kBF16,
                      state_->stream);
}

void CudaBackend::MlaAttention(const Tensor& q, const Tensor& kv_b, const AttentionTokens& tokens,
                               const Tensor& cache, int64_t head_begin, int64_t head_end,
                               int64_t dn, int64_t dv, float scale, const Tensor& out) {
  const auto [n, heads, kvr, dr] =
      CheckMlaAttention(device(), q, kv_b, tokens, cache, head_begin, head_end, dn, dv, out);
  const OpScope scope(*this, "MlaAttention", {n, head_end - head_begin});
  // The context bound: the host's hint, else the block tables' width.
  const int64_t max_context =
      tokens.max_context > 0 ? tokens.max_context : tokens.block_tables.dim(1) * tokens.block_size;
  const int64_t nh = head_end - head_begin;
  const bool tiles = MlaTilesFit(kvr, dr, cache.dtype() == DType::kBF16, tf32_);
  const int64_t seqs = tokens.block_tables.dim(0);
  if (tiles && !state_->capturing && MlaPrefillFits(n, seqs, max_context, dn, dr, dv, kvr, nh) &&
      Aligned16(cache.data())) {
    // Mostly new tokens: the expanded form (mla_prefill.cu), 3.4x fewer FLOPs than the absorbed.
    const int64_t width = kvr + dr, rows = seqs * max_context, ldkv = nh * (dn + dv);
    void* ctx = Scratch(kMlaPrefillCtx, rows * width * 2);
    auto* kvb = static_cast<uint16_t*>(Scratch(kMlaPrefillKvb, ldkv * kvr * 2));
    void* kv = Scratch(kMlaPrefillKv, rows * ldkv * 2);
    LaunchMlaGatherContext(tokens.block_tables.data_as<const int32_t>(), seqs,
                           tokens.block_tables.dim(1), tokens.block_size,
                           cache.dim(0) / tokens.block_size, max_context, cache.data(), width, ctx,
                           state_->stream);
    LaunchToBf16(kv_b.data_as<const float>() + head_begin * (dn + dv) * kvr, ldkv * kvr, kvb,
                 state_->stream);
    // kv [rows, ldkv] = ctx[:, :kvr] · kv_bᵀ (column-major: kvᵀ = kv_b_colᵀ · ctx_col).
    const float one = 1.0f, zero = 0.0f;
    AFD_CUBLAS_CHECK(cublasGemmEx(state_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, ldkv, rows, kvr, &one,
                                  kvb, CUDA_R_16BF, kvr, ctx, CUDA_R_16BF, width, &zero, kv,
                                  CUDA_R_16BF, ldkv, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    LaunchMlaPrefill(q.data_as<const float>(), n, heads, head_begin, nh,
                     tokens.positions.data_as<const int64_t>(),
                     tokens.seq_index.data_as<const int32_t>(), kv, ctx, width, kvr, max_context,
                     scale, out.data_as<float>(), state_->stream);
    return;
  }
  const int64_t splits = MlaSplits(n, nh, max_context, tiles, state_->sm_count, forms_.mla_splits);
  // The tiled kernel with one split writes o_lat directly: no partials (at prefill they would
  // take n x heads x (kvr + 2) floats).
  auto* partial = tiles && splits == 1
                      ? nullptr
                      : static_cast<float*>(Scratch(
                            kMlaPartial, MlaPartialFloats(n, nh, splits, kvr) * sizeof(float)));
  auto* counters = static_cast<int*>(ZeroedScratch(kMlaCounters, MlaCounters(n, nh) * sizeof(int)));
  // q_lat, o_lat: [n, nh, kvr] each.
  auto* q_lat = static_cast<float*>(Scratch(kMlaLatent, 2 * n * nh * kvr * sizeof(float)));
  float* o_lat = q_lat + n * nh * kvr;
  // Per head h (batched, fp32): q_lat_h [n, kvr] = q_nope_h [n, dn] · W_k[h] [dn, kvr]; in
  // column-major terms q_lat_hᵀ = W_k[h]ᵀ · q_nope_hᵀ (W_k rows are kvr wide, so no transpose).
  const float one = 1.0f, zero = 0.0f;
  const float* w_k = kv_b.data_as<const float>() + head_begin * (dn + dv) * kvr;
  const float* w_v = w_k + dn * kvr;
  if (MlaProjectionsFit(n, dn, kvr) && Aligned16(kv_b.data())) {
    // A few tokens: the projections as streaming kernels (cuBLAS is latency-bound here).
    LaunchMlaQLat(q.data_as<const float>(), n, heads, dn, dr, dv, kv_b.data_as<const float>(),
                  head_begin, head_end, kvr, q_lat, state_->stream);
    LaunchMlaAttention(q.data_as<const float>(), n, heads, q_lat, kvr, dn, dr, Paged(tokens),
                       cache.data(), cache.dim(0), cache.dtype() == DType::kBF16, head_begin,
                       head_end, scale, max_context, splits, tf32_, partial, counters, o_lat,
                       state_->sm_count, forms_.mla_bufs, state_->stream);
    LaunchMlaOut(o_lat, n, dn, dv, kv_b.data_as<const float>(), head_begin, head_end, kvr,
                 out.data_as<float>(), state_->stream);
    return;
  }
  // fp32 batched GEMMs; TF32 tensor cores when allowed (AllowTf32: bf16 models).
  const cublasComputeType_t compute = tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  AFD_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      state_->cublas, CUBLAS_OP_N, CUBLAS_OP_N, kvr, n, dn, &one, w_k, CUDA_R_32F, kvr,
      (dn + dv) * kvr, q.data_as<const float>() + head_begin * (dn + dr), CUDA_R_32F,
      heads * (dn + dr), dn + dr, &zero, q_lat, CUDA_R_32F, nh * kvr, kvr, nh, compute,
      CUBLAS_GEMM_DEFAULT));
  LaunchMlaAttention(q.data_as<const float>(), n, heads, q_lat, kvr, dn, dr, Paged(tokens),
                     cache.data(), cache.dim(0), cache.dtype() == DType::kBF16, head_begin,
                     head_end, scale, max_context, splits, tf32_, partial, counters, o_lat,
                     state_->sm_count, forms_.mla_bufs, state_->stream);
  // out_h [n, dv] = o_lat_h [n, kvr] · W_v[h]ᵀ (W_v[h]: [dv, kvr]).
  AFD_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      state_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, dv, n, kvr, &one, w_v, CUDA_R_32F, kvr,
      (dn + dv) * kvr, o_lat, CUDA_R_32F, nh * kvr, kvr, &zero, out.data_as<float>(), CUDA_R_32F,
      nh * dv, dv, nh, compute, CUBLAS_GEMM_DEFAULT));
}

namespace {

RouterArgs ToRouterArgs(const RouterSpec& spec) {
  return {spec.scoring == RouterScoring::kSigmoid,
          spec.group_limited,
          spec.top_k,
          spec.n_group,
          spec.topk_group,
          spec.norm_topk_prob,
          spec.norm_eps,
          spec.routed_scaling_factor};
}

}  // namespace

void CudaBackend::GqaCacheWrite(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                                float eps, const AttentionTokens& tokens, const RopeSpec& rope,
                                const Tensor& q, const Tensor& cache) {
  const auto [n, heads, kvh, d] =
      CheckGqaCacheWrite(device(), qkv, q_norm, k_norm, tokens, rope, q, cache);
  const OpScope scope(*this, "GqaCacheWrite", {n, heads + kvh});
  LaunchGqaCacheWrite(qkv.data_as<const float>(), n, heads, kvh, d, q_norm.data_as<const float>(),
                      k_norm.data_as<const float>(), eps, Paged(tokens), cuda::Rope(rope),
                      q.data_as<float>(), cache.data(), cache.dtype() == DType::kBF16,
                      state_->stream);
}

void CudaBackend::GqaAttention(const Tensor& q, const AttentionTokens& tokens, const Tensor& cache,
                               int64_t num_kv_heads, int64_t head_begin, int64_t head_end,
                               float scale, const Tensor& out) {
  const auto [n, heads, kvh, d] =
      CheckGqaAttention(device(), q, tokens, cache, num_kv_heads, head_begin, head_end, out);
  const OpScope scope(*this, "GqaAttention", {n, head_end - head_begin});
  const int64_t max_context =
      tokens.max_context > 0 ? tokens.max_context : tokens.block_tables.dim(1) * tokens.block_size;
  const bool bf16_cache = cache.dtype() == DType::kBF16;
  const GqaForm form = GqaChooseForm(d, bf16_cache, tf32_, n, tokens.block_tables.dim(0));
  const int64_t splits =
      GqaSplits(n, heads, kvh, head_begin, head_end, max_context, form, state_->sm_count);
  const int64_t floats = GqaPartialFloats(n, head_end - head_begin, splits, d);
  float* partial =
      floats > 0 ? static_cast<float*>(Scratch(kGqaPartial, floats * sizeof(float))) : nullptr;
  LaunchGqaAttention(q.data_as<const float>(), n, heads, kvh, d, Paged(tokens), cache.data(),
                     bf16_cache, head_begin, head_end, scale, splits, form, partial,
                     out.data_as<float>(), state_->stream);
}

void CudaBackend::RouterTopk(const Tensor& logits, const Tensor& bias, const RouterSpec& spec,
                             const Tensor& ids, const Tensor& weights) {
  const auto [n, e] = CheckRouterTopk(device(), logits, bias, spec, ids, weights);
  const OpScope scope(*this, "RouterTopk", {n, e});
  const RouterArgs a = ToRouterArgs(spec);
  LaunchRouterTopk(logits.data_as<const float>(), n, e,
                   bias.empty() ? nullptr : bias.data_as<const float>(), a, ids.data_as<int32_t>(),
                   weights.data_as<float>(), state_->stream);
}

void CudaBackend::RouterGateTopk(const Tensor& hidden, const Tensor& gate, const Tensor& bias,
                                 const RouterSpec& spec, const Tensor& logits, const Tensor& ids,
                                 const Tensor& weights) {
  const auto [n, k, e] = CheckLinear(device(), hidden, gate, logits);
  CheckRouterTopk(device(), logits, bias, spec, ids, weights);
  const RouterArgs a = ToRouterArgs(spec);
  static const bool fused_off = ChoiceOff("AFD_ROUTER_FUSED");  // Linear, then RouterTopk
  static const bool rows_off = ChoiceOff("AFD_ROUTER_ROWS");    // so from 65 tokens on
  const bool one_gemv = RouterGateTopkFits(n, k, e, a);
  if (fused_off || gate.dtype() != DType::kF32 || !Aligned16(hidden.data()) ||
      !Aligned16(gate.data()) || !(one_gemv || (!rows_off && RouterRowsFits(n, k, e, a)))) {
    Backend::RouterGateTopk(hidden, gate, bias, spec, logits, ids, weights);
    return;
  }
  const OpScope scope(*this, "RouterGateTopk", {n, e});
  if (!one_gemv) {  // 65-511 tokens
    auto* counters = static_cast<unsigned int*>(
        ZeroedScratch(kRouterRowsCounters, RouterRowsCounters(n) * sizeof(unsigned int)));
    LaunchRouterRows(hidden.data_as<const float>(), n, k, gate.data_as<const float>(), e,
                     logits.data_as<float>(), bias.empty() ? nullptr : bias.data_as<const float>(),
                     a, ids.data_as<int32_t>(), weights.data_as<float>(), counters, state_->stream);
    return;
  }
  auto* counter = static_cast<unsigned int*>(ZeroedScratch(kRouterCounter, sizeof(unsigned int)));
  LaunchRouterGateTopk(
      hidden.data_as<const float>(), n, k, gate.data_as<const float>(), e, logits.data_as<float>(),
      bias.empty() ? nullptr : bias.data_as<const float>(), a, ids.data_as<int32_t>(),
      weights.data_as<float>(), PermuteArgs{}, counter, state_->stream);
}

void CudaBackend::RouteAndPermute(const Tensor& hidden, const Tensor& gate, const Tensor& bias,
                                  const RouterSpec& spec, const Tensor& logits, const Tensor& ids,
                                  const Tensor& weights, int64_t begin, int64_t num_local,
                                  const Tensor& offsets, const Tensor& src_row,
                                  const Tensor& row_of_slot) {
  const auto [n, k, e] = CheckLinear(device(), hidden, gate, logits);
  CheckRouterTopk(device(), logits, bias, spec, ids, weights);
  CheckMoePermute(device(), ids, num_local, offsets, src_row, row_of_slot);
  const RouterArgs a = ToRouterArgs(spec);
  static const bool off = ChoiceOff("AFD_ROUTER_PERMUTE");  // RouterGateTopk, then MoePermute
  static const bool fused_off = ChoiceOff("AFD_ROUTER_FUSED");
  if (off || fused_off || gate.dtype() != DType::kF32 || !RouterGateTopkFits(n, k, e, a) ||
      !RouterPermuteFits(n, a, num_local) || !Aligned16(hidden.data()) || !Aligned16(gate.data())) {
    Backend::RouteAndPermute(hidden, gate, bias, spec, logits, ids, weights, begin, num_local,
                             offsets, src_row, row_of_slot);
    return;
  }
  const OpScope scope(*this, "RouteAndPermute", {n, e});
  auto* counter = static_cast<unsigned int*>(ZeroedScratch(kRouterCounter, sizeof(unsigned int)));
  const PermuteArgs p{begin, static_cast<int>(num_local), offsets.data_as<int32_t>(),
                      src_row.data_as<int32_t>(), row_of_slot.data_as<int32_t>()};
  LaunchRouterGateTopk(
      hidden.data_as<const float>(), n, k, gate.data_as<const float>(), e, logits.data_as<float>(),
      bias.empty() ? nullptr : bias.data_as<const float>(), a, ids.data_as<int32_t>(),
      weights.data_as<float>(), p, counter, state_->stream);
}

void CudaBackend::MoePermute(const Tensor& ids, int64_t begin, int64_t num_local,
                             const Tensor& offsets, const Tensor& src_row,
                             const Tensor& row_of_slot) {
  const auto [n, k] = CheckMoePermute(device(), ids, num_local, offsets, src_row, row_of_slot);
  const OpScope scope(*this, "MoePermute");
  const int64_t scratch_ints = MoePermuteScratchInts(n, k, num_local);
  auto* scratch =
      scratch_ints > 0
          ? static_cast<int32_t*>(Scratch(kPermuteCounts, scratch_ints * sizeof(int32_t)))
          : nullptr;
  LaunchMoePermute(ids.data_as<const int32_t>(), n, k, begin, num_local, offsets.data_as<int32_t>(),
                   src_row.data_as<int32_t>(), row_of_slot.data_as<int32_t>(), scratch,
                   state_->stream);
}

const void* const* CudaBackend::ExpertTable(const ExpertWeights& experts, int kind) {
  const std::vector<Tensor>& list = kind == 0   ? experts.gate_up
                                    : kind == 1 ? experts.down
                                    : kind == 2 ? experts.gate_up_scale
                                                : experts.down_scale;
  std::vector<const void*> ptrs;
  for (size_t e = 0; e < list.size(); ++e) {
    AFD_CHECK(!list[e].empty(), "routed expert {} is not loaded on {}",
              experts.expert_begin + static_cast<int64_t>(e), name_);
    CheckOn("GroupedExpertMlp", list[e], device_);
    ptrs.push_back(list[e].data());
  }
  State::ExpertTable& table = state_->expert_tables[std::make_pair(ptrs.front(), kind)];
  if (table.ptrs != ptrs) {
    Synchronize();  // an older table at this key may still be read by queued work
    table.device = Allocate(ptrs.size() * sizeof(void*));
    AFD_CUDA_CHECK(cudaMemcpy(table.device.get(), ptrs.data(), ptrs.size() * sizeof(void*),
                              cudaMemcpyHostToDevice));
    table.ptrs = ptrs;
  }
  return static_cast<const void* const*>(table.device.get());
}

void CudaBackend::GroupedExpertMlp(const Tensor& x, const Tensor& offsets,
                                   const ExpertWeights& experts, const Tensor& out) {
  const auto [m, h] = CheckGroupedExpertMlp(device(), x, offsets, experts, out);
  const int64_t e = experts.num_experts();
  if (e == 0 || m == 0) return;
  const OpScope scope(*this, "GroupedExpertMlp", {m, h});
  if (MmaExpertMlp(x.data_as<const float>(), nullptr, m, h, offsets, experts, out)) return;
  AFD_CHECK(!experts.fp8(),
            "GroupedExpertMlp: FP8 experts need hidden and intermediate sizes that are multiples "
            "of 32 on {} (hidden {}, intermediate {})",
            name_, h, experts.down.front().dim(1));
  const int64_t inter = experts.down.front().dim(1);
  const bool bf16 = experts.gate_up.front().dtype() == DType::kBF16;
  auto* act = static_cast<float*>(Scratch(kMoeAct, m * inter * sizeof(float)));  // [m, I]
  auto* xb =
      bf16 ? static_cast<uint16_t*>(Scratch(kBf16Input, m * std::max(h, inter) * 2)) : nullptr;
  LaunchGroupedLinear(x.data_as<const float>(), m, h, ExpertTable(experts, 0), bf16,
                      offsets.data_as<const int32_t>(), e, inter, /*swiglu=*/true, act, xb,
                      state_->stream);
  LaunchGroupedLinear(act, m, inter, ExpertTable(experts, 1), bf16,
                      offsets.data_as<const int32_t>(), e, h, /*swiglu=*/false,
                      out.data_as<float>(), xb, state_->stream);
}

bool CudaBackend::MmaExpertMlp(const float* x, const int32_t* src_row, int64_t m, int64_t h,
                               const Tensor& offsets, const ExpertWeights& experts,
                               const Tensor& out) {
  // bf16 experts of decode and mid-sized groups: both GEMMs on tensor cores with a bf16
  // intermediate (the act scratch holds it); FP8 experts at every size: w8a8 up to 256 rows an
  // expert (an fp32 intermediate in the act scratch, the E4M3 rows in the x scratch), the tiled
  // bf16 form on dequantized experts above.
  const bool fp8 = experts.fp8();
  if (!fp8 && experts.gate_up.front().dtype() != DType::kBF16) return false;
  const int64_t inter = experts.down.front().dim(1), e = experts.num_experts();
  auto* act = static_cast<uint16_t*>(Scratch(kMoeAct, m * inter * sizeof(float)));
  auto* xb = static_cast<uint16_t*>(Scratch(kBf16Input, m * std::max(h, inter) * 2));
  if (fp8 && GroupedMlpTiledFits(m, h, inter, e)) {
    // Prefill sizes: every local expert dequantized to bf16 (the bf16 experts' very values),
    // then the tiled bf16 form -- the mma form reading FP8 is not built for such row counts.
    const int64_t gu = 2 * inter * h, dn = h * inter;
    auto* base = static_cast<uint16_t*>(Scratch(kFp8Experts, e * (gu + dn) * 2));
    LaunchDequantFp8Experts(ExpertTable(experts, 0), ExpertTable(experts, 2), e, 2 * inter, h,
                            inter, base, state_->stream);
    LaunchDequantFp8Experts(ExpertTable(experts, 1), ExpertTable(experts, 3), e, h, inter, h,
                            base + e * gu, state_->stream);
    ExpertWeights bf16;
    bf16.expert_begin = experts.expert_begin;
    for (int64_t i = 0; i < e; ++i) {
      bf16.gate_up.emplace_back(base + i * gu, DType::kBF16, std::vector<int64_t>{2 * inter, h},
                                device());
      bf16.down.emplace_back(base + e * gu + i * dn, DType::kBF16, std::vector<int64_t>{h, inter},
                             device());
    }
    return LaunchGroupedMlpMma(x, src_row, m, h, inter, ExpertTable(bf16, 0), ExpertTable(bf16, 1),
                               nullptr, nullptr, offsets.data_as<const int32_t>(), e, xb, act,
                               out.data_as<float>(), state_->stream);
  }
  return LaunchGroupedMlpMma(x, src_row, m, h, inter, ExpertTable(experts, 0),
                             ExpertTable(experts, 1), fp8 ? ExpertTable(experts, 2) : nullptr,
                             fp8 ? ExpertTable(experts, 3) : nullptr,
                             offsets.data_as<const int32_t>(), experts.num_experts(), xb, act,
                             out.data_as<float>(), state_->stream);
}

void CudaBackend::GatheredExpertMlp(const Tensor& x, const Tensor& src_row, const Tensor& grouped,
                                    const Tensor& offsets, const ExpertWeights& experts,
                                    const Tensor& out) {
  const auto [m, h] = CheckGatherRows(device(), x, src_row, grouped);
  CheckGroupedExpertMlp(device(), grouped, offsets, experts, out);
  if (experts.num_experts() == 0 || m == 0) return;
  if (Aligned16(x.data())) {
    // The mma path rounds its rows to bf16 first: gathered on the way (no fp32 copy).
    const OpScope scope(*this, "GroupedExpertMlp", {m, h});
    if (MmaExpertMlp(x.data_as<const float>(), src_row.data_as<const int32_t>(), m, h, offsets,
                     experts, out)) {
      return;
    }
  }
  GatherRows(x, src_row, grouped);
  GroupedExpertMlp(grouped, offsets, experts, out);
}

void CudaBackend::MoeCombine(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                             bool accumulate, const Tensor& out) {
  const auto [n, k, h] = CheckMoeCombine(device(), y, row_of_slot, weights, out);
  const OpScope scope(*this, "MoeCombine", {n, h});
  LaunchMoeCombine(y.data_as<const float>(), h, row_of_slot.data_as<const int32_t>(),
                   weights.data_as<const float>(), n, k, accumulate, nullptr, out.data_as<float>(),
                   state_->stream);
}

void CudaBackend::MoeCombineAdd(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                                const Tensor& addend, const Tensor& out) {
  const auto [n, k, h] = CheckMoeCombine(device(), y, row_of_slot, weights, out);
  CheckAdd(device(), out, addend);
  const OpScope scope(*this, "MoeCombine", {n, h});
  LaunchMoeCombine(y.data_as<const float>(), h, row_of_slot.data_as<const int32_t>(),
                   weights.data_as<const float>(), n, k, /*accumulate=*/false,
                   addend.data_as<const float>(), out.data_as<float>(), state_->stream);
}

void CudaBackend::LogSoftmaxAt(const Tensor& logits, const Tensor& ids, const Tensor& out) {
  const auto [n, v] = CheckLogSoftmaxAt(device(), logits, ids, out);
  const OpScope scope(*this, "LogSoftmaxAt");
  LaunchLogSoftmaxAt(logits.data_as<const float>(), n, v, ids.data_as<const int32_t>(),
                     out.data_as<float>(), Scratch(kSampleReduce, SampleReduceBytes(n, v)),
                     state_->stream);
}

void CudaBackend::Sample(const Tensor& logits, const std::vector<SampleRow>& rows,
                         const Tensor& ids) {
  const auto [n, v] = CheckSample(device(), logits, rows, ids);
  const OpScope scope(*this, "Sample");
  LaunchArgMax(logits.data_as<const float>(), n, v, ids.data_as<int32_t>(),
               Scratch(kSampleReduce, SampleReduceBytes(n, v)), state_->stream);
  const bool any_sampled =
      std::any_of(rows.begin(), rows.end(), [](const SampleRow& r) { return r.temperature > 0; });
  if (!any_sampled || n == 0) return;
  // Per-row parameters, 8-byte fields first so that every array is aligned for any n:
  // [u f64 x n | top_k i64 x n | temperature f32 x n | top_p f32 x n].
  const size_t u_at = 0, top_k_at = 8 * n, temp_at = 16 * n, top_p_at = 20 * n;
  std::vector<double> host_words((24 * n + 7) / 8);  // 8-byte aligned host staging
  char* p = reinterpret_cast<char*>(host_words.data());
  auto* u = reinterpret_cast<double*>(p + u_at);
  auto* top_k = reinterpret_cast<int64_t*>(p + top_k_at);
  auto* temp = reinterpret_cast<float*>(p + temp_at);
  auto* top_p = reinterpret_cast<float*>(p + top_p_at);
  for (int64_t i = 0; i < n; ++i) {
    temp[i] = rows[i].temperature;
    top_k[i] = rows[i].top_k;
    top_p[i] = rows[i].top_p;
    u[i] = rows[i].u;
  }
  const size_t bytes = 24 * n;
  char* dev = static_cast<char*>(Scratch(kSampleParams, bytes));
  // From the pinned ring: the copy runs in stream order, nothing waits for it here.
  AFD_CUDA_CHECK(
      cudaMemcpyAsync(dev, Stage(p, bytes), bytes, cudaMemcpyHostToDevice, state_->stream));
  const SampleParamsDev params{reinterpret_cast<const float*>(dev + temp_at),
                               reinterpret_cast<const int64_t*>(dev + top_k_at),
                               reinterpret_cast<const float*>(dev + top_p_at),
                               reinterpret_cast<const double*>(dev + u_at)};
  // keys/vals in (2 n v) and out (2 n v), offsets (n + 1).
  auto* keys = static_cast<float*>(Scratch(kSortKeys, 2 * n * v * sizeof(float)));
  auto* vals = static_cast<int32_t*>(Scratch(kSortVals, (2 * n * v + n + 1) * sizeof(int32_t)));
  int32_t* offsets = vals + 2 * n * v;
  LaunchPrepareSort(logits.data_as<const float>(), n, v, keys, vals, offsets, state_->stream);
  const size_t temp_bytes = SegmentedSortTempBytes(n, v);
  void* sort_temp = Scratch(kSortTemp, temp_bytes);
  SegmentedSortDescending(sort_temp, temp_bytes, keys, keys + n * v, vals, vals + n * v, n, v,
                          offsets, state_->stream);
  LaunchSampleSorted(keys + n * v, vals + n * v, n, v, params, ids.data_as<int32_t>(),
                     state_->stream);
}

void CudaBackend::TakeIds(const Tensor& from, const Tensor& source, const Tensor& ids) {
  const int64_t n = CheckTakeIds(device(), from, source, ids);
  const OpScope scope(*this, "TakeIds");
  LaunchTakeIds(from.data_as<const int32_t>(), source.data_as<const int32_t>(), n,
                ids.data_as<int32_t>(), state_->stream);
}

namespace {

AfdRankPtrs RankPtrs(const std::vector<Tensor>& ts) {
  AfdRankPtrs p{};
  for (size_t f = 0; f < ts.size(); ++f) p.p[f] = ts[f].data();
  return p;
}

AfdRankInts RankInts(const std::vector<int64_t>& v) {
  AfdRankInts r{};
  for (size_t f = 0; f < v.size(); ++f) r.v[f] = v[f];
  return r;
}

}  // namespace

void CudaBackend::AfdDispatch(const Tensor& hidden, const Tensor& ids, const Tensor& weights,
                              int64_t num_experts, const std::vector<Tensor>& rows,
                              const std::vector<Tensor>& scales, const std::vector<Tensor>& tables,
                              const Tensor& send_row, bool shared) {
  const AfdShape a =
      CheckAfdDispatch(device(), hidden, ids, weights, num_experts, rows, scales, tables, send_row);
  const OpScope scope(*this, "AfdDispatch", {a.n, a.h});
  uint64_t bf16_mask = 0, fp8_mask = 0;
  AfdRankPtrs scale_ptrs{};
  for (int f = 0; f < a.ranks; ++f) {
    if (rows[f].dtype() == DType::kBF16) bf16_mask |= uint64_t{1} << f;
    if (rows[f].dtype() == DType::kF8E4M3) {
      fp8_mask |= uint64_t{1} << f;
      scale_ptrs.p[f] = scales[f].data();
    }
  }
  LaunchAfdDispatch(hidden.data_as<const float>(), ids.data_as<const int32_t>(),
                    weights.data_as<const float>(), a.n, a.k, a.h, num_experts, a.ranks,
                    RankPtrs(rows), bf16_mask, fp8_mask, scale_ptrs, RankPtrs(tables),
                    send_row.data_as<int32_t>(), shared, state_->stream);
}

void CudaBackend::DequantFp8Rows(const Tensor& q, const Tensor& scales, const Tensor& out) {
  const RowsShape r = CheckDequantFp8Rows(device(), q, scales, out);
  const OpScope scope(*this, "DequantFp8Rows", {r.n, r.d});
  LaunchDequantFp8Rows(q.data_as<const uint8_t>(), scales.data_as<const float>(), r.n, r.d,
                       out.data_as<float>(), state_->stream);
}

void CudaBackend::AfdSumPartials(const std::vector<Tensor>& partials, const Tensor& send_row,
                                 const Tensor& out) {
  const AfdShape a = CheckAfdSumPartials(device(), partials, send_row, out);
  const OpScope scope(*this, "AfdSumPartials", {a.n, a.h});
  LaunchAfdSumPartials(RankPtrs(partials), send_row.data_as<const int32_t>(), a.n, a.h, a.ranks,
                       out.data_as<float>(), state_->stream);
}

void CudaBackend::AfdPairIndex(const Tensor& ids, int64_t num_experts, const Tensor& send_row,
                               const std::vector<Tensor>& row_of_slot,
                               const std::vector<int64_t>& base,
                               const std::vector<int64_t>& shared_base, const Tensor& idx,
                               const Tensor& shared_idx) {
  const AfdShape a = CheckAfdPairIndex(device(), ids, num_experts, send_row, row_of_slot, base,
                                       shared_base, idx, shared_idx);
  const OpScope scope(*this, "AfdPairIndex", {a.n, a.k});
  LaunchAfdPairIndex(ids.data_as<const int32_t>(), a.n, a.k, num_experts, a.ranks,
                     send_row.data_as<const int32_t>(), RankPtrs(row_of_slot), RankInts(base),
                     RankInts(shared_base), idx.data_as<int32_t>(),
                     shared_idx.empty() ? nullptr : shared_idx.data_as<int32_t>(), state_->stream);
}

void CudaBackend::Convert(const Tensor& dst, const Tensor& src) {
  const int64_t n = CheckConvert(device(), dst, src);
  if (dst.dtype() == src.dtype()) {
    Copy(dst, src);
    return;
  }
  const OpScope scope(*this, "Convert", {n});
  if (dst.dtype() == DType::kF32) {
    LaunchBf16ToF32(src.data_as<const uint16_t>(), n, dst.data_as<float>(), state_->stream);
  } else {
    LaunchToBf16(src.data_as<const float>(), n, dst.data_as<uint16_t>(), state_->stream);
  }
}

}  // namespace afd::kernels::cuda
