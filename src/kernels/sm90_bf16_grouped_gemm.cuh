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
// BF16 v2 (docs/grouped_gemm.md "BF16 v2"): the plain epilogue may go through shared memory and bulk
// copies (kStagingRows > 0, store_bf16_epilogue_bulk), and sm90_bf16_wide_grouped_gemm_kernel (end of
// this file) runs split-M 128 x 256 tiles with one wgmma m64n256k16 per 16 K per math warpgroup, for GEMM 2
// and for GEMM 1 on gate/up-interleaved-by-8 weights (in-thread SwiGLU).
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

#include "kernels/sm90_cluster_pipeline.cuh"
#include "kernels/sm90_fp8_grouped_gemm.cuh"
#include "kernels/sm90_gemm_heuristics.h"
#include "kernels/sm90_grouped_schedule.cuh"
#include "kernels/sm90_ptx.cuh"

namespace megamoe::kernels::sm90 {

enum class Bf16Epilogue : int {
  kStoreBf16,   // out[r, n] = bf16(acc)
  kSwigluBf16,  // split-N only: gate (math warpgroup 0) x up (math warpgroup 1) -> bf16 [rows, n/2]
  // BF16 v2 (docs/grouped_gemm.md "BF16 v2"): split-M 128 x 256 wide tiles on weights packed gate/up
  // interleaved by 8 rows (GemmRole::kGateUpInterleaved8); every thread finishes its own outputs.
  kSwigluInterleavedBf16,
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
// kStagingRows > 0 (kStoreBf16 only; BF16 v2): the FP8 kernel's BF16 staging region for
// store_bf16_epilogue_bulk (standalone_bf16_staging_rows: 64 rows where that fits at kMaxExperts, else 32).
template <int kWarpgroupsM, int kSubTilesM, int kStages, Bf16Epilogue kEpilogue, int kStagingRows = 0>
using Bf16GroupedGemmLayout =
    GroupedGemmLayout<kWarpgroupsM, kSubTilesM, kStages,
                      kEpilogue == Bf16Epilogue::kSwigluBf16 ? Epilogue::kSwigluQuantFp8 : Epilogue::kStoreBf16,
                      kStagingRows>;

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
// kStagingRows = 0: v1 (direct 4-byte stores); > 0 (kStoreBf16, BF16 v2): store_bf16_epilogue_bulk.
template <int kWarpgroupsM, int kSubTilesM, int kStages, Bf16Epilogue kEpilogue, int kStagingRows = 0>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_bf16_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                  const __grid_constant__ CUtensorMap b_map, const Bf16GroupedGemmParams params) {
  using Layout = Bf16GroupedGemmLayout<kWarpgroupsM, kSubTilesM, kStages, kEpilogue, kStagingRows>;
  constexpr int kBlockM = Layout::kBlockM, kBlockN = Layout::kBlockN;
  static_assert(kEpilogue != Bf16Epilogue::kSwigluBf16 || kWarpgroupsM == 1, "SwiGLU epilogue needs split-N");
  static_assert(kEpilogue != Bf16Epilogue::kSwigluInterleavedBf16, "v2 GEMM 1: sm90_bf16_wide_grouped_gemm_kernel");
  static_assert(kStagingRows == 0 || kEpilogue == Bf16Epilogue::kStoreBf16, "bulk stores: plain epilogue only");

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
    if constexpr (kEpilogue == Bf16Epilogue::kStoreBf16 && kStagingRows > 0) {
      __nv_bfloat16* const out = params.out;
      const int out_cols = params.n;
      store_bf16_epilogue_bulk<kSubTilesM, kStagingRows>(
          accumulator, smem.bf16_staging + math_wg * kStagingRows * kBf16StagingPitch,
          t.m0 + wg_m * Layout::kRowsPerWarpgroup, t.m_end, t.n_tile * kBlockN + wg_n * 128,
          [out, out_cols](int row) { return out + static_cast<int64_t>(row) * out_cols; });
    } else if constexpr (kEpilogue == Bf16Epilogue::kStoreBf16) {
      store_bf16_epilogue(accumulator, where, t.n_tile * kBlockN + wg_n * 128 + 2 * (lane % 4),
                          [&](int row) { return params.out + static_cast<int64_t>(row) * params.n; });
    } else {
      swiglu_bf16_epilogue<Layout, false>(accumulator, smem.exchange, math_wg, where, t.n_tile, params.n / 2,
                                          params.topk_weights, params.out, params.activation, params.limit,
                                          params.alpha);
    }
  }
  if constexpr (kStagingRows > 0) bulk_wait_all();  // store_bf16_epilogue_bulk NOTES
}

