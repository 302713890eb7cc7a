// Dispatch: layout (who goes where), send (quantize + peer stores), receive (bounded wait, count per
// local expert, group rows by expert). Launcher at the bottom.
#pragma once

#include <cuda_runtime.h>

#include "kernels/sm90_ep_common.cuh"
#include "megamoe/error_cuda.h"

namespace megamoe::kernels {

// Exclusive scan over the block (blockDim.x multiple of 32, <= 1024). `scratch` >= 32 ints.
__device__ inline int block_exclusive_scan(int value, int* scratch, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int inclusive = value;
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += v;
  }
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int w = lane < warps ? scratch[lane] : 0;
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += v;
    }
    scratch[lane] = w;  // inclusive prefix over warps
  }
  __syncthreads();
  const int warp_base = warp == 0 ? 0 : scratch[warp - 1];
  const int result = warp_base + inclusive - value;
  if (total) *total = scratch[warps - 1];
  __syncthreads();
  return result;
}

// One block. Validates ids, assigns every (token, destination rank) a slot in the destination's
// receive block, saves ids/weights for combine, resets the receive-side counters, bumps the epoch.
// NOTES: slots are assigned in token order (deterministic); chunk-per-thread keeps it one pass.
__global__ void __launch_bounds__(kEpLayoutThreads) ep_layout_kernel(EpParams p) {
  if (ep_device::group_failed(p.ctx)) return;
  __shared__ int scratch[32];
  const int T = p.num_tokens, R = p.ctx.ranks, k = p.top_k;
  const int chunk = (T + blockDim.x - 1) / blockDim.x;
  const int begin = min(T, static_cast<int>(threadIdx.x) * chunk), end = min(T, begin + chunk);
  int counts[kMaxEpRanks];
#pragma unroll
  for (int r = 0; r < kMaxEpRanks; ++r) counts[r] = 0;
  for (int t = begin; t < end; ++t) {
    unsigned mask = 0;
    for (int j = 0; j < k; ++j) {
      int id = p.topk_ids[t * k + j];
      if (id < -1 || id >= p.num_experts) {
        ep_device::record_error(p.ctx, 2u, EpPhase::kInvalidInput, id, 0, /*fail_group=*/false);
        id = -1;
      }
      p.saved_ids[t * k + j] = id;
      p.saved_weights[t * k + j] = p.topk_weights[t * k + j];
      if (id >= 0) mask |= 1u << (id / p.experts_per_rank);
    }
#pragma unroll
    for (int r = 0; r < kMaxEpRanks; ++r) counts[r] += (mask >> r) & 1u;
  }
  int base[kMaxEpRanks];
#pragma unroll
  for (int r = 0; r < kMaxEpRanks; ++r) {
    if (r < R) {
      int total = 0;
      base[r] = block_exclusive_scan(counts[r], scratch, &total);
      if (threadIdx.x == 0) p.send_count[r] = total;
    }
  }
  for (int t = begin; t < end; ++t) {
    unsigned mask = 0;
    for (int j = 0; j < k; ++j) {
      const int id = p.saved_ids[t * k + j];
      if (id >= 0) mask |= 1u << (id / p.experts_per_rank);
    }
    for (int r = 0; r < R; ++r) p.token_dest_slot[t * R + r] = ((mask >> r) & 1u) ? base[r]++ : -1;
  }
  const int local_experts = p.experts_per_rank;
  for (int e = threadIdx.x; e < local_experts; e += blockDim.x) {
    p.expert_counts[e] = 0;
    p.expert_cursors[e] = 0;
  }
  if (threadIdx.x == 0) {
    *p.epoch += 1;
    p.traffic[1] = 0;  // combine's remote row counter
  }
}

