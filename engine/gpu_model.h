// The GPU model runner: a ModelRunner (runner.h) for qwen3_moe / mixtral on one CUDA device, with
// the MoE layers run by a MoeBackend (`--moe-backend staged | mega`; `reference` runs on the CPU with
// the hidden states copied over, a test mode for geometries the GPU backends cannot run).
//
// Per layer (T packed tokens, fp32 residual stream x [T, H] on the device):
//   RMSNorm(x) -> bf16 -> fused QKV GEMM (cuBLAS) -> q/k norm + RoPE + paged KV write
//   -> attention (cuDNN SDPA for whole-sequence prefills, our paged kernel otherwise)
//   -> O GEMM accumulated into x (fp32) -> RMSNorm -> router GEMM (fp32) + CUDA router
//   -> MoeBackend::forward (bf16) -> added into x by the next norm   [dense layers: GEMM, SiLU, GEMM]
// then the final RMSNorm of the chunks' last tokens and the LM head GEMM (fp32 logits).
//
// Expert parallel: with RunnerOptions::ep (one process per GPU, our launcher) every rank's step()
// is collective (each MoE layer's forward is); a rank with no work calls step() with an empty batch,
// and a rank whose batch is invalid runs an empty step before it throws, so the others complete.
#pragma once

#include <memory>
#include <string>

#include "engine/config.h"
#include "engine/model.h"
#include "engine/runner.h"

namespace megamoe::engine {

// True when this build has CUDA and a device is visible; else false with `why`.
bool gpu_runner_available(std::string* why);

std::unique_ptr<ModelRunner> make_gpu_model_runner(const ModelConfig& config, const std::string& model_dir,
                                                   const RunnerOptions& options);
std::unique_ptr<ModelRunner> make_gpu_model_runner(const std::string& model_dir, const RunnerOptions& options);

}  // namespace megamoe::engine
