// The GPU model runner's device operations other than GEMMs (cuBLAS) and the MoE layer (MoeBackend):
// embedding, residual-add + RMSNorm, q/k norm + RoPE + KV-cache write, SiLU-and-mul, paged attention.
//
// Three layers per op (DeepGEMM style):
//   __global__ kernel + launcher   engine/kernels/sm90_*.cuh (raw device pointers + sizes + stream)
//   typed validating API           this header, implemented in engine/gpu_ops.cu
//
// Conventions: the residual stream is fp32 [T, H]; GEMM inputs are bf16; norm weights are fp32.
// All functions are stream-ordered, allocate nothing and are capturable in a CUDA graph. Sizes are
// checked on the host (megamoe::Error naming the field and the limit); device data (token ids,
// positions, block tables) must have been validated by the caller (the runner validates the batch
// on the host before uploading it).
#pragma once

#include <cstdint>

#include "megamoe/moe.h"  // StreamHandle

namespace megamoe::engine::gpu {

// x[t, :] = float(embed[token_ids[t], :])  (embed bf16 [V, H], x fp32 [T, H]).
void embedding(const uint16_t* embed, int64_t vocab, int64_t hidden, const int32_t* token_ids, int64_t tokens,
               float* x, StreamHandle stream);

// Optionally x += delta (bf16 `delta_bf16` or fp32 `delta_f32`, at most one non-null), then
// normed = x / sqrt(mean(x^2) + eps) * weight, written as bf16 to `out_bf16` and, when non-null, as
// fp32 to `out_f32` (the router's input). fp32 math over `rows` rows of `hidden`. With `rows_index`,
// output row r is computed from x row (and delta row) rows_index[r] (the LM head's last-token
// gather); only those rows of x are updated then.
struct ResidualNormArgs {
  float* x = nullptr;
  const uint16_t* delta_bf16 = nullptr;
  const float* delta_f32 = nullptr;
  const float* weight = nullptr;
  float eps = 1e-6f;
  int64_t rows = 0, hidden = 0;
  const int32_t* rows_index = nullptr;
  uint16_t* out_bf16 = nullptr;
  float* out_f32 = nullptr;
};
void residual_rms_norm(const ResidualNormArgs& args, StreamHandle stream);

// From the fused projection qkv bf16 [T, (Hq + 2 Hkv) D]: optional per-head RMSNorm of q and k
// (fp32 weights [D]), RoPE (rotate-half, cos/sin tables [max_position, D/2] fp32) at positions[t],
// then q -> q_out bf16 [T, Hq, D]; k, v -> the paged cache bf16 [num_blocks, block_size, Hkv, D] at
// slot_mapping[t] (= block * block_size + offset; a negative slot writes nothing to the cache: the
// padding tokens of a CUDA-graph decode bucket) and, when non-null, packed k_out/v_out [T, Hkv, D].
struct QkvPrepareArgs {
  const uint16_t* qkv = nullptr;
  int64_t tokens = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  const float* q_norm = nullptr;  // null: no q/k norm
  const float* k_norm = nullptr;
  float eps = 1e-6f;
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  int max_position = 0;
  const int32_t* positions = nullptr;     // [T]
  const int64_t* slot_mapping = nullptr;  // [T]
  uint16_t* q_out = nullptr;
  uint16_t* k_cache = nullptr;
  uint16_t* v_cache = nullptr;
  uint16_t* k_out = nullptr;
  uint16_t* v_out = nullptr;
};
void qkv_prepare(const QkvPrepareArgs& args, StreamHandle stream);

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i]  (bf16 in [T, 2I], bf16 out [T, I], fp32 math).
void silu_mul(const uint16_t* gate_up, int64_t tokens, int64_t intermediate, uint16_t* out, StreamHandle stream);

// Causal attention of packed query tokens over the paged KV cache (GQA): token t (of sequence
// seq_of_token[t], at position positions[t]) attends to positions [0, positions[t]] of its sequence,
// whose KV blocks are block_tables[seq * max_blocks_per_seq + b]. q bf16 [T, Hq, D], out bf16
// [T, Hq, D]; softmax in fp32 with scale 1/sqrt(D). Serves decode, chunked prefill and (as the
// fallback of the cuDNN path) whole prefills.
struct PagedAttentionArgs {
  const uint16_t* q = nullptr;
  const uint16_t* k_cache = nullptr;
  const uint16_t* v_cache = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  const int32_t* seq_of_token = nullptr;  // [T]
  const int32_t* positions = nullptr;     // [T]
  int64_t tokens = 0;
  int num_seqs = 0, max_blocks_per_seq = 0;
  int heads = 0, kv_heads = 0, head_dim = 0, block_size = 0;
  float scale = 0.0f;  // 0: 1/sqrt(head_dim)
  uint16_t* out = nullptr;
  // Split-KV (decode): when tokens x kv_heads CTAs leave the GPU idle, each (token, KV head) is split
  // over up to kPagedAttentionMaxSplits key ranges whose fp32 partials go to split_workspace (size:
  // paged_attention_workspace_bytes) and are merged by a second kernel. num_splits: 0 = choose
  // (choose_paged_attention_splits, reduced to what the workspace holds; 1 without a workspace),
  // 1 = never split, n > 1 = exactly n (the workspace must hold them).
  void* split_workspace = nullptr;
  size_t split_workspace_bytes = 0;
  int num_splits = 0;
};
// Limits of paged_attention's kernel.
inline constexpr int kPagedAttentionMaxGroup = 16;  // heads / kv_heads
inline constexpr int kPagedAttentionMaxHeadDim = 256;
inline constexpr int kPagedAttentionMaxSplits = 64;
// Bytes of split workspace for `splits` splits of `tokens` query tokens: an fp32 accumulator [D] and
// a (max, sum) pair per (token, query head, split).
inline size_t paged_attention_workspace_bytes(int64_t tokens, int heads, int head_dim, int splits) {
  return static_cast<size_t>(tokens) * heads * splits * (static_cast<size_t>(head_dim) + 2) * sizeof(float);
}
// Splits so that tokens x kv_heads x splits CTAs cover about two waves of `num_sms`, each split at
// least 128 keys of max_context (the longest context a launch may see; a graph's fixed bound).
int choose_paged_attention_splits(int64_t tokens, int kv_heads, int max_context, int num_sms);
// Split workspace that holds every split the chooser picks on this device (splits only happen while
// tokens x kv_heads < #SMs, and then tokens x kv_heads x splits <= that + 2 #SMs).
size_t paged_attention_decode_workspace_bytes(int heads, int kv_heads, int head_dim);
// Streaming multiprocessors of the current device.
int multiprocessor_count();
void paged_attention(const PagedAttentionArgs& args, StreamHandle stream);

}  // namespace megamoe::engine::gpu
