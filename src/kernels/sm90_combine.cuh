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

// One (step, slot) item of a local-slot sum, shared by the send kernel and both roles of the fused kernel (one
// copy of the fmaf chain, so the two paths stay bit-identical): waits until the item has landed in ring stage
// `stage`, refills the stage consumed one item ago (issue(), the caller's lambda: always one cp.async group),
// and adds the q-th slot's weighted chunk: acc[i] = fmaf(w_q, y_q[i], acc[i]).
// NOTES: kStages - 1 groups are in flight on entry (item `it` is the oldest); lane q' < n holds the q'-th slot's
// weight in slot_weight (one warp, all lanes: shfl). The loops, their state and acc stay in the kernels:
// __forceinline__ and the same statements as the three copies it replaces, so the SASS is unchanged.
template <int kStages, class Issue>
__device__ __forceinline__ void combine_add_item(const uint4* ring, int stage, Issue& issue, float slot_weight, int q,
                                                 float (&acc)[8]) {
  cp_async_wait<kStages - 2>();  // the item has landed in `stage`
  const uint4 raw = ring[stage * 32];
  issue(stage == 0 ? kStages - 1 : stage - 1);  // the stage consumed one item ago
  const float wq = __shfl_sync(0xffffffffu, slot_weight, q);
  const __nv_bfloat16* y = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
  for (int i8 = 0; i8 < 8; ++i8) acc[i8] = __fmaf_rn(wq, __bfloat162float(y[i8]), acc[i8]);
}

// End of one step of a producer row (send kernel, fused producer): stores the lane's chunk of the partial,
// bf16_rn(acc), at dst[step * 32 + lane] (chunks past the row's `chunks` are not stored) and restarts acc at +0
// for the next step. NOTES: __forceinline__ and the same statements as the two copies it replaces: the SASS of
// both kernels is unchanged.
__device__ __forceinline__ void combine_store_step(uint4* dst, int step, int lane, int chunks, float (&acc)[8]) {
  const int c = step * 32 + lane;
  if (c < chunks) dst[c] = pack_bf16x8(acc);
#pragma unroll
  for (int i8 = 0; i8 < 8; ++i8) acc[i8] = 0.0f;
}

