// Dispatch: layout (who goes where), send (quantize + peer stores), receive (bounded wait, count per
// local expert, group rows by expert). Launcher at the bottom.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/ep_dispatch_pieces.h"
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

// Waits (bounded, like every EP wait) for an earlier layout tile's published word of this call.
__device__ inline bool wait_for_tile_slots(const EpDeviceContext& ctx, const uint64_t* word, uint32_t tag,
                                           uint64_t* value) {
  uint64_t v = ep_device::load_relaxed_gpu(word);
  if (static_cast<uint32_t>(v >> 32) != tag) {
    const uint64_t start = ep_device::globaltimer_ns();
    uint32_t polls = 0;
    while (static_cast<uint32_t>((v = ep_device::load_relaxed_gpu(word)) >> 32) != tag) {
      if ((++polls & 63u) == 0) {
        const uint64_t waited = ep_device::globaltimer_ns() - start;
        if (ep_device::group_failed(ctx)) return false;
        if (waited > ctx.wait_timeout_ns) {
          ep_device::record_error(ctx, 1u, EpPhase::kDispatch, ctx.rank, waited);
          return false;
        }
      }
    }
  }
  *value = v;
  return true;
}

// Grid ceil(T / kEpLayoutTileTokens) (at least 1) x kEpLayoutTileTokens, dynamic shared memory 4 * E.
// Validates ids, assigns every (token, destination rank) a slot in the destination's receive block
// and every valid (token, slot) a position among this rank's rows of its expert, saves ids/weights
// for combine, bumps the epoch. One tile of kEpLayoutTileTokens tokens per block.
// NOTES:
// - Tiles are taken in order from a ticket counter (not blockIdx), so a block only ever waits for
//   tiles whose blocks are already running: no deadlock whatever the scheduling order.
// - Receive slots follow token order (deterministic): slot = slots of earlier tiles (look-back over
//   their published per-rank counts) + earlier warps of this tile + earlier lanes of this warp
//   (ballot + popc). A tile publishes its counts as one 64-bit word (epoch tag << 32 | count) as
//   soon as it has them, so every block waits for its predecessors' counts, never for their ends,
//   and the words need no reset between calls.
// - Positions inside an expert: a block counts its tile's rows per expert (shared atomics), takes
//   a base with ONE global atomicAdd per (tile, expert) on layout_fill, then hands out base + local
//   index (shared atomics). The row order inside an expert is therefore unspecified (results never
//   depend on it: every grouped row is computed independently); the positions of an expert are
//   exactly 0..count-1.
// - The last block to finish (done counter) copies layout_fill to send_expert_counts and zeroes it,
//   resets the ticket/done counters and bumps the epoch: the scratch is zero again for the next call
//   (and for a graph replay).
// - All id/weight loads and saved_* / slot_pos stores are flat over the tile's [tokens, k] block, so
//   coalesced (the one-block version was bound by one SM storing 32 strided sectors per warp store).
__global__ void __launch_bounds__(kEpLayoutTileTokens) ep_layout_kernel(EpParams p) {
  constexpr int kWarps = kEpLayoutTileTokens / 32;
  if (ep_device::group_failed(p.ctx)) return;
  extern __shared__ int expert_base[];                 // [E]: tile's rows per expert, then next position
  __shared__ unsigned token_ranks[kEpLayoutTileTokens];  // destination-rank bit mask per token of the tile
  __shared__ int warp_slot_base[kMaxEpRanks][kWarps];  // per rank: slots of earlier warps of this tile
  __shared__ int earlier_tiles[kMaxEpRanks];           // per rank: slots of earlier tiles
  __shared__ int tile_slots[kMaxEpRanks];              // per rank: slots of this tile
  __shared__ int shared_tile;
  __shared__ uint32_t shared_tag;
  __shared__ int is_last;
  const int T = p.num_tokens, R = p.ctx.ranks, k = p.top_k, E = p.num_experts, El = p.experts_per_rank;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    shared_tile = static_cast<int>(atomicAdd(p.layout_counters + 0, 1u));
    shared_tag = static_cast<uint32_t>(*reinterpret_cast<volatile uint64_t*>(p.epoch) + 1);
  }
  for (int e = threadIdx.x; e < E; e += blockDim.x) expert_base[e] = 0;
  token_ranks[threadIdx.x] = 0;
  if (threadIdx.x < kMaxEpRanks) earlier_tiles[threadIdx.x] = 0;
  __syncthreads();
  const int tile = shared_tile;
  const uint32_t tag = shared_tag;
  if (tile >= static_cast<int>(gridDim.x)) {  // scratch left dirty by an aborted call: never expected
    if (threadIdx.x == 0) ep_device::record_error(p.ctx, 1u, EpPhase::kDispatch, p.ctx.rank, 0);
    return;
  }
  const int first_token = tile * kEpLayoutTileTokens;
  const int tokens = max(0, min(T - first_token, kEpLayoutTileTokens));
  const size_t first = static_cast<size_t>(first_token) * k;
  const int elems = tokens * k;

  // Pass 1: validate + save, count rows per expert, mark destination ranks per token.
  for (int i = threadIdx.x; i < elems; i += blockDim.x) {
    int id = __ldg(p.topk_ids + first + i);
    const float w = __ldg(p.topk_weights + first + i);
    if (id < -1 || id >= E) {
      ep_device::record_error(p.ctx, 2u, EpPhase::kInvalidInput, id, 0, /*fail_group=*/false);
      id = -1;
    }
    p.saved_ids[first + i] = id;
    p.saved_weights[first + i] = w;
    if (id >= 0) {
      atomicAdd(expert_base + id, 1);
      atomicOr(token_ranks + i / k, 1u << (id / El));
    }
  }
  __syncthreads();

  // Per-rank slots inside the tile (token order); publish the tile's counts at once.
  const unsigned mask = token_ranks[threadIdx.x];
  int in_warp[kMaxEpRanks];  // slots of earlier lanes of this warp, per rank
