// Typed, validating launchers of the GPU model runner's kernels (gpu_ops.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/gpu_ops.h"
#include "engine/kernels/sm90_elementwise.cuh"
#include "engine/kernels/sm90_paged_attention.cuh"
#include "engine/kernels/sm90_qkv_prepare.cuh"
#include "engine/kernels/sm90_residual_rms_norm.cuh"
#include "megamoe/error_cuda.h"

namespace megamoe::engine::gpu {
namespace {

cudaStream_t as_stream(StreamHandle stream) { return static_cast<cudaStream_t>(stream); }
const __nv_bfloat16* bf16(const uint16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
__nv_bfloat16* bf16(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

}  // namespace

void embedding(const uint16_t* embed, int64_t vocab, int64_t hidden, const int32_t* token_ids, int64_t tokens,
               float* x, StreamHandle stream) {
  MEGAMOE_CHECK(vocab > 0 && hidden > 0 && tokens >= 0, "embedding: vocab = ", vocab, ", hidden = ", hidden,
                ", tokens = ", tokens, " must be positive (tokens >= 0)");
  if (tokens == 0) return;
  MEGAMOE_CHECK(embed && token_ids && x, "embedding: null pointer");
  constexpr int kThreads = 256;
  kernels::embedding_kernel<<<kernels::elementwise_blocks(tokens * hidden, kThreads), kThreads, 0, as_stream(stream)>>>(
      bf16(embed), hidden, token_ids, tokens, x);
  MEGAMOE_LAUNCH_CHECK();
}

void residual_rms_norm(const ResidualNormArgs& a, StreamHandle stream) {
  MEGAMOE_CHECK(a.rows >= 0 && a.rows < (int64_t{1} << 31), "residual_rms_norm: rows = ", a.rows,
                " must be in [0, 2^31)");
  MEGAMOE_CHECK(a.hidden > 0, "residual_rms_norm: hidden = ", a.hidden, " must be positive");
  MEGAMOE_CHECK(!(a.delta_bf16 && a.delta_f32), "residual_rms_norm: give delta_bf16 or delta_f32, not both");
  if (a.rows == 0) return;
  MEGAMOE_CHECK(a.x && a.weight && a.out_bf16, "residual_rms_norm: x, weight and out_bf16 are required");
  kernels::residual_rms_norm_kernel<<<static_cast<unsigned>(a.rows), kernels::kNormThreads, 0, as_stream(stream)>>>(
      a.x, bf16(a.delta_bf16), a.delta_f32, a.weight, a.eps, a.hidden, a.rows_index, bf16(a.out_bf16), a.out_f32);
  MEGAMOE_LAUNCH_CHECK();
}

void qkv_prepare(const QkvPrepareArgs& a, StreamHandle stream) {
  MEGAMOE_CHECK(a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0, "qkv_prepare: heads = ", a.heads,
                " must be a positive multiple of kv_heads = ", a.kv_heads);
  MEGAMOE_CHECK(a.head_dim >= 2 && a.head_dim % 2 == 0 && a.head_dim <= kernels::kQkvMaxHeadDim,
                "qkv_prepare: head_dim = ", a.head_dim, " must be even and in [2, ", kernels::kQkvMaxHeadDim, "]");
  MEGAMOE_CHECK((a.q_norm == nullptr) == (a.k_norm == nullptr), "qkv_prepare: give both q_norm and k_norm or neither");
  MEGAMOE_CHECK(a.tokens >= 0 && a.tokens < (int64_t{1} << 31), "qkv_prepare: tokens = ", a.tokens,
                " must be in [0, 2^31)");
  if (a.tokens == 0) return;
  MEGAMOE_CHECK(a.qkv && a.rope_cos && a.rope_sin && a.positions && a.slot_mapping && a.q_out && a.k_cache &&
                    a.v_cache && a.max_position > 0,
                "qkv_prepare: null pointer or max_position = ", a.max_position);
  kernels::qkv_prepare_kernel<<<static_cast<unsigned>(a.tokens), kernels::kQkvWarps * 32, 0, as_stream(stream)>>>(
      bf16(a.qkv), a.heads, a.kv_heads, a.head_dim, a.q_norm, a.k_norm, a.eps, a.rope_cos, a.rope_sin, a.positions,
      a.slot_mapping, bf16(a.q_out), bf16(a.k_cache), bf16(a.v_cache), bf16(a.k_out), bf16(a.v_out));
  MEGAMOE_LAUNCH_CHECK();
}

void silu_mul(const uint16_t* gate_up, int64_t tokens, int64_t intermediate, uint16_t* out, StreamHandle stream) {
  MEGAMOE_CHECK(tokens >= 0 && intermediate > 0, "silu_mul: tokens = ", tokens, ", intermediate = ", intermediate);
  if (tokens == 0) return;
  constexpr int kThreads = 256;
  kernels::silu_mul_kernel<<<kernels::elementwise_blocks(tokens * intermediate, kThreads), kThreads, 0,
                             as_stream(stream)>>>(bf16(gate_up), tokens, intermediate, bf16(out));
  MEGAMOE_LAUNCH_CHECK();
}

void paged_attention(const PagedAttentionArgs& a, StreamHandle stream) {
  static_assert(kPagedAttentionMaxGroup == kernels::kAttnMaxGroup && kPagedAttentionMaxHeadDim == kernels::kAttnMaxHeadDim &&
                kPagedAttentionMaxSplits == kernels::kAttnMaxSplits);
  MEGAMOE_CHECK(a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0, "paged_attention: heads = ", a.heads,
                " must be a positive multiple of kv_heads = ", a.kv_heads);
  MEGAMOE_CHECK(a.heads / a.kv_heads <= kPagedAttentionMaxGroup, "paged_attention: heads / kv_heads = ",
                a.heads / a.kv_heads, " must be <= ", kPagedAttentionMaxGroup);
  MEGAMOE_CHECK(a.head_dim >= 2 && a.head_dim % 2 == 0 && a.head_dim <= kPagedAttentionMaxHeadDim,
                "paged_attention: head_dim = ", a.head_dim, " must be even and in [2, ", kPagedAttentionMaxHeadDim, "]");
  MEGAMOE_CHECK(a.block_size > 0, "paged_attention: block_size = ", a.block_size, " must be positive");
  MEGAMOE_CHECK(a.kv_heads <= 65535, "paged_attention: kv_heads = ", a.kv_heads, " must be <= 65535");
  MEGAMOE_CHECK(a.tokens >= 0 && a.tokens < (int64_t{1} << 31), "paged_attention: tokens = ", a.tokens,
                " must be in [0, 2^31)");
  if (a.tokens == 0) return;
  MEGAMOE_CHECK(a.num_seqs > 0 && a.max_blocks_per_seq > 0, "paged_attention: num_seqs = ", a.num_seqs,
                ", max_blocks_per_seq = ", a.max_blocks_per_seq, " must be positive");
  MEGAMOE_CHECK(a.q && a.k_cache && a.v_cache && a.block_tables && a.seq_of_token && a.positions && a.out,
                "paged_attention: null pointer");
  const int group = a.heads / a.kv_heads;
  const size_t smem = kernels::paged_attention_smem_bytes(group, a.head_dim);
  if (smem > 48 * 1024) {
    MEGAMOE_CUDA_CHECK(cudaFuncSetAttribute(kernels::paged_attention_kernel,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  MEGAMOE_CHECK(a.num_splits >= 0 && a.num_splits <= kPagedAttentionMaxSplits, "paged_attention: num_splits = ",
                a.num_splits, " must be in [0, ", kPagedAttentionMaxSplits, "]");
  int splits = a.num_splits;
  const size_t per_split = paged_attention_workspace_bytes(a.tokens, a.heads, a.head_dim, 1);
  if (splits == 0) {
    const int64_t max_context = static_cast<int64_t>(a.max_blocks_per_seq) * a.block_size;
    splits = choose_paged_attention_splits(a.tokens, a.kv_heads, static_cast<int>(std::min<int64_t>(max_context, INT32_MAX)),
                                           multiprocessor_count());
    splits = static_cast<int>(std::min<size_t>(splits, a.split_workspace ? a.split_workspace_bytes / per_split : 1));
    splits = std::max(splits, 1);
  } else if (splits > 1) {
    MEGAMOE_CHECK(a.split_workspace != nullptr && a.split_workspace_bytes >= per_split * splits,
                  "paged_attention: num_splits = ", splits, " needs a split_workspace of ", per_split * splits,
                  " bytes, have ", a.split_workspace_bytes);
  }
  MEGAMOE_CHECK(splits == 1 || reinterpret_cast<uintptr_t>(a.split_workspace) % 16 == 0,
                "paged_attention: split_workspace must be 16-byte aligned");
  float* split_acc = static_cast<float*>(a.split_workspace);
  float2* split_stats = split_acc == nullptr ? nullptr
      : reinterpret_cast<float2*>(split_acc + a.tokens * a.heads * splits * static_cast<int64_t>(a.head_dim));
  const float scale = a.scale != 0.0f ? a.scale : 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  const dim3 grid(static_cast<unsigned>(a.tokens), static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(splits));
  kernels::paged_attention_kernel<<<grid, kernels::kAttnThreads, smem, as_stream(stream)>>>(
      bf16(a.q), bf16(a.k_cache), bf16(a.v_cache), a.block_tables, a.seq_of_token, a.positions,
      a.max_blocks_per_seq, a.heads, a.kv_heads, a.head_dim, a.block_size, scale, bf16(a.out), split_acc, split_stats);
  MEGAMOE_LAUNCH_CHECK();
  if (splits == 1) return;
  kernels::paged_attention_merge_kernel<<<static_cast<unsigned>(a.tokens * a.heads), kernels::kAttnThreads, 0,
                                          as_stream(stream)>>>(split_acc, split_stats, splits, a.head_dim, bf16(a.out));
  MEGAMOE_LAUNCH_CHECK();
}

int multiprocessor_count() {
  int device = 0, count = 0;
  MEGAMOE_CUDA_CHECK(cudaGetDevice(&device));
  MEGAMOE_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

size_t paged_attention_decode_workspace_bytes(int heads, int kv_heads, int head_dim) {
  MEGAMOE_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "paged_attention_decode_workspace_bytes: heads = ",
                heads, " must be a positive multiple of kv_heads = ", kv_heads);
  return paged_attention_workspace_bytes(3 * int64_t{multiprocessor_count()}, heads / kv_heads, head_dim, 1);
}

int choose_paged_attention_splits(int64_t tokens, int kv_heads, int max_context, int num_sms) {
  constexpr int kMinKeysPerSplit = 128;
  const int64_t pairs = tokens * kv_heads;
  if (pairs <= 0 || pairs >= num_sms) return 1;
  const int64_t for_waves = (2 * int64_t{num_sms} + pairs - 1) / pairs;
  const int64_t for_keys = (int64_t{max_context} + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  return static_cast<int>(std::clamp<int64_t>(std::min(for_waves, for_keys), 1, kPagedAttentionMaxSplits));
}

}  // namespace megamoe::engine::gpu
