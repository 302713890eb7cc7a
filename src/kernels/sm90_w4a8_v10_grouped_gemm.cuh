// W4A8 v10 (docs/grouped_gemm.md "W4A8 v10"): the v11 FP8 skeleton (sm90_fp8_wide_grouped_gemm.cuh, 128 x 128)
// with an FP4 decode stage, for the BF16-out W4A8 GEMMs (GEMM 2 / plain), sm_90a. The numbers, the decode and
// the producer pieces are those of sm90_w4a8_grouped_gemm.cuh; the shared-memory layout is W4a8V10Layout below
// (one decoded 128 x 128 B tile both math warpgroups read, BF16 staging). The default for GEMM 2 / plain at rows
// hints > 64 or unknown (MEGAMOE_W4A8_V10, grouped_gemm_w4a8.cu's use_v10_kernel).
//
// Why: the default 128 x 256 split-N kernel runs, per math warpgroup and k-block, two sequential
// wgmma-wait-promote rounds (two m64 sub-tiles), builds its descriptors per thread (R2UR in the k loop) and
// spills; ncu at dsv3 GEMM 2 1024 rows: tensor pipe 34% active, vs 74% for v11 FP8. v10 takes v11's shape:
// math warpgroup g owns tile rows 64 g .. 64 g + 63 and ALL 128 columns, so per k-block ONE group of 4 wgmma
// m64n128k32 into a 64-register partial, commit, (decode the next k-block), wait, promote 64 FFMA.
//
// CTA = 3 warpgroups, 384 threads, persistent. Warpgroup 0 = run_w4a8_producer_warpgroup (thread 0: A [128 rows,
// 128 B] TMA 128-byte swizzle, FP4 [128 rows, 64 B] TMA 64-byte swizzle, the tile's group scales by one bulk
// copy; warp 1: the 128 A scales + the tile's ONE {factor, p} record per stage). A 128-row N tile is exactly one
// 128 x 128 weight block of the packed layout per k-block: layout and numerics unchanged. The 256 math threads
// decode the 128 x 128 FP4 tile, two threads per weight row (64 K each: decode_fp4_half_row_select, as the small-M
// kernel), into a double-buffered decoded tile (2 x 16 KiB, the wgmma B layout) that both math warpgroups read.
// Per k-block:
//   bar.sync 256 (decoded kb visible) -> 4 wgmma (A of the stage, B = decoded kb) + commit -> wait `full` of
//   kb+1, decode kb+1 into the other buffer (overlaps the tensor cores) -> wait 0 -> release the stage ->
//   promote acc += partial * fl(a_scale * factor).
// Epilogue: store_bf16_epilogue_tma (v11's: per-warp swizzled staging, TMA tensor stores; partial chunks from registers).
//
// NOTES:
// - Handoff of a decoded buffer: a named barrier over the 256 math threads (kW4a8V10DecodeBarrier), every thread
//   fencing its own st.shared with fence.proxy.async before it. It locks the two warpgroups together: both wait for
//   their wgmma at the same time and promote at the same time, so the tensor pipe idles for the promotion + barrier
//   tail of every k-block. Measured and removed: an mbarrier handoff (decoded[b] / consumed[b] per buffer, 8
//   arrivals each, letting one warpgroup issue k-block j + 1 while the other promotes j) was slower than the named
//   barrier at every measured point (docs/grouped_gemm.md "W4A8 v10").
// - Buffer reuse: the decoded buffer b written for k-block j+1 (CTA-running count j, across tiles) was last read
//   by the wgmmas of j-1 of BOTH warpgroups; each math thread waited for its own (wgmma_wait<0>) before it arrived
//   at the barrier of j, so after that barrier none still reads it. The buffer parity runs across tiles (the
//   first decode of a tile follows the barrier of the previous tile's last k-block), so no tile-start barrier.
// - Uniformity (v11's discipline): warpgroup / warp indices, the tile loop bound and every per-tile value are
//   broadcast from lane 0 (__shfl_sync); the stage, phase and buffer counters and the descriptor words (stage 0
//   base + stage * (bytes >> 4)) are warp-uniform values; only the decode addresses are per thread.
// - A math warpgroup whose 64 rows hold no row of the expert (m_end - m0 <= 64 g) runs its k loop unchanged (decode
//   of its half of the weight rows, which the other warpgroup reads; wgmma on the A box's rows past the expert,
//   TMA zero fill or the next expert's rows; promotion) and skips only the epilogue. Skipping the wgmma under
//   `if (active)` made ptxas serialize them (C7518: "wgmma.mma_async instructions are serialized due to program
//   dependence on compiler-inserted WG.DP in divergent path"; the removed v9 kernel had that warning), i.e.
//   a wait after every wgmma, which would end the decode / tensor-core overlap. The waste: one 64-row wgmma
//   group per k-block on tiles of <= 64 rows only (an expert's last tile), which the rows-hint gate (> 64) keeps
//   rare.
// - Producer, scale warp and math warpgroups iterate the identical (tile, k-block) sequence, so stage index and
//   phase stay in lockstep; `empty` takes lane 0 of each of the 8 math warps (kEmptyArrivals). A stage is released
//   after the warp's wgmma_wait of its k-block; its FP4 / group-scale bytes were decoded before the barrier of
//   that k-block (every thread), its scale slot read before the release.
// - Bit-identical to the default 128 x 256 kernel's BF16 output: the same wgmma m64n128k32 over the same A rows and
//   decoded bytes of the same 128 columns (an m64 sub-tile's partial does not depend on which warpgroup issues it),
//   the same promotion FFMA with fl(a_scale * factor) in the same k-block order, bf16_rn of the same FP32.
// - Shared memory (kStages = 6, kMaxExperts = 1024 -> tile table 12,300 B; limit 227 KiB = 232,448 B), bytes:
//     decoded 2 x 16,384 = 32,768 | A 6 x 16,384 = 98,304 | FP4 6 x 8,192 = 49,152 | group scales 6 x 1,024
//     (NVFP4; MXFP4 6 x 512) | BF16 staging 8 warps x 8 rows x 272 = 17,408 | scale ring 6 x 130 words = 3,120 |
//     mbarriers 96 | table 12,300 | alignment 1,024: 220,316 (NVFP4), 217,244 (MXFP4). A 7th stage (+26,136 /
//     +25,624 with its ring slot and barriers) does not fit at 1024 experts (246,452 / 242,868 B); the launcher's
//     max_stages (capped at 6) gives 6 (static_assert kW4a8V10Stages).
#pragma once

