// Persistent, warp-specialized W4A8 grouped GEMM for sm_90a: NVFP4 / MXFP4 weights decoded to FP8 E4M3
// in shared memory inside the mainloop, FP8 activations, FP8 wgmma, FP32 accumulation with per-128-K
// promotion (the numbers: grouped_gemm.h, "W4A8"; the decode: sm90_fp4_decode.cuh).
//
//   out[r, n] = sum_kb ( sum_{k in kb} e4m3(A[r,k]) * w8_e[n,k] ) * a_scale[r,kb] * factor_e[n/128,kb]
//
// CTA = 3 warpgroups, tiles BLOCK_M x 256 (split-N: math warpgroup w owns columns 128w..128w+127 of the
// tile). Warpgroup 0 (one thread) streams, per 128-K slice, the A tile (TMA, 128-byte swizzle), the
// packed FP4 tile [256 rows, 64 bytes] (TMA, 64-byte swizzle) and the tile's group scales (one bulk copy:
// the packed scale layout makes them contiguous) into a ring of stages (`full` / `empty` mbarriers).
// Each math warpgroup decodes its own 128 weight rows (one row per thread) into a private,
// double-buffered FP8 tile in the wgmma operand layout, so only a warpgroup-local barrier orders decode
// and wgmma. Per k-block:
//   bar.sync (decoded kb visible) -> wgmma sub-tile 0 of kb (async) -> decode kb+1 into the other buffer
//   (overlaps the tensor cores) -> wait -> promote; further sub-tiles (128-row tiles) follow; the stage is
//   released once its last wgmma has retired.
// Epilogues as the FP8-block kernel: BF16 store (GEMM 2 / plain) or gate x up SwiGLU + top-k weight +
// FP8 requant (GEMM 1; the gate warpgroup hands its accumulators over through shared memory). kSwigluInterleavedFp8
// (session 19): GEMM 1 on W13 packed kGateUpInterleaved8, each warpgroup holding gate and up of 64 outputs: the
// per-row decode record and gate / up promotion of w4a8_tile_mainloop, then the spread epilogue's kInterleaved form
// (tiles of <= kW4a8SpreadRows rows) or w4a8_interleaved_swiglu_epilogue (in-thread SwiGLU, one amax exchange).
//
// The pieces (shared-memory carve-up W4a8GemmShared, producer loop of one tile produce_w4a8_tile, math
// mainloop of one tile w4a8_tile_mainloop, the two epilogues) are device functions so that the fused
// MegaMoE kernel (sm90_mega_moe.cuh, formats nvfp4 / mxfp4) runs the very same W4A8 code on its own tile
// sequence, as it does with the FP8-block pieces; sm90_w4a8_grouped_gemm_kernel below is the standalone user.
//
// NOTES:
// - The decoded buffer written at k-block kb+1 was last read by the wgmma of kb-1, which every warp of
//   the warpgroup waited for before the bar.sync of kb: no further barrier is needed.
// - Writes by generic st.shared are made visible to the wgmma (async proxy) by fence.proxy.async before
//   the bar.sync.
// - Producer and math warpgroups iterate the identical (tile, k-block) sequence (sm90_grouped_schedule),
//   so their stage index and phase bit stay in lockstep.
// - Rows past the expert's end (next expert, or TMA zero fill) are computed, never stored.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/sm90_fp4_decode.cuh"
#include "kernels/sm90_fp8_grouped_gemm.cuh"
#include "kernels/sm90_gemm_heuristics.h"
#include "kernels/sm90_grouped_schedule.cuh"
#include "kernels/sm90_ptx.cuh"

