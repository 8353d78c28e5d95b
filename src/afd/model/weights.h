// The weights of a DeepSeek-V2/V3 or Qwen3-MoE model as Tensors in a backend's memory, and how
// they are read from a checkpoint. Linear weights are [out, in] (y = x · Wᵀ). Big matrices are
// stored as `matrix_dtype` (fp32, or bf16 to halve memory); norms, kv_b_proj, the router gate and
// its bias are always fp32: attention reads kv_b_proj per head and the router is tiny.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "afd/common/dtype_convert.h"
#include "afd/kernels/backend.h"
#include "afd/model/model_config.h"
#include "afd/tensor/tensor.h"

namespace afd::model {

class Checkpoint;

struct AttentionWeights {
  Tensor input_norm;  // [H]
  // GQA (Qwen3): q_proj, k_proj, v_proj stacked into one [(nH + 2·nKV)·d, H] matrix (rows: q of
  // every head, then k, then v of every KV head); q_norm, k_norm [d] fp32; o_proj [H, nH·d].
  Tensor qkv_proj;
  Tensor q_norm, k_norm;
  // MLA (DeepSeek):
  Tensor q_proj;     // [nH·(dn+dr), H], when q_lora_rank == 0
  Tensor q_a_proj;   // [q_lora, H], when q_lora_rank > 0
  Tensor q_a_norm;   // [q_lora]
  Tensor q_b_proj;   // [nH·(dn+dr), q_lora]
  Tensor kv_a_proj;  // [kv_lora + dr, H]
  Tensor kv_a_norm;  // [kv_lora]
  Tensor kv_b_proj;  // [nH·(dn+dv), kv_lora], fp32; per head: dn key rows, dv value rows
  Tensor o_proj;     // [H, nH·dv] (MLA), [H, nH·d] (GQA)
};

// gate/up fused: rows [0, I) are gate_proj, rows [I, 2I) up_proj.
struct MlpWeights {
  Tensor gate_up;  // [2·I, H]
  Tensor down;     // [H, I]
  bool empty() const { return gate_up.empty(); }
};

struct MoeWeights {
  Tensor gate;                     // router [E, H], fp32
  Tensor e_score_correction_bias;  // [E], V3 only
  kernels::ExpertWeights experts;  // the loaded range of routed experts
  MlpWeights shared;               // intermediate moe_inter·n_shared; empty if none
};

struct LayerWeights {
  AttentionWeights attn;
  Tensor post_attention_norm;  // [H]
  MlpWeights dense;            // layers < first_k_dense_replace
  MoeWeights moe;              // the other layers
};

struct ModelWeights {
  Tensor embed;  // [V, H]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [H]
  Tensor lm_head;     // [V, H]; shares the embedding's storage when tied
};

struct WeightOptions {
  DType matrix_dtype = DType::kF32;  // kF32 or kBf16
  // Which parts to hold, so that the attention role and the FFN role can each load their part.
  bool load_attention = true;  // embedding, attention, norms, dense MLP, lm_head
  bool load_moe = true;        // router and shared experts of MoE layers
  int64_t expert_begin = 0;    // routed experts [expert_begin, expert_end) of MoE layers
  int64_t expert_end = -1;     // -1: up to n_routed_experts
  // > 0 (`--quantization fp8`, vLLM's online FP8): every Linear weight but the routers' is
  // quantized on load to FP8 E4M3 in blocks of fp8_block x fp8_block (scale = the block's
  // largest |w| / 448) and held dequantized (the CPU reference of FP8 weights). Checkpoints that
  // are FP8 already keep their own scales.
  int64_t fp8_block = 0;
  // FP8 routed experts (an FP8 checkpoint's with 128 x 128 blocks, or fp8_block == 128) held as
  // FP8 codes with their block scales (kernels::ExpertWeights::fp8) rather than dequantized: the
  // bytes a GPU's expert kernels read halve. A layer whose routed experts are not all FP8 in the
  // source is held dequantized.
  bool keep_fp8_experts = false;
};

// Reads every tensor the config implies from `ckpt` (names as in the HF checkpoints; shapes and
// dtypes checked, errors name file and tensor). Tensors not needed (e.g. MTP layers) are ignored.
ModelWeights LoadWeights(const ModelConfig& config, const Checkpoint& ckpt,
                         const WeightOptions& options);

// Calls fn on every tensor of the weights (to move them to a device, count bytes, ...).
void ForEachTensor(ModelWeights& weights, const std::function<void(Tensor&)>& fn);

// Deterministic random weights for `seed` (same seed, same weights, on any machine), with the
// init of the golden data: embedding ~ unit variance, linear weights variance 1/fan_in,
// lm_head 4/fan_in, norms 1 + 0.1·noise, V3 correction bias 0.1·noise (uniform noise).
ModelWeights RandomWeights(const ModelConfig& config, uint64_t seed, const WeightOptions& options);

}  // namespace afd::model