// ---- BF16 v2: wide split-M tiles, wgmma m64n256k16 (docs/grouped_gemm.md "BF16 v2") ------------------
// Tile 128 x 256: math warpgroup w computes tile rows [64 w, 64 w + 64) x all 256 columns with one
// wgmma m64n256k16 per 16 K (128 FP32 accumulators per thread, float[2][64]: [h] = the m64n128 fragment
// of columns [128 h, 128 h + 128), wgmma_m64n256k16_bf16 NOTES). Both warpgroups read the same B stage.
// Shared-memory operand traffic per 16 K and warpgroup: A 2 KiB + B 8 KiB per 128 tensor-core cycles
// (80 B/cycle) vs m64n128k16's 2 + 4 KiB per 64 cycles (96 B/cycle).
// Epilogues: kStoreBf16 (GEMM 2 / plain: each 128-column half through store_bf16_epilogue_bulk) and
// kSwigluInterleavedBf16 (GEMM 1 on kGateUpInterleaved8 weights: act(gate, up) in-thread, then one
// 128-column output half through store_bf16_epilogue_tma).
//
// Byte budget (kStages = 4, kStagingRows = 32, kMaxExperts = 1024; the limit is 227 KiB = 232,448 B):
//   4 x (A 16,384 + B 32,768)           196,608
//   staging 8 warps x 2 boxes x 1,024    16,384   (store_bf16_epilogue_tma: 8 rows x 128 columns per warp and chunk)
//   full/empty mbarriers 2 x 4 x 8           64
//   ExpertTileTable 3 x 4 x 1025         12,300
//   alignment slack                       1,024
//   total                               226,380   (6,068 B to spare)
// kClusterSizeValue 2: the cluster kernel (MEGAMOE_BF16_CLUSTER=1; docs/grouped_gemm.md "BF16 clusters"): the same
// bytes; `empty` counts the math warps of both CTAs (Fp8GemmShared::init_barriers), B arrives in two 128-row parts.
template <int kStages, int kStagingRows, int kClusterSizeValue = 1>
struct Bf16WideLayout {
  static_assert(kClusterSizeValue == 1 || kClusterSizeValue == 2, "BF16 clusters: 1 or 2 CTAs");
  static constexpr int kClusterSize = kClusterSizeValue;
  static constexpr int kWarpgroupsMValue = 2;
  static constexpr int kSubTiles = 1;
  static constexpr int kStageCount = kStages;
  static constexpr int kRowsPerWarpgroup = 64;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 256;
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kTilesBytes = kStages * (kABytes + kBBytes);
  // Clusters: CTA r of a pair loads B rows [r kBBlockRows, (r + 1) kBBlockRows) of the tile (128 rows = 16 whole
  // 8-row swizzle atoms, 16 KiB: part r lands 1024-byte aligned at r kBBlockBytes, the two parts form the image of
  // one 256-row box) and multicasts them to both CTAs (cluster_load_b_tile).
  static constexpr int kBBlockRows = kBlockN / kClusterSize;
  static constexpr int kBBlockBytes = kBBlockRows * kBlockK;
  static_assert(kBBlockRows % 8 == 0 && kBBlockBytes % 1024 == 0, "B parts: whole 128-byte swizzle atoms");
  // Staging of store_bf16_epilogue_tma: kStagingRows rows per math warpgroup and chunk = kStagingRows / 4 rows per
  // warp (8: one row half of the warp's 16 per chunk, 16: both), 128 columns = two swizzled boxes of the out map.
  static_assert(kStagingRows == 32 || kStagingRows == 64, "store_bf16_epilogue_tma chunks of 8 / 16 rows per warp");
  static constexpr int kStagingRowsValue = kStagingRows;
  static constexpr int kOutMapRows = kStagingRows / 4;  // the out map's box rows (launch_wide_impl)
  static constexpr int kStagingBytesPerWarp = bf16_tma_staging_bytes_per_warp<128, kOutMapRows>();
  static constexpr int kStagingBytes = kMathWarpgroups * 4 * kStagingBytesPerWarp;
  static constexpr int kStagingOffset = kTilesBytes;
  static_assert(kStagingOffset % 1024 == 0, "TMA-store boxes start 1024-byte aligned (128-byte swizzle)");
  static constexpr bool kScalesInShared = false;  // (Fp8GemmShared's interface; BF16 has no scales)
  static constexpr int kScalesOffset = kTilesBytes + kStagingBytes;
  static constexpr int kBarrierOffset = kScalesOffset;
  static constexpr int kTableOffset = kBarrierOffset + 2 * kStages * 8;
  static constexpr int shared_bytes(int num_experts) { return 1024 + kTableOffset + ExpertTileTable::bytes(num_experts); }
};
constexpr int kBf16WideStages = 4;
constexpr int kBf16WideStagingRows = 32;
using Bf16WideStandaloneLayout = Bf16WideLayout<kBf16WideStages, kBf16WideStagingRows>;
static_assert(Bf16WideStandaloneLayout::shared_bytes(kMaxExperts) == 226380, "the byte budget above");
static_assert(Bf16WideStandaloneLayout::shared_bytes(kMaxExperts) <= kSharedBytesPerCta, "BF16 v2 tile overflows 227 KiB");
static_assert(Bf16WideLayout<kBf16WideStages, 64>::shared_bytes(kMaxExperts) > kSharedBytesPerCta,
              "64 staging rows fit: use them (one bulk-read wait per 16 rows of a warp instead of per 8)");