namespace megamoe::kernels::sm90 {

enum class W4a8Epilogue : int {
  kStoreBf16,       // out[r, n] = bf16(acc)
  kSwigluQuantFp8,  // gate (math warpgroup 0) x up (math warpgroup 1) -> FP8 + per-128 scale
  // GEMM 1 on W13 packed GemmRole::kGateUpInterleaved8 (session 19): math warpgroup w holds gate AND up of the
  // outputs 64 w .. 64 w + 63 of the tile (interleaved by 8); in-thread SwiGLU + a per-row amax exchange ->
  // FP8 + per-128 scale, bit-identical to kSwigluQuantFp8 on the same logical weights (see w4a8_tile_mainloop).
  kSwigluInterleavedFp8,
};

struct W4a8BlockScaleDevice {
  float factor;
  int32_t decode_exponent;
};

struct W4a8GemmParams {
  const float* a_scales = nullptr;                // [m_capacity, k/128]
  const uint8_t* group_scales = nullptr;          // [E, k/128, n, 128/group]
  const W4a8BlockScaleDevice* blocks = nullptr;   // [E, n/128, k/128]
  const int32_t* expert_offsets = nullptr;        // [E+1], device
  const float* topk_weights = nullptr;            // optional [m_capacity] (SwiGLU epilogue)
  void* out = nullptr;                            // bf16 [m_capacity, n] | e4m3 [m_capacity, n/2]
  float* out_scales = nullptr;                    // SwiGLU: [m_capacity, n/256]
  int m_capacity = 0, num_experts = 0, n = 0, k = 0;
  int activation = 0;                             // 0 = silu*up, 1 = clamped SwiGLU
  float limit = 0.f, alpha = 0.f;
  // SwiGLU epilogue of 64-row tiles with at most kW4a8SpreadRows rows (the standalone 2-warpgroup kernel):
  // swiglu_quant_fp8_spread_epilogue (sm90_fp8_grouped_gemm.cuh); MEGAMOE_SWIGLU_SPREAD=0 turns it off.
  bool swiglu_spread = true;
  // The FP4 decoder, sm90::Fp4Decoder: auto (default: v8 for MXFP4, old for NVFP4), old, v7 or v8
  // (MEGAMOE_W4A8_DECODE; sm90_fp4_decode.cuh).
  int decoder = 3;
};
// Rows of the spread epilogue's staging in the (then idle) decoded tiles: 2 x 32 x 512 B = 32 KiB of the 64 KiB.
constexpr int kW4a8SpreadRows = 32;

constexpr int kW4a8BlockN = 256;
constexpr int kW4a8Fp4RowBytes = kBlockK / 2;  // 64 bytes of FP4 per row per 128-K slice
// 16-byte FP4 chunks of a row decoded together. v1 decoded one at a time (unroll 1, to spare registers
// beside the accumulators) and was latency bound: ~2x slower than FP8 at large M (docs/grouped_gemm.md).
constexpr int kW4a8DecodeChunksInFlight = 4;
// Named barriers of the decode (kDecodeBarrier + math warpgroup, 128 threads each) in the standalone
// kernel; id 1 is the SwiGLU exchange. The fused kernel passes its own ids (sm90_mega_moe.cuh).
constexpr uint32_t kW4a8DecodeBarrier = 2;
// Named barriers kW4a8PairBarrier + w (w = warp in its warpgroup, 64 threads each) of the SwiGLU epilogue's
// warp pairs, in both kernels (the fused kernel uses ids 1-6 itself: sm90_mega_moe.cuh).
constexpr uint32_t kW4a8PairBarrier = 8;
// Named barrier of the spread SwiGLU epilogue (256 threads) in the standalone 2-warpgroup kernel.
constexpr uint32_t kW4a8SpreadBarrier = 1;
// Named barrier of kSwigluInterleavedFp8's per-row amax exchange (256 threads) in the standalone kernel: the
// spread epilogue's id (a tile takes one epilogue or the other, CTA-uniformly: one barrier sequence).
constexpr uint32_t kW4a8InterleavedAmaxBarrier = kW4a8SpreadBarrier;

// kStagingRows (the fused kernel): rows of BF16 staging per math warpgroup for store_bf16_epilogue_bulk
// (sm90_fp8_grouped_gemm.cuh), 0 = none (the standalone kernel stores BF16 directly). The staging rows
// ALIAS the SwiGLU exchange buffer (the region is the larger of the two), as in GroupedGemmLayout: a
// fused CTA runs all its GEMM-1 tiles (exchange) before its first GEMM-2 tile (staging).
// kSharedScales (v3, the standalone kernel): a scale warp stages each k-block's A scales and the two
// math warpgroups' block records {factor, p} into a per-stage slot of the ring (produce_w4a8_scales), so
// the math warps read them from shared memory instead of waiting on global loads (ncu, v2: ~5-7% of the
// math warps' stall samples sat on those loads). The fused kernel keeps the global loads (false).
template <int kSubTilesM, int kStages, Fp4Format kFormat, W4a8Epilogue kEpilogue, int kStagingRows = 0,
          bool kSharedScales = false>
struct W4a8GemmLayout {
  // The names the fused kernel reads from either GEMM's layout (GroupedGemmLayout has the same ones).
  static constexpr int kSubTiles = kSubTilesM;
  static constexpr int kStageCount = kStages;
  static constexpr int kWarpgroupsMValue = 1;  // always split-N
  static constexpr int kBlockN = kW4a8BlockN;
  // Read by the fused kernel as "FP8 shared scales" (it asserts FP8 for that); W4A8 has its own flag.
  static constexpr bool kScalesInShared = false;
  static constexpr bool kW4a8SharedScales = kSharedScales;
  static constexpr Fp4Format kFp4Format = kFormat;
  // W13 packed kGateUpInterleaved8 (kSwigluInterleavedFp8): per-thread decode record, gate / up promotion factor by
  // 8-column group, in-thread SwiGLU (w4a8_tile_mainloop, w4a8_interleaved_swiglu_epilogue).
  static constexpr bool kGateUpInterleaved8 = kEpilogue == W4a8Epilogue::kSwigluInterleavedFp8;
  static constexpr int kBlockM = 64 * kSubTilesM;
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kFp4Bytes = kW4a8BlockN * kW4a8Fp4RowBytes;
  static constexpr int kScaleBytes = kW4a8BlockN * Fp4Traits<kFormat>::kScaleBytesPerRow;
  static constexpr int kDecodedBytes = 128 * kBlockK;  // one warpgroup's FP8 B tile
  // Decoded tiles first (1024-aligned for the 128-byte swizzle), then the stage ring.
  static constexpr int kDecodedOffset = 0;
  static constexpr int kAOffset = kDecodedOffset + 2 * kMathWarpgroups * kDecodedBytes;
  static constexpr int kFp4Offset = kAOffset + kStages * kABytes;
  static constexpr int kScaleOffset = kFp4Offset + kStages * kFp4Bytes;
  static constexpr int kExchangeRegisters = 16;  // 8 KiB of gate values in flight
  static constexpr int kExchangeOffset = kScaleOffset + kStages * kScaleBytes;
  static constexpr int kExchangeBytes = kEpilogue == W4a8Epilogue::kSwigluQuantFp8 ? kExchangeRegisters * 128 * 4 : 0;
  static_assert(kStagingRows == 0 || kStagingRows == 32 || kStagingRows == 64, "BF16 staging: 0, 32 or 64 rows");
  static constexpr int kStagingRowsValue = kStagingRows;
  static constexpr int kStagingBytes = kMathWarpgroups * kStagingRows * kBf16StagingPitch;
  static constexpr int kExchangeRegionBytes = kExchangeBytes > kStagingBytes ? kExchangeBytes : kStagingBytes;
  // Scale ring (kSharedScales): per stage kBlockM A scales (tile row i at [i], 0 past the expert's end),
  // then the two math warpgroups' W4a8BlockScaleDevice records as 2 words each at [kBlockM + 2w].
  // Bytes = kStages * (kBlockM + 4) * 4, rounded up to 16.
  static constexpr int kScaleRecords = kW4a8BlockN / 128;  // one {factor, p} per 128-row block of the tile
  static constexpr int kScaleSlotWords = kBlockM + 2 * kScaleRecords;
  static constexpr int kEmptyArrivals = kMathWarpgroups * 4;  // lane 0 of every math warp
  // kGateUpInterleaved8: the per-row amax exchange of w4a8_interleaved_swiglu_epilogue, [kSubTilesM][2 warpgroups][64]
  // floats per tile. Standalone (kStagingRows == 0): its own region after the (empty) exchange region, two copies
  // (tile parity). Fused (kStagingRows > 0): one copy at the start of the exchange region, which the GEMM-2 staging
  // aliases: the fused kernel's 256-thread gemm1_done barrier after every GEMM-1 tile comes after every amax read of
  // the tile and before the next tile's amax writes or any staging write (sm90_mega_moe.cuh). kGateUp: none.
  static constexpr int kAmaxOffset = kStagingRows > 0 ? kExchangeOffset : kExchangeOffset + kExchangeRegionBytes;
  static constexpr int kAmaxBytes = kGateUpInterleaved8 && kStagingRows == 0 ? 2 * kSubTilesM * kMathWarpgroups * 64 * 4 : 0;
  static_assert(!kGateUpInterleaved8 || kStagingRows == 0 || kExchangeRegionBytes >= kSubTilesM * kMathWarpgroups * 64 * 4,
                "the fused kernel's amax exchange in the exchange region");
  static constexpr int kScaleRingOffset = kExchangeOffset + kExchangeRegionBytes + kAmaxBytes;
  static constexpr int kScaleRingBytes = kSharedScales ? (kStages * kScaleSlotWords * 4 + 15) / 16 * 16 : 0;
  static constexpr int kBarrierOffset = kScaleRingOffset + kScaleRingBytes;
  static constexpr int kTableOffset = kBarrierOffset + 2 * kStages * 8;
  static constexpr int shared_bytes(int num_experts) {
    return 1024 + kTableOffset + ExpertTileTable::bytes(num_experts);
  }
  static_assert(kABytes % 1024 == 0 && kFp4Bytes % 1024 == 0 && kScaleBytes % 16 == 0, "stage alignment");
  static_assert(kExchangeOffset % 16 == 0, "bulk copies read the staging rows at 16-byte aligned addresses");
};

// The standalone kernel's layout (v3: shared scales, no BF16 staging).
template <int kSubTilesM, int kStages, Fp4Format kFormat, W4a8Epilogue kEpilogue>
using W4a8StandaloneLayout = W4a8GemmLayout<kSubTilesM, kStages, kFormat, kEpilogue, 0, true>;

// ---- shared memory and the device pieces (the standalone kernel below and sm90_mega_moe.cuh) -------
template <class Layout>
struct W4a8GemmShared {
  uint8_t* decoded;       // [kMathWarpgroups][2][kDecodedBytes]
  uint8_t* a_tiles;       // [kStages][kABytes]
  uint8_t* fp4_tiles;     // [kStages][kFp4Bytes]
  uint8_t* scale_tiles;   // [kStages][kScaleBytes]
  float* exchange;        // SwiGLU gate values
  uint8_t* bf16_staging;  // kStagingRows > 0: aliases exchange
  float* row_amax;        // the per-row amax exchange at Layout::kAmaxOffset (layouts that have one; else null)
  uint32_t* scale_ring;   // Layout::kW4a8SharedScales: [kStages][kScaleSlotWords]
  uint64_t* full;
  uint64_t* empty;
  uint8_t* table_base;  // kTableOffset: ExpertTileTable (and whatever a caller puts after it)
  // `raw` = the dynamic shared memory; the base is aligned up to 1024 bytes for the 128-byte swizzle.
  __device__ __forceinline__ explicit W4a8GemmShared(uint8_t* raw) {
    uint8_t* shared = raw + ((1024 - (smem_address(raw) & 1023)) & 1023);
    decoded = shared + Layout::kDecodedOffset;
    a_tiles = shared + Layout::kAOffset;
    fp4_tiles = shared + Layout::kFp4Offset;
    scale_tiles = shared + Layout::kScaleOffset;
    exchange = reinterpret_cast<float*>(shared + Layout::kExchangeOffset);
    bf16_staging = shared + Layout::kExchangeOffset;
    row_amax = nullptr;
    if constexpr (requires { Layout::kAmaxOffset; }) row_amax = reinterpret_cast<float*>(shared + Layout::kAmaxOffset);
    scale_ring = reinterpret_cast<uint32_t*>(shared + Layout::kScaleRingOffset);
    full = reinterpret_cast<uint64_t*>(shared + Layout::kBarrierOffset);
    empty = full + Layout::kStageCount;
    table_base = shared + Layout::kTableOffset;
  }
  // One thread, before the CTA's first __syncthreads(). `full` completes on the TMA producer's
  // arrive-expect (+ its bytes) and, with shared scales, one cp.async arrival per scale-warp lane.
  __device__ __forceinline__ void init_barriers() const {
    for (int s = 0; s < Layout::kStageCount; ++s) {
      barrier_init(&full[s], Layout::kW4a8SharedScales ? 1 + 32 : 1);
      barrier_init(&empty[s], Layout::kEmptyArrivals);
    }
    barrier_init_fence();
  }
};

__device__ __forceinline__ void bulk_load(void* smem_destination, const void* source, uint32_t bytes,
                                          uint64_t* barrier) {
  cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, smem_destination, source, bytes,
                           barrier);
}