// Grid kEpSendBlocks x (32 * kEpWarpsPerBlock). One warp per token: each lane owns 16 consecutive
// channels per step (8 lanes = one 128-channel scale group), quantizes them (fp8) and stores 16 B to
// every destination rank's receive row. Afterwards every block bumps each destination's arrival
// counter (release), block 0 first publishing the row count.
__global__ void __launch_bounds__(32 * kEpWarpsPerBlock) ep_dispatch_send_kernel(EpParams p) {
  if (ep_device::group_failed(p.ctx)) return;
  const int lane = threadIdx.x & 31;
  const int warp_global = blockIdx.x * kEpWarpsPerBlock + (threadIdx.x >> 5);
  const int R = p.ctx.ranks, H = p.hidden, k = p.top_k, S = p.num_scale_groups();
  const int me = p.ctx.rank;
  for (int t = warp_global; t < p.num_tokens; t += gridDim.x * kEpWarpsPerBlock) {
    int dest_row[kMaxEpRanks];
#pragma unroll
    for (int r = 0; r < kMaxEpRanks; ++r)
      dest_row[r] = r < R && p.token_dest_slot[t * R + r] >= 0 ? me * p.capacity + p.token_dest_slot[t * R + r] : -1;
    const uint4* src = reinterpret_cast<const uint4*>(p.hidden_in + static_cast<size_t>(t) * H);
    const int chunks = H / 16;
    for (int c0 = 0; c0 < chunks; c0 += 32) {
      const int c = c0 + lane;
      const bool active = c < chunks;
      uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
      if (active) {
        lo = __ldg(src + 2 * c);
        hi = __ldg(src + 2 * c + 1);
      }
      if (p.fp8) {
        float scale = 0.0f;
        const uint4 q = quantize16_fp8(lo, hi, &scale);
        if (active) {
          for (int r = 0; r < R; ++r) {
            if (dest_row[r] < 0) continue;
            uint8_t* row = p.region<uint8_t>(r, p.layout.recv_x) + static_cast<size_t>(dest_row[r]) * H;
            reinterpret_cast<uint4*>(row)[c] = q;
            if ((lane & 7) == 0)
              p.region<float>(r, p.layout.recv_scales)[static_cast<size_t>(dest_row[r]) * S + c / 8] = scale;
          }
        }
      } else if (active) {
        for (int r = 0; r < R; ++r) {
          if (dest_row[r] < 0) continue;
          uint4* row = reinterpret_cast<uint4*>(p.region<__nv_bfloat16>(r, p.layout.recv_x) +
                                                static_cast<size_t>(dest_row[r]) * H);
          row[2 * c] = lo;
          row[2 * c + 1] = hi;
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      if (dest_row[r] < 0) continue;
      for (int j = lane; j < k; j += 32) {
        p.region<int32_t>(r, p.layout.recv_ids)[static_cast<size_t>(dest_row[r]) * k + j] = p.saved_ids[t * k + j];
        p.region<float>(r, p.layout.recv_weights)[static_cast<size_t>(dest_row[r]) * k + j] = p.saved_weights[t * k + j];
      }
      if (lane == 0) p.region<int32_t>(r, p.layout.recv_src_token)[dest_row[r]] = t;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int r = 0; r < R; ++r) {
      if (blockIdx.x == 0)
        ep_device::store_release_sys(p.region<uint64_t>(r, p.layout.recv_count) + me, static_cast<uint64_t>(p.send_count[r]));
      ep_device::add_release_sys(p.region<uint64_t>(r, p.layout.dispatch_arrivals) + me, 1ull);
    }
    if (blockIdx.x == 0) {
      uint64_t remote_rows = 0;
      for (int r = 0; r < R; ++r)
        if (r != me) remote_rows += p.send_count[r];
      const uint64_t row_bytes = static_cast<uint64_t>(H) * (p.fp8 ? 1 : 2) + (p.fp8 ? 4ull * S : 0ull) + 8ull * k + 4;
      p.traffic[0] = remote_rows * row_bytes;
    }
  }
}

// Waits (bounded) until every sender's dispatch blocks of this epoch have arrived. Call with all
// threads; returns false when the group failed.
__device__ inline bool wait_for_arrivals(const EpParams& p, size_t arrivals_offset, int blocks_per_sender, EpPhase phase) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = 1;
    const uint64_t target = *p.epoch * static_cast<uint64_t>(blocks_per_sender);
    const uint64_t* arrivals = p.region<uint64_t>(p.ctx.rank, arrivals_offset);
    for (int s = 0; s < p.ctx.ranks && ok; ++s)
      if (!ep_device::bounded_wait_geq(p.ctx, arrivals + s, target, phase, s)) ok = 0;
  }
  __syncthreads();
  return ok != 0;
}

