// The GPU model runner (gpu_model.h).
#include "engine/gpu_model.h"

#include "megamoe/error.h"

#ifdef MEGAMOE_WITH_CUDA

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "engine/cudnn_attention.h"
#include "engine/gpu_ops.h"
#include "engine/gpu_plan.h"
#include "engine/step_batch.h"
#include "engine/weights.h"
#include "megamoe/ep.h"
#include "megamoe/error_cuda.h"
#include "megamoe/formats.h"
#include "megamoe/moe.h"
#include "megamoe/routing_cuda.h"

#define MEGAMOE_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                               \
    const cublasStatus_t megamoe_cublas_status = (call);                                             \
    MEGAMOE_CHECK(megamoe_cublas_status == CUBLAS_STATUS_SUCCESS, #call, " failed: ",               \
                  cublasGetStatusString(megamoe_cublas_status));                                     \
  } while (0)

namespace megamoe::engine {
namespace {

// A device allocation freed with the runner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { resize(bytes); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }
  // Grows (contents lost) when `bytes` exceeds the capacity.
  void resize(size_t bytes) {
    if (bytes <= bytes_ && data_) return;
    if (data_) MEGAMOE_CUDA_CHECK(cudaFree(data_));
    data_ = nullptr;
    MEGAMOE_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(bytes, 16)));
    bytes_ = bytes;
  }
  template <typename T = void>
  T* get() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

DeviceBuffer upload_bytes(const void* host, size_t bytes) {
  DeviceBuffer buffer(bytes);
  if (bytes) MEGAMOE_CUDA_CHECK(cudaMemcpy(buffer.get(), host, bytes, cudaMemcpyHostToDevice));
  return buffer;
}
DeviceBuffer upload_f32(const std::vector<float>& values) { return upload_bytes(values.data(), values.size() * 4); }
// Dense weights are fp32 on the host (weights.h); BF16 checkpoints round-trip exactly.
DeviceBuffer upload_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = formats::f32_to_bf16(values[i]);
  return upload_bytes(bits.data(), bits.size() * 2);
}

struct GpuLayer {
  DeviceBuffer input_norm, post_attention_norm;  // fp32 [H]
  DeviceBuffer qkv;                              // bf16 [(Hq + 2 Hkv) D, H]: q rows, k rows, v rows
  DeviceBuffer o;                                // bf16 [H, Hq D]
  DeviceBuffer q_norm, k_norm;                   // fp32 [D] (qk_norm)
  DeviceBuffer k_cache, v_cache;                 // bf16 [blocks, block_size, Hkv, D]
  bool moe = false;
  DeviceBuffer router;                           // fp32 [E, H]
  MoeBackend* backend = nullptr;
  DeviceBuffer gate_up, down;                    // bf16 [2I, H], [H, I] (dense layers)
};

// Per-step metadata uploaded in one copy; offsets in int32 words (slot_mapping is int64: 2 words).
struct StepMeta {
  std::vector<int32_t> words;
  size_t token_ids = 0, positions = 0, seq_of_token = 0, slots = 0, block_tables = 0, logit_rows = 0;
};

class GpuModelRunner final : public ModelRunner {
 public:
  GpuModelRunner(const ModelConfig& config, const std::string& model_dir, const RunnerOptions& options)
      : config_(config), options_(options) {
    MEGAMOE_CHECK(options.kv_block_size > 0, "kv_block_size = ", options.kv_block_size, " must be positive");
    MEGAMOE_CHECK(options.kv_cache_from_memory || options.num_kv_blocks > 0, "num_kv_blocks = ", options.num_kv_blocks,
                  " must be positive");
    MEGAMOE_CHECK(options.gpu_memory_utilization > 0 && options.gpu_memory_utilization <= 1,
                  "--gpu-memory-utilization ", options.gpu_memory_utilization, " must be in (0, 1]");
    MEGAMOE_CHECK(options.max_graph_batch >= 1, "--max-graph-batch ", options.max_graph_batch, " must be >= 1");
    MEGAMOE_CHECK(options.max_tokens_per_step > 0, "max_tokens_per_step = ", options.max_tokens_per_step,
                  " must be positive");
    MEGAMOE_CHECK(!options.cpu_ep, "the GPU runner takes a GPU EpGroup (RunnerOptions::ep), not cpu_ep");
    MEGAMOE_CHECK(options.attention == "auto" || options.attention == "cudnn" || options.attention == "paged",
                  "attention '", options.attention, "' is not supported (auto, cudnn, paged)");
    MEGAMOE_CHECK(config.attention == AttentionKind::kGqa, "the GPU runner implements GQA attention only");
    config_.router.validate();
    info_.model_type = config.model_type;
    info_.vocab_size = config.vocab_size;
    info_.max_position_embeddings = config.max_position_embeddings;
    info_.eos_token_ids = config.eos_token_ids;
    info_.num_layers = config.num_layers;

    device_ = options.ep ? options.ep->device() : options.cuda_device;
    try {
      initialize(model_dir);
    } catch (...) {
      release();  // no destructor runs for a constructor that throws
      throw;
    }
  }

  ~GpuModelRunner() override { release(); }

  const ModelInfo& info() const override { return info_; }
  int kv_block_size() const override { return options_.kv_block_size; }
  int num_kv_blocks() const override { return num_kv_blocks_; }
  std::string memory_report() const override { return memory_report_; }
  int decode_graphs_captured() const override { return static_cast<int>(graphs_.size()); }
  int64_t decode_graph_replays() const override { return graph_replays_; }

