// The CPU model runner: a ModelRunner (runner.h) for qwen3_moe / mixtral in fp32, with the MoE layers
// run by a MoeBackend (`--moe-backend`, CPU: `reference`). It is the oracle the GPU runner is tested
// against and what CI runs.
//
// NOTES: attention and routing are per-layer choices (ModelConfig::attention, ModelConfig::router), so
// DeepSeek-V3 (MLA, grouped sigmoid routing, shared experts) adds cases, not a second model.
#pragma once

#include <memory>
#include <string>

#include "engine/config.h"
#include "engine/runner.h"
#include "engine/weights.h"

namespace megamoe {
class EpGroup;
class CpuEpGroup;
}

namespace megamoe::engine {

struct RunnerOptions {
  std::string moe_backend = "reference";  // normalised by normalize_backend_name
  std::string hf_overrides;               // JSON object merged into config.json
  LoadOptions load;
  int kv_block_size = 16;
  int num_kv_blocks = 256;
  int max_tokens_per_step = 4096;         // MoE buffers (MoeConfig::max_tokens_per_rank); larger steps are split
  EpGroup* ep = nullptr;                  // null: single rank, all experts local
  // Data parallel + expert parallel on the CPU (reference backend only): this runner is rank
  // `ep_rank` of `cpu_ep`, loads only its experts (CpuEpGroup::local_experts) and every step() is
  // collective: all ranks' runners must call step() together, from their own threads, with an empty
  // batch when they have no work. Logits are bit-identical to one rank holding every expert.
  std::shared_ptr<CpuEpGroup> cpu_ep;
  int ep_rank = 0;
  // Which model runner make_model_runner builds: "cpu", "cuda", or "auto" (cuda when the MoE backend
  // needs a GPU, e.g. staged / mega; else cpu).
  std::string device = "auto";
  // GPU runner only: CUDA device (ignored when `ep` is set: the group's device), and the attention of
  // whole-sequence prefills: "auto" (cuDNN when available, else ours), "cudnn" (required), "paged" (ours).
  int cuda_device = 0;
  std::string attention = "auto";
  // GPU runner, KV cache size: with kv_cache_from_memory (the CLI's default unless --num-kv-blocks is
  // given) num_kv_blocks is ignored and the cache takes gpu_memory_utilization x total device memory
  // minus what is in use after the weights, MoE workspaces and activation buffers (vLLM's rule;
  // engine/gpu_plan.h). The CPU runner always uses num_kv_blocks.
  bool kv_cache_from_memory = false;
  double gpu_memory_utilization = 0.9;
  // GPU runner: decode steps (every chunk one token) of at most max_graph_batch sequences replay a
  // CUDA graph captured per batch-size bucket (gpu_plan.h), unless enforce_eager.
  bool enforce_eager = false;
  int max_graph_batch = 256;
};

// Reads <model_dir>/config.json (+ overrides) and the weights (or dummy ones with load.load_format ==
// "dummy"; then model_dir only needs config.json).
std::unique_ptr<ModelRunner> make_cpu_model_runner(const std::string& model_dir, const RunnerOptions& options);
// Same with an already-parsed config (model_dir may be empty for dummy weights).
std::unique_ptr<ModelRunner> make_cpu_model_runner(const ModelConfig& config, const std::string& model_dir,
                                                   const RunnerOptions& options);

// The runner options.device asks for (see RunnerOptions::device); the GPU runner is in gpu_model.h.
std::unique_ptr<ModelRunner> make_model_runner(const std::string& model_dir, const RunnerOptions& options);
// "cpu" or "cuda" for options.device ("auto" resolved by the backend's needs_gpu); throws on a bad name.
std::string resolve_runner_device(const RunnerOptions& options);

// Expert weight format of the MoE layers: a pre-quantized checkpoint's format, else the online
// quantization when given, else BF16. Throws when --quantization asks to requantize a quantized checkpoint.
WeightFormat expert_weight_format(const LoadOptions& load, const ModelConfig& config);

}  // namespace megamoe::engine