// Math warpgroup, BF16 v2: the full K loop of one wide tile into `accumulator` (overwritten: the first
// wgmma of the tile does not accumulate). Same pipeline protocol as bf16_tile_mainloop (one wgmma group
// in flight, stage s released once the group of s + 1 is issued and s's has retired). active = false
// (the tile holds no row of the expert in this warpgroup's 64 rows, active_sub_tiles): every stage is
// still waited on `full` and released on `empty` exactly once, without MMAs; the accumulators are then
// garbage and the caller stores nothing.
// NOTES: waiting `full` before the release keeps the `empty` arrivals of this warpgroup in step with
// the other's (an early arrival for the next use of a stage would complete the current phase with the
// other warpgroup still reading it).
template <class Layout>
__device__ __forceinline__ void bf16_wide_tile_mainloop(float (&accumulator)[2][64], const Fp8GemmShared<Layout>& smem,
                                                        int k_blocks, int wg_m, bool active,
                                                        PipelineCursor<Layout::kStageCount>& cursor) {
  // Clusters: each release arrives on the `empty` of both CTAs (lane r on CTA r's; wide_release_stage).
  constexpr int kClusterSize = LayoutClusterSize<Layout>::value;
  if (!active) {
    for (int kb = 0; kb < k_blocks; ++kb) {
      barrier_wait(&smem.full[cursor.stage], cursor.phase);
      wide_release_stage<kClusterSize>(&smem.empty[cursor.stage]);
      cursor.advance();
    }
    return;
  }
  // Descriptor start-address words of stage 0 (v7 style: stage, k-step are constant adds).
  const uint32_t a_descriptor0 =
      kmajor_sw128_descriptor_low(smem_address(smem.a_tiles + wg_m * Layout::kRowsPerWarpgroup * kBlockK));
  const uint32_t b_descriptor0 = kmajor_sw128_descriptor_low(smem_address(smem.b_tiles));
  int previous_stage = 0;
  for (int kb = 0; kb < k_blocks; ++kb) {
    barrier_wait(&smem.full[cursor.stage], cursor.phase);
    const uint32_t a_low = a_descriptor0 + cursor.stage * (Layout::kABytes >> 4);
    const uint32_t b_low = b_descriptor0 + cursor.stage * (Layout::kBBytes >> 4);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 64; ++i) fence_operand(accumulator[h][i]);
    wgmma_fence();
#pragma unroll
    for (int k_step = 0; k_step < kBf16StageK / 16; ++k_step)  // 16 bf16 = 32 bytes per wgmma
      wgmma_m64n256k16_bf16(accumulator, sw128_descriptor_from_low(a_low + ((32 * k_step) >> 4)),
                            sw128_descriptor_from_low(b_low + ((32 * k_step) >> 4)), (kb > 0 || k_step > 0) ? 1u : 0u);
    wgmma_commit();
    if (kb > 0) {  // the previous stage's group has retired: its shared memory may be refilled
      wgmma_wait<1>();
      wide_release_stage<kClusterSize>(&smem.empty[previous_stage]);
    }
    previous_stage = cursor.stage;
    cursor.advance();
  }
  wgmma_wait<0>();
  if (k_blocks > 0) wide_release_stage<kClusterSize>(&smem.empty[previous_stage]);
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(accumulator[h][i]);
}

