// Model geometry and behaviour read from a Hugging Face `config.json` (transformers 4.x and 5.x
// spellings), after `--hf-overrides`. Anything the engine cannot run exactly is rejected with a
// megamoe::Error naming the field, never silently approximated.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "megamoe/routing.h"
#include "megamoe/types.h"

namespace megamoe::engine {

// How a layer attends. Only GQA (multi-head, grouped KV) today; DeepSeek's MLA is a later choice
// here, not a fork of the model.
enum class AttentionKind : uint8_t { kGqa };

struct ModelConfig {
  std::string model_type;          // "qwen3_moe" | "mixtral"
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  DType checkpoint_dtype = DType::kBF16;  // `dtype` / `torch_dtype`; compute is fp32 regardless
  // Format of the checkpoint's quantized linear weights (`quantization_config`): kBf16 = none;
  // kFp8Block = DeepSeek/Qwen FP8 (quant_method "fp8", weight_block_size [128, 128]).
  WeightFormat checkpoint_format = WeightFormat::kBf16;
  std::vector<int32_t> eos_token_ids;

  // Attention.
  AttentionKind attention = AttentionKind::kGqa;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  bool qk_norm = false;            // per-head RMSNorm on q and k before RoPE (Qwen3)
  double rope_theta = 10000.0;     // default RoPE only (rotate-half layout)

  // Feed-forward: dense layers use `intermediate_size`, MoE layers `moe_intermediate_size`.
  int intermediate_size = 0;
  int moe_intermediate_size = 0;
  int num_experts = 0;
  int top_k = 0;
  RouterConfig router;             // kind + renormalisation; DeepSeek's grouped sigmoid is a choice
  Activation activation;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;

  bool is_moe_layer(int layer) const;
  int q_size() const { return num_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
};

// Recursive merge: objects merge key by key, anything else replaces (null included).
nlohmann::json merge_hf_overrides(nlohmann::json base, const nlohmann::json& overrides);

// Parses an already-merged config object. Throws megamoe::Error naming the field on anything
// unsupported (unknown non-null fields too: set them to null in --hf-overrides to ignore them).
ModelConfig parse_model_config(const nlohmann::json& config);

// Reads <model_dir>/config.json, applies `hf_overrides_json` ("" = none) and parses it.
ModelConfig load_model_config(const std::string& model_dir, const std::string& hf_overrides_json = "");

nlohmann::json read_json_file(const std::string& path);

}  // namespace megamoe::engine