// One producer row, shared by ep_combine_send_kernel and the producer items of ep_combine_fused_kernel: the n >= 1
// local slots' (step, slot) items stream through the lane's ring, each step is summed in slot order
// (combine_add_item) and stored (combine_store_step), and publish(steps done) runs after every kEpProgressSteps
// steps and after the last (the fused producer's progress word; the send kernel passes a no-op).
// NOTES:
// - The caller has issued the first kStages - 1 items (issue(0 .. kStages - 2)) and set acc = +0, step = q =
//   stage = 0; kStages - 1 (possibly empty) cp.async groups are still pending on return.
// - The state (acc, step, q, stage) is the caller's, by reference, and so is the prologue: declared in here they
//   come out of register promotion in another order and ptxas renames / reschedules the loop. Likewise publish
//   is called under the progress condition in here (a wrapper lambda with the condition changed the fused
//   kernel's SASS). As it is (__forceinline__), both kernels' SASS is unchanged.
template <int kStages, class Issue, class Publish>
__device__ __forceinline__ void combine_sum_row(const uint4* ring, Issue& issue, Publish&& publish, float slot_weight,
                                                int n, int steps, int chunks, int lane, uint4* dst, float (&acc)[8],
                                                int& step, int& q, int& stage) {
  const int total = steps * n;
  for (int it = 0; it < total; ++it) {
    combine_add_item<kStages>(ring, stage, issue, slot_weight, q, acc);  // item `it`
    if (++q == n) {
      combine_store_step(dst, step, lane, chunks, acc);
      q = 0;
      ++step;
      if (step % kEpProgressSteps == 0 || step == steps) publish(step);
    }
    stage = stage == kStages - 1 ? 0 : stage + 1;
  }
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
    combine_sum_row<kStages>(ring, issue, [](int) {}, slot_weight, n, steps, chunks, lane, dst, acc, step, q, stage);
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

// ---- fused combine (MEGAMOE_EP_OVERLAP=1): send, wait and reduce in ONE kernel -----------------------------
// Work items, handed out in ticket order (one atomic per warp and item on combine_tickets[0]):
//   producer (sender s != me, row i): this rank's partial for s's token recv_src_token[s*C + i], stored
//     into s's combine_partials[token * R + me] step by step (256 channels per step); after every
//     kEpProgressSteps steps and after the last: __syncwarp, system fence, st.release.sys of
//     (epoch << 16) | steps into s's combine_progress[token * R + me].
//   consumer (own token t): out[t] from this rank's own partial (summed in registers from the grouped
//     rows of its local slots, rounded to BF16) and the peers' partials (read from this rank's window
//     once their progress covers the step), added in rank order.
// Item w -> virtual step v = w / R, sub = w % R: sub < R - 1 is the producer of sender (me + 1 + sub) % R,
// row v; sub = R - 1 is the consumer of token v - lag (invalid items are skipped).
// NOTES:
// - No deadlock, whatever the residency of blocks: give every item the position w on its rank. A consumer
//   (position R*(t + lag) + R - 1) only waits for producer rows (me, slot_r(t)) of peers r, at position
//   <= R*slot_r(t) + R - 2 <= R*t + R - 2 (slots follow token order, so slot_r(t) <= t): strictly smaller.
//   Producers never wait. Tickets are handed out in position order, so the item of smallest position
//   that is not complete on any rank has been handed out to a running warp, which finishes the items of
//   smaller position before it (complete) and then it (a producer, or a consumer whose rows are complete).
// - Memory ordering: a producer's lanes store the partial's chunks, __syncwarp orders them before lane 0's
//   __threadfence_system + st.release.sys of the progress word (cumulative, as the block-wide
//   __syncthreads + fence + red.release of the other EP kernels). A consumer lane waits (bounded, with
//   {rank, 'combine', peer}) with its own ld.acquire.sys, so its later __ldcg loads of the partial see
//   the producer's stores. Progress words are epoch-tagged, so they need no reset (a word of call e - 1
//   is < e << 16) and graph replays work.
// - Window reuse: this rank's next dispatch writes into a peer's window only after this kernel ends, i.e.
//   after every row the peer produced for this rank (every row it received from this rank) is
//   published; the peer read that row's metadata (recv_weights, recv_src_token) before publishing it.
//   The row counts come from the local recv_rows (see ep_receive_kernel), not from the window. The
//   peer's next combine writes this rank's partials only after this rank's next dispatch.
// - Bit-identical to the two-kernel path: a producer row is the same fmaf chain in slot order from +0,
//   rounded once; the consumer's own partial is the same chain and rounding (weights from saved_weights,
//   the values the send kernel copied into recv_weights), and out = bf16(+0 + float(partial_r) ... in
//   rank order over the ranks holding one of t's experts).
// - lag (EpParams::combine_lag, env MEGAMOE_EP_COMBINE_LAG, default 128): how many virtual steps the
//   consumers trail the producers, so that a consumer mostly finds its peers' rows already under way.
//   Any lag >= 0 is deadlock-free and gives the same output.
// - combine_tickets is zeroed by the last block to finish (no memset node: graph-capturable).

// Waits (bounded) until the peer's progress word covers `target`; every lane polls with its own acquire
// load. Returns the steps all lanes have seen (warp-uniform), or -1 after a failure (warp-uniform).
__device__ __forceinline__ int wait_combine_progress(const EpParams& p, const uint64_t* word, uint64_t epoch,
                                                     int target_steps, int steps, int peer) {
  const uint64_t target = (epoch << kEpProgressShift) | static_cast<uint64_t>(target_steps);
  const bool ok = ep_device::bounded_wait_geq(p.ctx, word, target, EpPhase::kCombine, peer);
  if (!__all_sync(0xffffffffu, ok)) return -1;
  const uint64_t v = ep_device::load_acquire_sys(word);
  // A word of a later epoch cannot appear (the peer's next combine follows this rank's next dispatch);
  // treat it as complete rather than trusting its step count.
  const unsigned seen = (v >> kEpProgressShift) > epoch ? static_cast<unsigned>(steps)
                                                        : static_cast<unsigned>(v & ((1ull << kEpProgressShift) - 1));
  return static_cast<int>(__reduce_min_sync(0xffffffffu, max(seen, static_cast<unsigned>(target_steps))));
}

template <int kStages>
__global__ void __launch_bounds__(32 * kEpWarpsPerBlock, 2) ep_combine_fused_kernel(EpParams p) {
  static_assert(kStages >= 2, "the ring needs at least two stages");
  if (ep_device::group_failed(p.ctx)) return;
  extern __shared__ uint4 combine_ring[];  // [warps][kStages][32]
  __shared__ int block_failed;
  const int lane = threadIdx.x & 31;
  uint4* ring = combine_ring + (threadIdx.x >> 5) * kStages * 32 + lane;  // stage st at ring[st * 32]
  const int H = p.hidden, k = p.top_k, R = p.ctx.ranks, me = p.ctx.rank, chunks = H / 8, T = p.num_tokens;
  const int steps = (chunks + 31) / 32;
  const uint64_t epoch = *reinterpret_cast<volatile uint64_t*>(p.epoch);
  if (threadIdx.x == 0) {
    block_failed = 0;
    // "this rank's combine of this call has started" (so its dispatch is over), for every peer's end wait
    for (int r = 0; r < p.ctx.ranks; ++r)
      ep_device::add_release_sys(p.region<uint64_t>(r, p.layout.combine_arrivals) + p.ctx.rank, 1ull);
  }
  __syncthreads();
  int max_rows = 0;
  for (int s = 0; s < R; ++s)
    if (s != me) max_rows = max(max_rows, p.recv_rows[s]);
  const int lag = p.combine_lag;
  const int virtual_steps = max(max_rows, T > 0 ? T + lag : 0);
  const unsigned long long items = static_cast<unsigned long long>(virtual_steps) * R;
  const __nv_bfloat16* own_partials = p.region<__nv_bfloat16>(me, p.layout.combine_partials);
  const uint64_t* own_progress = p.region<uint64_t>(me, p.layout.combine_progress);
  unsigned long long remote_rows = 0;
  bool failed = false;

  // One (step, slot) stream through the ring: rows [n] of expert_out (lane q < n holds the q-th one's
  // grouped row), `steps` steps of 32 chunks. issue() always commits one group.
  int issue_step = 0, issue_slot = 0, n = 0, slot_row = -1;
  float slot_weight = 0.0f;
  auto issue = [&](int stage) {
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
  // Compacts the slots with m >= 0 in slot order (lane q < n: the q-th one's grouped row and weight).
  auto compact = [&](int m, float wt) {
    const unsigned slots = __ballot_sync(0xffffffffu, m >= 0);
    n = __popc(slots);
    slot_row = -1;
    slot_weight = 0.0f;
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
    issue_step = 0;
    issue_slot = 0;
  };

  while (true) {
    unsigned long long w = 0;
    if (lane == 0) w = atomicAdd(p.combine_tickets, 1ull);
    w = __shfl_sync(0xffffffffu, w, 0);
    if (w >= items) break;
    // items <= (2^20 + 2^20) * 8 (capacity and lag limits): 32-bit division (a 64-bit one is a call)
    const int v = static_cast<int>(static_cast<unsigned>(w) / static_cast<unsigned>(R));
    const int sub = static_cast<int>(static_cast<unsigned>(w) % static_cast<unsigned>(R));
    if (sub < R - 1) {
      // ---- producer: row v of sender s ----
      const int s = (me + 1 + sub) % R;
      if (v >= p.recv_rows[s]) continue;  // warp-uniform
      const size_t row = static_cast<size_t>(s) * p.capacity + v;
      int m = -1;
      float wt = 1.0f;
      if (lane < k) {
        m = p.recv_slot_row[row * k + lane];
        if (p.apply_weights) wt = p.region<float>(me, p.layout.recv_weights)[row * k + lane];
      }
      compact(m, wt);
      const int token = p.region<int32_t>(me, p.layout.recv_src_token)[row];
      ++remote_rows;
      uint4* dst = reinterpret_cast<uint4*>(p.region<__nv_bfloat16>(s, p.layout.combine_partials) +
                                            (static_cast<size_t>(token) * R + me) * H);
      uint64_t* progress = p.region<uint64_t>(s, p.layout.combine_progress) + static_cast<size_t>(token) * R + me;
      auto publish = [&](int done) {
        __syncwarp();
        if (lane == 0) {
          __threadfence_system();
          ep_device::store_release_sys(progress, (epoch << kEpProgressShift) | static_cast<uint64_t>(done));
        }
      };
      if (n == 0) {  // no local slot (only with inconsistent peer counts): a zero partial
        for (int c = lane; c < chunks; c += 32) dst[c] = make_uint4(0, 0, 0, 0);
        publish(steps);
        continue;
      }
#pragma unroll
      for (int st = 0; st < kStages - 1; ++st) issue(st);
      float acc[8];
#pragma unroll
      for (int i8 = 0; i8 < 8; ++i8) acc[i8] = 0.0f;
      int step = 0, q = 0, stage = 0;
      combine_sum_row<kStages>(ring, issue, publish, slot_weight, n, steps, chunks, lane, dst, acc, step, q, stage);
      cp_async_wait<0>();  // the trailing empty groups; the ring is reused by the next item
      continue;
    }
    // ---- consumer: own token t ----
    const int t = v - lag;
    if (t < 0 || t >= T) continue;
    unsigned rank_bit = 0;
    if (lane < k) {
      const int id = p.saved_ids[static_cast<size_t>(t) * k + lane];
      if (id >= 0) rank_bit = 1u << (id / p.experts_per_rank);
    }
    const unsigned ranks = __reduce_or_sync(0xffffffffu, rank_bit);
    const bool own = (ranks >> me) & 1u;
    int m = -1;
    float wt = 1.0f;
    if (own && lane < k) {
      const int local_slot = p.token_dest_slot[static_cast<size_t>(t) * R + me];
      if (local_slot >= 0) {
        m = p.recv_slot_row[(static_cast<size_t>(me) * p.capacity + local_slot) * k + lane];
        if (p.apply_weights) wt = p.saved_weights[static_cast<size_t>(t) * k + lane];
      }
    }
    compact(m, wt);  // n = 0 when no own slot: the own partial is +0 (as the zero row before)
    if (n > 0) {
#pragma unroll
      for (int st = 0; st < kStages - 1; ++st) issue(st);
    }
    const unsigned peers = ranks & ~(1u << me);
    const int first_peer = peers ? __ffs(peers) - 1 : -1;
    int seen = peers ? 0 : steps;  // steps known to be stored in every peer's row (warp-uniform)
    const uint4* partial_row = reinterpret_cast<const uint4*>(own_partials + static_cast<size_t>(t) * R * H);
    int stage = 0;
    for (int step = 0; step < steps && !failed; ++step) {
      const int c = step * 32 + lane;
      if (seen <= step) {  // wait (bounded) for every peer's progress to cover this step
        seen = steps;
        for (unsigned rest = peers; rest; rest &= rest - 1) {
          const int r = __ffs(rest) - 1;
          const int got = wait_combine_progress(p, own_progress + static_cast<size_t>(t) * R + r, epoch, step + 1, steps, r);
          if (got < 0) {
            failed = true;
            break;
          }
          seen = min(seen, got);
        }
        if (failed) break;
      }
      // The first peer's chunk is loaded before the own slots are summed (the two latencies overlap).
      uint4 first_raw = make_uint4(0, 0, 0, 0);
      if (first_peer >= 0 && c < chunks) first_raw = __ldcg(partial_row + static_cast<size_t>(first_peer) * (H / 8) + c);
      uint4 own_raw = make_uint4(0, 0, 0, 0);  // the own partial, rounded to BF16 like a sent one (+0 without slots)
      if (own) {
        float part[8];
#pragma unroll
        for (int i8 = 0; i8 < 8; ++i8) part[i8] = 0.0f;
        for (int q = 0; q < n; ++q) {
          combine_add_item<kStages>(ring, stage, issue, slot_weight, q, part);  // item (step, q)
          stage = stage == kStages - 1 ? 0 : stage + 1;
        }
        own_raw = pack_bf16x8(part);
      }
      float out[8];
#pragma unroll
      for (int i8 = 0; i8 < 8; ++i8) out[i8] = 0.0f;
      for (unsigned rest = ranks; rest; rest &= rest - 1) {  // rank order, from +0
        const int r = __ffs(rest) - 1;
        uint4 raw = r == me ? own_raw : first_raw;
        if (r != me && r != first_peer && c < chunks) raw = __ldcg(partial_row + static_cast<size_t>(r) * (H / 8) + c);
        const __nv_bfloat16* b = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
        for (int i8 = 0; i8 < 8; ++i8) out[i8] = __fadd_rn(out[i8], __bfloat162float(b[i8]));
      }
      if (c < chunks) reinterpret_cast<uint4*>(p.out + static_cast<size_t>(t) * H)[c] = pack_bf16x8(out);
    }
    cp_async_wait<0>();
    if (failed) break;
  }
  cp_async_wait<0>();
  if (lane == 0 && remote_rows) atomicAdd(reinterpret_cast<unsigned long long*>(p.traffic + 1), remote_rows);
  if (failed && lane == 0) block_failed = 1;
  __syncthreads();
  // The last block to finish zeroes the tickets (after a failure the group is dead: leave them), then
  // waits (bounded) until every peer's combine of this call has started: this kernel must not end while
  // a peer may still be in its dispatch of this call (reading recv_expert_counts / recv_count /
  // recv_* of this call, which this rank's next dispatch overwrites). Without it a rank whose tokens
  // need no peer partial (T = 0, or all experts local) would wait for nothing and could run ahead.
  if (threadIdx.x == 0 && !block_failed) {
    __threadfence();
    if (atomicAdd(p.combine_tickets + 1, 1ull) == gridDim.x - 1) {
      p.combine_tickets[0] = 0;
      p.combine_tickets[1] = 0;
      const uint64_t target = (epoch - 1) * static_cast<uint64_t>(kEpCombineBlocks) + 1;
      const uint64_t* started = p.region<uint64_t>(me, p.layout.combine_arrivals);
      for (int s = 0; s < R; ++s)
        if (s != me && !ep_device::bounded_wait_geq(p.ctx, started + s, target, EpPhase::kCombine, s)) break;
    }
  }
}

template <int kStages>
inline void launch_ep_combine_fused(const EpParams& p, cudaStream_t stream) {
  const size_t shared_bytes = ep_combine_send_shared_bytes(kStages);
  MEGAMOE_CUDA_CHECK(cudaFuncSetAttribute(ep_combine_fused_kernel<kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(shared_bytes)));
  ep_combine_fused_kernel<kStages><<<kEpCombineBlocks, 32 * kEpWarpsPerBlock, shared_bytes, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
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

// fused (MEGAMOE_EP_OVERLAP=1): ep_combine_fused_kernel alone; marks[1] and marks[2] are then recorded
// back to back (the "reduce" split reads ~0: it is inside the one kernel).
inline void launch_ep_combine(const EpParams& p, cudaStream_t stream, const cudaEvent_t* marks = nullptr,
                              int stages = 8, bool fused = false) {
  if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[0], stream));
  if (fused) {
    switch (stages) {
      case 4: launch_ep_combine_fused<4>(p, stream); break;
      case 12: launch_ep_combine_fused<12>(p, stream); break;
      default: launch_ep_combine_fused<8>(p, stream); break;
    }
    if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[1], stream));
    if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[2], stream));
    return;
  }
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
