#include "engine/model.h"

#include "engine/step_batch.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "megamoe/cpu_ep.h"
#include "megamoe/error.h"
#include "megamoe/moe.h"
#include "megamoe/reference.h"
#include "megamoe/routing.h"

namespace megamoe::engine {
namespace {

// y[t, o] = sum_i x[t, i] * w[o, i]   (x [T, in], w [out, in], y [T, out]); fp32, 8 partial sums.
void linear(const float* x, int64_t tokens, int64_t in, const float* w, int64_t out, float* y) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xr = x + t * in;
    for (int64_t o = 0; o < out; ++o) {
      const float* wr = w + o * in;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= in; i += 8) {
        for (int j = 0; j < 8; ++j) acc[j] += xr[i + j] * wr[i + j];
      }
      float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      for (; i < in; ++i) sum += xr[i] * wr[i];
      y[t * out + o] = sum;
    }
  }
}

// out = x / sqrt(mean(x^2) + eps) * weight, over rows of `size` (in place allowed).
void rms_norm(const float* x, int64_t rows, int64_t size, const float* weight, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * size;
    double sum_sq = 0;
    for (int64_t i = 0; i < size; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / size) + eps);
    for (int64_t i = 0; i < size; ++i) out[r * size + i] = weight[i] * (xr[i] * inv);
  }
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }


// Paged K/V of one layer: [num_blocks, block_size, kv_heads, head_dim] each.
struct KvCache {
  std::vector<float> k, v;
};

// One layer's attention over the packed step, owning that layer's paged KV cache. Implementations
// are picked by ModelConfig::attention (make_attention); DeepSeek's MLA is the next one.
class Attention {
 public:
  virtual ~Attention() = default;
  // x [T, H] (normed) -> out [T, H]; writes the step's K/V into the cache first, then attends.
  virtual void forward(const float* x, const PackedBatch& packed, float* out) = 0;
};

// Grouped-query attention with RoPE (rotate-half, default scaling) and optional per-head q/k RMSNorm.
class GqaAttention final : public Attention {
 public:
  GqaAttention(const ModelConfig& config, const AttentionWeights& weights, int block_size, int num_blocks)
      : config_(config), weights_(weights), block_size_(block_size) {
    const size_t elements = static_cast<size_t>(num_blocks) * block_size * config.kv_size();
    cache_.k.assign(elements, 0.0f);
    cache_.v.assign(elements, 0.0f);
    const int half = config.head_dim / 2;
    inv_freq_.resize(half);
    for (int i = 0; i < half; ++i) {
      inv_freq_[i] = 1.0 / std::pow(config.rope_theta, (2.0 * i) / config.head_dim);
    }
  }

  void forward(const float* x, const PackedBatch& packed, float* out) override {
    const int64_t T = packed.num_tokens, H = config_.hidden_size, D = config_.head_dim;
    const int heads = config_.num_heads, kv_heads = config_.num_kv_heads, group = heads / kv_heads;
    std::vector<float> q(T * config_.q_size()), k(T * config_.kv_size()), v(T * config_.kv_size());
    linear(x, T, H, weights_.q_proj.data(), config_.q_size(), q.data());
    linear(x, T, H, weights_.k_proj.data(), config_.kv_size(), k.data());
    linear(x, T, H, weights_.v_proj.data(), config_.kv_size(), v.data());
    if (config_.qk_norm) {
      rms_norm(q.data(), T * heads, D, weights_.q_norm.data(), config_.rms_norm_eps, q.data());
      rms_norm(k.data(), T * kv_heads, D, weights_.k_norm.data(), config_.rms_norm_eps, k.data());
    }
    for (int64_t t = 0; t < T; ++t) {
      apply_rope(q.data() + t * config_.q_size(), heads, packed.positions[t]);
      apply_rope(k.data() + t * config_.kv_size(), kv_heads, packed.positions[t]);
    }
    const auto& chunks = packed.batch->chunks;
    for (size_t c = 0; c < chunks.size(); ++c) {
      for (size_t i = 0; i < chunks[c].tokens.size(); ++i) {
        const int64_t t = packed.offset[c] + static_cast<int64_t>(i);
        const size_t slot = cache_slot(chunks[c].block_table, packed.positions[t]);
        std::copy_n(k.data() + t * config_.kv_size(), config_.kv_size(), cache_.k.data() + slot);
        std::copy_n(v.data() + t * config_.kv_size(), config_.kv_size(), cache_.v.data() + slot);
      }
    }
    std::vector<float> attended(T * config_.q_size());
    std::vector<float> scores;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (size_t c = 0; c < chunks.size(); ++c) {
      for (size_t i = 0; i < chunks[c].tokens.size(); ++i) {
        const int64_t t = packed.offset[c] + static_cast<int64_t>(i);
        const int32_t context = packed.positions[t] + 1;  // causal: positions [0, p]
        scores.resize(context);
        for (int h = 0; h < heads; ++h) {
          const float* qh = q.data() + t * config_.q_size() + h * D;
          const int64_t kv_offset = static_cast<int64_t>(h / group) * D;
          float max_score = -INFINITY;
          for (int32_t j = 0; j < context; ++j) {
            const float* kj = cache_.k.data() + cache_slot(chunks[c].block_table, j) + kv_offset;
            float dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += qh[d] * kj[d];
            scores[j] = dot * scale;
            max_score = std::max(max_score, scores[j]);
          }
          double denominator = 0;
          for (int32_t j = 0; j < context; ++j) {
            scores[j] = std::exp(scores[j] - max_score);
            denominator += scores[j];
          }
          float* oh = attended.data() + t * config_.q_size() + h * D;
          std::fill_n(oh, D, 0.0f);
          for (int32_t j = 0; j < context; ++j) {
            const float* vj = cache_.v.data() + cache_slot(chunks[c].block_table, j) + kv_offset;
            const float p = static_cast<float>(scores[j] / denominator);
            for (int64_t d = 0; d < D; ++d) oh[d] += p * vj[d];
          }
        }
      }
    }
    linear(attended.data(), T, config_.q_size(), weights_.o_proj.data(), H, out);
  }

