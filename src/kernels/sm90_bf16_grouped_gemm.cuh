// Persistent, warp-specialized BF16 x BF16 grouped GEMM for sm_90a (FP32 accumulation).
//
//   acc[r, n] = sum_k A[r, k] * B_e[n, k]   (bf16 operands, FP32 tensor-core accumulation, no promotion)
//   for every row r of expert e (rows [offsets[e], offsets[e+1])), then one of two epilogues:
//   kStoreBf16:  out[r, n] = bf16_rn(acc)                                           (GEMM 2 / plain)
//   kSwigluBf16: out[r, j] = bf16_rn(act(acc_gate[r, j], acc_up[r, j]) [* topk[r]])  (GEMM 1)
//                with act exactly as docs/reference.md step 4 orders it (expf, IEEE division).
//
// Same CTA organisation as the FP8 kernel (sm90_fp8_grouped_gemm.cuh, tile shapes in
// sm90_gemm_heuristics.h): warpgroup 0 = one TMA producer thread, warpgroups 1-2 = wgmma math.
// The operands are addressed as BYTE matrices [rows, 2K]: one pipeline stage is a 128-byte (64-element)
// K slice, exactly one 128-byte swizzle atom, so the tensor maps and shared-memory descriptors are the
// FP8 kernel's; a stage is 4 wgmma m64n128k16.
//
// NOTES:
// - The math warpgroups keep one wgmma group in flight: stage s is released once the group of stage
//   s + 1 has been issued and the group of s has retired (wgmma.wait_group 1).
// - Producer and math warpgroups iterate the identical (tile, k-block) sequence, so their stage index
//   and phase bit stay in lockstep without communication.
// - Accumulator rows past the expert's last row (the next expert's rows, or TMA zero fill past
//   m_capacity) are computed but never stored.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/sm90_gemm_heuristics.h"
#include "kernels/sm90_grouped_schedule.cuh"
#include "kernels/sm90_ptx.cuh"

