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
inline constexpr int kEpLayoutThreads = 1024;
inline constexpr int kEpScaleGroup = 128;  // FP8 activation scales: one per token per 128 channels

// Byte offsets of the regions of one rank's dispatch window (identical on every rank).
// R = ranks, C = max tokens per rank, H = hidden, S = H / 128, k = top_k, P = 1 (fp8) or 2 (bf16),
// El = E / R local experts:
//   dispatch_arrivals  uint64 [kMaxEpRanks]   blocks of the senders' dispatch that finished, cumulative
//   combine_arrivals   uint64 [kMaxEpRanks]   blocks of the peers' combine that finished, cumulative
//   recv_count         uint64 [kMaxEpRanks]   rows sender s wrote in its latest dispatch
//   recv_expert_counts i32 [R, El]            (sender s, local expert e): rows of s that selected e
//   recv_x             [R * C, H] * P bytes   row s*C + i = i-th token sender s sent here
//   recv_scales        f32 [R * C, S]         (fp8 only)
//   recv_ids           i32 [R * C, k]         the token's global top-k ids (all k, also remote ones)
//   recv_pos           i32 [R * C, k]         slot j's position among sender s's rows of expert ids[j]
//   recv_weights       f32 [R * C, k]
//   recv_src_token     i32 [R * C]            token index on the sender
//   combine_partials   bf16 [C * R, H]        row t*R + r = rank r's partial sum for this rank's token t
// Each region starts on a 256-byte boundary.
// Total ~ R*C*(H*P + 4S + 12k + 4) + C*R*H*2 + 4*R*El + 192 bytes.
struct DispatchLayout {
  size_t dispatch_arrivals, combine_arrivals, recv_count, recv_expert_counts, recv_x, recv_scales, recv_ids, recv_pos,
      recv_weights, recv_src_token, combine_partials, total;
};

inline DispatchLayout make_dispatch_layout(const EpDispatchConfig& c, int ranks) {
  auto align = [](size_t v) { return (v + 255) / 256 * 256; };
  const size_t rows = static_cast<size_t>(ranks) * c.max_tokens_per_rank;
  const size_t payload = c.payload == EpPayload::kFp8 ? 1 : 2;
  DispatchLayout l{};
  size_t at = 0;
  l.dispatch_arrivals = at; at = align(at + 8 * kMaxEpRanks);
  l.combine_arrivals = at; at = align(at + 8 * kMaxEpRanks);
  l.recv_count = at; at = align(at + 8 * kMaxEpRanks);
  l.recv_expert_counts = at; at = align(at + 4 * static_cast<size_t>(c.num_experts));  // R * El = E
  l.recv_x = at; at = align(at + rows * c.hidden * payload);
  l.recv_scales = at; at = align(at + (c.payload == EpPayload::kFp8 ? rows * (c.hidden / kEpScaleGroup) * 4 : 0));
  l.recv_ids = at; at = align(at + rows * c.top_k * 4);
  l.recv_pos = at; at = align(at + rows * c.top_k * 4);
  l.recv_weights = at; at = align(at + rows * c.top_k * 4);
  l.recv_src_token = at; at = align(at + rows * 4);
  l.combine_partials = at; at = align(at + rows * c.hidden * 2);  // C * R rows
  l.total = at;
  return l;
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
  int32_t* token_dest_slot; // [C, R]: slot of token t in rank r's receive block, -1 = not sent
  int32_t* send_count;      // [R]
  int32_t* send_expert_counts;  // [E]: this rank's (token, slot) pairs per global expert
  int32_t* slot_pos;        // [C, k]: position of (t, j) among this rank's rows of expert ids[t, j]
  int32_t* saved_ids;       // [C, k] ids with invalid entries replaced by -1
  float* saved_weights;     // [C, k]
  int32_t* expert_offsets;  // [E_local + 1]
  int32_t* recv_slot_row;   // [R * C, k]: grouped row of received row (s*C + i), slot j (-1: not local)
  uint64_t* traffic;        // [2]: remote bytes dispatched / combined by the latest call
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
