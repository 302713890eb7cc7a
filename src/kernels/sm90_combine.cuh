// Combine: every grouped row's BF16 expert output goes back to its source rank's combine_rows slot
// (token, topk slot); the source then reduces its top-k slots in fixed order. Launcher at the bottom.
#pragma once

#include <cuda_runtime.h>

#include "kernels/sm90_ep_common.cuh"
#include "kernels/sm90_dispatch.cuh"  // wait_for_arrivals
#include "megamoe/error_cuda.h"

namespace megamoe::kernels {

// traffic[1] counts remote rows (the host turns them into bytes).
// Grid kEpCombineBlocks x (32 * kEpWarpsPerBlock): one warp per grouped row, 16 B per lane per step.
__global__ void __launch_bounds__(32 * kEpWarpsPerBlock) ep_combine_send_kernel(EpParams p) {
  if (ep_device::group_failed(p.ctx)) return;
  const int lane = threadIdx.x & 31;
  const int warp_global = blockIdx.x * kEpWarpsPerBlock + (threadIdx.x >> 5);
  const int H = p.hidden, k = p.top_k, me = p.ctx.rank;
  const int rows = p.expert_offsets[p.experts_per_rank];
  unsigned long long remote_rows = 0;
  for (int m = warp_global; m < rows; m += gridDim.x * kEpWarpsPerBlock) {
    const RowSource source = p.grouped_sources[m];
    remote_rows += source.rank != me;
    const uint4* src = reinterpret_cast<const uint4*>(p.expert_out + static_cast<size_t>(m) * H);
    uint4* dst = reinterpret_cast<uint4*>(p.region<__nv_bfloat16>(source.rank, p.layout.combine_rows) +
                                          (static_cast<size_t>(source.token) * k + source.slot) * H);
    warp_copy16(dst, src, H / 8, lane);
  }
  if (lane == 0 && remote_rows) atomicAdd(reinterpret_cast<unsigned long long*>(p.traffic + 1), remote_rows);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int r = 0; r < p.ctx.ranks; ++r) ep_device::add_release_sys(p.region<uint64_t>(r, p.layout.combine_arrivals) + me, 1ull);
  }
}

// One warp per token of this rank: out[t] = bf16(sum_j fmaf(w_j, y_j, acc)) over valid slots, in order.
__global__ void __launch_bounds__(32 * kEpWarpsPerBlock) ep_combine_reduce_kernel(EpParams p) {
  if (ep_device::group_failed(p.ctx)) return;
  if (!wait_for_arrivals(p, p.layout.combine_arrivals, kEpCombineBlocks, EpPhase::kCombine)) return;
  const int lane = threadIdx.x & 31;
  const int warp_global = blockIdx.x * kEpWarpsPerBlock + (threadIdx.x >> 5);
  const int H = p.hidden, k = p.top_k;
  const __nv_bfloat16* rows = p.region<__nv_bfloat16>(p.ctx.rank, p.layout.combine_rows);
  for (int t = warp_global; t < p.num_tokens; t += gridDim.x * kEpWarpsPerBlock)
    reduce_topk_row(rows + static_cast<size_t>(t) * k * H, p.saved_ids + t * k, p.saved_weights + t * k, k, H,
                    p.apply_weights, p.out + static_cast<size_t>(t) * H, lane);
}

inline void launch_ep_combine(const EpParams& p, cudaStream_t stream) {
  ep_combine_send_kernel<<<kEpCombineBlocks, 32 * kEpWarpsPerBlock, 0, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
  ep_combine_reduce_kernel<<<kEpCombineBlocks, 32 * kEpWarpsPerBlock, 0, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
}

}  // namespace megamoe::kernels