#include "kernels/sm90_fp8_wide_grouped_gemm.cuh"
#include "kernels/sm90_w4a8_grouped_gemm.cuh"

namespace megamoe::kernels::sm90 {

constexpr int kW4a8V10BlockM = 128;
constexpr int kW4a8V10BlockN = 128;
constexpr int kW4a8V10Stages = 6;
// The CTA-wide decode barrier of the 256 math threads (the standalone kernels' id 2 = kW4a8DecodeBarrier).
constexpr uint32_t kW4a8V10DecodeBarrier = kW4a8DecodeBarrier;

// The names W4a8GemmShared, produce_w4a8_tile, produce_w4a8_scales and run_w4a8_producer_warpgroup read (as
// W4a8GemmLayout), shared by the two v10 kernels: 128-row tiles of kBlockNValue weight rows whose ONE decoded
// kBlockNValue x 128 B tile (double-buffered) both math warpgroups read, then the kernel's epilogue staging
// (kStagingBytesValue bytes at kExchangeOffset = W4a8GemmShared::bf16_staging, aligned to kStagingAlignment), the
// scale ring, the barriers and the tile table (NOTES "Shared memory").
template <int kStages, Fp4Format kFormat, int kBlockNValue, int kStagingBytesValue, int kStagingAlignment>
struct W4a8V10LayoutBase {
  static constexpr int kSubTiles = 1;  // one 64-row sub-tile per math warpgroup
  static constexpr int kStageCount = kStages;
  static constexpr int kBlockM = kW4a8V10BlockM;
  static constexpr int kBlockN = kBlockNValue;
  static constexpr bool kScalesInShared = false;
  static constexpr bool kW4a8SharedScales = true;
  static constexpr Fp4Format kFp4Format = kFormat;
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kFp4Bytes = kBlockN * kW4a8Fp4RowBytes;
  static constexpr int kScaleBytes = kBlockN * Fp4Traits<kFormat>::kScaleBytesPerRow;
  static constexpr int kDecodedBytes = kBlockN * kBlockK;  // the one FP8 B tile both math warpgroups read
  static constexpr int kDecodedOffset = 0;
  static constexpr int kAOffset = kDecodedOffset + 2 * kDecodedBytes;
  static constexpr int kFp4Offset = kAOffset + kStages * kABytes;
  static constexpr int kScaleOffset = kFp4Offset + kStages * kFp4Bytes;
  static constexpr int kExchangeOffset =
      (kScaleOffset + kStages * kScaleBytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
  static constexpr int kStagingBytes = kStagingBytesValue;
  // Scale ring: per stage kBlockM A scales (0 past the expert's end), then one {factor, p} record per 128 weight rows
  // of the tile at [kBlockM + 2 r].
  static constexpr int kScaleRecords = kBlockN / 128;
  static constexpr int kScaleSlotWords = kBlockM + 2 * kScaleRecords;
  static constexpr int kEmptyArrivals = kMathWarpgroups * 4;  // lane 0 of every math warp
  static constexpr int kScaleRingOffset = kExchangeOffset + kStagingBytes;
  static constexpr int kScaleRingBytes = (kStages * kScaleSlotWords * 4 + 15) / 16 * 16;
  static constexpr int kBarrierOffset = kScaleRingOffset + kScaleRingBytes;
  static constexpr int kTableOffset = kBarrierOffset + 2 * kStages * 8;
  static constexpr int shared_bytes(int num_experts) {
    return 1024 + kTableOffset + ExpertTileTable::bytes(num_experts);
  }
  static_assert(kBlockM == 64 * kMathWarpgroups, "one 64-row sub-tile per math warpgroup");
  static_assert(kABytes % 1024 == 0 && kFp4Bytes % 1024 == 0 && kDecodedBytes % 1024 == 0 && kScaleBytes % 16 == 0,
                "stage alignment");
};

// GEMM 2 / plain (128 x 128 tiles), with the BF16 staging of store_bf16_epilogue_tma (WideFp8Layout's for 128 x 128):
// per math warp 8 rows as two 1024-byte swizzled boxes of the out map; 1024-aligned for them (already at 6 stages: no
// bytes added).
template <int kStages, Fp4Format kFormat>
struct W4a8V10Layout
    : W4a8V10LayoutBase<kStages, kFormat, kW4a8V10BlockN,
                        kMathWarpgroups * 4 * bf16_tma_staging_bytes_per_warp<kW4a8V10BlockN, 8>(), 1024> {
  static constexpr int kStagingRowsPerWarp = 8;
  static constexpr int kOutMapRows = kStagingRowsPerWarp;
  static constexpr int kStagingBytesPerWarp = bf16_tma_staging_bytes_per_warp<kW4a8V10BlockN, kStagingRowsPerWarp>();
  static_assert(W4a8V10Layout::kScaleRecords == 1, "one 128 x 128 weight block per tile and k-block");
  static_assert(W4a8V10Layout::kExchangeOffset % 1024 == 0, "TMA-store boxes: 128-byte swizzle atoms");
};

// One tile of math warpgroup `math_wg` (zeroes `accumulator`): decode (half the shared 128 x 128 weight tile) +
// one wgmma group + promotion per k-block, in the order of the header comment.
// math_thread: 0..255 over both math warpgroups. scale_row: this thread's first fragment row
// in the tile (its second is + 8). a_descriptor0 / b_descriptor0: descriptor start-address words of this
// warpgroup's A rows in stage 0 and of decoded buffer 0 (uniform). stage / phase: the ring cursor; count: the
// CTA-running k-block count (uniform, carried across tiles): k-block j uses decoded buffer j & 1.
template <class Layout>
__device__ __forceinline__ void w4a8_v10_tile_mainloop(float (&accumulator)[64], float (&partial)[64],
                                                       const W4a8GemmShared<Layout>& smem, int k_blocks,
                                                       int math_thread, int scale_row, uint32_t a_descriptor0,
                                                       uint32_t b_descriptor0, int& stage, uint32_t& phase,
                                                       uint32_t& count, int decoder) {
  constexpr int kStages = Layout::kStageCount;
  constexpr int kSlotWords = Layout::kScaleSlotWords;
  const int lane = threadIdx.x % 32;
  const uint32_t* const ring = smem.scale_ring;
  // Two threads per weight row: math thread t decodes logical chunks 2 (t & 1), +1 of row t / 2. k-block j (running
  // count) into buffer j & 1.
  const auto decode = [&](int s, uint32_t j) {
    decode_fp4_half_row_select<Layout::kFp4Format>(
        decoder, smem.fp4_tiles + s * Layout::kFp4Bytes, smem.scale_tiles + s * Layout::kScaleBytes,
        smem.decoded + (j & 1) * Layout::kDecodedBytes, math_thread / 2, 2 * (math_thread & 1),
        static_cast<int>(ring[s * kSlotWords + Layout::kBlockM + 1]));
    fence_proxy_async_shared();
  };
#pragma unroll
  for (int i = 0; i < 64; ++i) accumulator[i] = 0.0f;
  barrier_wait(&smem.full[stage], phase);
  decode(stage, count);
#pragma unroll 1
  for (int kb = 0; kb < k_blocks; ++kb) {
    // Stage kb's `full` was waited for before its decode: its scale slot is readable.
    const uint32_t* const slot = ring + stage * kSlotWords;
    const float factor = __uint_as_float(slot[Layout::kBlockM]);
    const float scale_a0 = __uint_as_float(slot[scale_row]), scale_a1 = __uint_as_float(slot[scale_row + 8]);
    const uint32_t buffer = count & 1u;
    named_barrier_sync(kW4a8V10DecodeBarrier, 256);  // every row of decoded kb is written and fenced
    const uint32_t a_low = a_descriptor0 + stage * (Layout::kABytes >> 4);
    const uint32_t b_low = b_descriptor0 + buffer * (Layout::kDecodedBytes >> 4);
    wgmma_group_m64n128_e4m3(partial, a_low, b_low);
    const int next_stage = stage + 1 == kStages ? 0 : stage + 1;
    const uint32_t next_phase = next_stage == 0 ? phase ^ 1u : phase;
    if (kb + 1 < k_blocks) {  // decode the next k-block while the tensor cores run
      barrier_wait(&smem.full[next_stage], next_phase);
      decode(next_stage, count + 1);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
    if (lane == 0) barrier_arrive(&smem.empty[stage]);
    ++count;
    stage = next_stage;
    phase = next_phase;
    w4a8_promote_m64n128(accumulator, partial, scale_a0 * factor, scale_a1 * factor);
  }
}

template <int kStages, Fp4Format kFormat>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_w4a8_v10_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                      const __grid_constant__ CUtensorMap b_map,
                                      const __grid_constant__ CUtensorMap out_map, const W4a8GemmParams params) {
  using Layout = W4a8V10Layout<kStages, kFormat>;
  constexpr int kBlockM = Layout::kBlockM;
  constexpr int kBlockN = Layout::kBlockN;
  extern __shared__ uint8_t shared_raw[];
  const W4a8GemmShared<Layout> smem(shared_raw);
  const ExpertTileTable table(reinterpret_cast<int*>(smem.table_base), params.num_experts);
  W4a8V10MathStart start;
  if (!start_w4a8_v10_kernel(smem, table, &a_map, &b_map, params, start)) return;  // the producer warpgroup ran
  const int k_blocks = start.k_blocks, n_tiles = start.n_tiles, total_tiles = start.total_tiles;
  const int math_wg = start.math_wg, warp_in_wg = start.warp_in_wg, math_thread = start.math_thread;
  const int scale_row = start.scale_row;
  const uint32_t a_descriptor0 = start.a_descriptor0, b_descriptor0 = start.b_descriptor0;
  const int lane = threadIdx.x % 32;
  uint8_t* const warp_staging = smem.bf16_staging + (math_wg * 4 + warp_in_wg) * Layout::kStagingBytesPerWarp;
  if (threadIdx.x % 128 == 0) prefetch_tensor_map(&out_map);
  __nv_bfloat16* const out = static_cast<__nv_bfloat16*>(params.out);

  int stage = 0;
  uint32_t phase = 0, count = 0;
  int expert = 0;
  float accumulator[64];
  float partial[64];
  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const TileCoordinates t = locate_tile(table, tile, n_tiles, kBlockM, expert);
    const int m0 = __shfl_sync(0xffffffffu, t.m0, 0);
    const int m_end = __shfl_sync(0xffffffffu, t.m_end, 0);
    const int n0 = __shfl_sync(0xffffffffu, t.n_tile, 0) * kBlockN;
    expert = __shfl_sync(0xffffffffu, expert, 0);
    const bool active = m_end - m0 > 64 * math_wg;
    w4a8_v10_tile_mainloop<Layout>(accumulator, partial, smem, k_blocks, math_thread, scale_row,
                                   a_descriptor0, b_descriptor0, stage, phase, count, params.decoder);
    if (active)
      store_bf16_epilogue_tma<kBlockN, Layout::kStagingRowsPerWarp>(accumulator, warp_staging,
                                                                    m0 + math_wg * 64 + warp_in_wg * 16, m_end,
                                                                    &out_map, out, n0, params.n);
  }
  bulk_wait_all();
}

}  // namespace megamoe::kernels::sm90
