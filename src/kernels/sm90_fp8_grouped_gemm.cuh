// Persistent, warp-specialized FP8-block grouped GEMM for sm_90a, and its launcher.
//
//   out[r, n] = sum_kb ( sum_{k in block kb} e4m3(A[r,k]) * e4m3(B_e[n,k]) ) * a_scale[r,kb] * b_scale_e[n/128,kb]
//   for every row r of expert e (rows [offsets[e], offsets[e+1])), then one of two epilogues.
//
// CTA = 3 warpgroups. Warpgroup 0 (producer; one thread) walks the tiles and streams the 128-K slices
// of A and B into a ring of shared-memory stages with TMA, completion counted on the stage's `full`
// mbarrier. Warpgroups 1, 2 (math) wait on `full`, run 4 wgmma m64n128k32 into a fresh FP32 partial,
// release the stage on its `empty` mbarrier, and fold the partial into the FP32 accumulator scaled by
// a_scale(row) * b_scale (per-128-K promotion: the tensor core's FP8 accumulation is never longer than
// 128 K, which bounds its reduced-precision error).
//
// NOTES:
// - Tile order (see sm90_gemm_heuristics.h): m-tiles of all experts concatenated, n-tile fastest. The
//   per-expert m-tile prefix is computed by every CTA from the device offsets (one warp scan), so the
//   host never needs the row counts.
// - A tile may run past its expert's last row into the next expert's rows (or past m_capacity, where
//   TMA fills zeros): those accumulator rows are computed but never stored, and their A scale is 0.
// - Producer and math warpgroups iterate the identical (tile, k-block) sequence, so their stage index
//   and phase bit stay in lockstep without communication.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/sm90_gemm_heuristics.h"
#include "kernels/sm90_ptx.cuh"