 private:
  size_t cache_slot(const std::vector<int32_t>& block_table, int32_t position) const {
    const int64_t block = block_table[position / block_size_];
    return static_cast<size_t>((block * block_size_ + position % block_size_) * config_.kv_size());
  }

  void apply_rope(float* x, int heads, int32_t position) const {
    const int D = config_.head_dim, half = D / 2;
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(position * inv_freq_[i]);
      const float cos = std::cos(angle), sin = std::sin(angle);
      for (int h = 0; h < heads; ++h) {
        float* xh = x + h * D;
        const float a = xh[i], b = xh[i + half];
        xh[i] = a * cos - b * sin;
        xh[i + half] = b * cos + a * sin;
      }
    }
  }

  const ModelConfig& config_;
  const AttentionWeights& weights_;
  int block_size_;
  KvCache cache_;
  std::vector<double> inv_freq_;
};

std::unique_ptr<Attention> make_attention(const ModelConfig& config, const AttentionWeights& weights, int block_size,
                                          int num_blocks) {
  switch (config.attention) {
    case AttentionKind::kGqa: return std::make_unique<GqaAttention>(config, weights, block_size, num_blocks);
  }
  MEGAMOE_FAIL("attention kind ", static_cast<int>(config.attention), " is not implemented");
}

class CpuModelRunner final : public ModelRunner {
 public:
  CpuModelRunner(const ModelConfig& config, const std::string& model_dir, const RunnerOptions& options)
      : config_(config), options_(options) {
    MEGAMOE_CHECK(options.kv_block_size > 0, "kv_block_size = ", options.kv_block_size, " must be positive");
    MEGAMOE_CHECK(options.num_kv_blocks > 0, "num_kv_blocks = ", options.num_kv_blocks, " must be positive");
    MEGAMOE_CHECK(options.max_tokens_per_step > 0, "max_tokens_per_step = ", options.max_tokens_per_step,
                  " must be positive");
    info_.model_type = config.model_type;
    info_.vocab_size = config.vocab_size;
    info_.max_position_embeddings = config.max_position_embeddings;
    info_.eos_token_ids = config.eos_token_ids;
    info_.num_layers = config.num_layers;
    config_.router.validate();

    const WeightFormat expert_format = expert_weight_format(options.load, config);
    MoeConfig moe;
    moe.hidden = config.hidden_size;
    moe.intermediate = config.moe_intermediate_size;
    moe.num_experts = config.num_experts;
    moe.top_k = config.top_k;
    moe.weight_format = expert_format;
    moe.activation = config.activation;
    moe.max_tokens_per_rank = options.max_tokens_per_step;
    const std::string backend_name = normalize_backend_name(options.moe_backend);
    std::vector<MoeBackend*> moe_layers(config.num_layers, nullptr);
    for (int layer = 0; layer < config.num_layers; ++layer) {
      if (!config.is_moe_layer(layer)) continue;
      std::unique_ptr<MoeBackend> backend;
      try {
        if (options.cpu_ep) {
          MEGAMOE_CHECK(options.ep == nullptr, "RunnerOptions: set ep (GPU group) or cpu_ep, not both");
          MEGAMOE_CHECK(backend_name == "reference" || backend_name == "reference_fp32",
                        "expert parallelism on the CPU runs the reference backend only (reference, reference_fp32)");
          const Accumulation accumulation = backend_name == "reference" ? Accumulation::kF64 : Accumulation::kF32;
          backend = make_reference_backend(moe, ReferenceOptions{accumulation}, *options.cpu_ep, options.ep_rank);
        } else {
          backend = make_backend(backend_name, moe, options.ep);
        }
      } catch (const Error& e) {
        MEGAMOE_FAIL("--moe-backend ", options.moe_backend, " cannot run ", config.model_type, " (",
                     weight_format_name(expert_format), " experts): ", e.what());
      }
      MEGAMOE_CHECK(!backend->capabilities().needs_gpu, "--moe-backend ", options.moe_backend,
                    " needs a GPU; the CPU model runner runs the reference backend only");
      moe_layers[layer] = backend.get();
      backends_.push_back(std::move(backend));
    }

    const std::string format = options.load.load_format;
    MEGAMOE_CHECK(format == "auto" || format == "safetensors" || format == "dummy", "--load-format '", format,
                  "' is not supported (auto, safetensors, dummy)");
    std::unique_ptr<WeightSource> source = format == "dummy" ? make_dummy_source(config, options.load.seed)
                                                             : make_checkpoint_source(config, model_dir);
    weights_ = load_model_weights(config_, *source, moe_layers, expert_format, options.load.progress);
    size_t next_backend = 0;
    for (int layer = 0; layer < config.num_layers; ++layer) {
      attention_.push_back(make_attention(config_, weights_.layers[layer].attention, options.kv_block_size,
                                          options.num_kv_blocks));
      moe_of_layer_.push_back(config.is_moe_layer(layer) ? backends_[next_backend++].get() : nullptr);
    }
    for (auto& backend : backends_) backend->warmup(nullptr);
  }

