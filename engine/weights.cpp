#include "engine/weights.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>

#include "engine/safetensors.h"
#include "megamoe/checkpoint.h"
#include "megamoe/error.h"
#include "megamoe/formats.h"

namespace megamoe::engine {
namespace {

std::string layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

// A run of elements of one record; an expert matrix is the concatenation of its segments in row
// order (W13 = gate rows then up rows).
struct Segment {
  const TensorRecord* record;
  int64_t first_element;
  int64_t count;
};

formats::QuantizedMatrix build_matrix(const std::vector<Segment>& segments, int64_t rows, int64_t cols,
                                      WeightFormat format) {
  int64_t total = 0;
  bool all_bf16 = true;
  for (const Segment& s : segments) {
    total += s.count;
    all_bf16 &= s.record->dtype == DType::kBF16;
  }
  MEGAMOE_CHECK(total == rows * cols, "expert matrix [", rows, ", ", cols, "] from ", total, " elements");
  formats::QuantizedMatrix matrix;
  if (format == WeightFormat::kBf16 && all_bf16) {
    // Exact: the BF16 bit patterns move unchanged.
    matrix.format = format;
    matrix.rows = rows;
    matrix.cols = cols;
    matrix.data.resize(static_cast<size_t>(total) * 2);
    size_t offset = 0;
    for (const Segment& s : segments) {
      std::memcpy(matrix.data.data() + offset, s.record->data + s.first_element * 2, s.count * 2);
      offset += s.count * 2;
    }
    return matrix;
  }
  std::vector<float> values(static_cast<size_t>(total));
  int64_t offset = 0;
  for (const Segment& s : segments) {
    convert_to_f32(*s.record, s.first_element, s.count, values.data() + offset);
    offset += s.count;
  }
  return formats::quantize(values.data(), rows, cols, format);
}

class CheckpointSource final : public WeightSource {
 public:
  CheckpointSource(const ModelConfig& config, const std::string& model_dir)
      : config_(config), checkpoint_(model_dir) {}

  bool has(const std::string& name) const override {
    return checkpoint_.has(name) || checkpoint_.has(base_of(name) + ".weight_packed");
  }

  std::vector<float> dense(const std::string& name, const std::vector<int64_t>& shape) const override {
    if (auto quantized = quantized_linear(base_of(name))) {
      check_shape(*quantized, name, shape[0], shape[1]);
      return formats::dequantize(*quantized);  // pre-quantized checkpoint: dense layers run in fp32
    }
    return checkpoint_.read_f32(name, shape);
  }

