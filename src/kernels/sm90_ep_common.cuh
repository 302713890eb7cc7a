// Parameters and window layout shared by the dispatch and combine kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "ep/ep_device.cuh"
#include "megamoe/ep_dispatch.h"

namespace megamoe::kernels {

// NOTES: the numbers of send/combine blocks are constants, not derived from the local GPU, because a
// receiver expects exactly epoch * kEpSendBlocks arrivals from every sender.
inline constexpr int kEpSendBlocks = 128;
inline constexpr int kEpCombineBlocks = 256;  // combine send is read-bound: 2 blocks per SM
inline constexpr int kEpReceiveBlocks = 256;  // receive side only (not counted by peers)
inline constexpr int kEpMaxExperts = 8192;    // layout/receive keep 4 * E bytes of shared memory
inline constexpr int kEpWarpsPerBlock = 16;
// Fused dispatch (ep_dispatch_fused_kernel): kEpSendBlocks blocks of kEpRoleWarps warps, the first
// EpParams::dispatch_send_warps (MEGAMOE_EP_DISPATCH_SEND_WARPS, default kEpRoleSendWarps) send, the others
// expand received rows; one block per SM at <= 64 registers.
inline constexpr int kEpRoleWarps = 32;
inline constexpr int kEpRoleSendWarps = 24;
inline constexpr int kEpRoleSendBatch = 4;  // 32-byte loads in flight per lane in a sender warp
inline constexpr int kEpRoleExpandBatch = 4;  // 16-byte loads in flight per lane in an expander warp
inline constexpr int kEpLayoutTileTokens = 256;  // tokens per layout block (= its threads)
inline constexpr int kEpScaleGroup = 128;  // FP8 activation scales: one per token per 128 channels

// Byte offsets of the regions of one rank's dispatch window (identical on every rank).
// R = ranks, C = max tokens per rank, H = hidden, S = H / 128, k = top_k, P = 1 (fp8) or 2 (bf16),
// El = E / R local experts:
//   dispatch_arrivals  uint64 [kMaxEpRanks]   blocks of the senders' dispatch that finished, cumulative
//   combine_arrivals   uint64 [kMaxEpRanks]   blocks of the peers' combine that finished, cumulative
//   recv_count         uint64 [kMaxEpRanks]   rows sender s wrote in its latest dispatch
//   counts_ready       uint64 [kMaxEpRanks]   send blocks of sender s that published recv_count and
//                                             recv_expert_counts, cumulative (epoch * kEpSendBlocks at most)
//   recv_expert_counts i32 [R, El]            (sender s, local expert e): rows of s that selected e
//   recv_x             [R * C, H] * P bytes   row s*C + i = i-th token sender s sent here (the block
//                                             s = this rank stays unused: local rows go straight to
//                                             the grouped rows, see ep_dispatch_send_kernel)
//   recv_scales        f32 [R * C, S]         (fp8 only)
//   recv_ids           i32 [R * C, k]         the token's global top-k ids (all k, also remote ones)
//   recv_pos           i32 [R * C, k]         slot j's position among sender s's rows of expert ids[j]
//   recv_weights       f32 [R * C, k]
//   recv_src_token     i32 [R * C]            token index on the sender (also written for local rows)
//   combine_partials   bf16 [C * R, H]        row t*R + r = rank r's partial sum for this rank's token t
//   combine_progress   uint64 [C * R]         word t*R + r = (epoch << 16) | steps of row t*R + r of
//                                             combine_partials that rank r has stored (fused combine,
//                                             MEGAMOE_EP_OVERLAP=1; a step = 256 channels)
//   dispatch_ready     uint64 [R * C]         word s*C + i = (epoch << 16) | scale groups of receive row
//                                             s*C + i that sender s has stored in call epoch (fused
//                                             dispatch, ep_dispatch_pieces.h)
// Each region starts on a 256-byte boundary.
// Total ~ R*C*(H*P + 4S + 12k + 4) + C*R*(H*2 + 16) + 4*R*El + 256 bytes.
struct DispatchLayout {
  size_t dispatch_arrivals, combine_arrivals, recv_count, counts_ready, recv_expert_counts, recv_x, recv_scales, recv_ids, recv_pos,
      recv_weights, recv_src_token, combine_partials, combine_progress, dispatch_ready, total;
};

// Fused combine (MEGAMOE_EP_OVERLAP=1): a combine_progress word holds (epoch << kEpProgressShift) | steps
// stored; a producer publishes after every kEpProgressSteps steps of 256 channels and after its last.
inline constexpr int kEpProgressShift = 16;
inline constexpr int kEpProgressSteps = 8;  // 7168 channels: 4 publications per row

inline DispatchLayout make_dispatch_layout(const EpDispatchConfig& c, int ranks) {
  auto align = [](size_t v) { return (v + 255) / 256 * 256; };
  const size_t rows = static_cast<size_t>(ranks) * c.max_tokens_per_rank;
  const size_t payload = c.payload == EpPayload::kFp8 ? 1 : 2;
  DispatchLayout l{};
  size_t at = 0;
  l.dispatch_arrivals = at; at = align(at + 8 * kMaxEpRanks);
  l.combine_arrivals = at; at = align(at + 8 * kMaxEpRanks);
  l.recv_count = at; at = align(at + 8 * kMaxEpRanks);
  l.counts_ready = at; at = align(at + 8 * kMaxEpRanks);
  l.recv_expert_counts = at; at = align(at + 4 * static_cast<size_t>(c.num_experts));  // R * El = E
  l.recv_x = at; at = align(at + rows * c.hidden * payload);
  l.recv_scales = at; at = align(at + (c.payload == EpPayload::kFp8 ? rows * (c.hidden / kEpScaleGroup) * 4 : 0));
  l.recv_ids = at; at = align(at + rows * c.top_k * 4);
  l.recv_pos = at; at = align(at + rows * c.top_k * 4);
  l.recv_weights = at; at = align(at + rows * c.top_k * 4);
  l.recv_src_token = at; at = align(at + rows * 4);
  l.combine_partials = at; at = align(at + rows * c.hidden * 2);  // C * R rows
  l.combine_progress = at; at = align(at + rows * 8);             // C * R words
  l.dispatch_ready = at; at = align(at + rows * 8);               // R * C words
  l.total = at;
  return l;
}

// Warp-cooperative copy of n 16-byte words. NOTES: 8 loads are issued before their 8 stores so each
// lane keeps 8 requests in flight (a plain load->store loop serialises on possible aliasing).
__device__ __forceinline__ void warp_copy16(uint4* __restrict__ dst, const uint4* __restrict__ src, int n, int lane) {
  constexpr int kBatch = 8;
  for (int base = 0; base < n; base += 32 * kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = base + u * 32 + lane;
      if (c < n) v[u] = src[c];
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = base + u * 32 + lane;
      if (c < n) dst[c] = v[u];
    }
  }
}