#pragma unroll
  for (int r = 0; r < kMaxEpRanks; ++r) {
    in_warp[r] = 0;
    if (r < R) {
      const unsigned bits = __ballot_sync(0xffffffffu, (mask >> r) & 1u);
      in_warp[r] = __popc(bits & ((1u << lane) - 1u));
      if (lane == 0) warp_slot_base[r][warp] = __popc(bits);
    }
  }
  __syncthreads();
  if (threadIdx.x < R) {
    const int r = threadIdx.x;
    int total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int count = warp_slot_base[r][w];
      warp_slot_base[r][w] = total;
      total += count;
    }
    tile_slots[r] = total;
    ep_device::store_relaxed_gpu(p.layout_tile_slots + static_cast<size_t>(tile) * kMaxEpRanks + r,
                                 static_cast<uint64_t>(tag) << 32 | static_cast<uint32_t>(total));
  }

  // This tile's first position per expert (one global atomic per (tile, expert)), then positions.
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int count = expert_base[e];
    if (count) expert_base[e] = atomicAdd(p.layout_fill + e, count);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < elems; i += blockDim.x) {
    const int id = p.saved_ids[first + i];  // this thread's own store of pass 1
    if (id >= 0) p.slot_pos[first + i] = atomicAdd(expert_base + id, 1);
  }

  // Look-back: slots of all earlier tiles (their blocks hold lower tickets, so they run).
  for (int x = threadIdx.x; x < tile * R; x += blockDim.x) {
    const int r = x % R;
    const uint64_t* word = p.layout_tile_slots + static_cast<size_t>(x / R) * kMaxEpRanks + r;
    uint64_t v = 0;
    if (!wait_for_tile_slots(p.ctx, word, tag, &v)) break;  // only after a failure: the group is dead
    atomicAdd(earlier_tiles + r, static_cast<int>(static_cast<uint32_t>(v)));
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < tokens) {
    const int t = first_token + threadIdx.x;
#pragma unroll
    for (int r = 0; r < kMaxEpRanks; ++r)
      if (r < R) {
        const int slot = ((mask >> r) & 1u) ? earlier_tiles[r] + warp_slot_base[r][warp] + in_warp[r] : -1;
        p.token_dest_slot[t * R + r] = slot;
      }
  }
  if (tile == static_cast<int>(gridDim.x) - 1 && threadIdx.x < R)
    p.send_count[threadIdx.x] = earlier_tiles[threadIdx.x] + tile_slots[threadIdx.x];

  // The last block to finish publishes the per-expert totals and leaves the scratch zeroed.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(p.layout_counters + 1, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int e = threadIdx.x; e < E; e += blockDim.x) p.send_expert_counts[e] = atomicExch(p.layout_fill + e, 0);
  if (threadIdx.x == 0) {
    p.layout_counters[0] = 0;
    p.layout_counters[1] = 0;
    *p.epoch += 1;
    p.traffic[1] = 0;  // combine's remote row counter
  }
}

// First grouped row of (sender s, local expert e) for every local expert, from the senders' per-expert
// counts in this rank's window (`counts` [R, El], complete: the caller waited for them):
//   expert e's rows start at offsets[e] = sum_{e' < e} sum_s counts[s][e'], sender s's rows of e at
//   offsets[e] + sum_{s' < s} counts[s'][e].
// Writes row_base[s * El + e] for every s (all_senders) or row_base[e] for s = `sender` only; with
// write_offsets also expert_offsets. Call with all threads of the block.
__device__ inline void grouped_row_bases(const EpParams& p, const volatile int32_t* counts, int* row_base,
                                         int* scratch, bool all_senders, int sender, bool write_offsets) {
  const int R = p.ctx.ranks, El = p.experts_per_rank;
  int carry = 0;
  for (int e0 = 0; e0 < El; e0 += blockDim.x) {
    const int e = e0 + threadIdx.x;
    int total = 0;
    if (e < El)
      for (int s = 0; s < R; ++s) total += counts[s * El + e];
    int chunk_total = 0;
    const int begin = carry + block_exclusive_scan(total, scratch, &chunk_total);
    if (e < El) {
      if (write_offsets) p.expert_offsets[e] = begin;
      int at = begin;
      for (int s = 0; s < R; ++s) {
        if (all_senders)
          row_base[s * El + e] = at;
        else if (s == sender)
          row_base[e] = at;
        at += counts[s * El + e];
      }
    }
    carry += chunk_total;
  }
  if (write_offsets && threadIdx.x == 0) p.expert_offsets[El] = carry;
  __syncthreads();
}