__device__ __forceinline__ W4a8BlockScaleDevice load_block(const W4a8BlockScaleDevice* block) {
  const int2 bits = __ldg(reinterpret_cast<const int2*>(block));
  return {__int_as_float(bits.x), bits.y};
}

// Producer (one thread): for k-block kb = 0 .. k_blocks-1 streams A rows [m0, m0 + BLOCK_M) (TMA), the
// packed FP4 rows [b_row, b_row + Layout::kBlockN) (TMA) and the tile's group scales at scales + kb * scales_kb_stride
// (one bulk copy of kScaleBytes) into the ring.
template <class Layout>
__device__ __forceinline__ void produce_w4a8_tile(const W4a8GemmShared<Layout>& smem, const CUtensorMap* a_map,
                                                  const CUtensorMap* b_map, int m0, int b_row, const uint8_t* scales,
                                                  int64_t scales_kb_stride, int k_blocks,
                                                  PipelineCursor<Layout::kStageCount>& cursor) {
  constexpr uint32_t kStageBytes = Layout::kABytes + Layout::kFp4Bytes + Layout::kScaleBytes;
  for (int kb = 0; kb < k_blocks; ++kb) {
    barrier_wait(&smem.empty[cursor.stage], cursor.phase ^ 1);
    barrier_arrive_expect_bytes(&smem.full[cursor.stage], kStageBytes);
    tma_load_2d(smem.a_tiles + cursor.stage * Layout::kABytes, a_map, kb * kBlockK, m0, &smem.full[cursor.stage]);
    tma_load_2d(smem.fp4_tiles + cursor.stage * Layout::kFp4Bytes, b_map, kb * kW4a8Fp4RowBytes, b_row,
                &smem.full[cursor.stage]);
    bulk_load(smem.scale_tiles + cursor.stage * Layout::kScaleBytes, scales + kb * scales_kb_stride,
              Layout::kScaleBytes, &smem.full[cursor.stage]);
    cursor.advance();
  }
}

// Scale warp (Layout::kW4a8SharedScales; all 32 lanes of one warp), for the same (tile, k-block) sequence
// as produce_w4a8_tile: waits for the stage to be free, copies the tile's kBlockM A scales of k-block kb
// (rows >= m_end zero-filled) and the two math warpgroups' block records of kb into the stage's scale
// slot with 4-byte cp.async, and arrives on `full` when they have landed (one .noinc arrival per lane).
// a_scales: [rows, k_blocks]; blocks_wg0 / blocks_wg1: the k_blocks records of each warpgroup's 128 rows.
// NOTES: as produce_fp8_scales (sm90_fp8_grouped_gemm.cuh): the math warps read the slot after `full`
// and before their `empty` arrival, and a 4-byte cp.async holds no register, so one warp keeps up.
template <class Layout>
__device__ __forceinline__ void produce_w4a8_scales(const W4a8GemmShared<Layout>& smem, const float* a_scales,
                                                    const W4a8BlockScaleDevice* blocks_wg0,
                                                    const W4a8BlockScaleDevice* blocks_wg1, int m0, int m_end,
                                                    int k_blocks, PipelineCursor<Layout::kStageCount>& cursor) {
  static_assert(Layout::kW4a8SharedScales, "the layout has no scale ring");
  const int lane = threadIdx.x % 32;
  const int valid_rows = m_end - m0;
  const int64_t row_step = static_cast<int64_t>(32) * k_blocks;
  // Lanes 0-3 copy the records' words: lane = 2 w + j -> word j of warpgroup w's record.
  const uint32_t* record_words =
      reinterpret_cast<const uint32_t*>(lane < 2 ? blocks_wg0 : blocks_wg1) + (lane & 1);
  for (int kb = 0; kb < k_blocks; ++kb) {
    barrier_wait(&smem.empty[cursor.stage], cursor.phase ^ 1);
    uint32_t* slot = smem.scale_ring + cursor.stage * Layout::kScaleSlotWords;
    const float* source = a_scales + static_cast<int64_t>(m0 + lane) * k_blocks + kb;
#pragma unroll 1
    for (int i = lane; i < Layout::kBlockM; i += 32, source += row_step) {
      const bool valid = i < valid_rows;
      cp_async_4(slot + i, valid ? source : a_scales, valid ? 4u : 0u);
    }
    if (lane < 2 * Layout::kScaleRecords) cp_async_4(slot + Layout::kBlockM + lane, record_words + 2 * kb, 4u);
    cp_async_arrive_noinc(&smem.full[cursor.stage]);
    cursor.advance();
  }
}