// Warp-cooperative FP8 quantization of one BF16 row chunk: every lane holds 16 consecutive channels
// (lo = channels 0..7, hi = 8..15); 8 consecutive lanes form one 128-channel scale group. All 32 lanes
// must call it (shuffles). Rule of formats::quantize_fp8_activations: scale = max(amax, 1e-10) / 448
// (IEEE division), q = e4m3_rn_sat(x / scale).
__device__ __forceinline__ uint4 quantize16_fp8(const uint4& lo, const uint4& hi, float* scale_out) {
  const __nv_bfloat16* v_lo = reinterpret_cast<const __nv_bfloat16*>(&lo);
  const __nv_bfloat16* v_hi = reinterpret_cast<const __nv_bfloat16*>(&hi);
  float v[16];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[i] = __bfloat162float(v_lo[i]);
    v[8 + i] = __bfloat162float(v_hi[i]);
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
  amax = fmaxf(amax, 1e-10f);  // formats::kFp8ScaleEps
  const float scale = __fdiv_rn(amax, 448.0f);
  uint32_t packed[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(__fdiv_rn(v[4 * w + b], scale), __NV_SATFINITE, __NV_E4M3);
      word |= static_cast<uint32_t>(q) << (8 * b);
    }
    packed[w] = word;
  }
  *scale_out = scale;
  return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// The mega kernel's top-k reduce of one (token, column segment): out = bf16_rn(fmaf chain over the
