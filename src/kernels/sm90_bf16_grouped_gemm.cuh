// Persistent, warp-specialized BF16 x BF16 grouped GEMM for sm_90a (FP32 accumulation), and its
// device-level building blocks.
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
// K slice, exactly one 128-byte swizzle atom, so the tensor maps, the shared-memory carve-up
// (GroupedGemmLayout / Fp8GemmShared), the producer (produce_fp8_tile, which only moves bytes) and the
// BF16 store epilogues are the FP8 file's; a stage is 4 wgmma m64n128k16.
//
// The pieces specific to BF16 (the math mainloop of one tile, the SwiGLU epilogue to BF16) are device
// functions so that the fused MegaMoE kernel (sm90_mega_moe.cuh, BF16 variant) runs the very same GEMM
// code on its own tile sequence; sm90_bf16_grouped_gemm_kernel below is the standalone user.
//
// NOTES:
// - The math warpgroups keep one wgmma group in flight: stage s is released once the group of stage
//   s + 1 has been issued and the group of s has retired (wgmma.wait_group 1).
// - Producer and math warpgroups iterate the identical (tile, k-block) sequence, so their stage index
//   and phase bit stay in lockstep without communication (PipelineCursor on each side).
// - Accumulator rows past the expert's last row (the next expert's rows, or TMA zero fill past
//   m_capacity) are computed but never stored.
// - Every output element depends only on its own row of A, its column of B and the fixed k-step order,
//   never on the tile shape or on other rows: the fused kernel's BF16 results equal these bit for bit.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/sm90_fp8_grouped_gemm.cuh"
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

// The FP8 layout's shared-memory carve-up (a BF16 stage is the same 128-byte rows); the SwiGLU variant
// keeps its kExchangeRegisters-at-a-time gate/up exchange buffer.
template <int kWarpgroupsM, int kSubTilesM, int kStages, Bf16Epilogue kEpilogue>
using Bf16GroupedGemmLayout =
    GroupedGemmLayout<kWarpgroupsM, kSubTilesM, kStages,
                      kEpilogue == Bf16Epilogue::kSwigluBf16 ? Epilogue::kSwigluQuantFp8 : Epilogue::kStoreBf16>;

// docs/reference.md step 4, in that order (fp32, expf, IEEE division; no contraction possible).
__device__ __forceinline__ float reference_activation(float gate, float up, int kind, float limit, float alpha) {
  if (kind == 0) return __fmul_rn(__fdiv_rn(gate, 1.0f + expf(-gate)), up);
  const float g = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  return __fmul_rn(__fmul_rn(g, __fdiv_rn(1.0f, 1.0f + expf(-__fmul_rn(alpha, g)))), u + 1.0f);
}

// Math warpgroup: the full K loop of one tile (k_blocks stages of 64 elements) into `accumulator`
// (overwritten: the first wgmma of the tile does not accumulate). wg_m / wg_n: which row block /
// 128-column half of the tile this warpgroup computes.
template <class Layout>
__device__ __forceinline__ void bf16_tile_mainloop(float (&accumulator)[Layout::kSubTiles][64],
                                                   const Fp8GemmShared<Layout>& smem, int k_blocks, int wg_m, int wg_n,
                                                   PipelineCursor<Layout::kStageCount>& cursor) {
  constexpr int kSubTilesM = Layout::kSubTiles;
  const int lane = threadIdx.x % 32;
  int previous_stage = 0;
  for (int kb = 0; kb < k_blocks; ++kb) {
    barrier_wait(&smem.full[cursor.stage], cursor.phase);
    const uint32_t b_base = smem_address(smem.b_tiles + cursor.stage * Layout::kBBytes + wg_n * 128 * kBlockK);
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int i = 0; i < 64; ++i) fence_operand(accumulator[s][i]);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s) {
      const uint32_t a_base = smem_address(smem.a_tiles + cursor.stage * Layout::kABytes +
                                           (wg_m * Layout::kRowsPerWarpgroup + 64 * s) * kBlockK);
#pragma unroll
      for (int k_step = 0; k_step < kBf16StageK / 16; ++k_step)  // 16 bf16 = 32 bytes per wgmma
        wgmma_m64n128k16_bf16(accumulator[s], make_kmajor_sw128_descriptor(a_base + k_step * 32),
                              make_kmajor_sw128_descriptor(b_base + k_step * 32), (kb > 0 || k_step > 0) ? 1u : 0u);
    }
    wgmma_commit();
    if (kb > 0) {  // the previous stage's group has retired: its shared memory may be refilled
      wgmma_wait<1>();
      if (lane == 0) barrier_arrive(&smem.empty[previous_stage]);
    }
    previous_stage = cursor.stage;
    cursor.advance();
  }
  wgmma_wait<0>();
  if (lane == 0 && k_blocks > 0) barrier_arrive(&smem.empty[previous_stage]);
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(accumulator[s][i]);
}