// One m64 x n128 x 128-K wgmma group of a math warpgroup into `partial` (async: committed, not waited for): A and B
// K-major 128-byte-swizzled tiles at shared addresses a_base (64 rows) and b_base (128 rows).
__device__ __forceinline__ void w4a8_issue_wgmma_m64n128(float (&partial)[64], uint32_t a_base, uint32_t b_base) {
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
  wgmma_fence();
#pragma unroll
  for (int k_step = 0; k_step < kBlockK / 32; ++k_step)
    wgmma_m64n128k32_e4m3(partial, make_kmajor_sw128_descriptor(a_base + k_step * 32),
                          make_kmajor_sw128_descriptor(b_base + k_step * 32), k_step > 0 ? 1u : 0u);
  wgmma_commit();
}

// Per-128-K promotion of one m64n128 sub-tile: accumulator += partial * scale, scale0 for the fragment's rows r
// (registers 4j, 4j + 1), scale1 for rows r + 8 (4j + 2, 4j + 3); scale = fl(a_scale * factor).
__device__ __forceinline__ void w4a8_promote_m64n128(float (&accumulator)[64], const float (&partial)[64], float scale0,
                                                     float scale1) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    accumulator[4 * j + 0] += partial[4 * j + 0] * scale0;
    accumulator[4 * j + 1] += partial[4 * j + 1] * scale0;
    accumulator[4 * j + 2] += partial[4 * j + 2] * scale1;
    accumulator[4 * j + 3] += partial[4 * j + 3] * scale1;
  }
}

// w4a8_promote_m64n128 on W13 packed kGateUpInterleaved8 (kRegs = 64: m64n128, the 2-warpgroup kernel; 32: m64n64,
// the small-M kernel): 8-column group j (registers 4 j .. 4 j + 3) is gate for even j (scales fl(a_scale * gate
// factor): gate0 rows r, gate1 rows r + 8), up for odd j (up0, up1).
template <int kRegs>
__device__ __forceinline__ void w4a8_promote_gate_up_groups(float (&accumulator)[kRegs], const float (&partial)[kRegs],
                                                            float gate0, float gate1, float up0, float up1) {
#pragma unroll
  for (int j = 0; j < kRegs / 4; ++j) {
    const float scale0 = j % 2 ? up0 : gate0, scale1 = j % 2 ? up1 : gate1;
    accumulator[4 * j + 0] += partial[4 * j + 0] * scale0;
    accumulator[4 * j + 1] += partial[4 * j + 1] * scale0;
    accumulator[4 * j + 2] += partial[4 * j + 2] * scale1;
    accumulator[4 * j + 3] += partial[4 * j + 3] * scale1;
  }
}

