// Combine: the expert-owning rank reduces, per received token, the outputs of its local experts in
// top-k slot order and sends ONE BF16 partial row back to the token's source rank; the source then
// sums the partials of the ranks that hold its experts in rank order. Launcher at the bottom.
//
// NOTES: summation order and rounding (deterministic, independent of row order and timing):
//   partial[t, r] = bf16_rn( fmaf over slots j = 0..k-1 in order with expert ids[t, j] on rank r:
//                            acc = fmaf(w_j, y_j, acc), acc starting at +0.0f )      (on rank r)
//   out[t]        = bf16_rn( sum over ranks r = 0..R-1 in order that hold one of t's experts:
//                            acc = acc + float(partial[t, r]), acc starting at +0.0f )  (on the source)
// With all of a token's experts on one rank, out = partial (one rounding, identical to the
// single-rank fp32 sum). Otherwise each partial is rounded to BF16 once before the fp32 sum: at most
// R + 1 roundings instead of 1, in exchange for sending one row per (token, rank) instead of one per
// (token, slot) (k / (experts per token per rank) times fewer combine bytes).
#pragma once

#include <cuda_runtime.h>

#include "kernels/sm90_dispatch.cuh"  // wait_for_arrivals
#include "kernels/sm90_ep_common.cuh"
#include "megamoe/error_cuda.h"

namespace megamoe::kernels {

__device__ __forceinline__ uint4 pack_bf16x8(const float* v) {
  uint4 packed;
  __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
  for (int i = 0; i < 8; ++i) o[i] = __float2bfloat16_rn(v[i]);
  return packed;
}

// Grid kEpCombineBlocks x (32 * kEpWarpsPerBlock): one warp per received row (sender s, row i).
// Lane j < k holds slot j's grouped row (recv_slot_row, -1 when its expert is not local); each lane
// reduces kChunks 8-channel chunks per step over the local slots in slot order and stores the BF16
// partial into s's combine_partials[token * R + me]. Then every block bumps every rank's
// combine_arrivals[me] (release). traffic[1] counts remote partial rows (the host makes bytes).
__global__ void __launch_bounds__(32 * kEpWarpsPerBlock) ep_combine_send_kernel(EpParams p) {
  if (ep_device::group_failed(p.ctx)) return;
  constexpr int kChunks = 4;
  const int lane = threadIdx.x & 31;
  const int warp_global = blockIdx.x * kEpWarpsPerBlock + (threadIdx.x >> 5);
  const int warps = gridDim.x * kEpWarpsPerBlock;
  const int H = p.hidden, k = p.top_k, R = p.ctx.ranks, me = p.ctx.rank, chunks = H / 8;
  const volatile uint64_t* recv_count = p.region<uint64_t>(me, p.layout.recv_count);
  unsigned long long remote_rows = 0;
  for (int s = 0; s < R; ++s) {
    const int n = static_cast<int>(recv_count[s]);
    for (int i = warp_global; i < n; i += warps) {
      const size_t row = static_cast<size_t>(s) * p.capacity + i;
      int m = -1;
      float w = 1.0f;
      if (lane < k) {
        m = p.recv_slot_row[row * k + lane];
        if (p.apply_weights) w = p.region<float>(me, p.layout.recv_weights)[row * k + lane];
      }
      const unsigned slots = __ballot_sync(0xffffffffu, m >= 0);
      const int token = p.region<int32_t>(me, p.layout.recv_src_token)[row];
      remote_rows += s != me;
      uint4* dst = reinterpret_cast<uint4*>(p.region<__nv_bfloat16>(s, p.layout.combine_partials) +
                                            (static_cast<size_t>(token) * R + me) * H);
      for (int c0 = 0; c0 < chunks; c0 += 32 * kChunks) {
        float acc[kChunks][8];
#pragma unroll
        for (int u = 0; u < kChunks; ++u)
#pragma unroll
          for (int i8 = 0; i8 < 8; ++i8) acc[u][i8] = 0.0f;
        for (unsigned rest = slots; rest; rest &= rest - 1) {  // slot order: lowest j first
          const int j = __ffs(rest) - 1;
          const int mj = __shfl_sync(0xffffffffu, m, j);
          const float wj = __shfl_sync(0xffffffffu, w, j);
          const uint4* y = reinterpret_cast<const uint4*>(p.expert_out + static_cast<size_t>(mj) * H);
          uint4 raw[kChunks];
#pragma unroll
          for (int u = 0; u < kChunks; ++u) {
            const int c = c0 + u * 32 + lane;
            raw[u] = c < chunks ? __ldg(y + c) : make_uint4(0, 0, 0, 0);
          }
#pragma unroll
          for (int u = 0; u < kChunks; ++u) {
            const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(&raw[u]);
#pragma unroll
            for (int i8 = 0; i8 < 8; ++i8) acc[u][i8] = __fmaf_rn(wj, __bfloat162float(v[i8]), acc[u][i8]);
          }
        }
#pragma unroll
        for (int u = 0; u < kChunks; ++u) {
          const int c = c0 + u * 32 + lane;
          if (c < chunks) dst[c] = pack_bf16x8(acc[u]);
        }
      }
    }
  }
  if (lane == 0 && remote_rows) atomicAdd(reinterpret_cast<unsigned long long*>(p.traffic + 1), remote_rows);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int r = 0; r < R; ++r) ep_device::add_release_sys(p.region<uint64_t>(r, p.layout.combine_arrivals) + me, 1ull);
  }
}