// slots j in order with id >= 0: acc = fmaf(w_j, y_j, acc), acc starting at +0.0f), the loads of up to
// 8 slots issued before their FMAs (session 7: one warp per token and one memory round trip per slot
// and chunk took 910 us at 8192 tokens x 8 slots x 7168). Lane j < k holds slot j's id (< 0: skipped)
// and weight (1 when the weights were applied in GEMM 1). rows: the token's [k, H] slot rows; chunks
// [c_begin, c_end) of 8 BF16. Rows are read with ld.global.cg (written by peers during the kernel).
// NOTES: the __shfl_sync inside the chunk loop needs all 32 lanes there: c_end - c_begin must be a
// multiple of 32 (the caller's segments are multiples of 32 chunks and mega requires H % 256 == 0).
__device__ __forceinline__ void reduce_topk_segment(const __nv_bfloat16* rows, int id_lane, float weight_lane, int k,
                                                    int H, int c_begin, int c_end, __nv_bfloat16* out, int lane) {
  constexpr int kBatch = 8;
  const unsigned valid = __ballot_sync(0xffffffffu, lane < k && id_lane >= 0);
  for (int c = c_begin + lane; c < c_end; c += 32) {
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
    for (int j0 = 0; j0 < k; j0 += kBatch) {
      uint4 raw[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int j = j0 + u;
        raw[u] = j < k && ((valid >> j) & 1u)
                     ? __ldcg(reinterpret_cast<const uint4*>(rows + static_cast<size_t>(j) * H) + c)
                     : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int j = j0 + u;
        const float w = __shfl_sync(0xffffffffu, weight_lane, j & 31);  // all lanes: shfl before the skip
        if (j >= k || !((valid >> j) & 1u)) continue;
        const __nv_bfloat16* y = reinterpret_cast<const __nv_bfloat16*>(&raw[u]);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = __fmaf_rn(w, __bfloat162float(y[i]), acc[i]);
      }
    }
    uint4 packed;
    __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = __float2bfloat16_rn(acc[i]);
    reinterpret_cast<uint4*>(out)[c] = packed;
  }
}

struct EpParams {
  EpDeviceContext ctx;
  std::array<char*, kMaxEpRanks> window;  // every rank's dispatch window base, mapped here
  DispatchLayout layout;
  int hidden, top_k, num_experts, experts_per_rank, capacity, num_tokens;
  bool fp8;
  // inputs of this rank (dispatch)
  const __nv_bfloat16* hidden_in;
  const int32_t* topk_ids;
  const float* topk_weights;
  // local state
  uint64_t* epoch;          // calls so far (incremented by the layout kernel)
  // layout scratch, zero at allocation and left zero by every completed layout kernel:
  int32_t* layout_fill;          // [E]: (token, slot) pairs per global expert handed out so far
  uint32_t* layout_counters;     // [2]: tile tickets taken, blocks done
  uint64_t* layout_tile_slots;   // [ceil(C / kEpLayoutTileTokens), kMaxEpRanks]: tag << 32 | tile's slots
  int32_t* token_dest_slot; // [C, R]: slot of token t in rank r's receive block, -1 = not sent
  int32_t* send_count;      // [R]
  int32_t* send_expert_counts;  // [E]: this rank's (token, slot) pairs per global expert
  int32_t* slot_pos;        // [C, k]: position of (t, j) among this rank's rows of expert ids[t, j]
  int32_t* saved_ids;       // [C, k] ids with invalid entries replaced by -1
  float* saved_weights;     // [C, k]
  int32_t* expert_offsets;  // [E_local + 1]
  int32_t* recv_slot_row;   // [R * C, k]: grouped row of received row (s*C + i), slot j (-1: not local)
  uint64_t* traffic;        // [2]: remote bytes dispatched / combined by the latest call
  int32_t* recv_rows;       // [kMaxEpRanks]: local copy of recv_count (receive kernel), read by the fused combine
  unsigned long long* combine_tickets;  // [2]: fused combine work tickets taken, blocks done (zero between calls)
  uint32_t* dispatch_tickets;  // [3]: fused dispatch send tickets, expand tickets, blocks done (zero between calls)
  int dispatch_piece_groups;   // fused dispatch: scale groups per progress publication (ep_dispatch_pieces.h)
  int dispatch_send_warps;     // fused dispatch: sender warps per block, in [1, kEpRoleWarps - 1]
  int combine_lag;          // fused combine: own token t is scheduled with the peers' rows t + lag
  // grouped rows (local)
  void* grouped_x;
  float* grouped_scales;
  RowSource* grouped_sources;
  float* grouped_weights;   // [max_rows]
  int64_t max_rows;
  // combine
  const __nv_bfloat16* expert_out;
  __nv_bfloat16* out;
  bool apply_weights;

  template <typename T>
  __device__ __forceinline__ T* region(int rank, size_t offset) const {
    return reinterpret_cast<T*>(window[rank] + offset);
  }
  __device__ __forceinline__ int num_scale_groups() const { return hidden / kEpScaleGroup; }
};

}  // namespace megamoe::kernels