  ~CpuModelRunner() override {
    for (auto& backend : backends_) backend->destroy();
  }

  const ModelInfo& info() const override { return info_; }
  int kv_block_size() const override { return options_.kv_block_size; }
  int num_kv_blocks() const override { return options_.num_kv_blocks; }

  StepOutput step(const StepBatch& batch) override {
    if (!options_.cpu_ep) return run(batch, pack(batch));
    // NOTES: collective step. A rank whose batch is invalid still runs an empty step, so the other
    // ranks' MoE collectives complete, then reports its error.
    PackedBatch packed;
    try {
      packed = pack(batch);
    } catch (const Error&) {
      const StepBatch empty;
      run(empty, pack(empty));
      throw;
    }
    return run(batch, packed);
  }

 private:
  StepOutput run(const StepBatch& batch, const PackedBatch& packed) {
    const int64_t T = packed.num_tokens, H = config_.hidden_size;
    std::vector<float> x(T * H), normed(T * H), delta(T * H);
    for (size_t c = 0, t = 0; c < batch.chunks.size(); ++c) {
      for (int32_t token : batch.chunks[c].tokens) {
        std::copy_n(weights_.embed.data() + static_cast<int64_t>(token) * H, H, x.data() + t * H);
        ++t;
      }
    }
    for (int layer = 0; layer < config_.num_layers; ++layer) {
      const LayerWeights& lw = weights_.layers[layer];
      rms_norm(x.data(), T, H, lw.input_norm.data(), config_.rms_norm_eps, normed.data());
      attention_[layer]->forward(normed.data(), packed, delta.data());
      for (int64_t i = 0; i < T * H; ++i) x[i] += delta[i];
      rms_norm(x.data(), T, H, lw.post_attention_norm.data(), config_.rms_norm_eps, normed.data());
      if (lw.moe) {
        moe_forward(*moe_of_layer_[layer], lw, normed.data(), T, delta.data());
      } else {
        dense_mlp(lw, normed.data(), T, delta.data());
      }
      for (int64_t i = 0; i < T * H; ++i) x[i] += delta[i];
    }
    StepOutput output;
    std::vector<float> last(H);
    for (size_t c = 0; c < batch.chunks.size(); ++c) {
      if (!batch.chunks[c].want_logits) continue;
      const int64_t t = packed.offset[c] + static_cast<int64_t>(batch.chunks[c].tokens.size()) - 1;
      rms_norm(x.data() + t * H, 1, H, weights_.final_norm.data(), config_.rms_norm_eps, last.data());
      std::vector<float> logits(config_.vocab_size);
      linear(last.data(), 1, H, weights_.lm_head_data(), config_.vocab_size, logits.data());
      output.logits.push_back(std::move(logits));
    }
    return output;
  }