namespace megamoe::kernels::sm90 {

enum class Epilogue : int {
  kStoreBf16,       // out[r, n] = bf16(acc)
  kSwigluQuantFp8,  // split-N only: gate (warpgroup 0) x up (warpgroup 1) -> FP8 + per-128 scale
};

struct GroupedGemmParams {
  const float* a_scales = nullptr;       // [m_capacity, k/128]
  const float* b_scales = nullptr;       // [E, n/128, k/128]
  const int32_t* expert_offsets = nullptr;  // [E+1], device
  const float* topk_weights = nullptr;   // optional [m_capacity] (SwiGLU epilogue)
  void* out = nullptr;                   // bf16 [m_capacity, n] | e4m3 [m_capacity, n/2]
  float* out_scales = nullptr;           // SwiGLU: [m_capacity, n/256]
  int m_capacity = 0, num_experts = 0, n = 0, k = 0;
  int activation = 0;                    // 0 = silu*up, 1 = clamped SwiGLU
  float limit = 0.f, alpha = 0.f;
};

// kWarpgroupsM: 2 = the math warpgroups split the tile's rows (split-M), 1 = its columns (split-N).
// kSubTilesM: 64-row sub-tiles per math warpgroup (each a separate 64 x 128 wgmma accumulator set).
template <int kWarpgroupsM, int kSubTilesM, int kStages, Epilogue kEpilogue>
struct GroupedGemmLayout {
  static constexpr int kRowsPerWarpgroup = 64 * kSubTilesM;
  static constexpr int kBlockM = kRowsPerWarpgroup * kWarpgroupsM;
  static constexpr int kBlockN = 128 * (kMathWarpgroups / kWarpgroupsM);
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  // SwiGLU: the gate accumulators cross to the up warpgroup kExchangeRegisters registers per thread
  // at a time (16 KiB), not all at once (64 KiB at 128 x 256), which leaves room for a 4th stage.
  static constexpr int kExchangeRegisters = 32;
  static constexpr int kExchangeBytes = kEpilogue == Epilogue::kSwigluQuantFp8 ? kExchangeRegisters * 128 * 4 : 0;
  static constexpr int kTilesBytes = kStages * (kABytes + kBBytes);
  static constexpr int kBarrierOffset = kTilesBytes + kExchangeBytes;
  static constexpr int kTableOffset = kBarrierOffset + 2 * kStages * 8;
  // 1024 bytes of slack to align the base for the 128-byte swizzle; 3 int tables of E+1.
  static constexpr int shared_bytes(int num_experts) { return 1024 + kTableOffset + 3 * 4 * (num_experts + 1); }
};

__device__ __forceinline__ float activate(float gate, float up, int kind, float limit, float alpha) {
  if (kind == 0) return gate / (1.0f + expf(-gate)) * up;
  const float g = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  return g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
}

template <int kWarpgroupsM, int kSubTilesM, int kStages, Epilogue kEpilogue>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_fp8_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                 const __grid_constant__ CUtensorMap b_map, const GroupedGemmParams params) {
  using Layout = GroupedGemmLayout<kWarpgroupsM, kSubTilesM, kStages, kEpilogue>;
  constexpr int kBlockM = Layout::kBlockM, kBlockN = Layout::kBlockN;
  static_assert(kEpilogue != Epilogue::kSwigluQuantFp8 || kWarpgroupsM == 1, "SwiGLU epilogue needs split-N");

  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = shared_raw + ((1024 - (smem_address(shared_raw) & 1023)) & 1023);
  uint8_t* a_tiles = shared;
  uint8_t* b_tiles = shared + kStages * Layout::kABytes;
  float* exchange = reinterpret_cast<float*>(shared + Layout::kTilesBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + Layout::kBarrierOffset);
  uint64_t* empty = full + kStages;
  const int num_experts = params.num_experts;
  int* tile_prefix = reinterpret_cast<int*>(shared + Layout::kTableOffset);  // [E+1] m-tiles before expert e
  int* row_begin = tile_prefix + num_experts + 1;                            // [E]
  int* row_end = row_begin + num_experts + 1;                                // [E]

  const int warpgroup = threadIdx.x / 128;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], kMathWarpgroups * 4);  // lane 0 of every math warp
    }
    barrier_init_fence();
    prefetch_tensor_map(&a_map);
    prefetch_tensor_map(&b_map);
  }
  if (threadIdx.x / 32 == 1) {  // warp 1: m-tile prefix over experts (inclusive scan, 32 at a time)
    int carry = 0;
    if (lane == 0) tile_prefix[0] = 0;
    for (int base = 0; base < num_experts; base += 32) {
      const int e = base + lane;
      int tiles = 0;
      if (e < num_experts) {
        const int begin = min(max(params.expert_offsets[e], 0), params.m_capacity);
        const int end = max(min(max(params.expert_offsets[e + 1], 0), params.m_capacity), begin);
        row_begin[e] = begin;
        row_end[e] = end;
        tiles = (end - begin + kBlockM - 1) / kBlockM;
      }
#pragma unroll
      for (int delta = 1; delta < 32; delta *= 2) {
        const int other = __shfl_up_sync(0xffffffffu, tiles, delta);
        if (lane >= delta) tiles += other;
      }
      if (e < num_experts) tile_prefix[e + 1] = carry + tiles;
      carry += __shfl_sync(0xffffffffu, tiles, 31);
    }
  }
  __syncthreads();

  const int k_blocks = params.k / kBlockK;
  const int n_tiles = params.n / kBlockN;
  const int total_tiles = tile_prefix[num_experts] * n_tiles;

  if (warpgroup == 0) {
    registers_decrease<kProducerRegisters>();
    if (threadIdx.x != 0) return;
    int stage = 0;
    uint32_t phase = 0;
    int expert = 0;
    for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
      const int m_tile = tile / n_tiles, n_tile = tile % n_tiles;
      while (tile_prefix[expert + 1] <= m_tile) ++expert;
      const int m0 = row_begin[expert] + (m_tile - tile_prefix[expert]) * kBlockM;
      const int b_row = expert * params.n + n_tile * kBlockN;
      for (int kb = 0; kb < k_blocks; ++kb) {
        barrier_wait(&empty[stage], phase ^ 1);
        barrier_arrive_expect_bytes(&full[stage], Layout::kABytes + Layout::kBBytes);
        tma_load_2d(a_tiles + stage * Layout::kABytes, &a_map, kb * kBlockK, m0, &full[stage]);
        tma_load_2d(b_tiles + stage * Layout::kBBytes, &b_map, kb * kBlockK, b_row, &full[stage]);
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
    return;
  }

  registers_increase<kMathRegisters>();
  const int math_wg = warpgroup - 1;
  const int wg_m = kWarpgroupsM == 2 ? math_wg : 0;  // which row block of the tile
  const int wg_n = kWarpgroupsM == 2 ? 0 : math_wg;  // which 128-column half of the tile
  const int thread_in_wg = threadIdx.x % 128;
  // Row of accumulator registers 4j+{0,1} of sub-tile s: row_in_tile + 64 s; registers 4j+{2,3}: + 8.
  const int row_in_tile = wg_m * Layout::kRowsPerWarpgroup + (thread_in_wg / 32) * 16 + lane / 4;
  const int n_blocks = params.n / 128;

  int stage = 0;
  uint32_t phase = 0;
  int expert = 0;
  float accumulator[kSubTilesM][64];
  float partial[64];
  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const int m_tile = tile / n_tiles, n_tile = tile % n_tiles;
    while (tile_prefix[expert + 1] <= m_tile) ++expert;
    const int m0 = row_begin[expert] + (m_tile - tile_prefix[expert]) * kBlockM;
    const int m_end = row_end[expert];
    int rows[kSubTilesM][2];
    bool valid[kSubTilesM][2];
    const float* a_scales[kSubTilesM][2];
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        rows[s][h] = m0 + row_in_tile + 64 * s + 8 * h;
        valid[s][h] = rows[s][h] < m_end;
        a_scales[s][h] = params.a_scales + static_cast<int64_t>(valid[s][h] ? rows[s][h] : 0) * k_blocks;
      }
    const int n_block = (n_tile * kBlockN) / 128 + wg_n;
    const float* b_scales = params.b_scales + (static_cast<int64_t>(expert) * n_blocks + n_block) * k_blocks;

