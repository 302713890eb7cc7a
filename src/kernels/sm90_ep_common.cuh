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
inline constexpr int kEpCombineBlocks = 128;
inline constexpr int kEpWarpsPerBlock = 16;
inline constexpr int kEpLayoutThreads = 1024;
inline constexpr int kEpScaleGroup = 128;  // FP8 activation scales: one per token per 128 channels

// Byte offsets of the regions of one rank's dispatch window (identical on every rank).
// R = ranks, C = max tokens per rank, H = hidden, S = H / 128, k = top_k, P = 1 (fp8) or 2 (bf16):
//   dispatch_arrivals  uint64 [kMaxEpRanks]   blocks of the senders' dispatch that finished, cumulative
//   combine_arrivals   uint64 [kMaxEpRanks]   blocks of the peers' combine that finished, cumulative
//   recv_count         uint64 [kMaxEpRanks]   rows sender s wrote in its latest dispatch
//   recv_x             [R * C, H] * P bytes   row s*C + i = i-th token sender s sent here
//   recv_scales        f32 [R * C, S]         (fp8 only)
//   recv_ids           i32 [R * C, k]         the token's global top-k ids (all k, also remote ones)
//   recv_weights       f32 [R * C, k]
//   recv_src_token     i32 [R * C]            token index on the sender
//   combine_rows       bf16 [C * k, H]        row t*k + j = expert output for this rank's token t, slot j
// Each region starts on a 256-byte boundary. Total ~ R*C*(H*P + 4S + 8k + 4) + C*k*H*2 + 192 bytes.
struct DispatchLayout {
  size_t dispatch_arrivals, combine_arrivals, recv_count, recv_x, recv_scales, recv_ids, recv_weights,
      recv_src_token, combine_rows, total;
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
  l.recv_x = at; at = align(at + rows * c.hidden * payload);
  l.recv_scales = at; at = align(at + (c.payload == EpPayload::kFp8 ? rows * (c.hidden / kEpScaleGroup) * 4 : 0));
  l.recv_ids = at; at = align(at + rows * c.top_k * 4);
  l.recv_weights = at; at = align(at + rows * c.top_k * 4);
  l.recv_src_token = at; at = align(at + rows * 4);
  l.combine_rows = at; at = align(at + static_cast<size_t>(c.max_tokens_per_rank) * c.top_k * c.hidden * 2);
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
  int32_t* saved_ids;       // [C, k] ids with invalid entries replaced by -1
  float* saved_weights;     // [C, k]
  int32_t* expert_counts;   // [E_local]
  int32_t* expert_cursors;  // [E_local]
  int32_t* expert_offsets;  // [E_local + 1]
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
