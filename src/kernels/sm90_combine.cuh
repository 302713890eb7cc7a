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

__device__ __forceinline__ void cp_async_16(void* shared_dst, const void* global_src) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Dynamic shared memory of ep_combine_send_kernel<kStages>: a kStages-deep ring of 16 B per lane.
inline constexpr size_t ep_combine_send_shared_bytes(int stages) {
  return static_cast<size_t>(stages) * kEpWarpsPerBlock * 32 * sizeof(uint4);
}

// Grid kEpCombineBlocks x (32 * kEpWarpsPerBlock): one warp per received row (sender s, row i).
// The warp sums the row's local slots (recv_slot_row >= 0) in slot order, 8 channels per lane per
// step, and stores the BF16 partial into s's combine_partials[token * R + me]. Then every block bumps
// every rank's combine_arrivals[me] (release). traffic[1] counts remote partial rows (the host makes
// bytes).
// NOTES:
// - Work order: item w -> (row i = w / R, sender s = (w % R + i * R / warps) % R) (a rotation per i,
//   so a bijection), i.e. rows of all senders interleaved: remote rows (NVLink-bound stores) and
//   local rows (HBM-bound) run side by side instead of one sender's rows after the other's, and the
//   rotation gives a warp a different sender on each of its rows.
// - Loads: the (step, slot) items of a row stream through a per-lane ring of kStages 16-B shared
//   slots filled by cp.async (kStages - 1 items in flight per lane without holding registers; each
//   lane reads back only what it copied itself, so no block or warp barrier is needed).
// - Sum: per step, acc = fmaf(w_j, y_j, acc) over the local slots j in increasing order from +0,
//   one BF16 rounding: bit-identical to the one-slot-at-a-time loop it replaces.
template <int kStages>
__global__ void __launch_bounds__(32 * kEpWarpsPerBlock) ep_combine_send_kernel(EpParams p) {
  static_assert(kStages >= 2, "the ring needs at least two stages");
  if (ep_device::group_failed(p.ctx)) return;
  extern __shared__ uint4 combine_ring[];  // [warps][kStages][32]
  const int lane = threadIdx.x & 31;
  uint4* ring = combine_ring + (threadIdx.x >> 5) * kStages * 32 + lane;  // stage st at ring[st * 32]
  const int warp_global = blockIdx.x * kEpWarpsPerBlock + (threadIdx.x >> 5);
  const int warps = gridDim.x * kEpWarpsPerBlock;
  const int H = p.hidden, k = p.top_k, R = p.ctx.ranks, me = p.ctx.rank, chunks = H / 8;
  const int steps = (chunks + 31) / 32;
  const volatile uint64_t* recv_count = p.region<uint64_t>(me, p.layout.recv_count);
  int rows_of[kMaxEpRanks];
  int max_rows = 0;
#pragma unroll
  for (int s = 0; s < kMaxEpRanks; ++s) {
    rows_of[s] = s < R ? static_cast<int>(recv_count[s]) : 0;
    max_rows = max(max_rows, rows_of[s]);
  }
  unsigned long long remote_rows = 0;
  const int64_t items = static_cast<int64_t>(max_rows) * R;
  for (int64_t w = warp_global; w < items; w += warps) {
    const int i = static_cast<int>(w / R);
    const int s = static_cast<int>((w % R + static_cast<int64_t>(i) * R / warps) % R);
    int rows_s = 0;
#pragma unroll
    for (int r = 0; r < kMaxEpRanks; ++r)
      if (r == s) rows_s = rows_of[r];
    if (i >= rows_s) continue;  // warp-uniform
    const size_t row = static_cast<size_t>(s) * p.capacity + i;
    int m = -1;
    float wt = 1.0f;
    if (lane < k) {
      m = p.recv_slot_row[row * k + lane];
      if (p.apply_weights) wt = p.region<float>(me, p.layout.recv_weights)[row * k + lane];
    }
    const unsigned slots = __ballot_sync(0xffffffffu, m >= 0);
    const int n = __popc(slots);
    // Compact the local slots in slot order: lane q < n holds the q-th one's grouped row and weight.
    int slot_row = -1;
    float slot_weight = 0.0f;
    {
      int q = 0;
      for (unsigned rest = slots; rest; rest &= rest - 1, ++q) {
        const int j = __ffs(rest) - 1;
        const int mj = __shfl_sync(0xffffffffu, m, j);
        const float wj = __shfl_sync(0xffffffffu, wt, j);
        if (lane == q) {
          slot_row = mj;
          slot_weight = wj;
        }
      }
    }
    const int token = p.region<int32_t>(me, p.layout.recv_src_token)[row];
    remote_rows += s != me;
    uint4* dst = reinterpret_cast<uint4*>(p.region<__nv_bfloat16>(s, p.layout.combine_partials) +
                                          (static_cast<size_t>(token) * R + me) * H);
    if (n == 0) {  // no local slot (only with inconsistent peer counts): a zero partial
      for (int c = lane; c < chunks; c += 32) dst[c] = make_uint4(0, 0, 0, 0);
      continue;
    }
    int issue_step = 0, issue_slot = 0;
    auto issue = [&](int stage) {  // next (step, slot) item into `stage`; always one commit group
      if (issue_step < steps) {
        const int mq = __shfl_sync(0xffffffffu, slot_row, issue_slot);
        const int c = issue_step * 32 + lane;
        if (c < chunks)
          cp_async_16(ring + stage * 32, reinterpret_cast<const uint4*>(p.expert_out + static_cast<size_t>(mq) * H) + c);
        if (++issue_slot == n) {
          issue_slot = 0;
          ++issue_step;
        }
      }
      cp_async_commit();
    };
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) issue(st);
    float acc[8];
#pragma unroll
    for (int i8 = 0; i8 < 8; ++i8) acc[i8] = 0.0f;
    int step = 0, q = 0, stage = 0;
    const int total = steps * n;
    for (int it = 0; it < total; ++it) {
      cp_async_wait<kStages - 2>();  // item `it` has landed in `stage`
      const uint4 raw = ring[stage * 32];
      issue(stage == 0 ? kStages - 1 : stage - 1);  // the stage consumed one item ago
      const float wq = __shfl_sync(0xffffffffu, slot_weight, q);
      const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
      for (int i8 = 0; i8 < 8; ++i8) acc[i8] = __fmaf_rn(wq, __bfloat162float(v[i8]), acc[i8]);
      if (++q == n) {
        const int c = step * 32 + lane;
        if (c < chunks) dst[c] = pack_bf16x8(acc);
#pragma unroll
        for (int i8 = 0; i8 < 8; ++i8) acc[i8] = 0.0f;
        q = 0;
        ++step;
      }
      stage = stage == kStages - 1 ? 0 : stage + 1;
    }
  }
  cp_async_wait<0>();
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
// NOTES: the ring depth (items in flight per lane) is a compile-time choice among kCombineStageChoices;
// `stages` picks one (ep_combine_stages(): env MEGAMOE_EP_COMBINE_STAGES, default 8). Every depth gives
// bit-identical results.
template <int kStages>
inline void launch_ep_combine_send(const EpParams& p, cudaStream_t stream) {
  const size_t shared_bytes = ep_combine_send_shared_bytes(kStages);
  MEGAMOE_CUDA_CHECK(cudaFuncSetAttribute(ep_combine_send_kernel<kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(shared_bytes)));
  ep_combine_send_kernel<kStages><<<kEpCombineBlocks, 32 * kEpWarpsPerBlock, shared_bytes, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
}

inline void launch_ep_combine(const EpParams& p, cudaStream_t stream, const cudaEvent_t* marks = nullptr,
                              int stages = 8) {
  if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[0], stream));
  switch (stages) {
    case 4: launch_ep_combine_send<4>(p, stream); break;
    case 12: launch_ep_combine_send<12>(p, stream); break;
    default: launch_ep_combine_send<8>(p, stream); break;
  }
  if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[1], stream));
  ep_combine_reduce_kernel<<<kEpCombineBlocks, 32 * kEpWarpsPerBlock, 0, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
  if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[2], stream));
}

}  // namespace megamoe::kernels