  StepOutput step(const StepBatch& batch) override {
    MEGAMOE_CUDA_CHECK(cudaSetDevice(device_));
    const BatchLimits limits{config_.max_position_embeddings, config_.vocab_size, options_.kv_block_size,
                             num_kv_blocks_};
    if (!collective()) return run(batch, pack_step_batch(batch, limits));
    // NOTES: collective step. A rank whose batch is invalid still runs an empty step, so the other
    // ranks' MoE collectives complete, then reports its error.
    PackedBatch packed;
    try {
      packed = pack_step_batch(batch, limits);
      MEGAMOE_CHECK(packed.num_tokens <= options_.max_tokens_per_step, "step: ", packed.num_tokens,
                    " tokens exceed --max-num-batched-tokens = ", options_.max_tokens_per_step,
                    " (expert-parallel steps are not split)");
    } catch (const Error&) {
      const StepBatch empty;
      run(empty, pack_step_batch(empty, limits));
      throw;
    }
    return run(batch, packed);
  }

 private:
  void initialize(const std::string& model_dir) {
    const ModelConfig& config = config_;
    const RunnerOptions& options = options_;
    MEGAMOE_CUDA_CHECK(cudaSetDevice(device_));
    MEGAMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MEGAMOE_CUBLAS_CHECK(cublasCreate(&cublas_));
    MEGAMOE_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));

    const int64_t used_at_start = device_memory_used();
    create_backends();
    const std::string format = options.load.load_format;
    MEGAMOE_CHECK(format == "auto" || format == "safetensors" || format == "dummy", "--load-format '", format,
                  "' is not supported (auto, safetensors, dummy)");
    {
      std::unique_ptr<WeightSource> source = format == "dummy" ? make_dummy_source(config, options.load.seed)
                                                               : make_checkpoint_source(config, model_dir);
      std::vector<MoeBackend*> moe_layers(config.num_layers, nullptr);
      for (int layer = 0; layer < config.num_layers; ++layer) moe_layers[layer] = backend_of_layer_[layer];
      ModelWeights weights = load_model_weights(config_, *source, moe_layers, expert_format_, options.load.progress);
      upload_weights(weights);
    }
    build_rope_tables();
    const int64_t used_after_weights = device_memory_used();
    std::string why_not;
    if (options.attention != "paged" && gpu::cudnn_attention_available(&why_not)) {
      cudnn_ = std::make_unique<gpu::CudnnVarlenAttention>(config.num_heads, config.num_kv_heads, config.head_dim);
    }
    MEGAMOE_CHECK(options.attention != "cudnn" || cudnn_, "--attention cudnn: ", why_not);
    // NOTES: cuBLAS gets its workspace from us, so a captured GEMM never allocates.
    cublas_workspace_.resize(kCublasWorkspaceBytes);
    MEGAMOE_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_.get(), cublas_workspace_.bytes()));
    attn_split_.resize(gpu::paged_attention_decode_workspace_bytes(config.num_heads, config.num_kv_heads, config.head_dim));
    // Activation buffers at their steady-state size before the KV cache takes the rest: a step of up
    // to max_tokens_per_step tokens and as many logit rows as sequences a decode graph holds.
    reserve(options.max_tokens_per_step, std::min(options.max_tokens_per_step, std::max(options.max_graph_batch, 256)));
    for (auto& backend : backends_) backend->warmup(host_moe_ ? nullptr : stream_);
    MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    graphs_enabled_ = !options.enforce_eager && !host_moe_;
    if (graphs_enabled_) {
      graph_buckets_ = decode_graph_buckets(std::min(options.max_graph_batch, options.max_tokens_per_step));
      graph_blocks_per_seq_ = (config.max_position_embeddings + options.kv_block_size - 1) / options.kv_block_size;
      graph_meta_host_ = graph_meta_layout(graph_buckets_.back());
      graph_meta_.resize(graph_meta_host_.words.size() * 4);
    }
    const int64_t used_before_cache = device_memory_used();
    allocate_kv_cache();
    const int64_t used_after_cache = device_memory_used();
    const double gib = 1024.0 * 1024.0 * 1024.0;
    char line[512];
    std::snprintf(line, sizeof(line),
                  "device %d memory: weights + MoE workspace %.2f GiB (MoE workspace %.2f GiB local + %.2f GiB "
                  "symmetric, shared by %zu MoE layers), activations + cuBLAS %.2f GiB, KV cache %.2f GiB (%d blocks "
                  "x %d tokens); in use %.2f GiB",
                  device_, (used_after_weights - used_at_start) / gib,
                  moe_workspace_ ? moe_workspace_->device_bytes() / gib : 0.0,
                  moe_workspace_ ? moe_workspace_->symmetric_bytes() / gib : 0.0, backends_.size(),
                  (used_before_cache - used_after_weights) / gib, (used_after_cache - used_before_cache) / gib,
                  num_kv_blocks_, options.kv_block_size, used_after_cache / gib);
    memory_report_ = line;
    if (!kv_plan_line_.empty()) memory_report_ += "\n" + kv_plan_line_;
    if (options.load.progress) std::fprintf(stderr, "megamoe: %s\n", memory_report_.c_str());
  }

  static int64_t device_memory_used() {
    size_t free_bytes = 0, total_bytes = 0;
    MEGAMOE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<int64_t>(total_bytes - free_bytes);
  }

  // The paged cache [blocks, block_size, Hkv, D] bf16 per layer, K and V: --num-kv-blocks, or (the
  // CLI's default) what --gpu-memory-utilization leaves after everything else (engine/gpu_plan.h).
  void allocate_kv_cache() {
    num_kv_blocks_ = options_.num_kv_blocks;
    if (options_.kv_cache_from_memory) {
      size_t free_bytes = 0, total_bytes = 0;
      MEGAMOE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
      KvCachePlanInputs in;
      in.total_bytes = static_cast<int64_t>(total_bytes);
      in.free_bytes = static_cast<int64_t>(free_bytes);
      in.gpu_memory_utilization = options_.gpu_memory_utilization;
      in.block_bytes = kv_block_bytes(config_.num_layers, options_.kv_block_size, config_.num_kv_heads, config_.head_dim);
      in.reserve_bytes = kKvReserveBytes;
      const KvCachePlan plan = plan_kv_cache(in);
      num_kv_blocks_ = plan.num_blocks;
      kv_plan_line_ = describe_kv_cache_plan(plan, in, options_.kv_block_size);
    }
    const size_t cache_bytes = static_cast<size_t>(num_kv_blocks_) * options_.kv_block_size * config_.kv_size() *
                               sizeof(uint16_t);
    for (GpuLayer& g : layers_) {
      g.k_cache.resize(cache_bytes);
      g.v_cache.resize(cache_bytes);
    }
  }

  // Frees what initialize() got, in dependency order (backends before their group); idempotent.
  void release() noexcept {
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& [bucket, graph] : graphs_) cudaGraphExecDestroy(graph.exec);
    graphs_.clear();
    for (auto& backend : backends_) {
      try {
        backend->destroy();
      } catch (...) {
      }
    }
    backends_.clear();
    if (moe_workspace_) moe_workspace_->release();
    moe_workspace_.reset();
    cudnn_.reset();
    if (own_group_) {
      try {
        own_group_->destroy();
      } catch (...) {
      }
    }
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
    cublas_ = nullptr;
    stream_ = nullptr;
  }

  bool collective() const { return options_.ep != nullptr && options_.ep->size() > 1; }

  void create_backends() {
    expert_format_ = expert_weight_format(options_.load, config_);
    MoeConfig moe;
    moe.hidden = config_.hidden_size;
    moe.intermediate = config_.moe_intermediate_size;
    moe.num_experts = config_.num_experts;
    moe.top_k = config_.top_k;
    moe.weight_format = expert_format_;
    moe.activation = config_.activation;
    moe.max_tokens_per_rank = options_.max_tokens_per_step;
    const std::string name = normalize_backend_name(options_.moe_backend);
    backend_of_layer_.assign(config_.num_layers, nullptr);
    EpGroup* group = options_.ep;
    const bool cpu_backend = name.rfind("reference", 0) == 0;
    if (group == nullptr && !cpu_backend && config_.num_experts > 0) {
      // One private single-rank group shared by every layer's backend (a backend given none would
      // bootstrap its own NCCL communicator per layer).
      const auto path = std::filesystem::temp_directory_path() /
                        ("megamoe-runner-" + std::to_string(getpid()) + "-" +
                         std::to_string(reinterpret_cast<uintptr_t>(this)));
      own_group_ = EpGroup::bootstrap(0, 1, "file:" + path.string(), device_);
      std::filesystem::remove(path);
      group = own_group_.get();
    }
    group_ = cpu_backend ? nullptr : group;
    // NOTES: one workspace for all layers: they run one after another on stream_, so one EP window
    // and one set of GEMM scratch serve them all (moe.h, docs/moe_workspace.md).
    moe_workspace_ = make_moe_workspace();
    for (int layer = 0; layer < config_.num_layers; ++layer) {
      if (!config_.is_moe_layer(layer)) continue;
      std::unique_ptr<MoeBackend> backend;
      try {
        backend = make_backend(name, moe, cpu_backend ? options_.ep : group, moe_workspace_);
      } catch (const Error& e) {
        MEGAMOE_FAIL("--moe-backend ", options_.moe_backend, " cannot run ", config_.model_type, " (",
                     weight_format_name(expert_format_), " experts): ", e.what());
      }
      const bool on_host = !backend->capabilities().needs_gpu;
      MEGAMOE_CHECK(!on_host || !collective(), "--moe-backend ", options_.moe_backend,
                    " runs on the CPU: the GPU runner supports it on one rank only (a test mode)");
      host_moe_ = on_host;
      backend_of_layer_[layer] = backend.get();
      backends_.push_back(std::move(backend));
    }
  }

  void upload_weights(const ModelWeights& w) {
    const int64_t V = config_.vocab_size, H = config_.hidden_size;
    embed_ = upload_bf16(w.embed);
    final_norm_ = upload_f32(w.final_norm);
    tied_ = w.lm_head.empty();
    if (!tied_) lm_head_ = upload_bf16(w.lm_head);
    MEGAMOE_CHECK(static_cast<int64_t>(w.embed.size()) == V * H, "embed has ", w.embed.size(), " values");
    layers_.resize(config_.num_layers);
    for (int l = 0; l < config_.num_layers; ++l) {
      const LayerWeights& lw = w.layers[l];
      GpuLayer& g = layers_[l];
      g.input_norm = upload_f32(lw.input_norm);
      g.post_attention_norm = upload_f32(lw.post_attention_norm);
      std::vector<float> qkv = lw.attention.q_proj;
      qkv.insert(qkv.end(), lw.attention.k_proj.begin(), lw.attention.k_proj.end());
      qkv.insert(qkv.end(), lw.attention.v_proj.begin(), lw.attention.v_proj.end());
      g.qkv = upload_bf16(qkv);
      g.o = upload_bf16(lw.attention.o_proj);
      if (config_.qk_norm) {
        g.q_norm = upload_f32(lw.attention.q_norm);
        g.k_norm = upload_f32(lw.attention.k_norm);
      }
      g.moe = lw.moe;
      if (lw.moe) {
        g.router = upload_f32(lw.router);
        g.backend = backend_of_layer_[l];
      } else {
        g.gate_up = upload_bf16(lw.dense_gate_up);
        g.down = upload_bf16(lw.dense_down);
      }
    }
  }

  // cos/sin [max_position, D/2], computed exactly as the CPU runner does (double inverse frequency,
  // fp32 angle).
  void build_rope_tables() {
    const int half = config_.head_dim / 2, positions = config_.max_position_embeddings;
    std::vector<double> inv_freq(half);
    for (int i = 0; i < half; ++i) inv_freq[i] = 1.0 / std::pow(config_.rope_theta, (2.0 * i) / config_.head_dim);
    std::vector<float> cos(static_cast<size_t>(positions) * half), sin(cos.size());
    for (int p = 0; p < positions; ++p) {
      for (int i = 0; i < half; ++i) {
        const float angle = static_cast<float>(p * inv_freq[i]);
        cos[static_cast<size_t>(p) * half + i] = std::cos(angle);
        sin[static_cast<size_t>(p) * half + i] = std::sin(angle);
      }
    }
    rope_cos_ = upload_f32(cos);
    rope_sin_ = upload_f32(sin);
  }

  // Work buffers for `tokens` packed tokens and `rows` logit rows.
  void reserve(int64_t tokens, int64_t rows) {
    tokens = std::max<int64_t>(tokens, 1);
    rows = std::max<int64_t>(rows, 1);
    if (tokens > reserved_tokens_) {
      MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      ++buffer_generation_;  // captured decode graphs point at the old buffers
      const int64_t H = config_.hidden_size, Q = config_.q_size(), KV = config_.kv_size();
      const int64_t I = std::max(config_.intermediate_size, 1), E = std::max(config_.num_experts, 1);
      const int64_t K = std::max(config_.top_k, 1);
      x_.resize(tokens * H * 4);
      normed_.resize(tokens * H * 2);
      normed_f32_.resize(tokens * H * 4);
      qkv_.resize(tokens * (Q + 2 * KV) * 2);
      q_.resize(tokens * Q * 2);
      k_packed_.resize(tokens * KV * 2);
      v_packed_.resize(tokens * KV * 2);
      attn_.resize(tokens * Q * 2);
      gate_up_.resize(tokens * 2 * I * 2);
      act_.resize(tokens * I * 2);
      moe_out_.resize(tokens * H * 4);  // bf16 from GPU backends, fp32 from a host backend
      router_logits_.resize(tokens * E * 4);
      topk_ids_.resize(tokens * K * 4);
      topk_weights_.resize(tokens * K * 4);
      reserved_tokens_ = tokens;
    }
    if (rows > reserved_rows_) {
      MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      ++buffer_generation_;
      last_normed_.resize(rows * config_.hidden_size * 2);
      logits_.resize(rows * static_cast<int64_t>(config_.vocab_size) * 4);
      reserved_rows_ = rows;
    }
  }

  StepMeta build_meta(const StepBatch& batch, const PackedBatch& packed, int64_t* logit_rows,
                      int* max_blocks) const {
    StepMeta m;
    const int64_t T = packed.num_tokens;
    int blocks = 1;
    for (const auto& chunk : batch.chunks) blocks = std::max(blocks, static_cast<int>(chunk.block_table.size()));
    *max_blocks = blocks;
    const size_t B = std::max<size_t>(batch.chunks.size(), 1);
    m.token_ids = 0;
    m.positions = m.token_ids + T;
    m.seq_of_token = m.positions + T;
    m.slots = (m.seq_of_token + T + 1) & ~size_t{1};  // int64 alignment
    m.block_tables = m.slots + 2 * T;
    m.logit_rows = m.block_tables + B * blocks;
    m.words.assign(m.logit_rows + B, 0);
    int64_t rows = 0;
    for (size_t c = 0; c < batch.chunks.size(); ++c) {
      const SequenceChunk& chunk = batch.chunks[c];
      std::copy(chunk.block_table.begin(), chunk.block_table.end(), m.words.begin() + m.block_tables + c * blocks);
      for (size_t i = 0; i < chunk.tokens.size(); ++i) {
        const int64_t t = packed.offset[c] + static_cast<int64_t>(i);
        const int32_t position = packed.positions[t];
        m.words[m.token_ids + t] = chunk.tokens[i];
        m.words[m.positions + t] = position;
        m.words[m.seq_of_token + t] = static_cast<int32_t>(c);
        const int64_t slot = static_cast<int64_t>(chunk.block_table[position / options_.kv_block_size]) *
                                 options_.kv_block_size + position % options_.kv_block_size;
        std::memcpy(&m.words[m.slots + 2 * t], &slot, sizeof(slot));
      }
      if (chunk.want_logits) {
        m.words[m.logit_rows + rows++] = static_cast<int32_t>(packed.offset[c] + chunk.tokens.size() - 1);
      }
    }
    *logit_rows = rows;
    return m;
  }

  // y[T, out] (+)= x[T, in] w[out, in]^T: bf16 or fp32 operands, fp32 accumulation.
  void gemm(const void* x, cudaDataType x_type, int64_t T, int64_t in, const void* w, cudaDataType w_type,
            int64_t out, void* y, cudaDataType y_type, bool accumulate) {
    if (T == 0) return;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    MEGAMOE_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(T),
                                      static_cast<int>(in), &alpha, w, w_type, static_cast<int>(in), x, x_type,
                                      static_cast<int>(in), &beta, y, y_type, static_cast<int>(out),
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // Device pointers and sizes of one forward: the eager step's metadata (meta_) or a decode graph's
  // fixed-capacity copy (graph_meta_).
  struct ForwardArgs {
    const int32_t *token_ids = nullptr, *positions = nullptr, *seq_of_token = nullptr;
    const int32_t *block_tables = nullptr, *logit_rows = nullptr;
    const int64_t* slots = nullptr;
    int64_t tokens = 0, rows = 0;
    int num_seqs = 1, max_blocks = 1;
    bool whole_prefill = false;
    std::vector<int32_t> seq_lens;
  };
  static ForwardArgs forward_pointers(const StepMeta& meta, const int32_t* words) {
    ForwardArgs a;
    a.token_ids = words + meta.token_ids;
    a.positions = words + meta.positions;
    a.seq_of_token = words + meta.seq_of_token;
    a.slots = reinterpret_cast<const int64_t*>(words + meta.slots);
    a.block_tables = words + meta.block_tables;
    a.logit_rows = words + meta.logit_rows;
    return a;
  }

  StepOutput run(const StepBatch& batch, const PackedBatch& packed) {
    if (graphs_enabled_) {
      const int bucket = decode_bucket(batch);
      if (bucket > 0) return run_decode_graph(batch, bucket);
    }
    const int64_t T = packed.num_tokens;
    int64_t rows = 0;
    int max_blocks = 1;
    StepMeta meta = build_meta(batch, packed, &rows, &max_blocks);
    reserve(T, rows);
    meta_.resize(meta.words.size() * 4);
    MEGAMOE_CUDA_CHECK(cudaMemcpyAsync(meta_.get(), meta.words.data(), meta.words.size() * 4,
                                       cudaMemcpyHostToDevice, stream_));
    ForwardArgs a = forward_pointers(meta, meta_.get<int32_t>());
    a.tokens = T;
    a.rows = rows;
    a.num_seqs = static_cast<int>(std::max<size_t>(batch.chunks.size(), 1));
    a.max_blocks = max_blocks;
    // Whole-sequence prefill (every chunk starts at position 0): cuDNN over the step's packed K/V.
    a.whole_prefill = cudnn_ != nullptr && T > 0;
    for (const auto& chunk : batch.chunks) {
      a.whole_prefill &= chunk.start_position == 0;
      a.seq_lens.push_back(static_cast<int32_t>(chunk.tokens.size()));
    }
    launch_forward(a);
    std::vector<int64_t> wanted;
    for (int64_t r = 0; r < rows; ++r) wanted.push_back(r);
    return fetch_logits(rows, wanted);
  }

  // ---- CUDA graphs for decode steps ------------------------------------------------------------
  // NOTES: a decode step (every chunk one new token) of n <= max bucket sequences replays the graph of
  // the smallest bucket b >= n (captured on first use, no execution during capture, so capturing is
  // not collective). Graph inputs live in graph_meta_, laid out for the largest bucket and
  // graph_blocks_per_seq_ table entries per sequence, so every graph reads the same addresses; the
  // host writes them before each replay. Padding rows n..b-1: token 0 at position 0, KV slot -1 (no
  // cache write), a block table of zeros (reads block 0), its own sequence index; their outputs are
  // dropped. A step's MoE forward runs b tokens (T is fixed in the graph); the padding's experts do
  // useless but harmless work. Graphs point at the work buffers: reserve() growing them bumps
  // buffer_generation_, and a stale graph is captured again.
  int decode_bucket(const StepBatch& batch) const {
    if (batch.chunks.empty()) return -1;
    for (const auto& chunk : batch.chunks) {
      if (chunk.tokens.size() != 1) return -1;
      if (static_cast<int>(chunk.block_table.size()) > graph_blocks_per_seq_) return -1;
    }
    return pick_decode_bucket(graph_buckets_, static_cast<int>(batch.chunks.size()));
  }

  // Offsets of the graph metadata for `capacity` sequences (one token each).
  StepMeta graph_meta_layout(int capacity) const {
    StepMeta m;
    const size_t B = static_cast<size_t>(capacity);
    m.token_ids = 0;
    m.positions = B;
    m.seq_of_token = 2 * B;
    m.slots = (3 * B + 1) & ~size_t{1};
    m.block_tables = m.slots + 2 * B;
    m.logit_rows = m.block_tables + B * static_cast<size_t>(graph_blocks_per_seq_);
    m.words.assign(m.logit_rows + B, 0);
    return m;
  }

  StepOutput run_decode_graph(const StepBatch& batch, int bucket) {
    const StepMeta& meta = graph_meta_host_;  // layout for the largest bucket; words reused step to step
    std::vector<int32_t>& words = graph_meta_host_.words;
    const int n = static_cast<int>(batch.chunks.size());
    for (int i = 0; i < bucket; ++i) {
      words[meta.seq_of_token + i] = i;
      words[meta.logit_rows + i] = i;
      int32_t* row_table = words.data() + meta.block_tables + static_cast<size_t>(i) * graph_blocks_per_seq_;
      int64_t slot = -1;
      if (i < n) {
        // NOTES: table entries past the sequence's length keep older values; the kernel reads only
        // entries of positions < its context, so they are never used.
        const SequenceChunk& chunk = batch.chunks[i];
        const int32_t position = chunk.start_position;
        words[meta.token_ids + i] = chunk.tokens[0];
        words[meta.positions + i] = position;
        std::copy(chunk.block_table.begin(), chunk.block_table.end(), row_table);
        slot = static_cast<int64_t>(chunk.block_table[position / options_.kv_block_size]) * options_.kv_block_size +
               position % options_.kv_block_size;
      } else {
        words[meta.token_ids + i] = 0;
        words[meta.positions + i] = 0;
        row_table[0] = 0;
      }
      std::memcpy(&words[meta.slots + 2 * static_cast<size_t>(i)], &slot, sizeof(slot));
    }
    // Two copies: everything up to the bucket's block-table rows, and its logit rows.
    const size_t head = meta.block_tables + static_cast<size_t>(bucket) * graph_blocks_per_seq_;
    MEGAMOE_CUDA_CHECK(cudaMemcpyAsync(graph_meta_.get(), words.data(), head * 4, cudaMemcpyHostToDevice, stream_));
    MEGAMOE_CUDA_CHECK(cudaMemcpyAsync(graph_meta_.get<int32_t>() + meta.logit_rows, words.data() + meta.logit_rows,
                                       static_cast<size_t>(bucket) * 4, cudaMemcpyHostToDevice, stream_));
    DecodeGraph& graph = decode_graph(bucket, meta);
    if (graph.exec == nullptr) {  // capture failed: graphs are off now; this step runs eagerly
      return eager_fallback(batch);
    }
    MEGAMOE_CUDA_CHECK(cudaGraphLaunch(graph.exec, stream_));
    ++graph_replays_;
    std::vector<int64_t> wanted;
    for (int i = 0; i < n; ++i)
      if (batch.chunks[i].want_logits) wanted.push_back(i);
    return fetch_logits(n, wanted);
  }

  StepOutput eager_fallback(const StepBatch& batch) {
    const BatchLimits limits{config_.max_position_embeddings, config_.vocab_size, options_.kv_block_size,
                             num_kv_blocks_};
    return run(batch, pack_step_batch(batch, limits));
  }

  struct DecodeGraph {
    cudaGraphExec_t exec = nullptr;
    int64_t generation = -1;
  };
  // The graph of `bucket`, captured now when missing or stale. On a capture failure graphs are turned
  // off (logged) and a graph with exec == nullptr is returned.
  DecodeGraph& decode_graph(int bucket, const StepMeta& meta) {
    DecodeGraph& graph = graphs_[bucket];
    if (graph.exec != nullptr && graph.generation == buffer_generation_) return graph;
    if (graph.exec != nullptr) MEGAMOE_CUDA_CHECK(cudaGraphExecDestroy(graph.exec));
    graph.exec = nullptr;
    reserve(bucket, bucket);  // before the capture: no reallocation inside it
    ForwardArgs a = forward_pointers(meta, graph_meta_.get<int32_t>());
    a.tokens = bucket;
    a.rows = bucket;
    a.num_seqs = bucket;
    a.max_blocks = graph_blocks_per_seq_;
    a.whole_prefill = false;
    cudaGraph_t captured = nullptr;
    MEGAMOE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      launch_forward(a);
    } catch (const Error& e) {
      cudaStreamEndCapture(stream_, &captured);
      if (captured) cudaGraphDestroy(captured);
      cudaGetLastError();
      graphs_.erase(bucket);
      graphs_enabled_ = false;
      std::fprintf(stderr, "megamoe: CUDA graphs off (capture of decode bucket %d failed): %s\n", bucket, e.what());
      static DecodeGraph none;
      return none;
    }
    MEGAMOE_CUDA_CHECK(cudaStreamEndCapture(stream_, &captured));
    const cudaError_t status = cudaGraphInstantiate(&graph.exec, captured, 0);
    cudaGraphDestroy(captured);
    MEGAMOE_CUDA_CHECK(status);
    graph.generation = buffer_generation_;
    return graph;
  }

  // Copies logit rows [0, computed) to the host and returns those in `wanted` (in order).
  StepOutput fetch_logits(int64_t computed, const std::vector<int64_t>& wanted) {
    StepOutput output;
    if (computed > 0 && !wanted.empty()) {
      std::vector<float> host(static_cast<size_t>(computed) * config_.vocab_size);
      MEGAMOE_CUDA_CHECK(cudaMemcpyAsync(host.data(), logits_.get(), host.size() * 4, cudaMemcpyDeviceToHost, stream_));
      MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (int64_t r : wanted)
        output.logits.emplace_back(host.begin() + r * config_.vocab_size, host.begin() + (r + 1) * config_.vocab_size);
    } else {
      MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    if (group_) group_->check_errors();  // a bounded wait in an EP kernel that expired, if any
    return output;
  }

  // Everything of a step on the device, up to the logits in logits_ (rows a.rows): stream-ordered,
  // no host synchronisation unless the MoE backend runs on the host (never under graph capture).
  bool launch_forward(ForwardArgs& a) {
    const int64_t T = a.tokens, H = config_.hidden_size, D = config_.head_dim;
    const int heads = config_.num_heads, kv_heads = config_.num_kv_heads;
    const int64_t rows = a.rows;
    const int32_t* token_ids = a.token_ids;
    const int32_t* positions = a.positions;
    const int32_t* seq_of_token = a.seq_of_token;
    const int64_t* slots = a.slots;
    const int32_t* block_tables = a.block_tables;
    const int32_t* logit_rows = a.logit_rows;
    bool& whole_prefill = a.whole_prefill;
    const std::vector<int32_t>& seq_lens = a.seq_lens;
    const int max_blocks = a.max_blocks;

    gpu::embedding(embed_.get<uint16_t>(), config_.vocab_size, H, token_ids, T, x_.get<float>(), stream_);
    const uint16_t* pending_bf16 = nullptr;  // MoE output not yet added into x
    const float* pending_f32 = nullptr;
    for (int l = 0; l < config_.num_layers; ++l) {
      GpuLayer& g = layers_[l];
      gpu::ResidualNormArgs norm;
      norm.x = x_.get<float>();
      norm.delta_bf16 = pending_bf16;
      norm.delta_f32 = pending_f32;
      norm.weight = g.input_norm.get<float>();
      norm.eps = config_.rms_norm_eps;
      norm.rows = T;
      norm.hidden = H;
      norm.out_bf16 = normed_.get<uint16_t>();
      gpu::residual_rms_norm(norm, stream_);
      pending_bf16 = nullptr;
      pending_f32 = nullptr;

      const int64_t qkv_width = config_.q_size() + 2 * config_.kv_size();
      gemm(normed_.get(), CUDA_R_16BF, T, H, g.qkv.get(), CUDA_R_16BF, qkv_width, qkv_.get(), CUDA_R_16BF, false);
      gpu::QkvPrepareArgs prep;
      prep.qkv = qkv_.get<uint16_t>();
      prep.tokens = T;
      prep.heads = heads;
      prep.kv_heads = kv_heads;
      prep.head_dim = static_cast<int>(D);
      prep.q_norm = config_.qk_norm ? g.q_norm.get<float>() : nullptr;
      prep.k_norm = config_.qk_norm ? g.k_norm.get<float>() : nullptr;
      prep.eps = config_.rms_norm_eps;
      prep.rope_cos = rope_cos_.get<float>();
      prep.rope_sin = rope_sin_.get<float>();
      prep.max_position = config_.max_position_embeddings;
      prep.positions = positions;
      prep.slot_mapping = slots;
      prep.q_out = q_.get<uint16_t>();
      prep.k_cache = g.k_cache.get<uint16_t>();
      prep.v_cache = g.v_cache.get<uint16_t>();
      prep.k_out = whole_prefill ? k_packed_.get<uint16_t>() : nullptr;
      prep.v_out = whole_prefill ? v_packed_.get<uint16_t>() : nullptr;
      gpu::qkv_prepare(prep, stream_);

      if (whole_prefill) whole_prefill = cudnn_attention(seq_lens);
      if (!whole_prefill) {
        gpu::PagedAttentionArgs attn;
        attn.q = q_.get<uint16_t>();
        attn.k_cache = g.k_cache.get<uint16_t>();
        attn.v_cache = g.v_cache.get<uint16_t>();
        attn.block_tables = block_tables;
        attn.seq_of_token = seq_of_token;
        attn.positions = positions;
        attn.tokens = T;
        attn.num_seqs = a.num_seqs;
        attn.max_blocks_per_seq = max_blocks;
        attn.heads = heads;
        attn.kv_heads = kv_heads;
        attn.head_dim = static_cast<int>(D);
        attn.block_size = options_.kv_block_size;
        attn.out = attn_.get<uint16_t>();
        attn.split_workspace = attn_split_.get();
        attn.split_workspace_bytes = attn_split_.bytes();
        gpu::paged_attention(attn, stream_);
      }
      gemm(attn_.get(), CUDA_R_16BF, T, config_.q_size(), g.o.get(), CUDA_R_16BF, H, x_.get(), CUDA_R_32F, true);

      norm = gpu::ResidualNormArgs{};
      norm.x = x_.get<float>();
      norm.weight = g.post_attention_norm.get<float>();
      norm.eps = config_.rms_norm_eps;
      norm.rows = T;
      norm.hidden = H;
      norm.out_bf16 = normed_.get<uint16_t>();
      norm.out_f32 = g.moe ? normed_f32_.get<float>() : nullptr;
      gpu::residual_rms_norm(norm, stream_);
      if (g.moe) {
        moe_layer(g, T);
        if (host_moe_) {
          pending_f32 = moe_out_.get<float>();
        } else {
          pending_bf16 = moe_out_.get<uint16_t>();
        }
      } else {
        const int64_t I = config_.intermediate_size;
        gemm(normed_.get(), CUDA_R_16BF, T, H, g.gate_up.get(), CUDA_R_16BF, 2 * I, gate_up_.get(), CUDA_R_16BF, false);
        gpu::silu_mul(gate_up_.get<uint16_t>(), T, I, act_.get<uint16_t>(), stream_);
        gemm(act_.get(), CUDA_R_16BF, T, I, g.down.get(), CUDA_R_16BF, H, x_.get(), CUDA_R_32F, true);
      }
    }

    if (rows > 0) {
      gpu::ResidualNormArgs norm;
      norm.x = x_.get<float>();
      norm.delta_bf16 = pending_bf16;
      norm.delta_f32 = pending_f32;
      norm.weight = final_norm_.get<float>();
      norm.eps = config_.rms_norm_eps;
      norm.rows = rows;
      norm.hidden = H;
      norm.rows_index = logit_rows;
      norm.out_bf16 = last_normed_.get<uint16_t>();
      gpu::residual_rms_norm(norm, stream_);
      const void* head = tied_ ? embed_.get() : lm_head_.get();
      gemm(last_normed_.get(), CUDA_R_16BF, rows, H, head, CUDA_R_16BF, config_.vocab_size, logits_.get(),
           CUDA_R_32F, false);
    }
    return pending_f32 != nullptr;
  }

  // cuDNN over the step's packed K/V; false (and cuDNN off from now on) when cuDNN rejects the shape
  // under --attention auto: the caller then runs the paged kernel, which reads the same K/V from the
  // cache. Nothing was launched when cuDNN rejects (the plan is built before execution).
  bool cudnn_attention(const std::vector<int32_t>& seq_lens) {
    try {
      cudnn_->run(q_.get<uint16_t>(), k_packed_.get<uint16_t>(), v_packed_.get<uint16_t>(), attn_.get<uint16_t>(),
                  seq_lens, stream_);
      return true;
    } catch (const Error& e) {
      if (options_.attention == "cudnn") throw;
      std::fprintf(stderr, "megamoe: cuDNN attention off, using the paged kernel: %s\n", e.what());
      cudnn_.reset();
      return false;
    }
  }

  // Router (fp32 GEMM + CUDA top-k) then the backend, in pieces of at most max_tokens_per_step
  // tokens (always one piece, possibly empty, on an expert-parallel group: step() checks the size).
  void moe_layer(GpuLayer& g, int64_t T) {
    const int64_t H = config_.hidden_size, E = config_.num_experts, K = config_.top_k;
    gemm(normed_f32_.get(), CUDA_R_32F, T, H, g.router.get(), CUDA_R_32F, E, router_logits_.get(), CUDA_R_32F, false);
    RouterDeviceInputs route;
    route.logits = router_logits_.get<float>();
    route.num_tokens = T;
    route_cuda(config_.router, route, topk_ids_.get<int32_t>(), topk_weights_.get<float>(), stream_);
    if (host_moe_) {
      host_moe_layer(*g.backend, T);
      return;
    }
    const int64_t piece_tokens = options_.max_tokens_per_step;
    const int64_t pieces = std::max<int64_t>(1, (T + piece_tokens - 1) / piece_tokens);
    for (int64_t piece = 0; piece < pieces; ++piece) {
      const int64_t begin = std::min(piece * piece_tokens, T);
      const int64_t count = std::clamp<int64_t>(T - begin, 0, piece_tokens);
      MoeInputs in;
      in.hidden = TensorView::make2d(normed_.get<uint16_t>() + begin * H, DType::kBF16, count, H, Device::kCuda);
      in.topk_ids = TensorView::make2d(topk_ids_.get<int32_t>() + begin * K, DType::kI32, count, K, Device::kCuda);
      in.topk_weights = TensorView::make2d(topk_weights_.get<float>() + begin * K, DType::kF32, count, K, Device::kCuda);
      MoeOutputs out;
      out.out = TensorView::make2d(moe_out_.get<uint16_t>() + begin * H, DType::kBF16, count, H, Device::kCuda);
      g.backend->forward(in, out, stream_);
    }
  }

  // A CPU backend (reference): the fp32 normed states and the routing go to the host and back.
  void host_moe_layer(MoeBackend& backend, int64_t T) {
    const int64_t H = config_.hidden_size, K = config_.top_k;
    std::vector<float> hidden(T * H), out(T * H), weights(T * K);
    std::vector<int32_t> ids(T * K);
    MEGAMOE_CUDA_CHECK(cudaMemcpyAsync(hidden.data(), normed_f32_.get(), hidden.size() * 4, cudaMemcpyDeviceToHost, stream_));
    MEGAMOE_CUDA_CHECK(cudaMemcpyAsync(ids.data(), topk_ids_.get(), ids.size() * 4, cudaMemcpyDeviceToHost, stream_));
    MEGAMOE_CUDA_CHECK(cudaMemcpyAsync(weights.data(), topk_weights_.get(), weights.size() * 4,
                                       cudaMemcpyDeviceToHost, stream_));
    MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    MoeInputs in;
    in.hidden = TensorView::make2d(hidden.data(), DType::kF32, T, H, Device::kCpu);
    in.topk_ids = TensorView::make2d(ids.data(), DType::kI32, T, K, Device::kCpu);
    in.topk_weights = TensorView::make2d(weights.data(), DType::kF32, T, K, Device::kCpu);
    MoeOutputs o;
    o.out = TensorView::make2d(out.data(), DType::kF32, T, H, Device::kCpu);
    backend.forward(in, o, nullptr);
    MEGAMOE_CUDA_CHECK(cudaMemcpyAsync(moe_out_.get(), out.data(), out.size() * 4, cudaMemcpyHostToDevice, stream_));
    MEGAMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `out` dies here
  }

  ModelConfig config_;
  RunnerOptions options_;
  ModelInfo info_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  WeightFormat expert_format_ = WeightFormat::kBf16;
  std::unique_ptr<EpGroup> own_group_;  // single rank, when RunnerOptions::ep is null
  EpGroup* group_ = nullptr;            // the GPU backends' group (options.ep or own_group_)
  std::shared_ptr<MoeWorkspace> moe_workspace_;  // shared by every layer's backend
  std::vector<std::unique_ptr<MoeBackend>> backends_;
  std::vector<MoeBackend*> backend_of_layer_;
  bool host_moe_ = false;
  std::unique_ptr<gpu::CudnnVarlenAttention> cudnn_;

  DeviceBuffer embed_, lm_head_, final_norm_, rope_cos_, rope_sin_;
  bool tied_ = false;
  std::vector<GpuLayer> layers_;

  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  // Left free by --gpu-memory-utilization sizing for what is allocated after it: cuDNN plan
  // workspaces (per prefill shape) and CUDA graph instantiation.
  static constexpr int64_t kKvReserveBytes = int64_t{512} << 20;
  int num_kv_blocks_ = 0;
  std::string memory_report_, kv_plan_line_;
  DeviceBuffer cublas_workspace_;
  DeviceBuffer attn_split_;  // paged attention's split-KV partials (fixed size, see the constructor)
  bool graphs_enabled_ = false;
  std::vector<int> graph_buckets_;
  int graph_blocks_per_seq_ = 0;
  DeviceBuffer graph_meta_;
  StepMeta graph_meta_host_;  // host words of graph_meta_ (layout for the largest bucket)
  std::map<int, DecodeGraph> graphs_;
  int64_t buffer_generation_ = 0, graph_replays_ = 0;
  int64_t reserved_tokens_ = 0, reserved_rows_ = 0;
  DeviceBuffer x_, normed_, normed_f32_, qkv_, q_, k_packed_, v_packed_, attn_, gate_up_, act_, moe_out_;
  DeviceBuffer router_logits_, topk_ids_, topk_weights_, last_normed_, logits_, meta_;
};

}  // namespace

bool gpu_runner_available(std::string* why) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    cudaGetLastError();
    if (why) *why = status != cudaSuccess ? std::string("no CUDA device: ") + cudaGetErrorName(status) : "no CUDA device visible";
    return false;
  }
  return true;
}

std::unique_ptr<ModelRunner> make_gpu_model_runner(const ModelConfig& config, const std::string& model_dir,
                                                   const RunnerOptions& options) {
  std::string why;
  MEGAMOE_CHECK(gpu_runner_available(&why), "--device cuda: ", why);
  return std::make_unique<GpuModelRunner>(config, model_dir, options);
}

std::unique_ptr<ModelRunner> make_gpu_model_runner(const std::string& model_dir, const RunnerOptions& options) {
  return make_gpu_model_runner(load_model_config(model_dir, options.hf_overrides), model_dir, options);
}

}  // namespace megamoe::engine

#endif  // MEGAMOE_WITH_CUDA