// Math warpgroup `math_wg` (columns 128 math_wg .. of the tile), one tile: decode + wgmma + promotion
// over k_blocks (see the header comment for the per-k-block order). a_scales_base: [rows, k_blocks] A
// scales (read coherently with kCoherentScales: the fused kernel writes them in the same launch);
// blocks: this warpgroup's k_blocks {factor, decode exponent} records. kDecodeBarrier + math_wg: the
// warpgroup-local named barrier (128 threads) ordering decode and wgmma.
// kInterleaved (default Layout::kGateUpInterleaved8; the fused kernel's GEMM-2 tiles pass false), W13 packed
// GemmRole::kGateUpInterleaved8 (docs/grouped_gemm.md "W4A8 2-warpgroup GEMM 1 on interleaved W13 (session 19)"):
// packed tile column 128 h + 16 p + c (c < 8) is gate row 64 h + 8 p + c of the tile's gate block (canonical block
// 2 n_tile), + 8 the up row (block 2 n_tile + 1) (sm90_w4a8_v10_gemm1.cuh NOTES), so math warpgroup w's 128 packed
// columns (h = w) hold gate (even 8-column groups j) AND up (odd j) of the outputs 64 w .. 64 w + 63. Thread t decodes its packed row t with that row's own block record (gate for (t / 8) % 2 == 0,
// up otherwise); the promotion scales are fl(a_scale * gate factor) on even j, fl(a_scale * up factor) on odd j.
// Both records come from the scale slot (shared scales: [kBlockM + 0, 1] gate, [kBlockM + 2, 3] up, as kGateUp's
// two warpgroups' records) or from global memory (blocks = the gate block's k_blocks records, the up block's at
// blocks + k_blocks).
// NOTES (kGateUpInterleaved8, bit-identical to kGateUp on the same logical weights): the decoded bytes of a row are
// the same (the packing moves rows and their group scales, each decodes with its own block's p); an element's 128-K
// partial is the same 4 wgmma k32 steps over the same A row and decoded B row (independent of the element's column
// in the n128 group); the promotion is the same FFMA with fl(a_scale * factor) of the element's block, in k-block
// order from 0. The kGateUp statements are those before the mode existed (their SASS is unchanged).
template <class Layout, bool kCoherentScales, uint32_t kDecodeBarrier, bool kInterleaved = Layout::kGateUpInterleaved8>
__device__ __forceinline__ void w4a8_tile_mainloop(float (&accumulator)[Layout::kSubTiles][64], float (&partial)[64],
                                                   const W4a8GemmShared<Layout>& smem,
                                                   const MathRows<Layout::kSubTiles>& where, const float* a_scales_base,
                                                   const W4a8BlockScaleDevice* blocks, int k_blocks, int math_wg,
                                                   PipelineCursor<Layout::kStageCount>& cursor, int decoder) {
  constexpr int kSubTilesM = Layout::kSubTiles;
  constexpr int kStages = Layout::kStageCount;
  constexpr Fp4Format kFormat = Layout::kFp4Format;
  constexpr int kScaleBytesPerRow = Fp4Traits<kFormat>::kScaleBytesPerRow;
  constexpr bool kSharedScales = Layout::kW4a8SharedScales;
  const int lane = threadIdx.x % 32;
  const int thread_in_wg = threadIdx.x % 128;
  const int row_in_tile = (thread_in_wg / 32) * 16 + lane / 4;  // MathRows' row of register pair 0
  uint8_t* my_decoded = smem.decoded + math_wg * 2 * Layout::kDecodedBytes;
  // kSharedScales: word w of stage s's scale slot (see W4a8GemmLayout).
  auto slot_word = [&](int stage, int word) { return smem.scale_ring[stage * Layout::kScaleSlotWords + word]; };
  // {factor, decode exponent} of this warpgroup (kGateUp) / of this thread's decoded row (kInterleaved).
  const int record_word = Layout::kBlockM + 2 * (kInterleaved ? (thread_in_wg / 8) % 2 : math_wg);
  const bool decodes_up_row = kInterleaved && (thread_in_wg / 8) % 2 == 1;
  // v3: a warp whose rows all lie past the expert's end skips the promotion of that sub-tile (its wgmma
  // still runs: wgmma is warpgroup-wide). Warp-uniform. At 8-32 rows per expert (64-row tiles) three of
  // the four warps hold no row.
  bool warp_has_rows[kSubTilesM];
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
    warp_has_rows[s] = __any_sync(0xffffffffu, where.valid[s][0] || where.valid[s][1]);
  // Decodes k-block `kb` (ring stage `s`) of this warpgroup's 128 weight rows into buffer kb & 1.
  auto decode = [&](int s, int kb, int decode_exponent) {
    decode_fp4_row_select<kFormat, kW4a8DecodeChunksInFlight>(
        decoder, smem.fp4_tiles + s * Layout::kFp4Bytes + math_wg * 128 * kW4a8Fp4RowBytes,
        smem.scale_tiles + s * Layout::kScaleBytes + math_wg * 128 * kScaleBytesPerRow,
        my_decoded + (kb & 1) * Layout::kDecodedBytes, thread_in_wg, decode_exponent);
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  };
  const float* a_scales[kSubTilesM][2];
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      a_scales[s][h] = a_scales_base + static_cast<int64_t>(where.valid[s][h] ? where.rows[s][h] : 0) * k_blocks;

#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
    for (int i = 0; i < 64; ++i) accumulator[s][i] = 0.0f;

  // Every warp of this warpgroup has retired the previous tile's wgmmas (which read decoded buffer 0
  // or 1) before any warp overwrites buffer 0.
  named_barrier_sync(kDecodeBarrier + math_wg, 128);
  // Global scales (the fused kernel): block records {factor, p} are loaded one k-block ahead (with the
  // A scales), off the decode's path. Shared scales: read from the stage's slot once `full` completed.
  W4a8BlockScaleDevice next_block{0.0f, 0};
  if constexpr (!kSharedScales) next_block = load_block(blocks);
  // kInterleaved, global scales: the up block's record (next_block: the gate block's).
  W4a8BlockScaleDevice next_up_block{0.0f, 0};
  if constexpr (!kSharedScales && kInterleaved) next_up_block = load_block(blocks + k_blocks);
  barrier_wait(&smem.full[cursor.stage], cursor.phase);
  decode(cursor.stage, 0,
         kSharedScales ? static_cast<int>(slot_word(cursor.stage, record_word + 1))
                       : (decodes_up_row ? next_up_block.decode_exponent : next_block.decode_exponent));

  float next_scale_a[kSubTilesM][2];
  if constexpr (!kSharedScales) {
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        next_scale_a[s][h] = where.valid[s][h] ? load_scale<kCoherentScales>(a_scales[s][h]) : 0.0f;
  }
  for (int kb = 0; kb < k_blocks; ++kb) {
    float scale_a[kSubTilesM][2];
    float factor;          // kInterleaved: the gate block's
    float up_factor = 0.f;  // kInterleaved: the up block's
    if constexpr (kSharedScales) {  // stage kb's `full` was waited for before its decode
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) scale_a[s][h] = __uint_as_float(slot_word(cursor.stage, row_in_tile + 64 * s + 8 * h));
      factor = __uint_as_float(slot_word(cursor.stage, kInterleaved ? Layout::kBlockM : record_word));
      if constexpr (kInterleaved) up_factor = __uint_as_float(slot_word(cursor.stage, Layout::kBlockM + 2));
    } else {
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) scale_a[s][h] = next_scale_a[s][h];
      factor = next_block.factor;
      if constexpr (kInterleaved) up_factor = next_up_block.factor;
      if (kb + 1 < k_blocks) {
#pragma unroll
        for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            next_scale_a[s][h] = where.valid[s][h] ? load_scale<kCoherentScales>(a_scales[s][h] + kb + 1) : 0.0f;
        next_block = load_block(blocks + kb + 1);
        if constexpr (kInterleaved) next_up_block = load_block(blocks + k_blocks + kb + 1);
      }
    }
    named_barrier_sync(kDecodeBarrier + math_wg, 128);  // every row of decoded kb is written and fenced
    const uint32_t b_base = smem_address(my_decoded + (kb & 1) * Layout::kDecodedBytes);
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s) {
      const uint32_t a_base = smem_address(smem.a_tiles + cursor.stage * Layout::kABytes + 64 * s * kBlockK);
      w4a8_issue_wgmma_m64n128(partial, a_base, b_base);
      if (s == 0 && kb + 1 < k_blocks) {  // decode the next k-block while the tensor cores run
        const int next_stage = cursor.stage + 1 == kStages ? 0 : cursor.stage + 1;
        barrier_wait(&smem.full[next_stage], next_stage == 0 ? cursor.phase ^ 1 : cursor.phase);
        decode(next_stage, kb + 1,
               kSharedScales ? static_cast<int>(slot_word(next_stage, record_word + 1))
                             : (decodes_up_row ? next_up_block.decode_exponent : next_block.decode_exponent));
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
      if (s == kSubTilesM - 1) {
        if (lane == 0) barrier_arrive(&smem.empty[cursor.stage]);
        cursor.advance();
      }
      if (warp_has_rows[s]) {
        if constexpr (kInterleaved)
          w4a8_promote_gate_up_groups<64>(accumulator[s], partial, scale_a[s][0] * factor, scale_a[s][1] * factor,
                                          scale_a[s][0] * up_factor, scale_a[s][1] * up_factor);
        else
          w4a8_promote_m64n128(accumulator[s], partial, scale_a[s][0] * factor, scale_a[s][1] * factor);
      }
    }
  }
}

// Accumulator fragment of wgmma m64n128: register 4j+{0,1} = (row, 8j + 2*(lane%4) + {0,1}),
// register 4j+{2,3} = (row + 8, same columns).
// Direct BF16 store of this warpgroup's 128 columns (the standalone kStoreBf16 epilogue; the fused
// kernel stages its GEMM-2 rows with store_bf16_epilogue_bulk instead). out: [rows, out_cols].
// kRegs: 64 (wgmma n128, 128 columns) or 32 (n64, the small-M kernel's 64 columns).
template <int kSubTilesM, int kRegs = 64>
__device__ __forceinline__ void w4a8_store_bf16_epilogue(const float (&accumulator)[kSubTilesM][kRegs],
                                                         const MathRows<kSubTilesM>& where, __nv_bfloat16* out,
                                                         int out_cols, int first_col) {
  const int lane = threadIdx.x % 32;
  const int col_base = first_col + 2 * (lane % 4);
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!where.valid[s][h]) continue;
      __nv_bfloat16* out_row = out + static_cast<int64_t>(where.rows[s][h]) * out_cols + col_base;
#pragma unroll
      for (int j = 0; j < kRegs / 4; ++j)
        *reinterpret_cast<__nv_bfloat162*>(out_row + 8 * j) =
            __floats2bfloat162_rn(accumulator[s][4 * j + 2 * h], accumulator[s][4 * j + 2 * h + 1]);
    }
}