// BF16 v2 GEMM-1 activation (kGateUpInterleaved8 weights, grouped_gemm.h): the wide accumulator holds,
// per fragment register, packed column 128 h + 8 j + 2 q + c of the tile (q = lane % 4), and the packing
// puts gate of output column 64 h + 8 p + 2 q + c at j = 2p and up of the same column at j = 2p + 1.
// So output register 4 m + 2 r + c (m = 8 h + p: output column 8 m + 2 q + c of the tile's 128, row
// half r) = act(accumulator[h][4 (2p) + 2r + c], accumulator[h][4 (2p + 1) + 2r + c]); in flat terms
// (register 64 h + i of the 128): out 4m + 2r + c = act(flat 4(2m) + 2r + c, flat 4(2m + 1) + 2r + c).
// `out` is then an m64n128 fragment of the 128 output columns. Per element exactly
// swiglu_bf16_epilogue's arithmetic: reference_activation(gate, up), then __fmul_rn by the row's top-k
// weight (1 for rows past m_end, which are never stored), so with the same FP32 accumulators the
// outputs are bit-identical to the split-N kernel's.
template <bool kCoherentWeights>
__device__ __forceinline__ void swiglu_interleaved_bf16_activate(const float (&accumulator)[2][64], float (&out)[1][64],
                                                                 int first_row, int m_end, const float* topk_weights,
                                                                 int activation, float limit, float alpha) {
  const int lane = threadIdx.x % 32;
  float weight[2] = {1.0f, 1.0f};
  if (topk_weights) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = first_row + 16 * ((threadIdx.x / 32) % 4) + 8 * r + lane / 4;
      if (row < m_end) weight[r] = load_scale<kCoherentWeights>(topk_weights + row);
    }
  }
#pragma unroll
  for (int m = 0; m < 16; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int h = m / 8, p = m % 8;
        float value = reference_activation(accumulator[h][4 * (2 * p) + 2 * r + c],
                                           accumulator[h][4 * (2 * p + 1) + 2 * r + c], activation, limit, alpha);
        if (topk_weights) value = __fmul_rn(value, weight[r]);
        out[0][4 * m + 2 * r + c] = value;
      }
}

// ---- BF16 clusters of 2 CTAs (MEGAMOE_BF16_CLUSTER=1; docs/grouped_gemm.md "BF16 clusters") ----------------
// Producer thread of one CTA of a cluster for one schedule unit (locate_cluster_tile): per k-block, after its
// `empty` wait (which completes only once the math warps of BOTH CTAs released the stage: `empty` counts 2 x 8
// arrivals), it expects the A tile (if it has one) + the WHOLE B tile, then loads its A tile (one kBlockM-row box,
// as produce_fp8_tile: this CTA only) and the B tile in two 128-row parts (cluster_load_b_tile: its own part
// multicast to both CTAs for a pair, both parts locally for a lone unit). m_end <= m0 (CTA 1 of the last lone
// unit at an odd n-tile count): no A; B still loaded (the expected bytes stay those of every unit).
// NOTES: the phase-safety argument of wide_produce_tile_cluster (sm90_fp8_wide_grouped_gemm.cuh) holds unchanged:
// the peer's part can reach this CTA's `full` before this thread's arrive-expect (the expect, which includes this
// CTA's own part, always exceeds it), and never in an earlier phase (the peer's issue of k-block j waited on its
// `empty`, which needs this CTA's releases of k-block j - kStages).
template <class Layout>
__device__ __forceinline__ void bf16_produce_tile_cluster(const Fp8GemmShared<Layout>& smem, const CUtensorMap* a_map,
                                                          const CUtensorMap* b_map, int m0, int m_end, int b_row,
                                                          int b_rows, bool shared_b, int cta_rank, int k_blocks,
                                                          PipelineCursor<Layout::kStageCount>& cursor) {
  const bool has_tile = m_end > m0;
  const int own_part_row = cluster_b_part_row<Layout>(b_row, b_rows, cta_rank);
  for (int kb = 0; kb < k_blocks; ++kb) {
    barrier_wait(&smem.empty[cursor.stage], cursor.phase ^ 1);
    barrier_arrive_expect_bytes(&smem.full[cursor.stage], (has_tile ? Layout::kABytes : 0) + Layout::kBBytes);
    if (has_tile)
      tma_load_2d(smem.a_tiles + cursor.stage * Layout::kABytes, a_map, kb * kBlockK, m0, &smem.full[cursor.stage]);
    cluster_load_b_tile<Layout>(smem.b_tiles + cursor.stage * Layout::kBBytes, b_map, kb * kBlockK, own_part_row,
                                b_row, b_rows, shared_b, cta_rank, &smem.full[cursor.stage]);
    cursor.advance();
  }
}

