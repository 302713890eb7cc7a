#include "engine/config.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "megamoe/error.h"

namespace megamoe::engine {
namespace {

using nlohmann::json;

// Fields that do not change inference (training knobs, bookkeeping, generic PretrainedConfig
// attributes). Everything else must be understood or the config is rejected.
const std::set<std::string>& ignored_fields() {
  static const std::set<std::string> fields = {
      "_name_or_path", "architectures", "attention_dropout", "bos_token_id", "pad_token_id",
      "chunk_size_feed_forward", "id2label", "label2id", "initializer_range", "is_encoder_decoder",
      "output_attentions", "output_hidden_states", "output_router_logits", "problem_type",
      "return_dict", "router_aux_loss_coef", "router_jitter_noise", "transformers_version",
      "use_cache", "torchscript", "use_bfloat16", "tokenizer_class", "is_decoder",
      "add_cross_attention", "tie_encoder_decoder", "prefix", "sep_token_id",
      "decoder_start_token_id", "task_specific_params", "finetuning_task", "pruned_heads",
      "tf_legacy_loss", "_attn_implementation_autoset", "max_window_layers", "use_return_dict",
      "cross_attention_hidden_size", "qkv_bias", "moe_aux_loss_coef"};
  return fields;
}

struct FieldReader {
  const json& config;
  std::set<std::string> used;