// Send prologue of every send block (two-kernel and fused dispatch): this rank's per-expert counts into
// every destination's recv_expert_counts[me] and recv_count[me] (identical values from every block),
// +1 on every destination's counts_ready[me] (release), then a bounded wait until every sender's
// counts_ready shows a block of this epoch. Call with all threads; false after a failure.
__device__ inline bool publish_counts_and_wait(const EpParams& p, uint64_t epoch) {
  __shared__ int ok;
  const int R = p.ctx.ranks, me = p.ctx.rank, El = p.experts_per_rank;
  for (int i = threadIdx.x; i < R * El; i += blockDim.x)
    p.region<int32_t>(i / El, p.layout.recv_expert_counts)[me * El + i % El] = p.send_expert_counts[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int r = 0; r < R; ++r) {
      ep_device::store_release_sys(p.region<uint64_t>(r, p.layout.recv_count) + me,
                                   static_cast<uint64_t>(p.send_count[r]));
      ep_device::add_release_sys(p.region<uint64_t>(r, p.layout.counts_ready) + me, 1ull);
    }
    ok = 1;
    const uint64_t target = (epoch - 1) * static_cast<uint64_t>(kEpSendBlocks) + 1;
    const uint64_t* ready = p.region<uint64_t>(me, p.layout.counts_ready);
    for (int s = 0; s < R && ok; ++s)
      if (!ep_device::bounded_wait_geq(p.ctx, ready + s, target, EpPhase::kDispatch, s)) ok = 0;
  }
  __syncthreads();
  return ok != 0;
}

// traffic[0] = remote bytes of this call's dispatch (one thread).
__device__ inline void record_dispatch_traffic(const EpParams& p) {
  const int R = p.ctx.ranks, me = p.ctx.rank, S = p.num_scale_groups();
  uint64_t remote_rows = 0;
  for (int r = 0; r < R; ++r)
    if (r != me) remote_rows += p.send_count[r];
  const uint64_t row_bytes =
      static_cast<uint64_t>(p.hidden) * (p.fp8 ? 1 : 2) + (p.fp8 ? 4ull * S : 0ull) + 12ull * p.top_k + 4;
  p.traffic[0] = remote_rows * row_bytes;
}

struct NoPiecePublish {
  __device__ __forceinline__ void operator()(int) const {}
};