// SwiGLU (+ optional top-k weight) to BF16 (split-N tiles: math warpgroup 0 holds the 128 gate
// columns, warpgroup 1 the 128 up columns of the same outputs). Output tile n_tile covers activation
// columns [128 n_tile, 128 n_tile + 128) of rows `out_cols` elements long.
// The gate warpgroup hands its accumulators to the up warpgroup through shared memory, in register
// order and Layout::kExchangeRegisters at a time (as swiglu_quant_fp8_epilogue), so both see identical
// (row, column) per slot; the up warpgroup finishes and stores. Per element:
// bf16_rn(fl(act(gate, up) * w)) -- the chunking changes no value. Named barrier 1 (256 threads).
template <class Layout, bool kCoherentWeights>
__device__ __forceinline__ void swiglu_bf16_epilogue(float (&accumulator)[Layout::kSubTiles][64], float* exchange,
                                                     int math_wg, const MathRows<Layout::kSubTiles>& where, int n_tile,
                                                     int out_cols, const float* topk_weights, __nv_bfloat16* out,
                                                     int activation, float limit, float alpha) {
  constexpr int kChunk = Layout::kExchangeRegisters;
  constexpr int kSubTilesM = Layout::kSubTiles;
  static_assert(64 % kChunk == 0 && kChunk % 4 == 0, "exchange chunks must tile the 64 accumulator registers");
  const int lane = threadIdx.x % 32;
  const int thread_in_wg = threadIdx.x % 128;
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s) {
    float weight[2] = {1.0f, 1.0f};
    if (math_wg == 1 && topk_weights) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (where.valid[s][h]) weight[h] = load_scale<kCoherentWeights>(topk_weights + where.rows[s][h]);
    }
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
          float value = reference_activation(exchange[r * 128 + thread_in_wg], accumulator[s][i], activation, limit, alpha);
          if (topk_weights) value = __fmul_rn(value, weight[(i % 4) / 2]);
          accumulator[s][i] = value;
        }
      }
      named_barrier_sync(1, 256);  // the exchange buffer is free again
    }
  }
  if (math_wg == 1)  // the accumulators now hold the activations, in the fragment layout of a 64 x 128 tile
    store_bf16_epilogue(accumulator, where, n_tile * 128 + 2 * (lane % 4),
                        [&](int row) { return out + static_cast<int64_t>(row) * out_cols; });
}

// ---- the standalone grouped GEMM ------------------------------------------------------------------
template <int kWarpgroupsM, int kSubTilesM, int kStages, Bf16Epilogue kEpilogue>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_bf16_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                  const __grid_constant__ CUtensorMap b_map, const Bf16GroupedGemmParams params) {
  using Layout = Bf16GroupedGemmLayout<kWarpgroupsM, kSubTilesM, kStages, kEpilogue>;
  constexpr int kBlockM = Layout::kBlockM, kBlockN = Layout::kBlockN;
  static_assert(kEpilogue != Bf16Epilogue::kSwigluBf16 || kWarpgroupsM == 1, "SwiGLU epilogue needs split-N");

  extern __shared__ uint8_t shared_raw[];
  const Fp8GemmShared<Layout> smem(shared_raw);
  const ExpertTileTable table(reinterpret_cast<int*>(smem.table_base), params.num_experts);

  const int warpgroup = threadIdx.x / 128;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    smem.init_barriers();
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
    PipelineCursor<kStages> cursor;
    int expert = 0;
    for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
      const TileCoordinates where = locate_tile(table, tile, n_tiles, kBlockM, expert);
      produce_fp8_tile(smem, &a_map, &b_map, where.m0, expert * params.n + where.n_tile * kBlockN, k_blocks, cursor);
    }
    return;
  }

  registers_increase<kMathRegisters>();
  const int math_wg = warpgroup - 1;
  const int wg_m = kWarpgroupsM == 2 ? math_wg : 0;  // which row block of the tile
  const int wg_n = kWarpgroupsM == 2 ? 0 : math_wg;  // which 128-column half of the tile
  const int thread_in_wg = threadIdx.x % 128;
  const int row_in_tile = wg_m * Layout::kRowsPerWarpgroup + (thread_in_wg / 32) * 16 + lane / 4;

  PipelineCursor<kStages> cursor;
  int expert = 0;
  float accumulator[kSubTilesM][64];
  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const TileCoordinates t = locate_tile(table, tile, n_tiles, kBlockM, expert);
    const MathRows<kSubTilesM> where(t.m0, t.m_end, row_in_tile);
    bf16_tile_mainloop<Layout>(accumulator, smem, k_blocks, wg_m, wg_n, cursor);
    if constexpr (kEpilogue == Bf16Epilogue::kStoreBf16) {
      store_bf16_epilogue(accumulator, where, t.n_tile * kBlockN + wg_n * 128 + 2 * (lane % 4),
                          [&](int row) { return params.out + static_cast<int64_t>(row) * params.n; });
    } else {
      swiglu_bf16_epilogue<Layout, false>(accumulator, smem.exchange, math_wg, where, t.n_tile, params.n / 2,
                                          params.topk_weights, params.out, params.activation, params.limit,
                                          params.alpha);
    }
  }
}

}  // namespace megamoe::kernels::sm90
