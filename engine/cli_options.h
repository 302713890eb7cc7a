// The engine's command-line options (vLLM spellings), shared by every subcommand that loads a model
// (`megamoe generate`, `megamoe serve`, `megamoe bench serve`). Header-only so that the engine
// library does not depend on CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "engine/model.h"
#include "megamoe/error.h"
#include "megamoe/types.h"

namespace megamoe::engine {

struct EngineCliOptions {
  std::string model;          // directory with config.json (+ safetensors unless dummy)
  std::string quantization;   // "" | fp8 | nvfp4 | mxfp4
  RunnerOptions runner;
  const CLI::Option* num_kv_blocks_option = nullptr;  // set by add_engine_options

  // Call after parsing: checks and converts the string options (throws megamoe::Error).
  RunnerOptions resolve() const {
    RunnerOptions out = runner;
    if (!quantization.empty()) out.load.quantization = parse_weight_format(quantization);
    // vLLM: the GPU cache is sized from memory unless a block count is forced.
    out.kv_cache_from_memory = num_kv_blocks_option != nullptr && num_kv_blocks_option->count() == 0;
    MEGAMOE_CHECK(out.gpu_memory_utilization > 0 && out.gpu_memory_utilization <= 1, "--gpu-memory-utilization ",
                  out.gpu_memory_utilization, " must be in (0, 1]");
    MEGAMOE_CHECK(out.max_graph_batch >= 1, "--max-graph-batch ", out.max_graph_batch, " must be >= 1");
    return out;
  }
};

inline void add_engine_options(CLI::App& app, EngineCliOptions& options) {
  app.add_option("model", options.model, "model directory (config.json, *.safetensors)")->required();
  app.add_option("--moe-backend", options.runner.moe_backend,
                 "MoE backend: reference | staged | mega (case and -/_ insensitive; aliases ref, cpu, fused, ...)")
      ->capture_default_str();
  app.add_option("--load-format", options.runner.load.load_format,
                 "auto | safetensors | dummy (seeded random weights from config.json alone)")
      ->capture_default_str();
  app.add_option("--hf-overrides", options.runner.hf_overrides,
                 R"(JSON merged into config.json, e.g. '{"num_hidden_layers": 8}')");
  app.add_option("--quantization", options.quantization,
                 "quantize BF16 experts at load: fp8 | nvfp4 | mxfp4 (pre-quantized checkpoints need none)");
  app.add_option("--seed", options.runner.load.seed, "seed of --load-format dummy")->capture_default_str();
  app.add_option("--block-size", options.runner.kv_block_size, "tokens per KV cache block")->capture_default_str();
  options.num_kv_blocks_option =
      app.add_option("--num-kv-blocks", options.runner.num_kv_blocks,
                     "KV cache blocks (default: CPU runner this many, GPU runner from --gpu-memory-utilization)")
          ->capture_default_str();
  app.add_option("--gpu-memory-utilization", options.runner.gpu_memory_utilization,
                 "GPU runner: fraction of device memory for weights, workspaces, activations and the KV cache")
      ->capture_default_str();
  app.add_flag("--enforce-eager", options.runner.enforce_eager, "GPU runner: no CUDA graphs for decode steps");
  app.add_option("--max-graph-batch", options.runner.max_graph_batch,
                 "GPU runner: largest decode batch replayed from a CUDA graph")
      ->capture_default_str();
  app.add_option("--device", options.runner.device,
                 "model runner: auto (cuda for GPU MoE backends such as staged, else cpu) | cpu | cuda")
      ->capture_default_str();
  app.add_option("--attention", options.runner.attention,
                 "GPU prefill attention: auto (cuDNN when available) | cudnn | paged (ours)")
      ->capture_default_str();
  app.add_option("--max-num-batched-tokens", options.runner.max_tokens_per_step,
                 "largest step the MoE buffers hold (bigger steps are split)")
      ->capture_default_str();
}

}  // namespace megamoe::engine
