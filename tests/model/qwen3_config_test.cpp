// Qwen3-MoE configs (qwen3_moe): the published spelling and transformers 5's, the layout of
// dense and MoE layers, the router's semantics, and every refusal naming the field.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "afd/common/error.h"
#include "afd/model/loader.h"
#include "afd/model/model_config.h"
#include "afd/model/rope.h"
#include "afd/model/router.h"

namespace afd::model {
namespace {

// Qwen/Qwen3-30B-A3B's config.json as published (transformers 4 spelling).
constexpr const char* kQwen3_30bA3bJson = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
  "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Qwen3Config, PublishedConfigMatchesThePreset) {
  const ModelConfig c = ParseModelConfig(kQwen3_30bA3bJson, "config.json");
  const ModelConfig p = PresetConfig("qwen3-30b-a3b");
  EXPECT_EQ(c.model_type, ModelType::kQwen3Moe);
  EXPECT_EQ(c.attention(), AttentionKind::kGqa);
  EXPECT_STREQ(c.model_type_name(), "qwen3_moe");
  for (auto [a, b] : {std::pair{c.vocab_size, p.vocab_size},
                      {c.hidden_size, p.hidden_size},
                      {c.num_hidden_layers, p.num_hidden_layers},
                      {c.num_attention_heads, p.num_attention_heads},
                      {c.num_key_value_heads, p.num_key_value_heads},
                      {c.head_dim, p.head_dim},
                      {c.n_routed_experts, p.n_routed_experts},
                      {c.num_experts_per_tok, p.num_experts_per_tok},
                      {c.moe_intermediate_size, p.moe_intermediate_size},
                      {c.max_position_embeddings, p.max_position_embeddings},
                      {c.bos_token_id, p.bos_token_id}}) {
    EXPECT_EQ(a, b);
  }
  EXPECT_EQ(c.eos_token_ids, p.eos_token_ids);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.n_shared_experts, 0);
  EXPECT_FALSE(c.rope_interleave);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.cache_row_width(), 2 * 4 * 128);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) EXPECT_TRUE(c.IsMoeLayer(l)) << l;
  EXPECT_EQ(Rope(c).inv_freq(), Rope(p).inv_freq());
  EXPECT_EQ(Rope(c).inv_freq().size(), 64u);
  EXPECT_FLOAT_EQ(Rope(c).softmax_scale(), 1.0f / std::sqrt(128.0f));
  // 30.5B parameters (the model card), 3.3B active.
  EXPECT_NEAR(static_cast<double>(ParameterCount(c)), 30.53e9, 0.05e9);
}

TEST(Qwen3Config, BothSpellingsReadTheSame) {
  // tests/data/golden/qwen3_gqa/config.json is transformers 5's (num_local_experts,
  // rope_parameters); the published checkpoints' spelling of the same model:
  const std::string path = std::string(AFD_SOURCE_DIR) + "/tests/data/golden/qwen3_gqa/config.json";
  nlohmann::json j = nlohmann::json::parse(ReadFile(path));
  ASSERT_TRUE(j.contains("num_local_experts"));
  const ModelConfig v5 = ParseModelConfig(j.dump(), path);
  j["num_experts"] = j["num_local_experts"];
  j.erase("num_local_experts");
  j["rope_theta"] = j["rope_parameters"]["rope_theta"];
  j.erase("rope_parameters");
  const ModelConfig v4 = ParseModelConfig(j.dump(), "legacy");
  EXPECT_EQ(v4.n_routed_experts, v5.n_routed_experts);
  EXPECT_EQ(v4.rope.theta, v5.rope.theta);
  EXPECT_EQ(Rope(v4).inv_freq(), Rope(v5).inv_freq());
  EXPECT_EQ(v4.mlp_only_layers, std::vector<int64_t>{0});
  EXPECT_FALSE(v4.IsMoeLayer(0));
  EXPECT_TRUE(v4.IsMoeLayer(1));
  // Both present and equal is fine; different is an error naming both.
  j["num_local_experts"] = j["num_experts"];
  EXPECT_EQ(ParseModelConfig(j.dump(), "both").n_routed_experts, v5.n_routed_experts);
  j["num_local_experts"] = 9;
  try {
    ParseModelConfig(j.dump(), "both");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"num_experts\" (8) and \"num_local_experts\" (9)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Qwen3Config, SparseStepAndMlpOnlyLayersMakeTheLayout) {
  nlohmann::json j = nlohmann::json::parse(kQwen3_30bA3bJson);
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  const ModelConfig c = ParseModelConfig(j.dump(), "config.json");
  std::string layout;
  for (int64_t l = 0; l < 6; ++l) layout += c.IsMoeLayer(l) ? 'M' : 'D';
  EXPECT_EQ(layout, "DMDDDM");  // (l + 1) % 2 == 0, but layer 3 dense
  EXPECT_EQ(c.MoeLayers(), (std::vector<int>{1, 5}));
  j["num_experts"] = 0;  // transformers: no experts, every layer dense
  const ModelConfig dense = ParseModelConfig(j.dump(), "config.json");
  for (int64_t l = 0; l < 6; ++l) EXPECT_FALSE(dense.IsMoeLayer(l)) << l;
  EXPECT_EQ(dense.num_moe_layers(), 0);
  EXPECT_EQ(ParameterCount(dense) > 0, true);
}

TEST(Qwen3Config, RouterRenormalisesWithoutEpsilon) {
  const kernels::RouterSpec q = RouterSpecOf(PresetConfig("qwen3-30b-a3b"));
  EXPECT_EQ(q.scoring, kernels::RouterScoring::kSoftmax);
  EXPECT_FALSE(q.group_limited);
  EXPECT_TRUE(q.norm_topk_prob);
  EXPECT_EQ(q.norm_eps, 0.0f);
  EXPECT_EQ(q.routed_scaling_factor, 1.0f);
  EXPECT_EQ(q.top_k, 8);
  // transformers' DeepSeek-V2 ignores norm_topk_prob.
  ModelConfig v2 = PresetConfig("deepseek-v2-lite");
  v2.norm_topk_prob = true;
  EXPECT_FALSE(RouterSpecOf(v2).norm_topk_prob);
}

TEST(Qwen3Config, UnsupportedFeaturesAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("use_sliding_window": false)", R"("use_sliding_window": true)"},
      {R"("attention_bias": false)", R"("attention_bias": true)"},
      {R"("num_key_value_heads": 4)", R"("num_key_value_heads": 3)"},
      {R"("head_dim": 128)", R"("head_dim": 127)"},
      {R"("mlp_only_layers": [])", R"("mlp_only_layers": [48])"},
      {R"("decoder_sparse_step": 1)", R"("decoder_sparse_step": 0)"},
      {R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "dynamic", "factor": 2.0})"},
      {R"("rope_scaling": null)", R"("partial_rotary_factor": 0.5)"},
      {R"("max_window_layers": 48)", R"("layer_types": ["sliding_attention"])"},
  };
  const std::vector<std::string> named = {"use_sliding_window",
                                          "attention_bias",
                                          "num_key_value_heads",
                                          "head_dim",
                                          "mlp_only_layers",
                                          "decoder_sparse_step",
                                          "dynamic",
                                          "partial_rotary_factor",
                                          "layer_types"};
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string text = kQwen3_30bA3bJson;
    const size_t at = text.find(cases[i].first);
    ASSERT_NE(at, std::string::npos) << cases[i].first;
    text.replace(at, cases[i].first.size(), cases[i].second);
    try {
      ParseModelConfig(text, "q.json");
      ADD_FAILURE() << cases[i].second << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(named[i]), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("q.json"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace afd::model