namespace megamoe::kernels::sm90 {

enum class Bf16Epilogue : int {
  kStoreBf16,   // out[r, n] = bf16(acc)
  kSwigluBf16,  // split-N only: gate (math warpgroup 0) x up (math warpgroup 1) -> bf16 [rows, n/2]
};

struct Bf16GroupedGemmParams {
  const int32_t* expert_offsets = nullptr;  // [E+1], device
  const float* topk_weights = nullptr;      // optional [m_capacity] (SwiGLU epilogue)
  __nv_bfloat16* out = nullptr;             // [m_capacity, n] (kStoreBf16) | [m_capacity, n/2] (SwiGLU)
  int m_capacity = 0, num_experts = 0, n = 0, k = 0;
  int activation = 0;                       // 0 = silu*up, 1 = clamped SwiGLU
  float limit = 0.f, alpha = 0.f;
};

constexpr int kBf16StageK = kBlockK / 2;  // elements of K per stage (kBlockK is bytes of one swizzle row)

template <int kWarpgroupsM, int kSubTilesM, int kStages, Bf16Epilogue kEpilogue>
struct Bf16GroupedGemmLayout {
  static constexpr int kRowsPerWarpgroup = 64 * kSubTilesM;
  static constexpr int kBlockM = kRowsPerWarpgroup * kWarpgroupsM;
  static constexpr int kBlockN = 128 * (kMathWarpgroups / kWarpgroupsM);
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kExchangeBytes = kEpilogue == Bf16Epilogue::kSwigluBf16 ? kRowsPerWarpgroup * 128 * 4 : 0;
  static constexpr int kTilesBytes = kStages * (kABytes + kBBytes);
  static constexpr int kBarrierOffset = kTilesBytes + kExchangeBytes;
  static constexpr int kTableOffset = kBarrierOffset + 2 * kStages * 8;
  // 1024 bytes of slack to align the base for the 128-byte swizzle.
  static constexpr int shared_bytes(int num_experts) {
    return 1024 + kTableOffset + ExpertTileTable::bytes(num_experts);
  }
};

// docs/reference.md step 4, in that order (fp32, expf, IEEE division; no contraction possible).
__device__ __forceinline__ float reference_activation(float gate, float up, int kind, float limit, float alpha) {
  if (kind == 0) return __fmul_rn(__fdiv_rn(gate, 1.0f + expf(-gate)), up);
  const float g = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  return __fmul_rn(__fmul_rn(g, __fdiv_rn(1.0f, 1.0f + expf(-__fmul_rn(alpha, g)))), u + 1.0f);
}

template <int kWarpgroupsM, int kSubTilesM, int kStages, Bf16Epilogue kEpilogue>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_bf16_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                  const __grid_constant__ CUtensorMap b_map, const Bf16GroupedGemmParams params) {
  using Layout = Bf16GroupedGemmLayout<kWarpgroupsM, kSubTilesM, kStages, kEpilogue>;
  constexpr int kBlockM = Layout::kBlockM, kBlockN = Layout::kBlockN;
  static_assert(kEpilogue != Bf16Epilogue::kSwigluBf16 || kWarpgroupsM == 1, "SwiGLU epilogue needs split-N");

  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = shared_raw + ((1024 - (smem_address(shared_raw) & 1023)) & 1023);
  uint8_t* a_tiles = shared;
  uint8_t* b_tiles = shared + kStages * Layout::kABytes;
  float* exchange = reinterpret_cast<float*>(shared + Layout::kTilesBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + Layout::kBarrierOffset);
  uint64_t* empty = full + kStages;
  const ExpertTileTable table(reinterpret_cast<int*>(shared + Layout::kTableOffset), params.num_experts);

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
  if (threadIdx.x / 32 == 1)
    build_expert_tile_table<kBlockM>(table, params.expert_offsets, params.num_experts, params.m_capacity);
  __syncthreads();

  const int k_blocks = params.k / kBf16StageK;
  const int n_tiles = params.n / kBlockN;
  const int total_tiles = table.tile_prefix[params.num_experts] * n_tiles;

  if (warpgroup == 0) {
    registers_decrease<kProducerRegisters>();
    if (threadIdx.x != 0) return;
    int stage = 0;
    uint32_t phase = 0;
    int expert = 0;
    for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
      const TileCoordinates where = locate_tile(table, tile, n_tiles, kBlockM, expert);
      const int b_row = expert * params.n + where.n_tile * kBlockN;
      for (int kb = 0; kb < k_blocks; ++kb) {
        barrier_wait(&empty[stage], phase ^ 1);
        barrier_arrive_expect_bytes(&full[stage], Layout::kABytes + Layout::kBBytes);
        tma_load_2d(a_tiles + stage * Layout::kABytes, &a_map, kb * kBlockK, where.m0, &full[stage]);
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

  int stage = 0;
  uint32_t phase = 0;
  int expert = 0;
  float accumulator[kSubTilesM][64];
  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const TileCoordinates where = locate_tile(table, tile, n_tiles, kBlockM, expert);
    int rows[kSubTilesM][2];
    bool valid[kSubTilesM][2];
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        rows[s][h] = where.m0 + row_in_tile + 64 * s + 8 * h;
        valid[s][h] = rows[s][h] < where.m_end;
      }

    int previous_stage = 0;
    for (int kb = 0; kb < k_blocks; ++kb) {
      barrier_wait(&full[stage], phase);
      const uint32_t b_base = smem_address(b_tiles + stage * Layout::kBBytes + wg_n * 128 * kBlockK);
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
        for (int i = 0; i < 64; ++i) fence_operand(accumulator[s][i]);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s) {
        const uint32_t a_base = smem_address(a_tiles + stage * Layout::kABytes +
                                             (wg_m * Layout::kRowsPerWarpgroup + 64 * s) * kBlockK);
#pragma unroll
        for (int k_step = 0; k_step < kBf16StageK / 16; ++k_step)  // 16 bf16 = 32 bytes per wgmma
          wgmma_m64n128k16_bf16(accumulator[s], make_kmajor_sw128_descriptor(a_base + k_step * 32),
                                make_kmajor_sw128_descriptor(b_base + k_step * 32),
                                (kb > 0 || k_step > 0) ? 1u : 0u);
      }
      wgmma_commit();
      if (kb > 0) {  // the previous stage's group has retired: its shared memory may be refilled
        wgmma_wait<1>();
        if (lane == 0) barrier_arrive(&empty[previous_stage]);
      }
      previous_stage = stage;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    wgmma_wait<0>();
    if (lane == 0) barrier_arrive(&empty[previous_stage]);
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int i = 0; i < 64; ++i) fence_operand(accumulator[s][i]);

    // Accumulator fragment of wgmma m64n128: register 4j+{0,1} = (row, 8j + 2*(lane%4) + {0,1}),
    // register 4j+{2,3} = (row + 8, same columns).
    if constexpr (kEpilogue == Bf16Epilogue::kStoreBf16) {
      const int col_base = where.n_tile * kBlockN + wg_n * 128 + 2 * (lane % 4);
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (!valid[s][h]) continue;
          __nv_bfloat16* out_row = params.out + static_cast<int64_t>(rows[s][h]) * params.n + col_base;
#pragma unroll
          for (int j = 0; j < 16; ++j)
            *reinterpret_cast<__nv_bfloat162*>(out_row + 8 * j) =
                __floats2bfloat162_rn(accumulator[s][4 * j + 2 * h], accumulator[s][4 * j + 2 * h + 1]);
        }
    } else {
      // The gate warpgroup hands its accumulators to the up warpgroup through shared memory in
      // register order, so both see the same (row, column) per slot; the up warpgroup finishes.
      if (math_wg == 0) {
#pragma unroll
        for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
          for (int i = 0; i < 64; ++i) exchange[(s * 64 + i) * 128 + thread_in_wg] = accumulator[s][i];
      }
      named_barrier_sync(1, 256);
      if (math_wg == 1) {
        const int out_cols = params.n / 2;
        const int col_base = where.n_tile * 128 + 2 * (lane % 4);
#pragma unroll
        for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (!valid[s][h]) continue;
            const bool weighted = params.topk_weights != nullptr;
            const float weight = weighted ? params.topk_weights[rows[s][h]] : 1.0f;
            __nv_bfloat16* out_row = params.out + static_cast<int64_t>(rows[s][h]) * out_cols + col_base;
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              float value[2];
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                const int i = 4 * j + 2 * h + c;
                value[c] = reference_activation(exchange[(s * 64 + i) * 128 + thread_in_wg], accumulator[s][i],
                                                params.activation, params.limit, params.alpha);
                if (weighted) value[c] = __fmul_rn(value[c], weight);
              }
              *reinterpret_cast<__nv_bfloat162*>(out_row + 8 * j) = __floats2bfloat162_rn(value[0], value[1]);
            }
          }
      }
      named_barrier_sync(1, 256);  // the exchange buffer is free for the next tile
    }
  }
}

}  // namespace megamoe::kernels::sm90