  bool has(const std::string& field) const {
    return config.contains(field) && !config.at(field).is_null();
  }
  const json& get(const std::string& field) {
    used.insert(field);
    MEGAMOE_CHECK(has(field), "config.json: required field '", field, "' is missing");
    return config.at(field);
  }
  int positive_int(const std::string& field) {
    const json& value = get(field);
    MEGAMOE_CHECK(value.is_number_integer() && value.get<int64_t>() > 0 && value.get<int64_t>() < (1ll << 31),
                  "config.json: '", field, "' = ", value.dump(), " must be a positive integer < 2^31");
    return value.get<int>();
  }
  int positive_int_or(const std::string& field, int fallback) {
    used.insert(field);
    return has(field) ? positive_int(field) : fallback;
  }
  double positive_number(const std::string& field) {
    const json& value = get(field);
    MEGAMOE_CHECK(value.is_number() && value.get<double>() > 0, "config.json: '", field, "' = ",
                  value.dump(), " must be a positive number");
    return value.get<double>();
  }
  bool boolean_or(const std::string& field, bool fallback) {
    used.insert(field);
    if (!has(field)) return fallback;
    const json& value = config.at(field);
    MEGAMOE_CHECK(value.is_boolean(), "config.json: '", field, "' = ", value.dump(), " must be true or false");
    return value.get<bool>();
  }
  // A field that must be absent, null or equal to `allowed` (e.g. attention_bias == false).
  void require_value_or_absent(const std::string& field, const json& allowed, const std::string& why) {
    used.insert(field);
    if (!has(field)) return;
    MEGAMOE_CHECK(config.at(field) == allowed, "config.json: '", field, "' = ", config.at(field).dump(),
                  " is not supported (", why, ")");
  }
  void ignore(const std::string& field) { used.insert(field); }
};

DType parse_checkpoint_dtype(FieldReader& reader) {
  // transformers 5 writes `dtype`, 4.x `torch_dtype`; both may appear.
  for (const char* field : {"dtype", "torch_dtype"}) {
    reader.ignore(field);
    if (!reader.has(field)) continue;
    const json& value = reader.config.at(field);
    MEGAMOE_CHECK(value.is_string(), "config.json: '", field, "' = ", value.dump(), " must be a string");
    const std::string name = value.get<std::string>();
    if (name == "bfloat16") return DType::kBF16;
    if (name == "float16") return DType::kF16;
    if (name == "float32") return DType::kF32;
    MEGAMOE_FAIL("config.json: '", field, "' = \"", name, "\" is not supported (bfloat16, float16, float32)");
  }
  return DType::kBF16;
}

// RoPE: `rope_parameters` (transformers 5) or top-level `rope_theta` + `rope_scaling` (4.x).
double parse_rope(FieldReader& reader) {
  reader.ignore("rope_parameters");
  reader.ignore("rope_scaling");
  reader.ignore("rope_theta");
  double theta = 10000.0;
  auto check_rope_type = [](const std::string& field, const json& params) {
    if (params.is_null()) return;
    MEGAMOE_CHECK(params.is_object(), "config.json: '", field, "' must be an object, got ", params.dump());
    for (const auto& [key, value] : params.items()) {
      if (key == "rope_type" || key == "type") {
        MEGAMOE_CHECK(value == "default", "config.json: '", field, ".", key, "' = ", value.dump(),
                      " is not supported (only default RoPE)");
      } else if (key != "rope_theta" && key != "partial_rotary_factor") {
        MEGAMOE_FAIL("config.json: '", field, ".", key, "' = ", value.dump(),
                     " is not supported (only default RoPE)");
      }
    }
    if (params.contains("partial_rotary_factor")) {
      MEGAMOE_CHECK(params.at("partial_rotary_factor") == 1.0, "config.json: '", field,
                    ".partial_rotary_factor' = ", params.at("partial_rotary_factor").dump(),
                    " is not supported (only full rotary)");
    }
  };
  if (reader.has("rope_theta")) theta = reader.positive_number("rope_theta");
  if (reader.has("rope_scaling")) check_rope_type("rope_scaling", reader.config.at("rope_scaling"));
  if (reader.has("rope_parameters")) {
    const json& params = reader.config.at("rope_parameters");
    check_rope_type("rope_parameters", params);
    if (params.contains("rope_theta")) {
      const json& value = params.at("rope_theta");
      MEGAMOE_CHECK(value.is_number() && value.get<double>() > 0, "config.json: 'rope_parameters.rope_theta' = ",
                    value.dump(), " must be a positive number");
      theta = value.get<double>();
    }
  }
  return theta;
}

std::vector<int32_t> parse_eos(FieldReader& reader) {
  reader.ignore("eos_token_id");
  std::vector<int32_t> ids;
  if (!reader.has("eos_token_id")) return ids;
  const json& value = reader.config.at("eos_token_id");
  auto add = [&](const json& id) {
    MEGAMOE_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "config.json: 'eos_token_id' = ",
                  value.dump(), " must be a non-negative integer or a list of them");
    ids.push_back(id.get<int32_t>());
  };
  if (value.is_array()) {
    for (const json& id : value) add(id);
  } else {
    add(value);
  }
  return ids;
}

// Pre-quantized checkpoints: FP8 with 128x128 block scales, ModelOpt NVFP4, compressed-tensors NVFP4 /
// MXFP4. Which tensors are quantized, and how, is read from the tensors themselves (weights.cpp).
WeightFormat parse_quantization_config(FieldReader& reader) {
  reader.ignore("quantization_config");
  if (!reader.has("quantization_config")) return WeightFormat::kBf16;
  const json& q = reader.config.at("quantization_config");
  MEGAMOE_CHECK(q.is_object(), "config.json: 'quantization_config' must be an object");
  const json method = q.value("quant_method", json());
  if (method == "modelopt") {
    MEGAMOE_CHECK(q.value("quant_algo", json()) == "NVFP4", "config.json: 'quantization_config.quant_algo' = ",
                  q.value("quant_algo", json()).dump(), " is not supported (modelopt: NVFP4)");
    MEGAMOE_CHECK(!q.contains("group_size") || q.at("group_size") == 16,
                  "config.json: 'quantization_config.group_size' = ", q.value("group_size", json()).dump(),
                  " is not supported (NVFP4 groups of 16)");
    return WeightFormat::kNvfp4;
  }
  if (method == "compressed-tensors") {
    const json format = q.value("format", json());
    if (format == "nvfp4-pack-quantized") return WeightFormat::kNvfp4;
    if (format == "mxfp4-pack-quantized") return WeightFormat::kMxfp4;
    MEGAMOE_FAIL("config.json: 'quantization_config.format' = ", format.dump(),
                 " is not supported (compressed-tensors: nvfp4-pack-quantized, mxfp4-pack-quantized)");
  }
  MEGAMOE_CHECK(method == "fp8", "config.json: 'quantization_config.quant_method' = ", method.dump(),
                " is not supported (fp8 with 128x128 blocks, modelopt NVFP4, compressed-tensors NVFP4/MXFP4; or a "
                "BF16 checkpoint with --quantization)");
  for (const auto& [key, value] : q.items()) {
    if (key == "quant_method" || key == "modules_to_not_convert" || key == "ignored_layers") continue;
    // Which tensors are FP8 is read from their dtype, so the two lists above need no interpretation.
    const bool supported = (key == "weight_block_size" && value == json::array({128, 128})) ||
                           (key == "fmt" && value == "e4m3") ||
                           (key == "activation_scheme" && value == "dynamic");
    MEGAMOE_CHECK(supported, "config.json: 'quantization_config.", key, "' = ", value.dump(),
                  " is not supported (weight_block_size [128, 128], fmt e4m3, activation_scheme dynamic)");
  }
  MEGAMOE_CHECK(q.contains("weight_block_size"),
                "config.json: 'quantization_config.weight_block_size' is missing (per-tensor FP8 is not supported)");
  return WeightFormat::kFp8Block;
}

}  // namespace