// One token of the send (one warp, all lanes): quantize (fp8) and store the row, scales and metadata
// into every REMOTE destination's receive row me*C + slot, and the row into the grouped rows of this
// rank's own experts that the token selected (local_row_base: first grouped row of (me, local expert)).
// Pieces (fused dispatch): kMetaFirst stores the metadata (ids, positions, weights, source token) before
// the payload, and the row is sent in pieces of piece_groups scale groups (0: one piece); after every
// piece, publish(scale groups stored so far) runs on all lanes (the caller's progress publication).
// The two-kernel send keeps the defaults (metadata last, one piece, nothing published).
template <int kSendBatch = 4, bool kMetaFirst = false, typename Publish = NoPiecePublish>
__device__ __forceinline__ void dispatch_send_token(const EpParams& p, int t, const int* local_row_base, int lane,
                                                    int piece_groups = 0, Publish publish = {}) {
  const int R = p.ctx.ranks, H = p.hidden, k = p.top_k, S = p.num_scale_groups();
  const int me = p.ctx.rank, El = p.experts_per_rank;
  int dest_row[kMaxEpRanks];  // remote destinations only
#pragma unroll
  for (int r = 0; r < kMaxEpRanks; ++r)
    dest_row[r] = r < R && r != me && p.token_dest_slot[t * R + r] >= 0
                      ? me * p.capacity + p.token_dest_slot[t * R + r]
                      : -1;
  // Local slots: lane j < k holds slot j's grouped row (-1: not a local expert, or the token has none).
  const int local_slot = p.token_dest_slot[t * R + me];
  int dst = -1;
  if (local_slot >= 0) {
    const size_t row = static_cast<size_t>(me) * p.capacity + local_slot;
    if (lane < k) {
      const int id = p.saved_ids[t * k + lane];  // -1 or a valid id (the layout replaced bad ids)
      const int e = id - me * El;
      if (id >= 0 && e >= 0 && e < El) {
        dst = local_row_base[e] + p.slot_pos[t * k + lane];
        if (dst >= p.max_rows) dst = -1;  // inconsistent counts: never write out of range
      }
      p.recv_slot_row[row * k + lane] = dst;
      // combine reads the weights of every received row (apply_weights), local ones included
      p.region<float>(me, p.layout.recv_weights)[row * k + lane] = p.saved_weights[t * k + lane];
      if (dst >= 0) {
        const float w = p.saved_weights[t * k + lane];
        p.grouped_sources[dst] = RowSource{me, t, lane, w};
        p.grouped_weights[dst] = w;
      }
    }
    if (lane == 0) p.region<int32_t>(me, p.layout.recv_src_token)[row] = t;
  }
  const unsigned local_targets = __ballot_sync(0xffffffffu, dst >= 0);
  auto write_metadata = [&]() {
    for (int r = 0; r < R; ++r) {
      if (dest_row[r] < 0) continue;
      for (int j = lane; j < k; j += 32) {
        const size_t at = static_cast<size_t>(dest_row[r]) * k + j;
        const int id = p.saved_ids[t * k + j];
        p.region<int32_t>(r, p.layout.recv_ids)[at] = id;
        p.region<int32_t>(r, p.layout.recv_pos)[at] = id >= 0 ? p.slot_pos[t * k + j] : -1;
        p.region<float>(r, p.layout.recv_weights)[at] = p.saved_weights[t * k + j];
      }
      if (lane == 0) p.region<int32_t>(r, p.layout.recv_src_token)[dest_row[r]] = t;
    }
  };
  if constexpr (kMetaFirst) write_metadata();
  const uint4* src = reinterpret_cast<const uint4*>(p.hidden_in + static_cast<size_t>(t) * H);
  const int chunks = H / 16;  // multiple of 8: a scale group's 8 lanes are all active or all idle
  // piece boundaries are whole scale groups (8 chunks), so the 8 lanes of a group stay together
  const int piece_chunks = piece_groups > 0 ? piece_groups * 8 : chunks;
  for (int piece = 0; piece < chunks; piece += piece_chunks) {
    const int piece_end = min(chunks, piece + piece_chunks);
    for (int c0 = piece; c0 < piece_end; c0 += 32 * kSendBatch) {
      uint4 lo[kSendBatch], hi[kSendBatch];
#pragma unroll
      for (int u = 0; u < kSendBatch; ++u) {
        const int c = c0 + u * 32 + lane;
        lo[u] = hi[u] = make_uint4(0, 0, 0, 0);
        if (c < piece_end) {
          lo[u] = __ldg(src + 2 * c);
          hi[u] = __ldg(src + 2 * c + 1);
        }
      }
#pragma unroll
      for (int u = 0; u < kSendBatch; ++u) {
        const int c = c0 + u * 32 + lane;
        if (c0 + u * 32 >= piece_end) break;  // warp-uniform
        const bool active = c < piece_end;
        if (p.fp8) {
          float scale;
          const uint4 q = quantize16_fp8(lo[u], hi[u], &scale);
          if (active)
            for (int r = 0; r < R; ++r) {
              if (dest_row[r] < 0) continue;
              uint8_t* row = p.region<uint8_t>(r, p.layout.recv_x) + static_cast<size_t>(dest_row[r]) * H;
              reinterpret_cast<uint4*>(row)[c] = q;
              if ((lane & 7) == 0)
                p.region<float>(r, p.layout.recv_scales)[static_cast<size_t>(dest_row[r]) * S + c / 8] = scale;
            }
          for (unsigned rest = local_targets; rest; rest &= rest - 1) {
            const int d = __shfl_sync(0xffffffffu, dst, __ffs(rest) - 1);
            if (!active) continue;
            reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.grouped_x) + static_cast<size_t>(d) * H)[c] = q;
            if ((lane & 7) == 0) p.grouped_scales[static_cast<size_t>(d) * S + c / 8] = scale;
          }
        } else {
          if (active)
            for (int r = 0; r < R; ++r) {
              if (dest_row[r] < 0) continue;
              uint4* row = reinterpret_cast<uint4*>(p.region<__nv_bfloat16>(r, p.layout.recv_x) +
                                                    static_cast<size_t>(dest_row[r]) * H);
              row[2 * c] = lo[u];
              row[2 * c + 1] = hi[u];
            }
          for (unsigned rest = local_targets; rest; rest &= rest - 1) {
            const int d = __shfl_sync(0xffffffffu, dst, __ffs(rest) - 1);
            if (!active) continue;
            uint4* row =
                reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.grouped_x) + static_cast<size_t>(d) * H);
            row[2 * c] = lo[u];
            row[2 * c + 1] = hi[u];
          }
        }
      }
    }
    publish(piece_end / 8);  // scale groups of the row stored so far
  }
  if constexpr (!kMetaFirst) write_metadata();
}

