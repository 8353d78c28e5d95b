#include "afd/model/weight_builder.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "afd/common/dtype_convert.h"
#include "afd/common/error.h"
#include "afd/model/loader.h"

namespace afd::model {

void TensorSource::ReadFp8(const std::string& name, const std::vector<int64_t>&, TensorKind,
                           uint8_t*, float*) {
  AFD_THROW("tensor {} cannot be read as FP8 blocks from this source", name);
}

namespace {

// A load progress bar on stderr for weights above 1 GiB: redrawn in place on a terminal,
// one line per 10% otherwise (logs).
class Progress {
 public:
  explicit Progress(double total_bytes)
      : total_(total_bytes), enabled_(total_bytes > 1073741824.0), tty_(isatty(2) == 1) {}
  ~Progress() {
    if (!enabled_) return;
    std::fprintf(stderr, "%sloading weights: done, %.1f GiB\n", tty_ ? "\r" : "",
                 done_ / 1073741824.0);
  }
  void Add(double bytes) {
    if (!enabled_) return;
    done_ += bytes;
    // The total is an estimate (some tensors are always fp32): stop short of 100% until done.
    const int percent = static_cast<int>(std::min(99.0, 100.0 * done_ / total_));
    if (tty_ ? percent == shown_ : percent / 10 == shown_ / 10) return;
    shown_ = percent;
    const int width = 40, filled = percent * width / 100;
    std::fprintf(stderr, "%sloading weights [%s%s] %3d%% (%.1f / %.1f GiB)%s", tty_ ? "\r" : "",
                 std::string(filled, '#').c_str(), std::string(width - filled, ' ').c_str(),
                 percent, done_ / 1073741824.0, total_ / 1073741824.0, tty_ ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  double total_, done_ = 0;
  bool enabled_, tty_;
  int shown_ = -1;
};

class Builder {
 public:
  Builder(const ModelConfig& c, const WeightOptions& o, TensorSource& s)
      : c_(c),
        o_(o),
        s_(s),
        progress_(static_cast<double>(LoadedParameterCount(c, o)) * DTypeSize(o.matrix_dtype)) {}

  Tensor Vector(const std::string& name, int64_t n, TensorKind kind) {
    Tensor v = Tensor::HostZeros(DType::kF32, {n});
    s_.Read(name, {n}, kind, DType::kF32, v.data());
    progress_.Add(v.nbytes());
    return v;
  }

  Tensor Mat(const std::string& name, int64_t rows, int64_t cols, TensorKind kind, DType dtype) {
    Tensor m = Tensor::HostZeros(dtype, {rows, cols});
    s_.Read(name, {rows, cols}, kind, dtype, m.data());
    progress_.Add(m.nbytes());
    return m;
  }
  Tensor Mat(const std::string& name, int64_t rows, int64_t cols, TensorKind kind) {
    return Mat(name, rows, cols, kind, o_.matrix_dtype);
  }

  // gate_proj and up_proj [inter, H] stacked into one [2·inter, H] matrix; down [H, inter].
  MlpWeights Mlp(const std::string& prefix, int64_t inter) {
    const int64_t h = c_.hidden_size;
    MlpWeights w;
    w.gate_up = Tensor::HostZeros(o_.matrix_dtype, {2 * inter, h});
    char* base = static_cast<char*>(w.gate_up.data());
    s_.Read(prefix + "gate_proj.weight", {inter, h}, TensorKind::kLinear, o_.matrix_dtype, base);
    s_.Read(prefix + "up_proj.weight", {inter, h}, TensorKind::kLinear, o_.matrix_dtype,
            base + inter * h * DTypeSize(o_.matrix_dtype));
    progress_.Add(w.gate_up.nbytes());
    w.down = Mat(prefix + "down_proj.weight", h, inter, TensorKind::kLinear);
    return w;
  }

  // Qwen3's q_proj, k_proj, v_proj read into one [(nH + 2·nKV)·d, H] matrix.
  AttentionWeights GqaAttention(const std::string& p) {
    const int64_t h = c_.hidden_size, nh = c_.num_attention_heads;
    const int64_t kvh = c_.num_key_value_heads, d = c_.head_dim;
    AttentionWeights a;
    a.qkv_proj = Tensor::HostZeros(o_.matrix_dtype, {(nh + 2 * kvh) * d, h});
    char* base = static_cast<char*>(a.qkv_proj.data());
    const int64_t row_bytes = h * static_cast<int64_t>(DTypeSize(o_.matrix_dtype));
    s_.Read(p + "q_proj.weight", {nh * d, h}, TensorKind::kLinear, o_.matrix_dtype, base);
    s_.Read(p + "k_proj.weight", {kvh * d, h}, TensorKind::kLinear, o_.matrix_dtype,
            base + nh * d * row_bytes);
    s_.Read(p + "v_proj.weight", {kvh * d, h}, TensorKind::kLinear, o_.matrix_dtype,
            base + (nh + kvh) * d * row_bytes);
    progress_.Add(a.qkv_proj.nbytes());
    a.q_norm = Vector(p + "q_norm.weight", d, TensorKind::kNorm);
    a.k_norm = Vector(p + "k_norm.weight", d, TensorKind::kNorm);
    a.o_proj = Mat(p + "o_proj.weight", h, nh * d, TensorKind::kLinear);
    return a;
  }

  AttentionWeights Attention(const std::string& p) {
    if (c_.attention() == AttentionKind::kGqa) return GqaAttention(p);
    const int64_t h = c_.hidden_size, nh = c_.num_attention_heads;
    AttentionWeights a;
    if (c_.q_lora_rank == 0) {
      a.q_proj = Mat(p + "q_proj.weight", nh * c_.qk_head_dim(), h, TensorKind::kLinear);
    } else {
      a.q_a_proj = Mat(p + "q_a_proj.weight", c_.q_lora_rank, h, TensorKind::kLinear);
      a.q_a_norm = Vector(p + "q_a_layernorm.weight", c_.q_lora_rank, TensorKind::kNorm);
      a.q_b_proj =
          Mat(p + "q_b_proj.weight", nh * c_.qk_head_dim(), c_.q_lora_rank, TensorKind::kLinear);
    }
    a.kv_a_proj = Mat(p + "kv_a_proj_with_mqa.weight", c_.kv_lora_rank + c_.qk_rope_head_dim, h,
                      TensorKind::kLinear);
    a.kv_a_norm = Vector(p + "kv_a_layernorm.weight", c_.kv_lora_rank, TensorKind::kNorm);
    a.kv_b_proj = Mat(p + "kv_b_proj.weight", nh * (c_.qk_nope_head_dim + c_.v_head_dim),
                      c_.kv_lora_rank, TensorKind::kLinear, DType::kF32);
    a.o_proj = Mat(p + "o_proj.weight", h, nh * c_.v_head_dim, TensorKind::kLinear);
    return a;
  }

  MoeWeights Moe(const std::string& p, int64_t expert_begin, int64_t expert_end) {
    const int64_t e = c_.n_routed_experts;
    MoeWeights m;
    m.experts.expert_begin = expert_begin;
    if (o_.load_moe) {
      m.gate = Mat(p + "gate.weight", e, c_.hidden_size, TensorKind::kLinear, DType::kF32);
      if (c_.model_type == ModelType::kDeepseekV3) {
        m.e_score_correction_bias =
            Vector(p + "gate.e_score_correction_bias", e, TensorKind::kBias);
      }
      if (c_.n_shared_experts > 0) {
        m.shared = Mlp(p + "shared_experts.", c_.moe_intermediate_size * c_.n_shared_experts);
      }
    }
    // FP8 experts held as FP8 when asked and every routed expert of the layer is FP8 in the
    // source; else dequantized, as every other weight.
    bool fp8 = o_.keep_fp8_experts && expert_end > expert_begin;
    for (int64_t i = expert_begin; fp8 && i < expert_end; ++i) {
      const std::string e = fmt::format("{}experts.{}.", p, i);
      fp8 = s_.HasFp8(e + "gate_proj.weight") && s_.HasFp8(e + "up_proj.weight") &&
            s_.HasFp8(e + "down_proj.weight");
    }
    for (int64_t i = expert_begin; i < expert_end; ++i) {
      const std::string e = fmt::format("{}experts.{}.", p, i);
      if (fp8) {
        Fp8Expert(e, c_.moe_intermediate_size, m.experts);
        continue;
      }
      MlpWeights expert = Mlp(e, c_.moe_intermediate_size);
      m.experts.gate_up.push_back(expert.gate_up);
      m.experts.down.push_back(expert.down);
    }
    return m;
  }

  // One routed expert's FP8 codes and block scales (kernels::ExpertWeights' layout: gate_proj
  // and up_proj stacked, each with its own block rows).
  void Fp8Expert(const std::string& prefix, int64_t inter, kernels::ExpertWeights& experts) {
    const int64_t h = c_.hidden_size;
    const auto blocks = [](int64_t n) {
      return (n + kernels::kFp8WeightBlock - 1) / kernels::kFp8WeightBlock;
    };
    Tensor gate_up = Tensor::HostZeros(DType::kF8E4M3, {2 * inter, h});
    Tensor gate_up_scale = Tensor::HostZeros(DType::kF32, {2 * blocks(inter), blocks(h)});
    auto* codes = static_cast<uint8_t*>(gate_up.data());
    auto* scales = static_cast<float*>(gate_up_scale.data());
    s_.ReadFp8(prefix + "gate_proj.weight", {inter, h}, TensorKind::kLinear, codes, scales);
    s_.ReadFp8(prefix + "up_proj.weight", {inter, h}, TensorKind::kLinear, codes + inter * h,
               scales + blocks(inter) * blocks(h));
    Tensor down = Tensor::HostZeros(DType::kF8E4M3, {h, inter});
    Tensor down_scale = Tensor::HostZeros(DType::kF32, {blocks(h), blocks(inter)});
    s_.ReadFp8(prefix + "down_proj.weight", {h, inter}, TensorKind::kLinear,
               static_cast<uint8_t*>(down.data()), static_cast<float*>(down_scale.data()));
    progress_.Add(gate_up.nbytes() + down.nbytes());
    experts.gate_up.push_back(gate_up);
    experts.down.push_back(down);
    experts.gate_up_scale.push_back(gate_up_scale);
    experts.down_scale.push_back(down_scale);
  }

  ModelWeights Build() {
    const int64_t h = c_.hidden_size, v = c_.vocab_size;
    const int64_t expert_end = o_.expert_end < 0 ? c_.n_routed_experts : o_.expert_end;
    AFD_CHECK(
        0 <= o_.expert_begin && o_.expert_begin <= expert_end && expert_end <= c_.n_routed_experts,
        "routed expert range [{}, {}) is outside [0, {})", o_.expert_begin, expert_end,
        c_.n_routed_experts);
    ModelWeights w;
    if (o_.load_attention) {
      w.embed = Mat("model.embed_tokens.weight", v, h, TensorKind::kEmbedding);
      w.final_norm = Vector("model.norm.weight", h, TensorKind::kNorm);
      w.lm_head =
          c_.tie_word_embeddings ? w.embed : Mat("lm_head.weight", v, h, TensorKind::kLmHead);
    }
    w.layers.resize(c_.num_hidden_layers);
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      const std::string p = fmt::format("model.layers.{}.", l);
      LayerWeights& layer = w.layers[l];
      if (o_.load_attention) {
        layer.attn = Attention(p + "self_attn.");
        layer.attn.input_norm = Vector(p + "input_layernorm.weight", h, TensorKind::kNorm);
        layer.post_attention_norm =
            Vector(p + "post_attention_layernorm.weight", h, TensorKind::kNorm);
        if (!c_.IsMoeLayer(l)) layer.dense = Mlp(p + "mlp.", c_.intermediate_size);
      }
      if (c_.IsMoeLayer(l)) layer.moe = Moe(p + "mlp.", o_.expert_begin, expert_end);
    }
    return w;
  }

 private:
  const ModelConfig& c_;
  const WeightOptions& o_;
  TensorSource& s_;
  Progress progress_;
};

}  // namespace

namespace {

// --quantization fp8: each Linear weight (the routers' aside, as vLLM leaves them unquantized)
// read in fp32, rounded through FP8 E4M3 blocks, then stored as asked.
class Fp8OnLoadSource : public TensorSource {
 public:
  Fp8OnLoadSource(TensorSource& inner, int64_t block) : inner_(inner), block_(block) {}
  void Read(const std::string& name, const std::vector<int64_t>& shape, TensorKind kind,
            DType dst_type, void* dst) override {
    if (kind != TensorKind::kLinear || shape.size() != 2 || IsRouter(name)) {
      inner_.Read(name, shape, kind, dst_type, dst);
      return;
    }
    const int64_t rows = shape[0], cols = shape[1];
    std::vector<float> w(rows * cols);
    inner_.Read(name, shape, kind, DType::kF32, w.data());
    RoundThroughFp8Blocks(w.data(), rows, cols, block_, block_);
    ConvertFromF32(w.data(), rows * cols, dst_type, dst);
  }
  bool HasFp8(const std::string& name) const override {
    return block_ == kernels::kFp8WeightBlock && !IsRouter(name);
  }
  void ReadFp8(const std::string& name, const std::vector<int64_t>& shape, TensorKind kind,
               uint8_t* codes, float* scales) override {
    AFD_CHECK(HasFp8(name) && kind == TensorKind::kLinear && shape.size() == 2,
              "--quantization fp8: tensor {} is not quantized in blocks of {}", name,
              kernels::kFp8WeightBlock);
    std::vector<float> w(shape[0] * shape[1]);
    inner_.Read(name, shape, kind, DType::kF32, w.data());
    RoundThroughFp8Blocks(w.data(), shape[0], shape[1], block_, block_, codes, scales);
  }