// One warp per token of this rank: out[t] = bf16(sum of the partials of the ranks holding t's experts,
// in rank order). A token without valid experts gets +0.
__global__ void __launch_bounds__(32 * kEpWarpsPerBlock) ep_combine_reduce_kernel(EpParams p) {
  if (ep_device::group_failed(p.ctx)) return;
  if (!wait_for_arrivals(p, p.layout.combine_arrivals, kEpCombineBlocks, EpPhase::kCombine)) return;
  constexpr int kChunks = 2;
  const int lane = threadIdx.x & 31;
  const int warp_global = blockIdx.x * kEpWarpsPerBlock + (threadIdx.x >> 5);
  const int H = p.hidden, k = p.top_k, R = p.ctx.ranks, chunks = H / 8;
  const __nv_bfloat16* partials = p.region<__nv_bfloat16>(p.ctx.rank, p.layout.combine_partials);
  for (int t = warp_global; t < p.num_tokens; t += gridDim.x * kEpWarpsPerBlock) {
    unsigned rank_bit = 0;
    if (lane < k) {
      const int id = p.saved_ids[t * k + lane];
      if (id >= 0) rank_bit = 1u << (id / p.experts_per_rank);
    }
    const unsigned ranks = __reduce_or_sync(0xffffffffu, rank_bit);
    for (int c0 = 0; c0 < chunks; c0 += 32 * kChunks) {
      float acc[kChunks][8];
#pragma unroll
      for (int u = 0; u < kChunks; ++u)
#pragma unroll
        for (int i8 = 0; i8 < 8; ++i8) acc[u][i8] = 0.0f;
      for (unsigned rest = ranks; rest; rest &= rest - 1) {  // rank order
        const int r = __ffs(rest) - 1;
        const uint4* row = reinterpret_cast<const uint4*>(partials + (static_cast<size_t>(t) * R + r) * H);
#pragma unroll
        for (int u = 0; u < kChunks; ++u) {
          const int c = c0 + u * 32 + lane;
          if (c >= chunks) continue;
          const uint4 raw = row[c];
          const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
          for (int i8 = 0; i8 < 8; ++i8) acc[u][i8] = __fadd_rn(acc[u][i8], __bfloat162float(v[i8]));
        }
      }
#pragma unroll
      for (int u = 0; u < kChunks; ++u) {
        const int c = c0 + u * 32 + lane;
        if (c < chunks) reinterpret_cast<uint4*>(p.out + static_cast<size_t>(t) * H)[c] = pack_bf16x8(acc[u]);
      }
    }
  }
}

// marks (optional): 3 events, before the send kernel and after each kernel.
inline void launch_ep_combine(const EpParams& p, cudaStream_t stream, const cudaEvent_t* marks = nullptr) {
  if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[0], stream));
  ep_combine_send_kernel<<<kEpCombineBlocks, 32 * kEpWarpsPerBlock, 0, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
  if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[1], stream));
  ep_combine_reduce_kernel<<<kEpCombineBlocks, 32 * kEpWarpsPerBlock, 0, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
  if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[2], stream));
}

}  // namespace megamoe::kernels