// Grid kEpSendBlocks x (32 * kEpWarpsPerBlock), dynamic shared memory 4 * El bytes. One warp per token:
// each lane owns 16 consecutive channels per step (8 lanes = one 128-channel scale group), quantizes
// them (fp8) and stores 16 B to every REMOTE destination's receive row, and to the grouped rows of
// this rank's own experts that the token selected (local rows skip the receive buffer). Loads of
// kSendBatch steps are issued before any store (the row is read once, several requests in flight per
// lane). Afterwards every block bumps each destination's arrival counter (release).
// NOTES:
// - Counts first: every block publishes this rank's per-(destination, expert) counts and row counts
//   into every destination's window (the same values from every block, so no block has to be
//   scheduled before another) and then adds 1 to each destination's counts_ready[me] (release). It
//   then waits (bounded) until every sender's counts_ready shows one block of this epoch
//   (> (epoch - 1) * kEpSendBlocks), which gives it the grouped layout of its own rows. A block
//   waits only after it published, so the wait never depends on another block of its own rank
//   running, and peers publish at the start of their send before they wait: no cycle.
// - Local grouped rows use the receive kernel's formula (grouped_row_bases + slot_pos), so grouped_x,
//   grouped_scales, grouped_sources, grouped_weights and recv_slot_row get the bytes the receive
//   kernel wrote before (and recv_src_token / recv_weights of the local received row, which combine reads) (bit-identical; the row order inside an expert was already unspecified). The
//   local copies overlap the NVLink stores of the remote copy, and the receive kernel expands only the
//   remote senders' rows (before session 14 it also re-read this rank's own rows after the send).
// - Window reuse: a destination reads counts_ready / recv_expert_counts in its send and receive,
//   both before its combine send, which this rank's next dispatch follows (docs/ep.md, Protocol).
__global__ void __launch_bounds__(32 * kEpWarpsPerBlock) ep_dispatch_send_kernel(EpParams p) {
  if (ep_device::group_failed(p.ctx)) return;
  extern __shared__ int local_row_base[];  // [El]: first grouped row of (sender me, local expert e)
  __shared__ int scratch[32];
  const int lane = threadIdx.x & 31;
  const int warp_global = blockIdx.x * kEpWarpsPerBlock + (threadIdx.x >> 5);
  const int R = p.ctx.ranks, me = p.ctx.rank;
  const uint64_t epoch = *p.epoch;

  if (!publish_counts_and_wait(p, epoch)) return;
  grouped_row_bases(p, p.region<int32_t>(me, p.layout.recv_expert_counts), local_row_base, scratch,
                    /*all_senders=*/false, me, /*write_offsets=*/false);

  for (int t = warp_global; t < p.num_tokens; t += gridDim.x * kEpWarpsPerBlock)
    dispatch_send_token(p, t, local_row_base, lane);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int r = 0; r < R; ++r)
      ep_device::add_release_sys(p.region<uint64_t>(r, p.layout.dispatch_arrivals) + me, 1ull);
    if (blockIdx.x == 0) record_dispatch_traffic(p);
  }
}

// Waits (bounded) until every sender's blocks of this epoch have arrived. Call with all threads;
// returns false when the group failed.
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

// Stores one batch of a received row (lane's words c = w0 + u * 32 + lane, u < kBatch, those below `limit`)
// into the grouped row of every target: lane j's `dst` for each bit j of `targets` (the lanes with dst >= 0).
// One copy for expand_received_row and expand_received_row_pieces, which store the same bytes.
// NOTES: one warp, all lanes (shfl); v holds the batch (loaded by the caller); row_bytes: a grouped row's
// bytes, a multiple of 16. __forceinline__ and the same statements as the two loops it replaces: the SASS of
// the dispatch kernels is unchanged.
template <int kBatch>
__device__ __forceinline__ void store_row_batch(const EpParams& p, unsigned targets, int dst, size_t row_bytes,
                                                const uint4 (&v)[kBatch], int w0, int limit, int lane) {
  for (unsigned rest = targets; rest; rest &= rest - 1) {
    const int d = __shfl_sync(0xffffffffu, dst, __ffs(rest) - 1);
    uint4* out = reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.grouped_x) + static_cast<size_t>(d) * row_bytes);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = w0 + u * 32 + lane;
      if (c < limit) out[c] = v[u];
    }
  }
}

// One row received from ANOTHER rank s (row i of s's block, one warp, all lanes): load it once, store it
// into the grouped row of every local expert it selected (row_base [R, El]: first grouped row of (s, e)),
// and record grouped_sources / grouped_weights / recv_slot_row.
__device__ __forceinline__ void expand_received_row(const EpParams& p, int s, int i, const int* row_base, int lane) {
  constexpr int kBatch = 8;
  const int El = p.experts_per_rank, me = p.ctx.rank;
  const int k = p.top_k, H = p.hidden, S = p.num_scale_groups(), first = me * El;
  const size_t row_bytes = static_cast<size_t>(H) * (p.fp8 ? 1 : 2);
  const int words = static_cast<int>(row_bytes / 16);
  const size_t row = static_cast<size_t>(s) * p.capacity + i;
  const uint4* src = reinterpret_cast<const uint4*>(p.region<uint8_t>(me, p.layout.recv_x) + row * row_bytes);
  uint4 v[kBatch];  // the first batch is loaded before the row's metadata: the two latencies overlap
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int c = u * 32 + lane;
    if (c < words) v[u] = src[c];
  }
  int dst = -1;
  if (lane < k) {
    const int e = p.region<int32_t>(me, p.layout.recv_ids)[row * k + lane] - first;
    if (e >= 0 && e < El) {
      dst = row_base[s * El + e] + p.region<int32_t>(me, p.layout.recv_pos)[row * k + lane];
      if (dst >= p.max_rows) dst = -1;  // inconsistent counts from a peer: never write out of range
    }
    p.recv_slot_row[row * k + lane] = dst;
    if (dst >= 0) {
      const float w = p.region<float>(me, p.layout.recv_weights)[row * k + lane];
      p.grouped_sources[dst] =
          RowSource{s, p.region<int32_t>(me, p.layout.recv_src_token)[row], lane, w};
      p.grouped_weights[dst] = w;
    }
  }
  const unsigned targets = __ballot_sync(0xffffffffu, dst >= 0);
  for (int w0 = 0; w0 < words; w0 += 32 * kBatch) {
    if (w0 > 0) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int c = w0 + u * 32 + lane;
        if (c < words) v[u] = src[c];
      }
    }
    store_row_batch(p, targets, dst, row_bytes, v, w0, words, lane);
  }
  if (p.fp8) {
    const float* src_scales = p.region<float>(me, p.layout.recv_scales) + row * S;
    for (int g0 = 0; g0 < S; g0 += 32) {
      const float sv = g0 + lane < S ? src_scales[g0 + lane] : 0.0f;
      for (unsigned rest = targets; rest; rest &= rest - 1) {
        const int d = __shfl_sync(0xffffffffu, dst, __ffs(rest) - 1);
        if (g0 + lane < S) p.grouped_scales[static_cast<size_t>(d) * S + g0 + lane] = sv;
      }
    }
  }
}

