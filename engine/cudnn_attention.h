// Prefill attention through cuDNN's SDPA (graph API via the header-only cudnn-frontend): causal,
// GQA, packed variable-length sequences (THD layout with ragged offsets), bf16 in/out, fp32 softmax.
// The tensor-core path of the GPU runner's whole-sequence prefills; paged_attention (gpu_ops.h)
// serves decode and chunked prefill, and everything when cuDNN is unavailable.
//
// NOTES:
// - Built only when the cudnn-frontend headers are found (MEGAMOE_WITH_CUDNN, scripts/install_deps.sh
//   puts them in .deps/); libcudnn is loaded at run time (dlopen "libcudnn.so.9"), so a machine whose
//   cuDNN lives in a Python wheel works with LD_LIBRARY_PATH, and one without cuDNN falls back.
// - Graphs are built per (number of sequences, longest sequence rounded up to a power of two) and
//   cached; building one takes milliseconds, so steady-state serving shapes hit the cache.
// - Not capturable in a CUDA graph (uploads the sequence lengths; prefills run eagerly).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megamoe/moe.h"  // StreamHandle

namespace megamoe::engine::gpu {

// True when this build has the cuDNN path and libcudnn could be loaded; else false with `why`.
bool cudnn_attention_available(std::string* why);
// The loaded libcudnn's version (e.g. 91900) and path, or 0 / "" when unavailable.
int64_t cudnn_loaded_version();
std::string cudnn_loaded_path();

class CudnnVarlenAttention {
 public:
  // Throws megamoe::Error when cuDNN is unavailable (cudnn_attention_available) or the shape is bad.
  CudnnVarlenAttention(int heads, int kv_heads, int head_dim);
  ~CudnnVarlenAttention();
  CudnnVarlenAttention(const CudnnVarlenAttention&) = delete;
  CudnnVarlenAttention& operator=(const CudnnVarlenAttention&) = delete;

  // q, out bf16 [T, heads, D]; k, v bf16 [T, kv_heads, D]; sequence i owns tokens
  // [sum(seq_lens[:i]), sum(seq_lens[:i+1])) and attends causally within itself (position 0 first).
  // Throws megamoe::Error when cuDNN rejects the shape (the message says why).
  void run(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out,
           const std::vector<int32_t>& seq_lens, StreamHandle stream);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace megamoe::engine::gpu