// Gate warpgroup (0) -> up warpgroup (1) through shared memory, kExchangeRegisters registers per thread at
// a time in register order (both see the same (row, column) per slot); the up warpgroup activates,
// applies the top-k weight, quantizes (formats::quantize_fp8_activations rule) and stores ALL the tile's
// rows (out: e4m3 [rows, out_cols], out_scales [rows, out_cols / 128]; column block n_tile). The top-k
// weights are read coherently with kCoherentScales (fused kernel).
// v3: thread t of the gate warpgroup only ever hands values to thread t of the up warpgroup, so warp w of
// one and warp w of the other form a pair that synchronizes on its own named barrier
// (kW4a8PairBarrier + w, 64 threads) instead of all 256 threads on one, and a pair whose 16 rows of a
// sub-tile are all past the expert's end skips that sub-tile (both warps see the same rows).
// NOTES: the exchange slots of pair w are r * 128 + 32 w .. + 31, disjoint between pairs; each pair's slots
// are free again after its last barrier of each chunk, and the up warpgroup's stores follow it: a caller
// that publishes the rows (the fused kernel's gemm1_done) fences and releases from the up warpgroup only.
// A caller whose next use of the exchange region is not per pair (the fused kernel's GEMM-2 staging
// aliases it) is ordered by the next tile's decode barrier, which every warp of the warpgroup reaches
// only after its own pair finished.
template <class Layout, bool kCoherentScales>
__device__ __forceinline__ void w4a8_swiglu_quant_fp8_epilogue(float (&accumulator)[Layout::kSubTiles][64],
                                                               float* exchange, int math_wg,
                                                               const MathRows<Layout::kSubTiles>& where, int n_tile,
                                                               int out_cols, const float* topk_weights, uint8_t* out,
                                                               float* out_scales, int activation, float limit,
                                                               float alpha) {
  constexpr int kSubTilesM = Layout::kSubTiles;
  constexpr int kChunk = Layout::kExchangeRegisters;
  const int lane = threadIdx.x % 32;
  const int thread_in_wg = threadIdx.x % 128;
  const int col_base = n_tile * 128 + 2 * (lane % 4);
  const uint32_t pair_barrier = kW4a8PairBarrier + thread_in_wg / 32;
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s) {
    if (!__any_sync(0xffffffffu, where.valid[s][0] || where.valid[s][1])) continue;  // warp-uniform, pair-uniform
    float amax[2] = {0.0f, 0.0f};
#pragma unroll
    for (int chunk = 0; chunk < 64 / kChunk; ++chunk) {
      if (math_wg == 0) {
#pragma unroll
        for (int r = 0; r < kChunk; ++r) exchange[r * 128 + thread_in_wg] = accumulator[s][chunk * kChunk + r];
      }
      named_barrier_sync(pair_barrier, 64);
      if (math_wg == 1) {
#pragma unroll
        for (int r = 0; r < kChunk; ++r) {
          const int i = chunk * kChunk + r;
          const float value = activate(exchange[r * 128 + thread_in_wg], accumulator[s][i], activation, limit, alpha);
          accumulator[s][i] = value;
          amax[(i % 4) / 2] = fmaxf(amax[(i % 4) / 2], fabsf(value));
        }
      }
      named_barrier_sync(pair_barrier, 64);  // the pair's exchange slots are free again
    }
    if (math_wg == 1) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
        if (!where.valid[s][h]) continue;
        const int row = where.rows[s][h];
        // amax |fl(v * w)| = fl(amax |v| * |w|) (rounding is monotonic), so the weight multiplies here.
        float weight = 1.0f;
        if (topk_weights) weight = kCoherentScales ? __ldcg(topk_weights + row) : topk_weights[row];
        const float scale = __fdiv_rn(fmaxf(__fmul_rn(amax[h], fabsf(weight)), 1e-10f), 448.0f);
        uint8_t* out_row = out + static_cast<int64_t>(row) * out_cols + col_base;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float2 pair = make_float2(__fdiv_rn(__fmul_rn(accumulator[s][4 * j + 2 * h], weight), scale),
                                          __fdiv_rn(__fmul_rn(accumulator[s][4 * j + 2 * h + 1], weight), scale));
          *reinterpret_cast<__nv_fp8x2_storage_t*>(out_row + 8 * j) =
              __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
        }
        if (lane % 4 == 0) out_scales[static_cast<int64_t>(row) * (out_cols / 128) + n_tile] = scale;
      }
    }
  }
}

// GEMM-1 epilogue on W13 packed kGateUpInterleaved8 (the 2-warpgroup kernel's kSwigluInterleavedFp8, the fused
// kernel's W4A8 GEMM 1 on that packing, the small-M kernel's kInterleaved8 mode): math warpgroup math_wg (of
// kWarpgroups) holds, per sub-tile s and fragment row r, in register 4 j + 2 r + c (j = 2 q + u) the gate (u = 0) and
// up (u = 1) value of output column kRegs * math_wg + 8 q + 2 (lane % 4) + c of FP8 block n_tile (kRegs = 64: wgmma
// n128, 64 outputs per warpgroup; 32: n64, 32 outputs). Per row: value = activate(gate, up) in place, the row's amax
// over this warpgroup's outputs (the thread's, then the quad's shuffles) into row_amax[s][math_wg][row], ONE named
// barrier `barrier_id` over the kWarpgroups x 128 math threads, then the max over every warpgroup's partial, the top-k
// weight (read coherently with kCoherentScales), the scale and the codes of this warpgroup's outputs; warpgroup 0
// stores the row's scale (out: e4m3 [rows, out_cols], out_scales [rows, out_cols / 128]).
// NOTES:
// - Every math thread calls it for every tile (the barrier). A warp's 8-row half without a row of the expert skips its
//   activations and writes amax 0, read only for rows never stored.
// - row_amax: [kSubTilesM][kWarpgroups][64] floats nothing else touches between this call's writes and reads. A
//   caller that reuses it on its next tile double-buffers it by tile parity: a warpgroup writes the buffer of tile
//   t + 2 only after the barrier of tile t + 1, which no warpgroup reaches before its reads of tile t (program order).
// - Bit-identical to w4a8_swiglu_quant_fp8_epilogue (and swiglu_quant_fp8_finish_rows): per output the same
//   activate(gate, up), the amax over the row's 128 outputs an exact max (fmaxf, order-free), scale =
//   __fdiv_rn(fmaxf(__fmul_rn(amax, |w|), 1e-10), 448), code = e4m3(__fdiv_rn(__fmul_rn(v, w), scale)) satfinite on
//   the same column pairs.
template <int kSubTilesM, int kRegs, int kWarpgroups, bool kCoherentScales>
__device__ __forceinline__ void w4a8_interleaved_swiglu_epilogue(float (&accumulator)[kSubTilesM][kRegs],
                                                                 float* row_amax, int math_wg,
                                                                 const MathRows<kSubTilesM>& where, uint32_t barrier_id,
                                                                 int n_tile, int out_cols, const float* topk_weights,
                                                                 uint8_t* out, float* out_scales, int activation,
                                                                 float limit, float alpha) {
  static_assert(kRegs == 32 || kRegs == 64, "wgmma n64 or n128 fragments");
  const int lane = threadIdx.x % 32;
  const int row0 = (threadIdx.x % 128) / 32 * 16 + lane / 4;  // sub-tile row of fragment row 0 (row 1: + 8)
  float amax[kSubTilesM][2];
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      amax[s][r] = 0.0f;
      if (__any_sync(0xffffffffu, where.valid[s][r])) {  // warp-uniform
#pragma unroll
        for (int q = 0; q < kRegs / 8; ++q)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float value = activate(accumulator[s][8 * q + 2 * r + c], accumulator[s][8 * q + 4 + 2 * r + c],
                                         activation, limit, alpha);
            accumulator[s][8 * q + 2 * r + c] = value;
            amax[s][r] = fmaxf(amax[s][r], fabsf(value));
          }
        amax[s][r] = fmaxf(amax[s][r], __shfl_xor_sync(0xffffffffu, amax[s][r], 1));
        amax[s][r] = fmaxf(amax[s][r], __shfl_xor_sync(0xffffffffu, amax[s][r], 2));
      }
      if (lane % 4 == 0) row_amax[(s * kWarpgroups + math_wg) * 64 + row0 + 8 * r] = amax[s][r];
    }
  named_barrier_sync(barrier_id, 128 * kWarpgroups);
  const int col_base = n_tile * 128 + kRegs * math_wg + 2 * (lane % 4);
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!where.valid[s][r]) continue;
#pragma unroll
      for (int g = 0; g < kWarpgroups; ++g)  // this warpgroup's own slot too: fmaxf(x, x) = x
        amax[s][r] = fmaxf(amax[s][r], row_amax[(s * kWarpgroups + g) * 64 + row0 + 8 * r]);
      const int row = where.rows[s][r];
      // amax |fl(v * w)| = fl(amax |v| * |w|) (rounding is monotonic), so the weight multiplies here.
      const float weight = topk_weights ? load_scale<kCoherentScales>(topk_weights + row) : 1.0f;
      const float scale = __fdiv_rn(fmaxf(__fmul_rn(amax[s][r], fabsf(weight)), 1e-10f), 448.0f);
      uint8_t* out_row = out + static_cast<int64_t>(row) * out_cols + col_base;