// Received row index space: sender s, row i < recv_count[s]  <->  flat s*C + i.
// Grid kEpReceiveBlocks x (32 * kEpWarpsPerBlock), dynamic shared memory 4 * E bytes.
// Every block derives the grouped layout from the senders' per-expert counts (no atomics):
//   expert e's rows start at offsets[e] = sum_{e' < e} sum_s counts[s][e'], sender s's rows of e at
//   offsets[e] + sum_{s' < s} counts[s'][e], and slot j of a received row at that base + recv_pos.
// Then one warp per received row loads it once and stores it into the grouped row of every local
// expert it selected (recording the grouped row per (row, slot) for combine).
__global__ void __launch_bounds__(32 * kEpWarpsPerBlock) ep_receive_kernel(EpParams p) {
  if (ep_device::group_failed(p.ctx)) return;
  if (!wait_for_arrivals(p, p.layout.dispatch_arrivals, kEpSendBlocks, EpPhase::kDispatch)) return;
  extern __shared__ int row_base[];  // [R, El]: first grouped row of (sender s, local expert e)
  __shared__ int scratch[32];
  const int R = p.ctx.ranks, me = p.ctx.rank;
  grouped_row_bases(p, p.region<int32_t>(me, p.layout.recv_expert_counts), row_base, scratch, /*all_senders=*/true, 0,
                    /*write_offsets=*/blockIdx.x == 0);
  // NOTES: the fused combine reads the row counts from this local copy, never from the window: a peer
  // rewrites recv_count[peer] at the start of its next dispatch, which may begin while a late block of
  // this rank's fused combine is still starting (docs/ep.md, "Overlap").
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < R)
    p.recv_rows[threadIdx.x] =
        static_cast<int>(reinterpret_cast<const volatile uint64_t*>(p.region<uint64_t>(me, p.layout.recv_count))[threadIdx.x]);

  const int lane = threadIdx.x & 31;
  const int warp_global = blockIdx.x * kEpWarpsPerBlock + (threadIdx.x >> 5);
  const int warps = gridDim.x * kEpWarpsPerBlock;
  const volatile uint64_t* recv_count = p.region<uint64_t>(me, p.layout.recv_count);
  for (int s = 0; s < R; ++s) {
    if (s == me) continue;  // this rank's own rows were grouped by its send kernel
    const int n = static_cast<int>(recv_count[s]);
    for (int i = warp_global; i < n; i += warps) expand_received_row(p, s, i, row_base, lane);
  }
}

// ---- fused dispatch (MEGAMOE_EP_OVERLAP=1): one kernel, two warp roles per block ------------------------
// One row received from ANOTHER rank s while s is still sending it (fused dispatch, one warp, all lanes):
// piece by piece (DispatchPieces, src/kernels/ep_dispatch_pieces.h), wait (bounded, every lane acquires,
// {rank, 'dispatch', s} on timeout) until s's progress word of the row shows the piece, then copy it into
// the grouped row of every local expert the row selected (loads through L2: ld.global.cg). The metadata
// (ids, positions, weights, source token) lands before the first piece, so it is read after the first wait.
// Stores the same bytes as expand_received_row. Returns false (warp-uniform) when a wait failed.
__device__ __forceinline__ bool expand_received_row_pieces(const EpParams& p, int s, int i, const int* row_base, int lane,
                                                           const DispatchPieces& pieces, uint64_t epoch) {
  constexpr int kBatch = kEpRoleExpandBatch;
  constexpr unsigned kPollSleepNs = 64;
  const int El = p.experts_per_rank, me = p.ctx.rank;
  const int k = p.top_k, H = p.hidden, S = p.num_scale_groups(), first = me * El;
  const size_t row_bytes = static_cast<size_t>(H) * (p.fp8 ? 1 : 2);
  const int words_per_group = p.fp8 ? kEpScaleGroup / 16 : kEpScaleGroup * 2 / 16;  // 16-byte words
  const size_t row = static_cast<size_t>(s) * p.capacity + i;
  const uint4* src = reinterpret_cast<const uint4*>(p.region<uint8_t>(me, p.layout.recv_x) + row * row_bytes);
  const uint64_t* progress = p.region<uint64_t>(me, p.layout.dispatch_ready) + row;
  int dst = -1;
  unsigned targets = 0;
  for (int q = 0; q < pieces.count(); ++q) {
    const bool ok = ep_device::bounded_wait_geq(p.ctx, progress, dispatch_progress_word(epoch, pieces.end(q)),
                                                EpPhase::kDispatch, s, kPollSleepNs);
    if (!__all_sync(0xffffffffu, ok)) return false;
    const int w_begin = pieces.begin(q) * words_per_group, w_end = pieces.end(q) * words_per_group;
    for (int w0 = w_begin; w0 < w_end; w0 += 32 * kBatch) {
      uint4 v[kBatch];  // the row's first batch is loaded before its metadata: the two latencies overlap
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int c = w0 + u * 32 + lane;
        if (c < w_end) v[u] = __ldcg(src + c);
      }
      if (q == 0 && w0 == w_begin) {  // warp-uniform
        if (lane < k) {
          const int e = __ldcg(p.region<int32_t>(me, p.layout.recv_ids) + row * k + lane) - first;
          if (e >= 0 && e < El) {
            dst = row_base[s * El + e] + __ldcg(p.region<int32_t>(me, p.layout.recv_pos) + row * k + lane);
            if (dst >= p.max_rows) dst = -1;  // inconsistent counts from a peer: never write out of range
          }
          p.recv_slot_row[row * k + lane] = dst;
          if (dst >= 0) {
            const float w = __ldcg(p.region<float>(me, p.layout.recv_weights) + row * k + lane);
            p.grouped_sources[dst] = RowSource{s, __ldcg(p.region<int32_t>(me, p.layout.recv_src_token) + row), lane, w};
            p.grouped_weights[dst] = w;
          }
        }
        targets = __ballot_sync(0xffffffffu, dst >= 0);
      }
      store_row_batch(p, targets, dst, row_bytes, v, w0, w_end, lane);
    }
    if (p.fp8) {
      const float* src_scales = p.region<float>(me, p.layout.recv_scales) + row * S;
      for (int g0 = pieces.begin(q); g0 < pieces.end(q); g0 += 32) {
        const int g = g0 + lane;
        const float sv = g < pieces.end(q) ? __ldcg(src_scales + g) : 0.0f;
        for (unsigned rest = targets; rest; rest &= rest - 1) {
          const int d = __shfl_sync(0xffffffffu, dst, __ffs(rest) - 1);
          if (g < pieces.end(q)) p.grouped_scales[static_cast<size_t>(d) * S + g] = sv;
        }
      }
    }
  }
  return true;
}