  ExpertWeights expert(int layer, int expert, WeightFormat format) const override {
    const int64_t H = config_.hidden_size, I = config_.moe_intermediate_size, E = config_.num_experts;
    const std::string moe = moe_prefix(layer);
    ExpertWeights weights;
    // transformers 5 native (fused) names, or one tensor per expert (Qwen: gate/up/down_proj,
    // Mixtral: w1 = gate, w3 = up, w2 = down).
    if (checkpoint_.has(moe + "experts.gate_up_proj")) {
      const TensorRecord& gate_up = checked(moe + "experts.gate_up_proj", {E, 2 * I, H});
      MEGAMOE_CHECK(gate_up.dtype != DType::kFP8E4M3, "tensor '", gate_up.name, "' in ", gate_up.file,
                    ": fused FP8 expert tensors are not supported (per-expert FP8 keys are)");
      const TensorRecord& down = checked(moe + "experts.down_proj", {E, H, I});
      weights.w13 = build_matrix({{&gate_up, expert * 2 * I * H, 2 * I * H}}, 2 * I, H, format);
      weights.w2 = build_matrix({{&down, expert * H * I, H * I}}, H, I, format);
      return weights;
    }
    const std::string e = moe + "experts." + std::to_string(expert) + ".";
    const bool mixtral_names = has(e + "w1.weight");
    const std::string gate_base = e + (mixtral_names ? "w1" : "gate_proj");
    const std::string up_base = e + (mixtral_names ? "w3" : "up_proj");
    const std::string down_base = e + (mixtral_names ? "w2" : "down_proj");
    if (auto gate_q = quantized_linear(gate_base)) {
      // Pre-quantized experts move to the backend unchanged (no requantization).
      MEGAMOE_CHECK(gate_q->format == format, "tensor '", gate_base, "' in ", checkpoint_.dir(), " is ",
                    weight_format_name(gate_q->format), "-quantized; it cannot be loaded as ",
                    weight_format_name(format));
      auto up_q = quantized_linear(up_base);
      auto down_q = quantized_linear(down_base);
      MEGAMOE_CHECK(up_q && down_q && up_q->format == format && down_q->format == format, "expert ", expert,
                    " of layer ", layer, ": gate, up and down must be quantized alike (", gate_base, ")");
      check_shape(*gate_q, gate_base, I, H);
      check_shape(*up_q, up_base, I, H);
      check_shape(*down_q, down_base, H, I);
      weights.w13 = formats::fuse_w13(*gate_q, *up_q);
      weights.w2 = std::move(*down_q);
      return weights;
    }
    const TensorRecord& gate = checked(gate_base + ".weight", {I, H});
    const TensorRecord& up = checked(up_base + ".weight", {I, H});
    const TensorRecord& down = checked(down_base + ".weight", {H, I});
    weights.w13 = build_matrix({{&gate, 0, I * H}, {&up, 0, I * H}}, 2 * I, H, format);
    weights.w2 = build_matrix({{&down, 0, H * I}}, H, I, format);
    return weights;
  }

 private:
  // "model.layers.N.mlp." (Qwen, transformers-5 Mixtral) or "model.layers.N.block_sparse_moe." (Mixtral).
  std::string moe_prefix(int layer) const {
    const std::string block_sparse = layer_prefix(layer) + "block_sparse_moe.";
    return checkpoint_.has(block_sparse + "gate.weight") ? block_sparse : layer_prefix(layer) + "mlp.";
  }
  static std::string base_of(const std::string& name) {
    constexpr std::string_view suffix = ".weight";
    return name.ends_with(suffix) ? name.substr(0, name.size() - suffix.size()) : name;
  }

  // A checkpoint tensor as formats::RawTensor; `f32` holds F32 / BF16 / F16 scales converted to F32.
  formats::RawTensor raw(const std::string& name, std::vector<float>* f32 = nullptr) const {
    const TensorRecord& record = checkpoint_.get(name);
    if (f32 == nullptr || record.dtype == DType::kF32) {
      return formats::RawTensor{record.dtype, record.shape, record.data, record.name + " in " + record.file};
    }
    f32->resize(static_cast<size_t>(record.numel()));
    convert_to_f32(record, 0, record.numel(), f32->data());
    return formats::RawTensor{DType::kF32, record.shape, f32->data(), record.name + " in " + record.file};
  }

  // Linear layer `base` (`<base>.weight` or `<base>.weight_packed` + scales) in the canonical form when
  // the checkpoint stores it quantized, by the tensors present (docs/formats.md, checkpoint conventions):
  //   FP8 block (DeepSeek / Qwen3-FP8): weight E4M3 + weight_scale_inv
  //   NVFP4 ModelOpt:                   weight U8 + weight_scale E4M3 + weight_scale_2
  //   NVFP4 compressed-tensors:         weight_packed + weight_scale E4M3 + weight_global_scale
  //   MXFP4 compressed-tensors:         weight_packed + weight_scale E8M0 / U8
  // nullopt for a plain BF16 / F16 / F32 weight.
  std::optional<formats::QuantizedMatrix> quantized_linear(const std::string& base) const {
    const std::string weight = base + ".weight";
    std::vector<float> scale_f32;
    if (checkpoint_.has(weight) && checkpoint_.get(weight).dtype == DType::kFP8E4M3) {
      return formats::from_deepseek_fp8(raw(weight), raw(weight + "_scale_inv", &scale_f32));
    }
    if (checkpoint_.has(weight + "_scale_2")) {
      return formats::from_modelopt_nvfp4(raw(weight), raw(weight + "_scale"), raw(weight + "_scale_2", &scale_f32));
    }
    if (checkpoint_.has(base + ".weight_packed")) {
      if (checkpoint_.has(base + ".weight_global_scale")) {
        return formats::from_compressed_tensors_nvfp4(raw(base + ".weight_packed"), raw(base + ".weight_scale"),
                                                      raw(base + ".weight_global_scale", &scale_f32));
      }
      return formats::from_mxfp4(raw(base + ".weight_packed"), raw(base + ".weight_scale"));
    }
    return std::nullopt;
  }