#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int i = 0; i < 64; ++i) accumulator[s][i] = 0.0f;

    // Scales are loaded one k-block ahead (software pipelined): a row's scales share a 32-byte sector
    // over 8 k-blocks, so every 8th load misses L1 and would otherwise stall the promotion.
    float next_scale_a[kSubTilesM][2];
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) next_scale_a[s][h] = valid[s][h] ? __ldg(a_scales[s][h]) : 0.0f;
    float next_scale_b = __ldg(b_scales);
    for (int kb = 0; kb < k_blocks; ++kb) {
      float scale_a[kSubTilesM][2];
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) scale_a[s][h] = next_scale_a[s][h];
      const float scale_b = next_scale_b;
      if (kb + 1 < k_blocks) {
#pragma unroll
        for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
          for (int h = 0; h < 2; ++h) next_scale_a[s][h] = valid[s][h] ? __ldg(a_scales[s][h] + kb + 1) : 0.0f;
        next_scale_b = __ldg(b_scales + kb + 1);
      }
      barrier_wait(&full[stage], phase);
      const uint32_t b_base = smem_address(b_tiles + stage * Layout::kBBytes + wg_n * 128 * kBlockK);
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s) {
        const uint32_t a_base = smem_address(a_tiles + stage * Layout::kABytes +
                                             (wg_m * Layout::kRowsPerWarpgroup + 64 * s) * kBlockK);
#pragma unroll
        for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
        wgmma_fence();
#pragma unroll
        for (int k_step = 0; k_step < kBlockK / 32; ++k_step)
          wgmma_m64n128k32_e4m3(partial, make_kmajor_sw128_descriptor(a_base + k_step * 32),
                                make_kmajor_sw128_descriptor(b_base + k_step * 32), k_step > 0 ? 1u : 0u);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
        if (s == kSubTilesM - 1) {
          if (lane == 0) barrier_arrive(&empty[stage]);
          if (++stage == kStages) stage = 0, phase ^= 1;
        }
        const float scale0 = scale_a[s][0] * scale_b, scale1 = scale_a[s][1] * scale_b;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          accumulator[s][4 * j + 0] += partial[4 * j + 0] * scale0;
          accumulator[s][4 * j + 1] += partial[4 * j + 1] * scale0;
          accumulator[s][4 * j + 2] += partial[4 * j + 2] * scale1;
          accumulator[s][4 * j + 3] += partial[4 * j + 3] * scale1;
        }
      }
    }

    // Accumulator fragment of wgmma m64n128: register 4j+{0,1} = (row, 8j + 2*(lane%4) + {0,1}),
    // register 4j+{2,3} = (row + 8, same columns).
    if constexpr (kEpilogue == Epilogue::kStoreBf16) {
      auto* out = static_cast<__nv_bfloat16*>(params.out);
      const int col_base = n_tile * kBlockN + wg_n * 128 + 2 * (lane % 4);
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (!valid[s][h]) continue;
          __nv_bfloat16* out_row = out + static_cast<int64_t>(rows[s][h]) * params.n + col_base;
#pragma unroll
          for (int j = 0; j < 16; ++j)
            *reinterpret_cast<__nv_bfloat162*>(out_row + 8 * j) =
                __floats2bfloat162_rn(accumulator[s][4 * j + 2 * h], accumulator[s][4 * j + 2 * h + 1]);
        }
    } else {
      // Gate warpgroup hands its accumulators to the up warpgroup through shared memory, in register
      // order and kExchangeRegisters at a time, so both see identical (row, column) per slot; the up
      // warpgroup finishes the tile. The second barrier of a chunk frees the buffer, so the gate
      // warpgroup moves on to its next tile while the up warpgroup quantizes and stores.
      constexpr int kChunk = Layout::kExchangeRegisters;
      static_assert(64 % kChunk == 0, "exchange chunks must tile the 64 accumulator registers");
      const int out_cols = params.n / 2;
      auto* out = static_cast<uint8_t*>(params.out);
      const int col_base = n_tile * 128 + 2 * (lane % 4);
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s) {
        float amax[2] = {0.0f, 0.0f};
#pragma unroll
        for (int chunk = 0; chunk < 64 / kChunk; ++chunk) {
          if (math_wg == 0) {
#pragma unroll
            for (int r = 0; r < kChunk; ++r) exchange[r * 128 + thread_in_wg] = accumulator[s][chunk * kChunk + r];
          }
          named_barrier_sync(1, 256);
          if (math_wg == 1) {
#pragma unroll
            for (int r = 0; r < kChunk; ++r) {
              const int i = chunk * kChunk + r;
              const int h = (i % 4) / 2;
              const float value =
                  activate(exchange[r * 128 + thread_in_wg], accumulator[s][i], params.activation, params.limit,
                           params.alpha);
              accumulator[s][i] = value;
              amax[h] = fmaxf(amax[h], fabsf(value));
            }
          }
          named_barrier_sync(1, 256);  // the exchange buffer is free again
        }
        if (math_wg == 1) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
            amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
            if (!valid[s][h]) continue;
            // The top-k weight multiplies here, not in the chunk loop (fewer live registers there):
            // fl(v * w) is the same value, and amax |fl(v * w)| = fl(amax |v| * |w|) because rounding
            // is monotonic.
            const float weight = params.topk_weights ? params.topk_weights[rows[s][h]] : 1.0f;
            // Same rule as formats::quantize_fp8_activations (IEEE divisions, RNE, saturating).
            const float scale = __fdiv_rn(fmaxf(__fmul_rn(amax[h], fabsf(weight)), 1e-10f), 448.0f);
            uint8_t* out_row = out + static_cast<int64_t>(rows[s][h]) * out_cols + col_base;
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              const float2 pair = make_float2(__fdiv_rn(__fmul_rn(accumulator[s][4 * j + 2 * h], weight), scale),
                                              __fdiv_rn(__fmul_rn(accumulator[s][4 * j + 2 * h + 1], weight), scale));
              *reinterpret_cast<__nv_fp8x2_storage_t*>(out_row + 8 * j) =
                  __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
            }
            if (lane % 4 == 0) params.out_scales[static_cast<int64_t>(rows[s][h]) * (out_cols / 128) + n_tile] = scale;
          }
        }
      }
    }
  }
}

}  // namespace megamoe::kernels::sm90