// kCluster: clusters of 2 CTAs sharing each B tile by TMA multicast (launched with cluster dims (2, 1, 1), grid
// 2 x cudaOccupancyMaxActiveClusters; cluster_launch.h). The v11 cluster design (docs/grouped_gemm.md "v11
// clusters") on the BF16 v2 tile:
// - Schedule: locate_cluster_tile (the tile table counts its units), n-tile fastest (locate_tile's order on
//   pairs); both CTAs of a cluster take the same units with the same k_blocks, so their (unit, k-block) sequences
//   and ring cursors are the same. A pair = m-tiles 2p, 2p + 1 of one expert and n-tile (B shared); a lone unit =
//   the odd last m-tile with n-tiles 2j, 2j + 1 (each CTA its own B). A CTA without a tile loads B only, both math
//   warpgroups release every stage unread (the !active path), stores nothing.
// - `empty` counts the 8 math warps of BOTH CTAs (wide_release_stage), `full` 1 arrival + A + whole-B bytes.
// - Start: barrier init, then a cluster barrier before any multicast or remote arrival; exit: every thread reaches
//   a final cluster barrier (no early return), so no CTA exits while its peer may still arrive on its barriers.
// - Outputs: each tile is computed by one CTA from the same A box, the same B image (two atom-aligned 128-row
//   parts of the 256-row box) and the same wgmma sequence: bit-identical to the 1-CTA kernel.
template <Bf16Epilogue kEpilogue, bool kCluster = false>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_bf16_wide_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                       const __grid_constant__ CUtensorMap b_map,
                                       const __grid_constant__ CUtensorMap out_map, const Bf16GroupedGemmParams params) {
  using Layout = Bf16WideLayout<kBf16WideStages, kBf16WideStagingRows, kCluster ? 2 : 1>;
  constexpr int kBlockM = Layout::kBlockM, kBlockN = Layout::kBlockN, kStages = Layout::kStageCount;
  static_assert(kEpilogue == Bf16Epilogue::kStoreBf16 || kEpilogue == Bf16Epilogue::kSwigluInterleavedBf16,
                "BF16 v2: plain or interleaved SwiGLU epilogue");

  extern __shared__ uint8_t shared_raw[];
  const Fp8GemmShared<Layout> smem(shared_raw);
  const ExpertTileTable table(reinterpret_cast<int*>(smem.table_base), params.num_experts);

  // Lane-0 broadcast: the role branch is warp-uniform to the compiler (sm90_fp8_grouped_gemm_kernel).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  if (threadIdx.x == 0) {
    smem.init_barriers();
    prefetch_tensor_map(&a_map);
    prefetch_tensor_map(&b_map);
  }
  if (threadIdx.x / 32 == 1) {
    if constexpr (kCluster)  // the table counts cluster units
      build_expert_tile_table<kBlockM, true>(table, params.expert_offsets, params.num_experts, params.m_capacity,
                                             params.n / kBlockN);
    else
      build_expert_tile_table<kBlockM>(table, params.expert_offsets, params.num_experts, params.m_capacity);
  }
  if constexpr (kCluster) cluster_sync();  // the peer's barriers are initialised before anything reaches them
  else __syncthreads();

  const int k_blocks = params.k / kBf16StageK;
  const int n_tiles = params.n / kBlockN;
  // Units: tiles (n_tiles per m-tile), or cluster units (the table counts them).
  const int total_units = table.tile_prefix[params.num_experts] * (kCluster ? 1 : n_tiles);
  // This CTA's rank in its pair, the first schedule unit and the stride (uniform broadcasts; 1-CTA: tiles).
  const int cta_rank = kCluster ? __shfl_sync(0xffffffffu, static_cast<int>(cluster_cta_rank()), 0) : 0;
  const int first_unit =
      kCluster ? __shfl_sync(0xffffffffu, static_cast<int>(cluster_index_x()), 0) : static_cast<int>(blockIdx.x);
  const int unit_step =
      kCluster ? __shfl_sync(0xffffffffu, static_cast<int>(cluster_count_x()), 0) : static_cast<int>(gridDim.x);

  // 24 / 240 registers as the FP8 standalone kernel (its NOTES: 24 + 2 x 240 = 504 of the launch's
  // 168 x 384 per-thread-slot registers); the 128 accumulators need the 240.
  constexpr uint32_t kProducerRegs = 24;
  constexpr uint32_t kMathRegs = 240;
  static_assert(kProducerRegs + kMathWarpgroups * kMathRegs <= 504, "the launch's 168 x 384 registers");
  if (warpgroup == 0) {
    registers_decrease<kProducerRegs>();
    if constexpr (!kCluster) {
      if (threadIdx.x != 0) return;
    }
    if (kCluster ? threadIdx.x == 0 : true) {  // kCluster: the other threads go on to the exit cluster barrier
      PipelineCursor<kStages> cursor;
      int expert = 0;
      for (int unit = first_unit; unit < total_units; unit += unit_step) {
        const ClusterTileCoordinates where =
            locate_unit<kCluster>(table, unit, n_tiles, kBlockM, cta_rank, expert, false);
        const int b_row = expert * params.n + where.n_tile * kBlockN;
        if constexpr (kCluster)
          bf16_produce_tile_cluster(smem, &a_map, &b_map, where.m0, where.m_end, b_row, params.num_experts * params.n,
                                    where.shared_b, cta_rank, k_blocks, cursor);
        else
          produce_fp8_tile(smem, &a_map, &b_map, where.m0, b_row, k_blocks, cursor);
      }
    }
    if constexpr (!kCluster) return;
  } else {
    registers_increase<kMathRegs>();
    const int wg_m = warpgroup - 1;  // which 64-row half of the tile
    const int warp_in_wg = (threadIdx.x / 32) % 4;
    uint8_t* const warp_staging = smem.bf16_staging + (wg_m * 4 + warp_in_wg) * Layout::kStagingBytesPerWarp;
    if (threadIdx.x % 128 == 0) prefetch_tensor_map(&out_map);
    PipelineCursor<kStages> cursor;
    int expert = 0;
    float accumulator[2][64];
    for (int unit = first_unit; unit < total_units; unit += unit_step) {
      const ClusterTileCoordinates t = locate_unit<kCluster>(table, unit, n_tiles, kBlockM, cta_rank, expert, false);
      const int first_row = t.m0 + wg_m * Layout::kRowsPerWarpgroup;
      // active_sub_tiles(...) > 0, warpgroup-uniform (kCluster: false also for a CTA without a tile, m_end <= m0)
      const bool active = first_row < t.m_end;
      bf16_wide_tile_mainloop<Layout>(accumulator, smem, k_blocks, wg_m, active, cursor);
      if (!active) continue;  // no row of the expert: nothing to store
      const int warp_first_row = first_row + 16 * warp_in_wg;
      if constexpr (kEpilogue == Bf16Epilogue::kStoreBf16) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          store_bf16_epilogue_tma<128, Layout::kOutMapRows>(accumulator[h], warp_staging, warp_first_row, t.m_end,
                                                            &out_map, params.out, t.n_tile * kBlockN + 128 * h,
                                                            params.n);
      } else {
        float activations[1][64];
        swiglu_interleaved_bf16_activate<false>(accumulator, activations, first_row, t.m_end, params.topk_weights,
                                                params.activation, params.limit, params.alpha);
        store_bf16_epilogue_tma<128, Layout::kOutMapRows>(activations[0], warp_staging, warp_first_row, t.m_end,
                                                          &out_map, params.out, t.n_tile * 128, params.n / 2);
      }
    }
    bulk_wait_all();  // store_bf16_epilogue_tma NOTES
  }
  // kCluster: no CTA leaves while its peer may still arrive on its barriers (NOTES above).
  if constexpr (kCluster) cluster_sync();
}

}  // namespace megamoe::kernels::sm90