  static void check_shape(const formats::QuantizedMatrix& matrix, const std::string& name, int64_t rows,
                          int64_t cols) {
    MEGAMOE_CHECK(matrix.rows == rows && matrix.cols == cols, "quantized tensor '", name, "': shape [", matrix.rows,
                  ", ", matrix.cols, "] but the config needs [", rows, ", ", cols, "]");
  }
  const TensorRecord& checked(const std::string& name, const std::vector<int64_t>& shape) const {
    const TensorRecord& record = checkpoint_.get(name);
    MEGAMOE_CHECK(record.shape == shape, "tensor '", name, "' in ", record.file, ": shape ", record.shape_string(),
                  " but the config needs ", shape_string(shape));
    return record;
  }

  ModelConfig config_;
  Checkpoint checkpoint_;
};

// Seeded uniform values with the standard deviation of a sensible init; every tensor (and every
// expert) has its own stream keyed by its name, so ranks agree on shared tensors and an expert's
// values do not depend on which rank loads it.
class DummySource final : public WeightSource {
 public:
  DummySource(const ModelConfig& config, uint64_t seed) : config_(config), seed_(seed) {}

  bool has(const std::string& name) const override {
    return !(config_.tie_word_embeddings && name == "lm_head.weight");
  }

  std::vector<float> dense(const std::string& name, const std::vector<int64_t>& shape) const override {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    std::vector<float> out(static_cast<size_t>(numel));
    const bool is_norm = name.size() >= 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
    const bool is_embed = name == "model.embed_tokens.weight";
    const double std = is_norm ? 0.1 : is_embed ? 1.0 : 1.0 / std::sqrt(static_cast<double>(shape.back()));
    fill(name, std, out.data(), numel);
    if (is_norm) {
      for (float& v : out) v += 1.0f;
    }
    return out;
  }

  ExpertWeights expert(int layer, int expert, WeightFormat format) const override {
    const int64_t H = config_.hidden_size, I = config_.moe_intermediate_size;
    const std::string e = layer_prefix(layer) + "mlp.experts." + std::to_string(expert) + ".";
    std::vector<float> w13(static_cast<size_t>(2 * I * H)), w2(static_cast<size_t>(H * I));
    fill(e + "gate_up", 1.0 / std::sqrt(static_cast<double>(H)), w13.data(), 2 * I * H);
    fill(e + "down", 1.0 / std::sqrt(static_cast<double>(I)), w2.data(), H * I);
    ExpertWeights weights;
    weights.w13 = to_format(w13, 2 * I, H, format);
    weights.w2 = to_format(w2, H, I, format);
    return weights;
  }

 private:
  static formats::QuantizedMatrix to_format(std::vector<float>& values, int64_t rows, int64_t cols,
                                            WeightFormat format) {
    if (format != WeightFormat::kBf16) return formats::quantize(values.data(), rows, cols, format);
    formats::QuantizedMatrix matrix;
    matrix.format = format;
    matrix.rows = rows;
    matrix.cols = cols;
    matrix.data.resize(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t bits = formats::f32_to_bf16(values[i]);
      matrix.data[2 * i] = static_cast<uint8_t>(bits);
      matrix.data[2 * i + 1] = static_cast<uint8_t>(bits >> 8);
    }
    return matrix;
  }