#pragma unroll
      for (int q = 0; q < kRegs / 8; ++q) {
        const float2 pair = make_float2(__fdiv_rn(__fmul_rn(accumulator[s][8 * q + 2 * r], weight), scale),
                                        __fdiv_rn(__fmul_rn(accumulator[s][8 * q + 2 * r + 1], weight), scale));
        *reinterpret_cast<__nv_fp8x2_storage_t*>(out_row + 8 * q) =
            __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
      }
      if (math_wg == 0 && lane % 4 == 0) out_scales[static_cast<int64_t>(row) * (out_cols / 128) + n_tile] = scale;
    }
}

// Producer warpgroup of the standalone W4A8 kernels (this one, the small-M kernel and the 128 x 128 v10 kernel,
// shared scales; tiles of Layout::kBlockN weight rows, Layout::kScaleRecords block records each):
// warp 1 is the scale warp (produce_w4a8_scales), thread 0 streams the operands (produce_w4a8_tile),
// both over the CTA's tile sequence; the other threads return at once. The caller has lowered this
// warpgroup's registers already.
template <class Layout>
__device__ __forceinline__ void run_w4a8_producer_warpgroup(const W4a8GemmShared<Layout>& smem, const ExpertTileTable& table,
                                                            const CUtensorMap* a_map, const CUtensorMap* b_map,
                                                            const W4a8GemmParams& params, int total_tiles, int n_tiles,
                                                            int k_blocks) {
  constexpr int kScaleBytesPerRow = Fp4Traits<Layout::kFp4Format>::kScaleBytesPerRow;
  const int n_blocks = params.n / 128;
  PipelineCursor<Layout::kStageCount> cursor;
  int expert = 0;
  if (threadIdx.x / 32 == 1) {  // the scale warp
    for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
      const TileCoordinates where = locate_tile(table, tile, n_tiles, Layout::kBlockM, expert);
      const W4a8BlockScaleDevice* blocks =
          params.blocks + (static_cast<int64_t>(expert) * n_blocks + where.n_tile * Layout::kScaleRecords) * k_blocks;
      produce_w4a8_scales(smem, params.a_scales, blocks, Layout::kScaleRecords > 1 ? blocks + k_blocks : blocks,
                          where.m0, where.m_end, k_blocks, cursor);
    }
    cp_async_wait_all();
    return;
  }
  if (threadIdx.x != 0) return;
  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const TileCoordinates where = locate_tile(table, tile, n_tiles, Layout::kBlockM, expert);
    const uint8_t* scales = params.group_scales + (static_cast<int64_t>(expert) * k_blocks * params.n +
                                                   where.n_tile * Layout::kBlockN) * kScaleBytesPerRow;
    produce_w4a8_tile(smem, a_map, b_map, where.m0, expert * params.n + where.n_tile * Layout::kBlockN, scales,
                      static_cast<int64_t>(params.n) * kScaleBytesPerRow, k_blocks, cursor);
  }
}

// The standalone W4A8 kernels' start (this one, the small-M and the v10 kernel), before the warpgroup roles split:
// thread 0 initializes the ring's mbarriers and prefetches the tensor maps, warp 1 builds the expert tile
// table of Layout::kBlockM-row tiles; then __syncthreads().
template <class Layout>
__device__ __forceinline__ void start_w4a8_kernel(const W4a8GemmShared<Layout>& smem, const ExpertTileTable& table,
                                                  const CUtensorMap* a_map, const CUtensorMap* b_map,
                                                  const W4a8GemmParams& params) {
  if (threadIdx.x == 0) {
    smem.init_barriers();
    prefetch_tensor_map(a_map);
    prefetch_tensor_map(b_map);
  }
  if (threadIdx.x / 32 == 1)
    build_expert_tile_table<Layout::kBlockM>(table, params.expert_offsets, params.num_experts, params.m_capacity);
  __syncthreads();
}

// The two v10 kernels' start (sm90_w4a8_v10_grouped_gemm_kernel, sm90_w4a8_v10_gemm1_kernel): start_w4a8_kernel, the
// tile counts, the register split (40 producer / 232 math) and, on the producer warpgroup, the whole producer run;
// returns false there (the caller returns) and true on the math warpgroups with their per-thread start values.
// NOTES:
// - 40 / 232 as v11's cluster kernel: at 24 / 240 (v11's, the 128-row W4A8 kernel's) ptxas spilled 20 bytes in the
//   producer thread and the scale warp (the W4A8 producer pieces need more than v11's); at 40 / 232 ptxas reports 0
//   bytes of spills and the math k loops have no R2UR.
// - total_tiles is computed before the register split (uniform, broadcast): moved into the math branch, ptxas lost
//   the uniform descriptor words of the k loop (16 R2UR per k-block). The producer side reads its own copies.
// - __forceinline__ and the statements the two kernels had inline: their SASS is unchanged by the move.
struct W4a8V10MathStart {
  int k_blocks, n_tiles, total_tiles;
  int math_wg;      // which 64-row half of the tile
  int warp_in_wg;
  int math_thread;  // 0..255 over both math warpgroups
  int scale_row;    // this thread's first fragment row in the tile (its second is + 8)
  uint32_t a_descriptor0, b_descriptor0;  // descriptor start-address words of this warpgroup's A rows / the decoded B
};
template <class Layout>
__device__ __forceinline__ bool start_w4a8_v10_kernel(const W4a8GemmShared<Layout>& smem, const ExpertTileTable& table,
                                                      const CUtensorMap* a_map, const CUtensorMap* b_map,
                                                      const W4a8GemmParams& params, W4a8V10MathStart& math) {
  constexpr uint32_t kProducerRegs = 40;
  constexpr uint32_t kMathRegs = 232;
  static_assert(kProducerRegs + kMathWarpgroups * kMathRegs <= 504, "the launch's 168 x 384 registers");
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 32), 0);
  start_w4a8_kernel(smem, table, a_map, b_map, params);

  math.k_blocks = params.k / kBlockK;
  math.n_tiles = params.n / Layout::kBlockN;
  math.total_tiles = __shfl_sync(0xffffffffu, table.tile_prefix[params.num_experts], 0) * math.n_tiles;
  if (warpgroup == 0) {
    registers_decrease<kProducerRegs>();
    run_w4a8_producer_warpgroup(smem, table, a_map, b_map, params, table.tile_prefix[params.num_experts] * math.n_tiles,
                                math.n_tiles, params.k / kBlockK);
    return false;
  }
  registers_increase<kMathRegs>();
  const int lane = threadIdx.x % 32;
  math.math_wg = warpgroup - 1;
  math.warp_in_wg = warp % 4;
  math.math_thread = static_cast<int>(threadIdx.x) - 128;
  math.scale_row = math.math_wg * 64 + math.warp_in_wg * 16 + lane / 4;
  math.a_descriptor0 = __shfl_sync(
      0xffffffffu, kmajor_sw128_descriptor_low(smem_address(smem.a_tiles + math.math_wg * 64 * kBlockK)), 0);
  math.b_descriptor0 = __shfl_sync(0xffffffffu, kmajor_sw128_descriptor_low(smem_address(smem.decoded)), 0);
  return true;
}