bool ModelConfig::is_moe_layer(int layer) const {
  if (num_experts == 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

json merge_hf_overrides(json base, const json& overrides) {
  MEGAMOE_CHECK(overrides.is_object(), "--hf-overrides must be a JSON object, got ", overrides.dump());
  for (const auto& [key, value] : overrides.items()) {
    if (value.is_object() && base.contains(key) && base.at(key).is_object()) {
      base[key] = merge_hf_overrides(base.at(key), value);
    } else {
      base[key] = value;
    }
  }
  return base;
}

ModelConfig parse_model_config(const json& config) {
  MEGAMOE_CHECK(config.is_object(), "config.json must hold a JSON object");
  FieldReader reader{config, {}};
  ModelConfig out;
  const json& model_type = reader.get("model_type");
  MEGAMOE_CHECK(model_type == "qwen3_moe" || model_type == "mixtral", "config.json: 'model_type' = ",
                model_type.dump(), " is not supported (qwen3_moe, mixtral)");
  out.model_type = model_type.get<std::string>();
  const bool qwen = out.model_type == "qwen3_moe";

  out.vocab_size = reader.positive_int("vocab_size");
  out.hidden_size = reader.positive_int("hidden_size");
  out.num_layers = reader.positive_int("num_hidden_layers");
  out.max_position_embeddings = reader.positive_int("max_position_embeddings");
  out.rms_norm_eps = static_cast<float>(reader.positive_number("rms_norm_eps"));
  out.tie_word_embeddings = reader.boolean_or("tie_word_embeddings", false);
  out.checkpoint_dtype = parse_checkpoint_dtype(reader);
  out.eos_token_ids = parse_eos(reader);
  for (int32_t id : out.eos_token_ids) {
    MEGAMOE_CHECK(id < out.vocab_size, "config.json: 'eos_token_id' ", id, " must be < vocab_size = ", out.vocab_size);
  }

  // Attention.
  out.num_heads = reader.positive_int("num_attention_heads");
  out.num_kv_heads = reader.positive_int_or("num_key_value_heads", out.num_heads);
  MEGAMOE_CHECK(out.num_heads % out.num_kv_heads == 0, "config.json: 'num_attention_heads' = ", out.num_heads,
                " must be a multiple of 'num_key_value_heads' = ", out.num_kv_heads);
  MEGAMOE_CHECK(reader.has("head_dim") || out.hidden_size % out.num_heads == 0, "config.json: 'hidden_size' = ",
                out.hidden_size, " must be a multiple of 'num_attention_heads' = ", out.num_heads,
                " when 'head_dim' is absent");
  out.head_dim = reader.positive_int_or("head_dim", out.hidden_size / out.num_heads);
  MEGAMOE_CHECK(out.head_dim % 2 == 0, "config.json: 'head_dim' = ", out.head_dim, " must be even (RoPE)");
  out.qk_norm = qwen;
  out.rope_theta = parse_rope(reader);
  reader.require_value_or_absent("attention_bias", false, "no q/k/v/o biases");
  if (qwen) {
    reader.require_value_or_absent("use_sliding_window", false, "full attention only");
    reader.ignore("sliding_window");  // used by transformers only when use_sliding_window is true
  } else {
    reader.require_value_or_absent("sliding_window", nullptr, "full attention only");
  }
  reader.ignore("layer_types");
  if (reader.has("layer_types")) {
    for (const json& type : config.at("layer_types")) {
      MEGAMOE_CHECK(type == "full_attention", "config.json: 'layer_types' contains ", type.dump(),
                    "; only full_attention is supported");
    }
  }
  reader.require_value_or_absent("hidden_act", "silu", "only silu");
  out.activation.kind = Activation::Kind::kSiluMul;

  // Feed-forward and routing.
  out.top_k = reader.positive_int("num_experts_per_tok");
  if (qwen) {
    // transformers 5 maps num_experts <-> num_local_experts; either spelling may be written.
    const char* experts_field = reader.has("num_experts") ? "num_experts" : "num_local_experts";
    reader.ignore("num_experts");
    out.num_experts = reader.positive_int(experts_field);
    out.moe_intermediate_size = reader.positive_int("moe_intermediate_size");
    out.intermediate_size = reader.positive_int_or("intermediate_size", 0);
    out.decoder_sparse_step = reader.positive_int_or("decoder_sparse_step", 1);
    out.router.renormalize = reader.boolean_or("norm_topk_prob", false);
    reader.ignore("mlp_only_layers");
    if (reader.has("mlp_only_layers")) {
      const json& layers = config.at("mlp_only_layers");
      MEGAMOE_CHECK(layers.is_array(), "config.json: 'mlp_only_layers' must be a list of layer indices");
      for (const json& layer : layers) {
        MEGAMOE_CHECK(layer.is_number_integer() && layer.get<int64_t>() >= 0 && layer.get<int64_t>() < (1 << 20),
                      "config.json: 'mlp_only_layers' entry ", layer.dump(), " must be a layer index >= 0");
        // Entries past num_hidden_layers (e.g. after --hf-overrides) name no layer, as in transformers.
        if (layer.get<int>() < out.num_layers) out.mlp_only_layers.push_back(layer.get<int>());
      }
    }
    reader.require_value_or_absent("shared_expert_intermediate_size", 0, "no shared expert in qwen3_moe");
  } else {
    out.num_experts = reader.positive_int("num_local_experts");
    out.moe_intermediate_size = reader.positive_int("intermediate_size");
    out.intermediate_size = out.moe_intermediate_size;
    out.router.renormalize = true;  // Mixtral always renormalises the top-k softmax weights
  }
  MEGAMOE_CHECK(out.top_k <= out.num_experts, "config.json: 'num_experts_per_tok' = ", out.top_k,
                " must be <= the number of experts = ", out.num_experts);
  bool any_dense = false;
  for (int layer = 0; layer < out.num_layers; ++layer) any_dense |= !out.is_moe_layer(layer);
  MEGAMOE_CHECK(!any_dense || out.intermediate_size > 0,
                "config.json: 'intermediate_size' is required: some layers are dense (decoder_sparse_step = ",
                out.decoder_sparse_step, ", mlp_only_layers)");
  out.router.kind = RouterKind::kSoftmaxTopK;
  out.router.num_experts = out.num_experts;
  out.router.top_k = out.top_k;

  out.checkpoint_format = parse_quantization_config(reader);
  for (const auto& [key, value] : config.items()) {
    if (value.is_null() || reader.used.count(key) || ignored_fields().count(key)) continue;
    MEGAMOE_FAIL("config.json: field '", key, "' = ", value.dump().substr(0, 80), " is not supported by the ",
                 out.model_type, " model (set it to null with --hf-overrides to ignore it)");
  }
  return out;
}

json read_json_file(const std::string& path) {
  std::ifstream file(path);
  MEGAMOE_CHECK(file.good(), "cannot open ", path);
  std::stringstream text;
  text << file.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    MEGAMOE_FAIL(path, ": invalid JSON: ", e.what());
  }
}

ModelConfig load_model_config(const std::string& model_dir, const std::string& hf_overrides_json) {
  json config = read_json_file(model_dir + "/config.json");
  if (!hf_overrides_json.empty()) {
    json overrides;
    try {
      overrides = json::parse(hf_overrides_json);
    } catch (const json::exception& e) {
      MEGAMOE_FAIL("--hf-overrides: invalid JSON: ", e.what());
    }
    config = merge_hf_overrides(std::move(config), overrides);
  }
  return parse_model_config(config);
}

}  // namespace megamoe::engine