 private:
  static bool IsRouter(const std::string& name) {
    return name.size() >= 15 && name.compare(name.size() - 15, 15, "mlp.gate.weight") == 0;
  }
  TensorSource& inner_;
  int64_t block_;
};

}  // namespace

namespace {

// RoundThroughFp8Blocks on this thread.
void RoundBlocks(float* w, int64_t rows, int64_t cols, int64_t bn, int64_t bk, uint8_t* codes,
                 float* scales) {
  const int64_t block_cols = (cols + bk - 1) / bk;
  for (int64_t r0 = 0; r0 < rows; r0 += bn) {
    for (int64_t c0 = 0; c0 < cols; c0 += bk) {
      const int64_t r1 = std::min(rows, r0 + bn), c1 = std::min(cols, c0 + bk);
      float amax = 0;
      for (int64_t i = r0; i < r1; ++i) {
        for (int64_t j = c0; j < c1; ++j) amax = std::max(amax, std::fabs(w[i * cols + j]));
      }
      const float scale = amax > 0 ? amax / 448.0f : 1.0f;  // the block's weight_scale_inv
      if (scales != nullptr) scales[(r0 / bn) * block_cols + c0 / bk] = scale;
      for (int64_t i = r0; i < r1; ++i) {
        for (int64_t j = c0; j < c1; ++j) {
          float& x = w[i * cols + j];
          const uint8_t code = F32ToFp8E4M3(x / scale);
          if (codes != nullptr) codes[i * cols + j] = code;
          x = Fp8E4M3ToF32(code) * scale;
        }
      }
    }
  }
}

}  // namespace

void RoundThroughFp8Blocks(float* w, int64_t rows, int64_t cols, int64_t bn, int64_t bk,
                           uint8_t* codes, float* scales) {
  // Rows of blocks on several threads for big matrices (each block on its own: the same values
  // for any thread count; a V2-Lite checkpoint's 15.7e9 weights take minutes on one thread).
  const int64_t block_cols = (cols + bk - 1) / bk, block_rows = (rows + bn - 1) / bn;
  const int64_t threads =
      rows * cols < (1 << 20)
          ? 1
          : std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, block_rows);
  if (threads == 1) {
    RoundBlocks(w, rows, cols, bn, bk, codes, scales);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t b0 = block_rows * t / threads, b1 = block_rows * (t + 1) / threads;
    const int64_t r0 = b0 * bn, r1 = std::min(rows, b1 * bn);
    pool.emplace_back([=] {
      RoundBlocks(w + r0 * cols, r1 - r0, cols, bn, bk,
                  codes == nullptr ? nullptr : codes + r0 * cols,
                  scales == nullptr ? nullptr : scales + b0 * block_cols);
    });
  }
  for (std::thread& t : pool) t.join();
}

ModelWeights BuildWeights(const ModelConfig& config, const WeightOptions& options,
                          TensorSource& source) {
  AFD_CHECK(options.matrix_dtype == DType::kF32 || options.matrix_dtype == DType::kBF16,
            "weights can be stored as fp32 or bf16 only");
  AFD_CHECK(options.fp8_block >= 0, "the FP8 block size must be >= 0, got {}", options.fp8_block);
  // An FP8 checkpoint keeps its own scales (its weights are FP8 values already).
  if (options.fp8_block > 0 && config.fp8_block_n == 0) {
    Fp8OnLoadSource fp8(source, options.fp8_block);
    return Builder(config, options, fp8).Build();
  }
  return Builder(config, options, source).Build();
}

void ForEachTensor(ModelWeights& w, const std::function<void(Tensor&)>& fn) {
  auto visit = [&fn](Tensor& t) {
    if (!t.empty()) fn(t);
  };
  auto mlp = [&visit](MlpWeights& m) {
    visit(m.gate_up);
    visit(m.down);
  };
  visit(w.embed);
  visit(w.final_norm);
  visit(w.lm_head);
  for (LayerWeights& l : w.layers) {
    for (Tensor* t : {&l.attn.input_norm, &l.attn.qkv_proj, &l.attn.q_norm, &l.attn.k_norm,
                      &l.attn.q_proj, &l.attn.q_a_proj, &l.attn.q_a_norm, &l.attn.q_b_proj,
                      &l.attn.kv_a_proj, &l.attn.kv_a_norm, &l.attn.kv_b_proj, &l.attn.o_proj,
                      &l.post_attention_norm, &l.moe.gate, &l.moe.e_score_correction_bias}) {
      visit(*t);
    }
    mlp(l.dense);
    mlp(l.moe.shared);
    kernels::ExpertWeights& e = l.moe.experts;
    for (std::vector<Tensor>* list : {&e.gate_up, &e.down, &e.gate_up_scale, &e.down_scale}) {
      for (Tensor& t : *list) visit(t);
    }
  }
}

}  // namespace afd::model