// Grid kEpSendBlocks x (32 * kEpRoleWarps), __launch_bounds__(32 * kEpRoleWarps, 1) (<= 64 registers, 32 warps
// per SM), dynamic shared memory 4 * E bytes (row_base [R, El]).
// Every block runs the send prologue (publish_counts_and_wait: counts_ready still advances by exactly
// kEpSendBlocks per call), derives the grouped layout of ALL senders (block 0 writes expert_offsets and the
// local recv_rows copy); then its warps take one of two roles:
//   warps [0, p.dispatch_send_warps) (default kEpRoleSendWarps = 16): SENDERS. Tokens in ticket order (one atomic per warp and token on
//     dispatch_tickets[0]); per token the send kernel's body (dispatch_send_token, metadata first) in
//     pieces of p.dispatch_piece_groups scale groups; after every piece: __syncwarp, lane 0 one system
//     fence + st.release.sys of (epoch << 16) | groups stored into every remote destination's
//     dispatch_ready[me*C + slot] (one fence per piece and token; tokens with no remote destination
//     publish nothing).
//   warps [p.dispatch_send_warps, kEpRoleWarps): EXPANDERS. Received rows in ticket order (dispatch_tickets[1];
//     item j -> row j / (R-1) of sender (me + 1 + j % (R-1)) % R, skipped past recv_count[s]):
//     expand_received_row_pieces, which follows the row's progress word piece by piece.
// NOTES:
// - No deadlock, whatever the residency of blocks: after the prologue (which only needs one block of every
//   peer to have started, as before) senders never wait; every running block has sender warps, and tokens
//   are handed out by ticket, so every token is sent as long as any block of the rank runs; expanders
//   wait only for peers' senders. The one __syncthreads after the prologue is the final one, which a
//   sender reaches only when no token is left to take.
// - dispatch_send_warps is in [1, kEpRoleWarps - 1] (checked on the host): every block has senders (the
//   deadlock argument) and expanders (rows are expanded only by them).
// - Occupancy: one register budget for both roles; 1024 threads at <= 64 registers give 16 sender + 16
//   expander warps on every SM by default (the send kernel had 16 warps per SM at 85 registers, the receive kernel
//   32 at 62 after the send; the merged-order kernel this replaces had 16 at 122 doing both).
// - Memory ordering: the sending warp's lanes store the metadata and the piece; __syncwarp orders them
//   before lane 0's fence + st.release.sys of the word (cumulative); every expanding lane acquires the
//   word itself and reads through L2 (ld.global.cg). Words carry the epoch, so they need no reset.
// - Window reuse: as in the two-kernel path (a sender writes rows into this window only after this
//   rank's next send prologue, i.e. after this kernel and this rank's combine). dispatch_arrivals is
//   not used by this path.
// - dispatch_tickets [3] (send, expand, blocks done) are zeroed by the last block to finish.
__global__ void __launch_bounds__(32 * kEpRoleWarps, 1) ep_dispatch_fused_kernel(EpParams p) {
  if (ep_device::group_failed(p.ctx)) return;
  extern __shared__ int row_base[];  // [R, El]: first grouped row of (sender s, local expert e)
  __shared__ int scratch[32];
  __shared__ int block_failed;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int R = p.ctx.ranks, me = p.ctx.rank, El = p.experts_per_rank, T = p.num_tokens;
  const uint64_t epoch = *reinterpret_cast<volatile uint64_t*>(p.epoch);
  if (threadIdx.x == 0) block_failed = 0;
  if (!publish_counts_and_wait(p, epoch)) return;
  grouped_row_bases(p, p.region<int32_t>(me, p.layout.recv_expert_counts), row_base, scratch, /*all_senders=*/true, 0,
                    /*write_offsets=*/blockIdx.x == 0);
  const volatile uint64_t* recv_count = p.region<uint64_t>(me, p.layout.recv_count);
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < R) p.recv_rows[threadIdx.x] = static_cast<int>(recv_count[threadIdx.x]);
  bool failed = false;
  if (warp < p.dispatch_send_warps) {
    while (true) {
      unsigned t = 0;
      if (lane == 0) t = atomicAdd(p.dispatch_tickets + 0, 1u);
      t = __shfl_sync(0xffffffffu, t, 0);
      if (t >= static_cast<unsigned>(T)) break;
      const int token = static_cast<int>(t);
      const bool remote = __any_sync(0xffffffffu, lane < R && lane != me && p.token_dest_slot[token * R + lane] >= 0);
      auto publish = [&](int groups_done) {
        if (!remote) return;  // warp-uniform: nothing of this token went to another rank
        __syncwarp();
        if (lane == 0) {
          __threadfence_system();
          for (int r = 0; r < R; ++r) {
            const int slot = r == me ? -1 : p.token_dest_slot[token * R + r];
            if (slot >= 0)
              ep_device::store_release_sys(
                  p.region<uint64_t>(r, p.layout.dispatch_ready) + static_cast<size_t>(me) * p.capacity + slot,
                  dispatch_progress_word(epoch, groups_done));
          }
        }
      };
      dispatch_send_token<kEpRoleSendBatch, /*kMetaFirst=*/true>(p, token, row_base + me * El, lane,
                                                                 p.dispatch_piece_groups, publish);
    }
  } else if (R > 1) {
    int max_rows = 0;
    for (int s = 0; s < R; ++s)
      if (s != me) max_rows = max(max_rows, static_cast<int>(recv_count[s]));
    const unsigned items = static_cast<unsigned>(R - 1) * static_cast<unsigned>(max_rows);
    const DispatchPieces pieces{p.num_scale_groups(), p.dispatch_piece_groups};
    while (true) {
      unsigned j = 0;
      if (lane == 0) j = atomicAdd(p.dispatch_tickets + 1, 1u);
      j = __shfl_sync(0xffffffffu, j, 0);
      if (j >= items) break;
      const int s = (me + 1 + static_cast<int>(j % static_cast<unsigned>(R - 1))) % R;
      const int i = static_cast<int>(j / static_cast<unsigned>(R - 1));
      if (i >= static_cast<int>(recv_count[s])) continue;  // warp-uniform (past the rows s sent here)
      if (!expand_received_row_pieces(p, s, i, row_base, lane, pieces, epoch)) {
        failed = true;
        break;
      }
    }
  }
  if (failed && lane == 0) block_failed = 1;
  __syncthreads();
  if (threadIdx.x == 0 && !block_failed) {
    if (blockIdx.x == 0) record_dispatch_traffic(p);
    __threadfence();
    if (atomicAdd(p.dispatch_tickets + 2, 1u) == gridDim.x - 1) {
      p.dispatch_tickets[0] = 0;
      p.dispatch_tickets[1] = 0;
      p.dispatch_tickets[2] = 0;
    }
  }
}