  PackedBatch pack(const StepBatch& batch) const {
    return pack_step_batch(batch, BatchLimits{config_.max_position_embeddings, config_.vocab_size,
                                              options_.kv_block_size, options_.num_kv_blocks});
  }

  void dense_mlp(const LayerWeights& lw, const float* x, int64_t T, float* out) const {
    const int64_t H = config_.hidden_size, I = config_.intermediate_size;
    std::vector<float> gate_up(T * 2 * I), act(T * I);
    linear(x, T, H, lw.dense_gate_up.data(), 2 * I, gate_up.data());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < I; ++i) act[t * I + i] = silu(gate_up[t * 2 * I + i]) * gate_up[t * 2 * I + I + i];
    }
    linear(act.data(), T, I, lw.dense_down.data(), H, out);
  }

  // Router (fp32 logits -> top-k) then the backend, in pieces of at most max_tokens_per_step tokens.
  void moe_forward(MoeBackend& backend, const LayerWeights& lw, float* x, int64_t T, float* out) const {
    const int64_t H = config_.hidden_size, E = config_.num_experts, K = config_.top_k;
    std::vector<float> router_logits(T * E), topk_weights(T * K);
    std::vector<int32_t> topk_ids(T * K);
    linear(x, T, H, lw.router.data(), E, router_logits.data());
    RouterInputs inputs;
    inputs.logits = router_logits.data();
    inputs.num_tokens = T;
    route_reference(config_.router, inputs, topk_ids.data(), topk_weights.data());
    // At least one call, even with T = 0: forward() is collective across the EP group, and with
    // a CPU EP group every rank makes as many calls as the rank with the most pieces.
    int64_t pieces = std::max<int64_t>(1, (T + options_.max_tokens_per_step - 1) / options_.max_tokens_per_step);
    if (options_.cpu_ep) pieces = options_.cpu_ep->max_over_ranks(options_.ep_rank, pieces);
    for (int64_t piece = 0; piece < pieces; ++piece) {
      const int64_t begin = std::min<int64_t>(piece * options_.max_tokens_per_step, T);
      const int64_t count = std::clamp<int64_t>(T - begin, 0, options_.max_tokens_per_step);
      MoeInputs moe_inputs;
      moe_inputs.hidden = TensorView::make2d(x + begin * H, DType::kF32, count, H, Device::kCpu);
      moe_inputs.topk_ids = TensorView::make2d(topk_ids.data() + begin * K, DType::kI32, count, K, Device::kCpu);
      moe_inputs.topk_weights =
          TensorView::make2d(topk_weights.data() + begin * K, DType::kF32, count, K, Device::kCpu);
      MoeOutputs moe_outputs;
      moe_outputs.out = TensorView::make2d(out + begin * H, DType::kF32, count, H, Device::kCpu);
      backend.forward(moe_inputs, moe_outputs, nullptr);
    }
  }

  ModelConfig config_;
  RunnerOptions options_;
  ModelInfo info_;
  std::vector<std::unique_ptr<MoeBackend>> backends_;
  std::vector<MoeBackend*> moe_of_layer_;
  ModelWeights weights_;
  std::vector<std::unique_ptr<Attention>> attention_;
};

}  // namespace

WeightFormat expert_weight_format(const LoadOptions& load, const ModelConfig& config) {
  // Dummy weights of a quantized model default to its format; --quantization may pick another.
  if (load.load_format == "dummy") return load.quantization.value_or(config.checkpoint_format);
  if (config.checkpoint_format == WeightFormat::kBf16) return load.quantization.value_or(WeightFormat::kBf16);
  MEGAMOE_CHECK(!load.quantization || *load.quantization == config.checkpoint_format, "--quantization ",
                weight_format_name(*load.quantization), ": the checkpoint is already quantized (",
                weight_format_name(config.checkpoint_format), ", quantization_config); requantizing is not supported");
  return config.checkpoint_format;
}

std::unique_ptr<ModelRunner> make_cpu_model_runner(const ModelConfig& config, const std::string& model_dir,
                                                   const RunnerOptions& options) {
  return std::make_unique<CpuModelRunner>(config, model_dir, options);
}

std::unique_ptr<ModelRunner> make_cpu_model_runner(const std::string& model_dir, const RunnerOptions& options) {
  return make_cpu_model_runner(load_model_config(model_dir, options.hf_overrides), model_dir, options);
}

}  // namespace megamoe::engine