// Received row index space: sender s, row i < recv_count[s]  <->  flat s*C + i.
// Counts rows per local expert (one per (row, slot) whose expert lives here).
__global__ void __launch_bounds__(32 * kEpWarpsPerBlock) ep_receive_count_kernel(EpParams p) {
  if (ep_device::group_failed(p.ctx)) return;
  if (!wait_for_arrivals(p, p.layout.dispatch_arrivals, kEpSendBlocks, EpPhase::kDispatch)) return;
  const int k = p.top_k, first = p.ctx.rank * p.experts_per_rank;
  const volatile uint64_t* counts = p.region<uint64_t>(p.ctx.rank, p.layout.recv_count);
  const int32_t* ids = p.region<int32_t>(p.ctx.rank, p.layout.recv_ids);
  for (int s = 0; s < p.ctx.ranks; ++s) {
    const int n = static_cast<int>(counts[s]);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n * k; i += gridDim.x * blockDim.x) {
      const int e = ids[static_cast<size_t>(s) * p.capacity * k + i] - first;
      if (e >= 0 && e < p.experts_per_rank) atomicAdd(p.expert_counts + e, 1);
    }
  }
}

__global__ void ep_receive_offsets_kernel(EpParams p) {
  if (ep_device::group_failed(p.ctx) || threadIdx.x != 0) return;
  int at = 0;
  for (int e = 0; e < p.experts_per_rank; ++e) {
    p.expert_offsets[e] = at;
    at += p.expert_counts[e];
  }
  p.expert_offsets[p.experts_per_rank] = at;
}

// One warp per received row: copies it into one grouped row per local expert it selected.
__global__ void __launch_bounds__(32 * kEpWarpsPerBlock) ep_receive_scatter_kernel(EpParams p) {
  if (ep_device::group_failed(p.ctx)) return;
  const int lane = threadIdx.x & 31;
  const int warp_global = blockIdx.x * kEpWarpsPerBlock + (threadIdx.x >> 5);
  const int warps = gridDim.x * kEpWarpsPerBlock;
  const int k = p.top_k, H = p.hidden, S = p.num_scale_groups(), first = p.ctx.rank * p.experts_per_rank;
  const int me = p.ctx.rank;
  const uint64_t* counts = p.region<uint64_t>(me, p.layout.recv_count);
  const size_t payload = p.fp8 ? 1 : 2;
  for (int s = 0; s < p.ctx.ranks; ++s) {
    const int n = static_cast<int>(counts[s]);
    for (int i = warp_global; i < n; i += warps) {
      const size_t row = static_cast<size_t>(s) * p.capacity + i;
      const int32_t* ids = p.region<int32_t>(me, p.layout.recv_ids) + row * k;
      const float* weights = p.region<float>(me, p.layout.recv_weights) + row * k;
      const uint4* src = reinterpret_cast<const uint4*>(p.region<uint8_t>(me, p.layout.recv_x) + row * H * payload);
      const float* src_scales = p.region<float>(me, p.layout.recv_scales) + row * S;
      const int token = p.region<int32_t>(me, p.layout.recv_src_token)[row];
      for (int j = 0; j < k; ++j) {
        const int e = ids[j] - first;
        if (e < 0 || e >= p.experts_per_rank) continue;
        int dst = 0;
        if (lane == 0) dst = p.expert_offsets[e] + atomicAdd(p.expert_cursors + e, 1);
        dst = __shfl_sync(0xffffffffu, dst, 0);
        uint4* out = reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.grouped_x) + static_cast<size_t>(dst) * H * payload);
        warp_copy16(out, src, static_cast<int>(H * payload / 16), lane);
        if (p.fp8)
          for (int g = lane; g < S; g += 32) p.grouped_scales[static_cast<size_t>(dst) * S + g] = src_scales[g];
        if (lane == 0) {
          p.grouped_sources[dst] = RowSource{s, token, j, weights[j]};
          p.grouped_weights[dst] = weights[j];
        }
      }
    }
  }
}

inline void launch_ep_dispatch(const EpParams& p, cudaStream_t stream) {
  ep_layout_kernel<<<1, kEpLayoutThreads, 0, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
  ep_dispatch_send_kernel<<<kEpSendBlocks, 32 * kEpWarpsPerBlock, 0, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
  ep_receive_count_kernel<<<kEpSendBlocks, 32 * kEpWarpsPerBlock, 0, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
  ep_receive_offsets_kernel<<<1, 32, 0, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
  ep_receive_scatter_kernel<<<kEpSendBlocks, 32 * kEpWarpsPerBlock, 0, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
}

}  // namespace megamoe::kernels