// marks (optional, for `megamoe bench ep` kernel splits): 4 events, recorded before the layout kernel and
// after each of the three kernels.
// fused (MEGAMOE_EP_OVERLAP=1): layout + ep_dispatch_fused_kernel; marks[2] and marks[3] are then
// recorded back to back after it (the "receive" split reads ~0: it is inside the one kernel).
inline void launch_ep_dispatch(const EpParams& p, cudaStream_t stream, const cudaEvent_t* marks = nullptr,
                               bool fused = false) {
  const size_t expert_table_bytes = sizeof(int) * static_cast<size_t>(p.num_experts);  // E = R * El
  if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[0], stream));
  const int layout_tiles = std::max(1, (p.num_tokens + kEpLayoutTileTokens - 1) / kEpLayoutTileTokens);
  ep_layout_kernel<<<layout_tiles, kEpLayoutTileTokens, expert_table_bytes, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
  if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[1], stream));
  if (fused) {
    ep_dispatch_fused_kernel<<<kEpSendBlocks, 32 * kEpRoleWarps, expert_table_bytes, stream>>>(p);
    MEGAMOE_LAUNCH_CHECK();
    if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[2], stream));
    if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[3], stream));
    return;
  }
  const size_t local_table_bytes = sizeof(int) * static_cast<size_t>(p.experts_per_rank);
  ep_dispatch_send_kernel<<<kEpSendBlocks, 32 * kEpWarpsPerBlock, local_table_bytes, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
  if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[2], stream));
  ep_receive_kernel<<<kEpReceiveBlocks, 32 * kEpWarpsPerBlock, expert_table_bytes, stream>>>(p);
  MEGAMOE_LAUNCH_CHECK();
  if (marks) MEGAMOE_CUDA_CHECK(cudaEventRecord(marks[3], stream));
}

}  // namespace megamoe::kernels