  // Uniform in [-sqrt(3) std, sqrt(3) std]. The tensor is cut into fixed chunks of kChunk values, each
  // with its own splitmix64 stream keyed by (seed, name, chunk), so the values do not depend on how
  // many threads fill them; chunks are spread over the cores (full-size dummy models have ~10^10 values).
  void fill(const std::string& name, double std, float* out, int64_t count) const {
    constexpr int64_t kChunk = int64_t{1} << 18;
    uint64_t key = seed_ ^ 0x9E3779B97F4A7C15ull;
    for (char c : name) key = (key ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;  // FNV-1a
    const float half_width = static_cast<float>(std * std::sqrt(3.0));
    const int64_t chunks = (count + kChunk - 1) / kChunk;
    auto fill_chunk = [&](int64_t chunk) {
      uint64_t state = key + static_cast<uint64_t>(chunk) * 0xD1B54A32D192ED03ull;
      const int64_t end = std::min(count, (chunk + 1) * kChunk);
      for (int64_t i = chunk * kChunk; i < end; i += 2) {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        // Two 24-bit uniforms per draw, mapped to [-1, 1).
        out[i] = (static_cast<float>(z >> 40) * 0x1.0p-23f - 1.0f) * half_width;
        if (i + 1 < end) out[i + 1] = (static_cast<float>((z >> 8) & 0xFFFFFF) * 0x1.0p-23f - 1.0f) * half_width;
      }
    };
    const int64_t threads = std::min<int64_t>({chunks, std::max(1u, std::thread::hardware_concurrency()), 32});
    if (threads <= 1) {
      for (int64_t chunk = 0; chunk < chunks; ++chunk) fill_chunk(chunk);
      return;
    }
    std::atomic<int64_t> next{0};
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        for (int64_t chunk = next++; chunk < chunks; chunk = next++) fill_chunk(chunk);
      });
    }
    for (auto& thread : pool) thread.join();
  }

  ModelConfig config_;
  uint64_t seed_;
};

class ProgressBar {
 public:
  ProgressBar(bool enabled, int64_t total)
      : enabled_(enabled), interactive_(::isatty(STDERR_FILENO) == 1), total_(total), start_(clock::now()) {}
  // Redraws at most every 100 ms on a terminal; a log file gets the final line only.
  void advance(int64_t done) {
    if (!enabled_) return;
    const auto now = clock::now();
    if (done < total_ && (!interactive_ || now - last_ < std::chrono::milliseconds(100))) return;
    last_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(total_, 1));
    const double seconds = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "%sLoading weights [%.*s%*s] %lld/%lld layers %.1fs", interactive_ ? "\r" : "", filled,
                 "##############################", kWidth - filled, "", static_cast<long long>(done),
                 static_cast<long long>(total_), seconds);
    if (done >= total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  using clock = std::chrono::steady_clock;
  bool enabled_, interactive_;
  int64_t total_;
  clock::time_point start_, last_{};
};

}  // namespace

std::unique_ptr<WeightSource> make_checkpoint_source(const ModelConfig& config, const std::string& model_dir) {
  return std::make_unique<CheckpointSource>(config, model_dir);
}

std::unique_ptr<WeightSource> make_dummy_source(const ModelConfig& config, uint64_t seed) {
  return std::make_unique<DummySource>(config, seed);
}