// ---- the standalone grouped GEMM ------------------------------------------------------------------
template <int kSubTilesM, int kStages, Fp4Format kFormat, W4a8Epilogue kEpilogue>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_w4a8_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                  const __grid_constant__ CUtensorMap b_map, const W4a8GemmParams params) {
  using Layout = W4a8StandaloneLayout<kSubTilesM, kStages, kFormat, kEpilogue>;
  constexpr int kBlockM = Layout::kBlockM;

  extern __shared__ uint8_t shared_raw[];
  const W4a8GemmShared<Layout> smem(shared_raw);
  const ExpertTileTable table(reinterpret_cast<int*>(smem.table_base), params.num_experts);

  const int warpgroup = threadIdx.x / 128;
  const int lane = threadIdx.x % 32;
  start_w4a8_kernel(smem, table, &a_map, &b_map, params);

  const int k_blocks = params.k / kBlockK;
  const int n_tiles = params.n / kW4a8BlockN;
  const int total_tiles = table.tile_prefix[params.num_experts] * n_tiles;

  // v3: the 128-row variants split 24 (producer thread, scale warp) / 240 (math), as the standalone FP8
  // kernel (its NOTES: 24 + 2 x 240 = 504 is the launch's whole pool): at 40 / 232 (v2) they spilled
  // 76-104 bytes. The 64-row variants keep 40 / 232 (no math spill there; at 24 the producer side spills).
  constexpr uint32_t kProducerRegs = kSubTilesM == 2 ? 24 : 40;
  constexpr uint32_t kMathRegs = kSubTilesM == 2 ? 240 : 232;
  static_assert(kProducerRegs + kMathWarpgroups * kMathRegs <= 504, "the launch's 168 x 384 registers");
  const int n_blocks = params.n / 128;
  if (warpgroup == 0) {
    registers_decrease<kProducerRegs>();
    run_w4a8_producer_warpgroup(smem, table, &a_map, &b_map, params, total_tiles, n_tiles, k_blocks);
    return;
  }

  registers_increase<kMathRegs>();
  const int math_wg = warpgroup - 1;  // = which 128-column half of the tile
  const int thread_in_wg = threadIdx.x % 128;
  const int row_in_tile = (thread_in_wg / 32) * 16 + lane / 4;

  PipelineCursor<kStages> cursor;
  int expert = 0;
  float accumulator[kSubTilesM][64];
  float partial[64];
  uint32_t tile_parity = 0;  // kSwigluInterleavedFp8: the CTA's tile parity (the amax buffer)
  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const TileCoordinates t = locate_tile(table, tile, n_tiles, kBlockM, expert);
    const MathRows<kSubTilesM> where(t.m0, t.m_end, row_in_tile);
    const int n_block = t.n_tile * 2 + math_wg;
    const W4a8BlockScaleDevice* blocks = params.blocks + (static_cast<int64_t>(expert) * n_blocks + n_block) * k_blocks;
    w4a8_tile_mainloop<Layout, false, kW4a8DecodeBarrier>(accumulator, partial, smem, where, params.a_scales, blocks,
                                                          k_blocks, math_wg, cursor, params.decoder);
    if constexpr (kEpilogue == W4a8Epilogue::kStoreBf16) {
      w4a8_store_bf16_epilogue<kSubTilesM>(accumulator, where, static_cast<__nv_bfloat16*>(params.out), params.n,
                                           t.n_tile * kW4a8BlockN + math_wg * 128);
    } else if constexpr (kEpilogue == W4a8Epilogue::kSwigluInterleavedFp8) {
      // Both math warpgroups run every tile, so the amax buffer's tile parity is the same on both sides; the spread
      // epilogue's tiles flip it too (its barriers order the buffer's uses as the amax barrier does).
      const uint32_t parity = tile_parity;
      tile_parity ^= 1u;
      if constexpr (kSubTilesM == 1) {
        // CTA-uniform branch, as kSwigluQuantFp8's. kInterleaved: the staging image is the split-N tile's.
        if (params.swiglu_spread && t.m_end - t.m0 <= kW4a8SpreadRows) {
          swiglu_quant_fp8_spread_epilogue<kW4a8SpreadRows, false, false, true>(
              accumulator[0], reinterpret_cast<float*>(smem.decoded), math_wg, t.m0, t.m_end - t.m0, t.n_tile,
              params.n / 2, params.topk_weights, static_cast<uint8_t*>(params.out), params.out_scales,
              params.activation, params.limit, params.alpha, kW4a8SpreadBarrier);
          continue;
        }
      }
      w4a8_interleaved_swiglu_epilogue<kSubTilesM, 64, kMathWarpgroups, false>(
          accumulator, smem.row_amax + parity * (kSubTilesM * kMathWarpgroups * 64), math_wg, where,
          kW4a8InterleavedAmaxBarrier, t.n_tile, params.n / 2, params.topk_weights, static_cast<uint8_t*>(params.out),
          params.out_scales, params.activation, params.limit, params.alpha);
    } else {
      if constexpr (kSubTilesM == 1) {
        static_assert(2 * kW4a8SpreadRows * 128 * 4 <= 2 * kMathWarpgroups * Layout::kDecodedBytes,
                      "the spread staging lives in the decoded tiles");
        // CTA-uniform branch. The spread epilogue's first barrier comes after both warpgroups' last wgmma
        // of the tile (wgmma_wait<0> in the mainloop), so the decoded tiles are idle; the next tile's first
        // decode comes after its last barrier.
        if (params.swiglu_spread && t.m_end - t.m0 <= kW4a8SpreadRows) {
          swiglu_quant_fp8_spread_epilogue<kW4a8SpreadRows, false, false>(
              accumulator[0], reinterpret_cast<float*>(smem.decoded), math_wg, t.m0, t.m_end - t.m0, t.n_tile,
              params.n / 2, params.topk_weights, static_cast<uint8_t*>(params.out), params.out_scales,
              params.activation, params.limit, params.alpha, kW4a8SpreadBarrier);
          continue;
        }
      }
      w4a8_swiglu_quant_fp8_epilogue<Layout, false>(accumulator, smem.exchange, math_wg, where, t.n_tile, params.n / 2,
                                                    params.topk_weights, static_cast<uint8_t*>(params.out),
                                                    params.out_scales, params.activation, params.limit, params.alpha);
    }
  }
}

}  // namespace megamoe::kernels::sm90