namespace {

// Reading (or generating) and quantizing an expert is the CPU-heavy part of loading a full-size model
// (Qwen3-30B-A3B: 3072 experts per rank at EP2), so a layer's experts are produced by several threads
// at once, in batches (bounded host memory), and handed to the backend in order on this thread
// (load_expert uploads synchronously and is not thread-safe). WeightSource::expert is const and
// reads immutable data (mmap'ed files, seeded streams): safe to call concurrently.
void load_layer_experts(const WeightSource& source, int layer, MoeBackend& backend, WeightFormat format) {
  const int count = backend.num_local_experts(), first = backend.first_local_expert();
  const int threads = std::max(1, std::min<int>({count, static_cast<int>(std::thread::hardware_concurrency()), 16}));
  for (int begin = 0; begin < count; begin += threads) {
    const int batch = std::min(threads, count - begin);
    std::vector<ExpertWeights> produced(batch);
    std::vector<std::exception_ptr> errors(batch);
    std::vector<std::thread> pool;
    for (int i = 0; i < batch; ++i) {
      pool.emplace_back([&, i] {
        try {
          produced[i] = source.expert(layer, first + begin + i, format);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
    for (auto& thread : pool) thread.join();
    for (int i = 0; i < batch; ++i) {
      if (errors[i]) std::rethrow_exception(errors[i]);  // the lowest expert's error, as a serial load
      backend.load_expert(begin + i, produced[i]);
    }
  }
}

}  // namespace

ModelWeights load_model_weights(const ModelConfig& config, const WeightSource& source,
                                const std::vector<MoeBackend*>& moe_layers, WeightFormat expert_format,
                                bool progress) {
  MEGAMOE_CHECK(static_cast<int>(moe_layers.size()) == config.num_layers, "moe_layers has ", moe_layers.size(),
                " entries, expected num_hidden_layers = ", config.num_layers);
  const int64_t V = config.vocab_size, H = config.hidden_size, D = config.head_dim;
  ModelWeights weights;
  ProgressBar bar(progress, config.num_layers + 1);
  weights.embed = source.dense("model.embed_tokens.weight", {V, H});
  weights.final_norm = source.dense("model.norm.weight", {H});
  if (!config.tie_word_embeddings) weights.lm_head = source.dense("lm_head.weight", {V, H});
  bar.advance(1);
  weights.layers.resize(config.num_layers);
  for (int layer = 0; layer < config.num_layers; ++layer) {
    LayerWeights& lw = weights.layers[layer];
    const std::string p = layer_prefix(layer);
    lw.input_norm = source.dense(p + "input_layernorm.weight", {H});
    lw.post_attention_norm = source.dense(p + "post_attention_layernorm.weight", {H});
    AttentionWeights& a = lw.attention;
    a.q_proj = source.dense(p + "self_attn.q_proj.weight", {config.q_size(), H});
    a.k_proj = source.dense(p + "self_attn.k_proj.weight", {config.kv_size(), H});
    a.v_proj = source.dense(p + "self_attn.v_proj.weight", {config.kv_size(), H});
    a.o_proj = source.dense(p + "self_attn.o_proj.weight", {H, config.q_size()});
    if (config.qk_norm) {
      a.q_norm = source.dense(p + "self_attn.q_norm.weight", {D});
      a.k_norm = source.dense(p + "self_attn.k_norm.weight", {D});
    }
    lw.moe = config.is_moe_layer(layer);
    if (lw.moe) {
      MoeBackend* backend = moe_layers[layer];
      MEGAMOE_CHECK(backend != nullptr, "layer ", layer, " is an MoE layer but has no MoE backend");
      const std::string block_sparse = p + "block_sparse_moe.gate.weight";
      lw.router = source.dense(source.has(block_sparse) ? block_sparse : p + "mlp.gate.weight",
                               {config.num_experts, H});
      load_layer_experts(source, layer, *backend, expert_format);
    } else {
      const int64_t I = config.intermediate_size;
      const std::vector<float> gate = source.dense(p + "mlp.gate_proj.weight", {I, H});
      const std::vector<float> up = source.dense(p + "mlp.up_proj.weight", {I, H});
      lw.dense_gate_up = gate;
      lw.dense_gate_up.insert(lw.dense_gate_up.end(), up.begin(), up.end());
      lw.dense_down = source.dense(p + "mlp.down_proj.weight", {H, I});
    }
    bar.advance(layer + 2);
  }
  return weights;
}

}  // namespace megamoe::engine
