// Persistent, warp-specialized FP8-block grouped GEMM for sm_90a, and its device-level building blocks.
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
// The pieces (shared-memory carve-up, producer loop of one tile, math mainloop of one tile, the two
// epilogues) are device functions so that the fused MegaMoE kernel (sm90_mega_moe.cuh) runs the very
// same GEMM code on its own tile sequence; sm90_fp8_grouped_gemm_kernel below is the standalone user.
//
// NOTES:
// - Tile order (see sm90_gemm_heuristics.h): m-tiles of all experts concatenated, n-tile fastest. The
//   per-expert m-tile prefix is computed by every CTA from the device offsets (one warp scan,
//   sm90_grouped_schedule.cuh), so the host never needs the row counts.
// - A tile may run past its expert's last row into the next expert's rows (or past m_capacity, where
//   TMA fills zeros): those accumulator rows are computed but never stored, and their A scale is 0.
// - Producer and math warpgroups iterate the identical (tile, k-block) sequence, so their stage index
//   and phase bit stay in lockstep without communication (PipelineCursor on each side).
// - kCoherentScales: the A scales (and the top-k weights) are read with ld.global.cg instead of the
//   read-only path (ld.global.nc), because the fused kernel writes them during the same launch; the
//   non-coherent path may return stale lines there.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kernels/exact_quotient.h"
#include "kernels/sm90_gemm_heuristics.h"
#include "kernels/sm90_grouped_schedule.cuh"
#include "kernels/sm90_ptx.cuh"

namespace megamoe::kernels::sm90 {

enum class Epilogue : int {
  kStoreBf16,       // out[r, n] = bf16(acc)
  kSwigluQuantFp8,  // split-N only: gate (warpgroup 0) x up (warpgroup 1) -> FP8 + per-128 scale
  // v9 (docs/grouped_gemm.md "v9"): split-M 128 x 256 on weights packed gate/up-interleaved by 8 rows
  // (GemmRole::kGateUpInterleaved8); each math warpgroup finishes its own 64 rows (no exchange).
  kSwigluInterleavedFp8,
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
  int v9_skew_kblocks = 0;               // kSwigluInterleavedFp8 + kSerial only: see kV9SkewBarrier
  // Tail trim (produce_fp8_tile_trimmed; the standalone kernel's A map box is kATrimRows rows): the
  // producer loads only the 64-row chunks of a tile that hold rows of its expert. false: all of them.
  bool a_tail_trim = false;
  // SwiGLU epilogue of 64 x 256 split-N tiles with at most 32 rows: the spread variant
  // (swiglu_quant_fp8_spread_epilogue; MEGAMOE_SWIGLU_SPREAD=0 keeps the balanced one everywhere).
  bool swiglu_spread = true;
  // Tile order of the v11 wide kernels (locate_tile_ordered): false = n-tile fastest, true = m-tile fastest inside an
  // expert (MEGAMOE_GEMM_M_FASTEST=0|1, read by the v11 launchers). Same outputs either way.
  bool m_fastest = false;
};

// v9 skew (an experiment, GroupedGemm1Fp8Args::v9_skew_kblocks): math warpgroup 1 starts its first
// tile only after warpgroup 0 has released v9_skew_kblocks (clamped to k_blocks) k-blocks of it, so the
// two warpgroups run that many k-blocks apart and one's epilogue can overlap the other's MMAs.
// NOTES (named barrier kV9SkewBarrier, 256 threads, used once per CTA with at least one tile):
// warpgroup 1 bar.syncs before its tile loop, warpgroup 0 bar.arrives in its first tile's K loop after
// k-block skew - 1. No deadlock for skew <= kStages: warpgroup 0 needs only the first `skew` stages,
// which the producer fills before any release. Afterwards nothing re-synchronizes the warpgroups
// (split-M v9 has no exchange), so the lag persists up to the ring's depth. Serial schedule only: the
// ordered-issue token would wait on warpgroup 1 while it waits here.
constexpr uint32_t kV9SkewBarrier = 2;

// One 128-K wgmma group of a math warpgroup: the operand fences of `partial`, wgmma.fence, 4 x wgmma m64n128k32 E4M3
// (the first overwrites `partial`), commit. a_low / b_low: descriptor start-address words (kmajor_sw128_descriptor_low)
// of the 64 A rows and the 128 B rows at K 0 of the block; each k32 step adds 32 bytes (>> 4). Shared by FP8 v11 GEMM 1
// and the two W4A8 v10 kernels (their waits and promotions differ). NOTES: __forceinline__ and the statements the
// kernels had inline: their SASS is unchanged.
__device__ __forceinline__ void wgmma_group_m64n128_e4m3(float (&partial)[64], uint32_t a_low, uint32_t b_low) {
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
  wgmma_fence();
#pragma unroll
  for (int k_step = 0; k_step < kBlockK / 32; ++k_step)
    wgmma_m64n128k32_e4m3(partial, sw128_descriptor_from_low(a_low + ((32 * k_step) >> 4)),
                          sw128_descriptor_from_low(b_low + ((32 * k_step) >> 4)), k_step > 0 ? 1u : 0u);
  wgmma_commit();
}

// Row pitch of the BF16 staging buffer of store_bf16_epilogue_bulk: 128 BF16 (256 B) + 16 B of padding
// (bank math there), a multiple of the 16 bytes a bulk copy's source address needs.
constexpr int kBf16StagingPitch = 128 * 2 + 16;
// Row pitch of the FP8 staging rows of the SwiGLU epilogues' bulk stores (v8c, v9): 128 codes + 16 B,
// 16-byte aligned rows, 2-byte writes of a quad's 8 row slots conflict-free (36 words = 4 mod 32).
constexpr int kFp8StagingPitch = 128 + 16;
// Per-warp FP8 staging of swiglu_quant_fp8_rows_epilogue<..., kTmaStore = true> (v11 / W4A8 v10 GEMM 1, 128 x 256):
// one [16 rows][128 B] box of the 128-byte-swizzled out map (two whole 1024-byte swizzle atoms), so a warp stride of
// 2048 keeps every warp's box 1024-byte aligned from a 1024-aligned base; the partial-warp fallback reuses it as 16
// unswizzled 128-byte rows.
constexpr int kFp8TmaStagingBytesPerWarp = 16 * 128;

// kWarpgroupsM: 2 = the math warpgroups split the tile's rows (split-M), 1 = its columns (split-N).
// kSubTilesM: 64-row sub-tiles per math warpgroup (each a separate 64 x 128 wgmma accumulator set).
// kStagingRows: rows of BF16 staging per math warpgroup for store_bf16_epilogue_bulk (64 or 32; 0 = no
// staging region: the direct-store epilogues, the BF16 kernel's alias). With kSwigluQuantFp8 (the fused
// kernel, whose GEMM-2 tiles store BF16 while its GEMM-1 tiles run the SwiGLU epilogue) the staging
// rows ALIAS the SwiGLU exchange buffer: the region is the larger of the two, see kStagingOffset.
// kSharedScales (v8): the A and B scales of every stage are staged in shared memory by the scale warp
// (warp 1 of the producer warpgroup, cp.async) next to the operands, instead of each math thread
// loading them from global memory. The fused kernel keeps global loads (false).
// kGroupsN (derived from the epilogue): 128-column wgmma groups per math warpgroup and sub-tile. 1 for
// every layout but kSwigluInterleavedFp8 (v9: 2, the tile's two n-halves). A math warpgroup's
// accumulator is float[kGroups][64], group g = (sub-tile g / kGroupsN, n-half g % kGroupsN).
// kSplitNInterleaved (the fused mega kernel's FP8 GEMM 1 on kGateUpInterleaved8 weights, sm90_mega_moe.cuh):
// a split-N SwiGLU layout (kWarpgroupsM 1, kSwigluQuantFp8, shared scales) whose GEMM-1 tiles read W13
// interleaved by 8 as v11 GEMM 1 small does: math warpgroup w multiplies packed columns [128 w, 128 w + 128) =
// gate AND up of outputs [64 w, 64 w + 64), promoted with the tile's gate scale on even 8-column groups and its
// up scale on odd ones (fp8_tile_mainloop_shared_scales), and finishes them with swiglu_quant_fp8_rows_epilogue
// (kHalves 1, per 64-row sub-tile) + the per-row amax exchange, or the spread epilogue (kInterleaved). It adds
// the rows epilogue's FP8 row staging (18,432 B) to the region after the tiles and the amax exchange
// ([2 parities][2 warpgroups][64 rows] floats, 1 KiB) after the scale ring. GEMM-2 tiles are unchanged.
template <int kWarpgroupsM, int kSubTilesM, int kStages, Epilogue kEpilogue, int kStagingRows = 0,
          bool kSharedScales = false, bool kSplitNInterleaved = false>
struct GroupedGemmLayout {
  static constexpr int kWarpgroupsMValue = kWarpgroupsM;
  static constexpr int kSubTiles = kSubTilesM;
  static constexpr int kGroupsN = kEpilogue == Epilogue::kSwigluInterleavedFp8 ? 2 : 1;
  static constexpr int kGroups = kSubTilesM * kGroupsN;
  static constexpr bool kGateUpInterleaved8 = kEpilogue == Epilogue::kSwigluInterleavedFp8;
  static_assert(kEpilogue != Epilogue::kSwigluInterleavedFp8 || (kWarpgroupsM == 2 && kSubTilesM == 1),
                "v9 GEMM 1: split-M, one 64-row sub-tile per math warpgroup (128 x 256)");
  static constexpr bool kGateUpSplitNInterleaved8 = kSplitNInterleaved;
  static_assert(!kSplitNInterleaved || (kWarpgroupsM == 1 && kEpilogue == Epilogue::kSwigluQuantFp8 && kSharedScales),
                "split-N GEMM 1 on interleaved W13: the fused kernel's split-N SwiGLU layout with shared scales");
  // `empty` arrivals per math warp and stage: lane 0's (1), or every lane's (32) where the math threads read the
  // stage's scale slot per wgmma group (kSplitNInterleaved, fp8_kblock_groups kScalesPerGroup). NOTES: an
  // mbarrier arrival releases only the arriving thread's own accesses (PTX memory model), so with lane 0 alone
  // the other lanes' scale reads are not ordered before the scale warp's next cp.async into the slot; racecheck
  // reports exactly that (docs/perf.md "Session 25"; a __syncwarp() before lane 0's arrival did not satisfy
  // it). The other layouts keep one arrival per warp (racecheck-clean; their GEMMs are the staged hot path).
  static constexpr int kEmptyArrivalsPerWarp = kSplitNInterleaved ? 32 : 1;
  static constexpr int kStageCount = kStages;
  static constexpr int kRowsPerWarpgroup = 64 * kSubTilesM;
  static constexpr int kBlockM = kRowsPerWarpgroup * kWarpgroupsM;
  static constexpr int kBlockN = 128 * kGroupsN * (kMathWarpgroups / kWarpgroupsM);
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  // SwiGLU: the accumulators the other math warpgroup finishes cross through shared memory
  // kExchangeRegisters registers per thread at a time (16 KiB; half each way in the FP8 epilogue), not
  // all at once (64 KiB at 128 x 256), which leaves room for a 4th stage.
  static constexpr int kExchangeRegisters = 32;
  static constexpr int kExchangeBytes = kEpilogue == Epilogue::kSwigluQuantFp8 ? kExchangeRegisters * 128 * 4 : 0;
  static constexpr int kTilesBytes = kStages * (kABytes + kBBytes);
  // v8 BF16 epilogue: kMathWarpgroups x kStagingRows x kBf16StagingPitch bytes (64 rows: 34,816 B;
  // 32 rows: 17,408 B), warpgroup w's rows at w * kStagingRows * kBf16StagingPitch.
  // NOTES: exchange and staging both start at kTilesBytes and the region after the tiles is the larger
  // of the two. Only one of them is non-empty in the standalone layouts (the offsets are those of two
  // regions back to back); in the fused kernel's (kSwigluQuantFp8 + staging) they alias, which is safe
  // because a CTA runs all its GEMM-1 tiles (exchange) before its first GEMM-2 tile (staging), and the
  // last exchange barrier of a GEMM-1 tile (and, with bulk FP8 stores, the completed copies behind
  // gemm1_done) come before any staging write (sm90_mega_moe.cuh NOTES).
  static_assert(kStagingRows == 0 || kStagingRows == 32 || kStagingRows == 64, "BF16 staging: 32 or 64 rows per math warpgroup");
  static constexpr int kStagingRowsValue = kStagingRows;
  static constexpr int kStagingBytes = kMathWarpgroups * kStagingRows * kBf16StagingPitch;
  static constexpr int kStagingOffset = kTilesBytes;
  // v9 (kSwigluInterleavedFp8): no exchange; every math warp stages its 16 FP8 rows of a tile here for
  // the bulk copies: kMathWarpgroups x 4 warps x 16 rows x kFp8StagingPitch = 18,432 B (the 16 KiB the
  // exchange buffer took, + 2 KiB), warp v (0..7 over both math warpgroups) at v * 16 * kFp8StagingPitch.
  static constexpr int kFp8RowStagingBytes = kEpilogue == Epilogue::kSwigluInterleavedFp8 || kSplitNInterleaved
                                                 ? kMathWarpgroups * 4 * 16 * kFp8StagingPitch
                                                 : 0;
  static constexpr int kExchangeOrFp8Bytes = kExchangeBytes > kFp8RowStagingBytes ? kExchangeBytes : kFp8RowStagingBytes;
  static constexpr int kExchangeRegionBytes = kExchangeOrFp8Bytes > kStagingBytes ? kExchangeOrFp8Bytes : kStagingBytes;
  static_assert(kStagingOffset % 16 == 0, "bulk copies read the staging rows at 16-byte aligned addresses");
  // Scale ring (kSharedScales): per stage kBlockM A scales (tile row i at [i]; 0 for rows past the
  // expert's end) then kMathWarpgroups B scales ([kBlockM + w] = the 128-column block math warpgroup w
  // multiplies; both equal in split-M). v9: [kBlockM] = the tile's gate block, [kBlockM + 1] = its up
  // block (packed scale blocks 2j and 2j + 1 of n-tile j), read by both warpgroups for both n-halves
  // (every 128-column half holds 64 gate and 64 up columns). Bytes = kStages * (kBlockM + 2) * 4,
  // rounded up to 16, in every layout.
  static constexpr bool kScalesInShared = kSharedScales;
  static constexpr int kScaleFloats = kBlockM + kMathWarpgroups;
  static constexpr int kScalesOffset = kTilesBytes + kExchangeRegionBytes;
  static constexpr int kScalesBytes = kSharedScales ? (kStages * kScaleFloats * 4 + 15) / 16 * 16 : 0;
  // kSplitNInterleaved: the per-row amax exchange of the rows epilogue (RowsAmaxExchange), [2][2][64] floats
  // (the fused kernel: one [warpgroup][row] buffer per sub-tile).
  static constexpr int kAmaxOffset = kScalesOffset + kScalesBytes;
  static constexpr int kAmaxBytes = kSplitNInterleaved ? 2 * kMathWarpgroups * 64 * 4 : 0;
  static constexpr int kBarrierOffset = kAmaxOffset + kAmaxBytes;
  static constexpr int kTableOffset = kBarrierOffset + 2 * kStages * 8;
  // 1024 bytes of slack to align the base for the 128-byte swizzle; 3 int tables of E+1.
  static constexpr int shared_bytes(int num_experts) { return 1024 + kTableOffset + ExpertTileTable::bytes(num_experts); }
};

// The standalone kernel's layout (v8): kStoreBf16 gets the BF16 staging region of
// store_bf16_epilogue_bulk, a whole 64-row sub-tile per math warpgroup when that fits, else a 32-row
// half (one more bulk-read wait per sub-tile; docs/grouped_gemm.md v8 has the table):
//   64 x 256 (4 stages):  163,840 tiles + 34,816 staging + 1,056 scale ring -> 213,100 B at 1024 experts
//   128 x 128 (6 stages): 196,608 tiles + 17,408 staging + 3,120 scale ring -> 230,556 B
//   256 x 128 (4 stages): 196,608 tiles + 17,408 staging + 4,128 scale ring -> 231,532 B
// (each total includes the 1,024 B alignment slack, the barriers and ExpertTileTable::bytes(1024) = 12,300 B;
// the 227 KiB limit is 232,448 B).
constexpr int kSharedBytesPerCta = 227 * 1024;  // sm_90 opt-in maximum of dynamic shared memory per CTA
// Staging rows of the standalone kernel's BF16 epilogue: 64 where the whole layout (scale ring
// included) fits at kMaxExperts, else 32.
template <int kWarpgroupsM, int kSubTilesM, int kStages, bool kSharedScales>
constexpr int standalone_bf16_staging_rows() {
  using Whole = GroupedGemmLayout<kWarpgroupsM, kSubTilesM, kStages, Epilogue::kStoreBf16, 64, kSharedScales>;
  return Whole::shared_bytes(kMaxExperts) <= kSharedBytesPerCta ? 64 : 32;
}

__device__ __forceinline__ float activate(float gate, float up, int kind, float limit, float alpha) {
  if (kind == 0) return gate / (1.0f + expf(-gate)) * up;
  const float g = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  return g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
}

// ---- shared memory and pipeline ---------------------------------------------------------------------
// CTAs per cluster of a layout: Layout::kClusterSize where it has one (the v11 cluster kernels), else 1.
template <class Layout, class = void>
struct LayoutClusterSize {
  static constexpr int value = 1;
};
template <class Layout>
struct LayoutClusterSize<Layout, std::void_t<decltype(Layout::kClusterSize)>> {
  static constexpr int value = Layout::kClusterSize;
};

// `empty` arrivals per math warp and stage of a layout: Layout::kEmptyArrivalsPerWarp where it has one
// (GroupedGemmLayout), else 1 (lane 0).
template <class Layout>
constexpr int layout_empty_arrivals_per_warp() {
  if constexpr (requires { Layout::kEmptyArrivalsPerWarp; }) return Layout::kEmptyArrivalsPerWarp;
  else return 1;
}

template <class Layout>
struct Fp8GemmShared {
  uint8_t* a_tiles;
  uint8_t* b_tiles;
  float* exchange;
  uint8_t* bf16_staging;  // kStagingOffset (kStagingBytes, 0 unless the layout has kStagingRows; may alias exchange)
  uint8_t* fp8_row_staging;  // v9: kFp8RowStagingBytes at kTilesBytes
  float* scales;          // Layout::kScalesInShared: [kStageCount][kScaleFloats]
  uint64_t* full;
  uint64_t* empty;
  uint8_t* table_base;  // kTableOffset: ExpertTileTable (and whatever a caller puts after it)
  // `raw` = the dynamic shared memory; the base is aligned up to 1024 bytes for the 128-byte swizzle.
  __device__ __forceinline__ explicit Fp8GemmShared(uint8_t* raw) {
    uint8_t* shared = raw + ((1024 - (smem_address(raw) & 1023)) & 1023);
    a_tiles = shared;
    b_tiles = shared + Layout::kStageCount * Layout::kABytes;
    exchange = reinterpret_cast<float*>(shared + Layout::kTilesBytes);
    bf16_staging = shared + Layout::kStagingOffset;
    fp8_row_staging = shared + Layout::kTilesBytes;
    scales = reinterpret_cast<float*>(shared + Layout::kScalesOffset);
    full = reinterpret_cast<uint64_t*>(shared + Layout::kBarrierOffset);
    empty = full + Layout::kStageCount;
    table_base = shared + Layout::kTableOffset;
  }
  // One thread, before the CTA's first __syncthreads(). `full` completes on the TMA producer's
  // arrive-expect (+ its bytes) and, with shared scales, one cp.async arrival per scale-warp lane; `empty` on
  // layout_empty_arrivals_per_warp arrivals of every math warp (release_stage).
  // Clusters (LayoutClusterSize > 1, the v11 cluster kernels): `empty` takes one arrival per math warp of
  // EVERY CTA of the cluster (the peers multicast into this CTA's stages: docs/grouped_gemm.md "v11 clusters").
  __device__ __forceinline__ void init_barriers() const {
    for (int s = 0; s < Layout::kStageCount; ++s) {
      barrier_init(&full[s], Layout::kScalesInShared ? 1 + 32 : 1);
      barrier_init(&empty[s],
                   kMathWarpgroups * 4 * layout_empty_arrivals_per_warp<Layout>() * LayoutClusterSize<Layout>::value);
    }
    barrier_init_fence();
  }
};

// A math warp is done with the stage (its wgmma waited and its reads of the scale slot issued): lane 0 arrives on
// `empty`, or every lane where the layout counts per-thread arrivals (layout_empty_arrivals_per_warp).
template <class Layout>
__device__ __forceinline__ void release_stage(const Fp8GemmShared<Layout>& smem, int stage, int lane) {
  if (layout_empty_arrivals_per_warp<Layout>() == 32 || lane == 0) barrier_arrive(&smem.empty[stage]);
}

// Stage index + phase bit of one side of the ring.
template <int kStages>
struct PipelineCursor {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
};

// Producer (one thread): streams the k_blocks 128-K slices of A rows [m0, m0 + BLOCK_M) and B rows
// [b_row, b_row + BLOCK_N) into the ring.
template <class Layout>
__device__ __forceinline__ void produce_fp8_tile(const Fp8GemmShared<Layout>& smem, const CUtensorMap* a_map,
                                                 const CUtensorMap* b_map, int m0, int b_row, int k_blocks,
                                                 PipelineCursor<Layout::kStageCount>& cursor) {
  for (int kb = 0; kb < k_blocks; ++kb) {
    barrier_wait(&smem.empty[cursor.stage], cursor.phase ^ 1);
    barrier_arrive_expect_bytes(&smem.full[cursor.stage], Layout::kABytes + Layout::kBBytes);
    tma_load_2d(smem.a_tiles + cursor.stage * Layout::kABytes, a_map, kb * kBlockK, m0, &smem.full[cursor.stage]);
    tma_load_2d(smem.b_tiles + cursor.stage * Layout::kBBytes, b_map, kb * kBlockK, b_row, &smem.full[cursor.stage]);
    cursor.advance();
  }
}

// Rows per A box of the tail-trimming producer: one wgmma sub-tile.
constexpr int kATrimRows = 64;

// produce_fp8_tile with the A rows trimmed to the expert (GroupedGemmParams::a_tail_trim; the A map's
// box is kATrimRows rows): per k-block only the 64-row chunks c with m0 + 64 c < m_end are loaded, and
// the stage's expected bytes count only those.
// NOTES:
// - Why: an expert's last m-tile is usually part-empty (uniform routing at ~512 rows per expert puts
//   half of them 1-40 rows into another 256- or 128-row tile). The math warpgroups already skip the
//   sub-tiles without rows (active_sub_tiles), but a whole-box load still streamed every A row of the
//   tile from L2: a 256 x 128 tile with one active sub-tile moved 48 KiB per k-block for a quarter of
//   the MMAs, so the tail cost most of a full tile.
// - The chunks left unloaded keep the stage's previous bytes. No stored result reads them: a sub-tile
//   without rows is skipped by the kSerial mainloop, and where a schedule still runs its wgmma
//   (kOrderedIssue keeps every group for its token, kHalfOverlap, the BF16 v1 mainloop) the products
//   land only in accumulator rows >= m_end, which no epilogue stores and no row-wise reduction (SwiGLU
//   amax, top-k weight) mixes with a valid row.
// - The 128-byte swizzle repeats every 8 rows (1 KiB), so four 64-row boxes at 8 KiB offsets write the
//   same shared-memory image as one 256-row box.
template <class Layout>
__device__ __forceinline__ void produce_fp8_tile_trimmed(const Fp8GemmShared<Layout>& smem, const CUtensorMap* a_map,
                                                         const CUtensorMap* b_map, int m0, int m_end, int b_row,
                                                         int k_blocks, PipelineCursor<Layout::kStageCount>& cursor) {
  static_assert(Layout::kBlockM % kATrimRows == 0, "whole 64-row chunks");
  constexpr int kChunkBytes = kATrimRows * kBlockK;
  const int chunks = min((m_end - m0 + kATrimRows - 1) / kATrimRows, Layout::kBlockM / kATrimRows);
  for (int kb = 0; kb < k_blocks; ++kb) {
    barrier_wait(&smem.empty[cursor.stage], cursor.phase ^ 1);
    barrier_arrive_expect_bytes(&smem.full[cursor.stage], chunks * kChunkBytes + Layout::kBBytes);
    uint8_t* a_stage = smem.a_tiles + cursor.stage * Layout::kABytes;
    for (int c = 0; c < chunks; ++c)
      tma_load_2d(a_stage + c * kChunkBytes, a_map, kb * kBlockK, m0 + c * kATrimRows, &smem.full[cursor.stage]);
    tma_load_2d(smem.b_tiles + cursor.stage * Layout::kBBytes, b_map, kb * kBlockK, b_row, &smem.full[cursor.stage]);
    cursor.advance();
  }
}

// Scale warp (Layout::kScalesInShared; all 32 lanes of one warp): for the same (tile, k-block)
// sequence as produce_fp8_tile, waits for the stage to be free, copies the tile's kBlockM A scales of
// k-block kb (rows >= m_end zero-filled) and the math warpgroups' B scales into the stage's scale slot
// with 4-byte cp.async, and arrives on `full` when they have landed (one .noinc arrival per lane).
// a_scales: [rows, k_blocks]; b_scales_wg[w]: the k_blocks scales of math warpgroup w's 128 columns.
// NOTES: the math warpgroups read the slot after waiting on `full` and before arriving on `empty`, so
// the ring protocol is the operands' own; a 4-byte cp.async never blocks this warp on load latency
// (no registers held per stage), so one warp keeps up with 64-row tiles.
template <class Layout>
__device__ __forceinline__ void produce_fp8_scales(const Fp8GemmShared<Layout>& smem, const float* a_scales,
                                                   const float* b_scales_wg0, const float* b_scales_wg1, int m0,
                                                   int m_end, int k_blocks, PipelineCursor<Layout::kStageCount>& cursor) {
  const int lane = threadIdx.x % 32;
  const int valid_rows = m_end - m0;
  const int64_t row_step = static_cast<int64_t>(32) * k_blocks;
  for (int kb = 0; kb < k_blocks; ++kb) {
    barrier_wait(&smem.empty[cursor.stage], cursor.phase ^ 1);
    float* slot = smem.scales + cursor.stage * Layout::kScaleFloats;
    const float* source = a_scales + static_cast<int64_t>(m0 + lane) * k_blocks + kb;
#pragma unroll 1
    for (int i = lane; i < Layout::kBlockM; i += 32, source += row_step) {
      const bool valid = i < valid_rows;
      cp_async_4(slot + i, valid ? source : a_scales, valid ? 4u : 0u);
    }
    if (lane < kMathWarpgroups) cp_async_4(slot + Layout::kBlockM + lane, (lane == 0 ? b_scales_wg0 : b_scales_wg1) + kb, 4u);
    cp_async_arrive_noinc(&smem.full[cursor.stage]);
    cursor.advance();
  }
}

template <bool kCoherent>
__device__ __forceinline__ float load_scale(const float* p) {
  if constexpr (kCoherent) return __ldcg(p);
  else return __ldg(p);
}

// Where a math thread's accumulator rows lie. Register 4j+{0,1} of sub-tile s: row_in_tile + 64 s;
// registers 4j+{2,3}: + 8 (wgmma m64n128 fragment).
template <int kSubTilesM>
struct MathRows {
  int rows[kSubTilesM][2];
  bool valid[kSubTilesM][2];
  __device__ __forceinline__ MathRows(int m0, int m_end, int row_in_tile) {
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        rows[s][h] = m0 + row_in_tile + 64 * s + 8 * h;
        valid[s][h] = rows[s][h] < m_end;
      }
  }
};

// 64-row sub-tiles of a math warpgroup that hold at least one row of the tile's expert (the rest are
// padding: rows of the next expert or past the end). tile_rows = m_end - m0; first_row = the
// warpgroup's first row inside the tile (wg_m * kRowsPerWarpgroup). Warpgroup-uniform.
// NOTES: experts rarely fill their last m-tile (uniform routing at ~128 rows per expert puts half of
// them 1-40 rows into a second 128-row tile), so skipping empty sub-tiles saves up to half (128-row
// tiles) or three quarters (256-row tiles) of that tile's MMAs; its TMA traffic stays.
__device__ __forceinline__ int active_sub_tiles(int tile_rows, int first_row, int sub_tiles) {
  return min(max((tile_rows - first_row + 63) / 64, 0), sub_tiles);
}

// Issue token of MathSchedule::kOrderedIssue: the two math warpgroups issue their wgmma groups
// strictly alternately (warpgroup 0 first), so each group reaches the tensor cores whole and behind
// the other warpgroup's previous one instead of interleaved with it.
// NOTES (named barriers kIssueTurnBarrier + w, w = 0, 1, 256 threads each):
// - Barrier kIssueTurnBarrier + w is "warpgroup w may issue". take() = bar.sync on one's own barrier
//   (128 threads); hand_over() = bar.arrive on the other's (the other 128). One generation per issue.
// - start(): warpgroup 1 arrives once on warpgroup 0's barrier, so warpgroup 0 issues first.
// - At most one arrival per barrier is ever pending: between two hand_over()s a warpgroup passes a
//   take(), which completes only after the other warpgroup took (and consumed) the previous token.
// - Both warpgroups issue the same number of groups (identical tile sequence, k_blocks and
//   kSubTiles), so after the last group exactly one arrival (warpgroup 1's last hand_over) is left on
//   barrier kIssueTurnBarrier + 0; finish() lets warpgroup 0 consume it, so the CTA exits with both
//   barriers idle. Every other CTA-wide barrier (the SwiGLU exchange, id 1) is reached by each
//   warpgroup after its own last issue of the tile, and take() never waits on anything but the other
//   warpgroup's previous issue: no cycle, no deadlock (the full/empty mbarriers are waited before
//   take(), and the producer only needs both warpgroups' empty arrivals of earlier stages).
// - Ids 5 and 6: the standalone kernel uses 1 (exchange); the fused kernel (1-4) does not use this.
constexpr uint32_t kIssueTurnBarrier = 5;
struct IssueTurn {
  int math_wg;
  // Barrier ids stay immediates (a branch per call, uniform over the warpgroup): with an id in a
  // register ptxas reserves all 16 hardware barriers. Order-only barriers: the token publishes no
  // memory, it only orders the (asm volatile) wgmma issue of the two warpgroups.
  static constexpr uint32_t kTurn0 = kIssueTurnBarrier, kTurn1 = kIssueTurnBarrier + 1;
  __device__ __forceinline__ void start() const {
    if (math_wg == 1) named_barrier_arrive_order_only<kTurn0, 256>();
  }
  __device__ __forceinline__ void take() const {
    if (math_wg == 0) named_barrier_sync_order_only<kTurn0, 256>();
    else named_barrier_sync_order_only<kTurn1, 256>();
  }
  __device__ __forceinline__ void hand_over() const {
    if (math_wg == 0) named_barrier_arrive_order_only<kTurn1, 256>();
    else named_barrier_arrive_order_only<kTurn0, 256>();
  }
  __device__ __forceinline__ void finish() const {
    if (math_wg == 0) named_barrier_sync_order_only<kTurn0, 256>();
  }
};

// MathSchedule::kHalfOverlap: the K loop of one tile with the promotion of each wgmma group
// overlapped with the next group's MMA inside one warpgroup. The 64 x 128 product of a sub-tile is
// split into two 64 x 64 column halves (wgmma m64n64k32), each a "group" with its own 32-register
// partial, so two partials cost the registers of today's one (128 + 2 x 32 at 128-row warpgroup
// tiles; two 64-register partials would need 256).
// NOTES (groups g = 0 .. 2 kSubTilesM - 1 of one k-block: sub-tile g / 2, column half g % 2, written
// into partial[g % 2]):
// - Step g >= 1: fence partial[g % 2]; issue g; commit; wgmma.wait_group 1 (every group but g is
//   complete); promote g - 1 from partial[(g - 1) % 2]. partial[g % 2] was last written by g - 2, which
//   step g - 1 waited for and promoted before g is issued. The in-flight partial is never touched by
//   non-wgmma code, so ptxas keeps the wgmma pipelined (no C7514; checked for every instantiation).
// - The k-block drains: wait_group 0, release its stage (all its wgmma reads of shared memory are
//   done), promote the last group. So nothing is in flight across the k-loop's back edge: carrying the
//   last group into the next k-block (to overlap that promotion too) made ptxas serialize every wgmma
//   (C7514 "non wgmma instructions reading accumulator registers", from the loop-carried partial).
//   1 of 2 kSubTilesM promotions per k-block stays exposed; the other math warpgroup's MMAs cover it.
// - Per element the promotion order over k-blocks is unchanged; the 128-K FP8 product of a half comes
//   from an m64n64 instead of an m64n128 wgmma (same K steps; not asserted bit-identical to kSerial).
// - Cost: an m64n64k32 reads 4 KiB of shared operands per 32 tensor-core cycles (A 2 KiB + B 2 KiB),
//   the SM's full 128 B/cycle, vs 6 KiB per 64 cycles (96 B/cycle) for m64n128k32.
template <class Layout, bool kCoherentScales>
__device__ __forceinline__ void fp8_tile_mainloop_half_overlap(float (&accumulator)[Layout::kSubTiles][64],
                                                               const Fp8GemmShared<Layout>& smem,
                                                               const MathRows<Layout::kSubTiles>& where,
                                                               const float* a_scales_base, const float* b_scales,
                                                               int k_blocks, int wg_m, int wg_n,
                                                               PipelineCursor<Layout::kStageCount>& cursor) {
  static_assert(Layout::kGroupsN == 1, "half overlap: one 128-column group per sub-tile");
  constexpr int kSubTilesM = Layout::kSubTiles;
  constexpr int kGroups = 2 * kSubTilesM;  // per k-block
  const int lane = threadIdx.x % 32;
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

  float partial[2][32];
  float scale_a[kSubTilesM][2], next_scale_a[kSubTilesM][2];
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      next_scale_a[s][h] = where.valid[s][h] ? load_scale<kCoherentScales>(a_scales[s][h]) : 0.0f;
      scale_a[s][h] = 0.0f;
    }
  float scale_b = 0.0f, next_scale_b = __ldg(b_scales);

  // acc[s][32 half + i] += partial[half][i] * a_scale(row of i) * b_scale
  const auto promote = [&](int s, int half) {
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(partial[half][i]);
    const float scale0 = scale_a[s][0] * scale_b, scale1 = scale_a[s][1] * scale_b;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      accumulator[s][32 * half + 4 * j + 0] += partial[half][4 * j + 0] * scale0;
      accumulator[s][32 * half + 4 * j + 1] += partial[half][4 * j + 1] * scale0;
      accumulator[s][32 * half + 4 * j + 2] += partial[half][4 * j + 2] * scale1;
      accumulator[s][32 * half + 4 * j + 3] += partial[half][4 * j + 3] * scale1;
    }
  };
  // wgmma descriptors as in fp8_tile_mainloop: stage-0 start-address words + constant adds (v7).
  const uint32_t a_descriptor0 =
      kmajor_sw128_descriptor_low(smem_address(smem.a_tiles + wg_m * Layout::kRowsPerWarpgroup * kBlockK));
  const uint32_t b_descriptor0 = kmajor_sw128_descriptor_low(smem_address(smem.b_tiles + wg_n * 128 * kBlockK));
  const auto issue = [&](int stage, int s, int half) {
    const uint32_t a_low = a_descriptor0 + stage * (Layout::kABytes >> 4) + ((64 * s * kBlockK) >> 4);
    const uint32_t b_low = b_descriptor0 + stage * (Layout::kBBytes >> 4) + ((64 * half * kBlockK) >> 4);
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(partial[half][i]);
    wgmma_fence();
#pragma unroll
    for (int k_step = 0; k_step < kBlockK / 32; ++k_step)
      wgmma_m64n64k32_e4m3(partial[half], sw128_descriptor_from_low(a_low + ((32 * k_step) >> 4)),
                           sw128_descriptor_from_low(b_low + ((32 * k_step) >> 4)), k_step > 0 ? 1u : 0u);
    wgmma_commit();
  };

  for (int kb = 0; kb < k_blocks; ++kb) {
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) scale_a[s][h] = next_scale_a[s][h];
    scale_b = next_scale_b;
    if (kb + 1 < k_blocks) {
#pragma unroll
      for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          next_scale_a[s][h] = where.valid[s][h] ? load_scale<kCoherentScales>(a_scales[s][h] + kb + 1) : 0.0f;
      next_scale_b = __ldg(b_scales + kb + 1);
    }
    barrier_wait(&smem.full[cursor.stage], cursor.phase);
    issue(cursor.stage, 0, 0);
#pragma unroll
    for (int g = 1; g < kGroups; ++g) {
      issue(cursor.stage, g / 2, g % 2);
      wgmma_wait<1>();
      promote((g - 1) / 2, (g - 1) % 2);
    }
    wgmma_wait<0>();
    release_stage(smem, cursor.stage, lane);
    cursor.advance();
    promote(kSubTilesM - 1, 1);
  }
}

// One k-block of the kSerial / kOrderedIssue schedules (both scale sources): Layout::kGroups wgmma groups,
// group g = (64-row sub-tile s = g / kGroupsN, 128-column n-half n = g % kGroupsN; A at row 64 s, B at
// row 128 n of this warpgroup's slices), each 4 wgmma m64n128k32 into `partial`, wait, then
// accumulator[g] += partial * scale_a[s][r] * scale_b[n][j % 2] for fragment register 4j + 2r + c
// (rows: r = row half; columns: j = 8-column group). The stage is released on `empty` after the last
// group's wait (its shared memory is no longer read).
// scale_b[n][parity]: the B scale of the 8-column groups j of that parity in n-half n. The plain layouts
// pass the one block scale twice (both products are the same expression: ptxas folds them, the FFMAs
// are the old ones); v9 passes {gate block, up block}: the interleave puts gate columns at even j, up
// columns at odd j (grouped_gemm.h, kGateUpInterleaved8), so the choice is compile-time per register.
// a_stage / b_stage: descriptor start-address words of this warpgroup's A and B slices of the stage.
// active_sub_tiles (warpgroup-uniform, 0..kSubTiles; see active_sub_tiles()): the groups of sub-tiles
// s >= it hold no row of the expert, so their wgmma and promotions are skipped (their accumulators stay
// 0; the epilogues never store rows past the expert's end). The stage is still released exactly once.
// kScalesPerGroup (the split-N interleaved GEMM-1 tiles, kSplitNGatePairs): scale_a / scale_b are not used; each
// group reads its two A scales (slot[scale_row + 64 s + {0, 8}]) and the gate / up pair (slot[b_slot + {0, 1}])
// from the stage's scale slot as it issues its wgmma (the slot stays valid until this warpgroup's `empty` arrivals
// after the last group's wait: one per thread, Layout::kEmptyArrivalsPerWarp), so no group's scales are live across
// another group's MMAs: with 128 x 256 split-N tiles (128 accumulators + 64 partials) the up-front pairs cost the
// fused kernel a spilled register (session 25: reading them up front compiled without a spill and measured the
// same). Same values, same products, same FFMAs.
template <class Layout, MathSchedule kSchedule, bool kScalesPerGroup = false>
__device__ __forceinline__ void fp8_kblock_groups(float (&accumulator)[Layout::kGroups][64], float (&partial)[64],
                                                  const Fp8GemmShared<Layout>& smem,
                                                  const float (&scale_a)[Layout::kSubTiles][2],
                                                  const float (&scale_b)[Layout::kGroupsN][2], uint32_t a_stage,
                                                  uint32_t b_stage, const IssueTurn& turn,
                                                  PipelineCursor<Layout::kStageCount>& cursor, int active_sub_tiles,
                                                  const float* scale_slot = nullptr, int scale_row = 0,
                                                  int b_slot = 0) {
  constexpr int kGroupsN = Layout::kGroupsN;
  const int lane = threadIdx.x % 32;
  if (active_sub_tiles == 0) {  // nothing of this warpgroup's rows in the tile: release the stage unread
    release_stage(smem, cursor.stage, lane);
    cursor.advance();
    return;
  }
#pragma unroll
  for (int g = 0; g < Layout::kGroups; ++g) {
    const int s = g / kGroupsN, n = g % kGroupsN;
    if (s > 0 && s >= active_sub_tiles) break;
    float group_a0 = 0.0f, group_a1 = 0.0f, group_b0 = 0.0f, group_b1 = 0.0f;  // kScalesPerGroup only
    if constexpr (kScalesPerGroup) {
      group_a0 = scale_slot[scale_row + 64 * s];
      group_a1 = scale_slot[scale_row + 64 * s + 8];
      group_b0 = scale_slot[b_slot];
      group_b1 = scale_slot[b_slot + 1];
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
    if constexpr (kSchedule == MathSchedule::kOrderedIssue) turn.take();
    wgmma_fence();
#pragma unroll
    for (int k_step = 0; k_step < kBlockK / 32; ++k_step)
      wgmma_m64n128k32_e4m3(partial, sw128_descriptor_from_low(a_stage + ((64 * s * kBlockK + 32 * k_step) >> 4)),
                            sw128_descriptor_from_low(b_stage + ((128 * n * kBlockK + 32 * k_step) >> 4)),
                            k_step > 0 ? 1u : 0u);
    wgmma_commit();
    if constexpr (kSchedule == MathSchedule::kOrderedIssue) turn.hand_over();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(partial[i]);
    if (g == Layout::kGroups - 1 || (n == kGroupsN - 1 && s + 1 >= active_sub_tiles)) {
      release_stage(smem, cursor.stage, lane);
      cursor.advance();
    }
    // The same products either way (kScalesPerGroup only changes where the four factors come from).
    const float scale00 = kScalesPerGroup ? group_a0 * group_b0 : scale_a[s][0] * scale_b[n][0];
    const float scale01 = kScalesPerGroup ? group_a0 * group_b1 : scale_a[s][0] * scale_b[n][1];
    const float scale10 = kScalesPerGroup ? group_a1 * group_b0 : scale_a[s][1] * scale_b[n][0];
    const float scale11 = kScalesPerGroup ? group_a1 * group_b1 : scale_a[s][1] * scale_b[n][1];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float scale0 = j % 2 ? scale01 : scale00, scale1 = j % 2 ? scale11 : scale10;
      accumulator[g][4 * j + 0] += partial[4 * j + 0] * scale0;
      accumulator[g][4 * j + 1] += partial[4 * j + 1] * scale0;
      accumulator[g][4 * j + 2] += partial[4 * j + 2] * scale1;
      accumulator[g][4 * j + 3] += partial[4 * j + 3] * scale1;
    }
  }
}

// The kSerial / kOrderedIssue K loop with the scales read from the stage's scale slot (v8,
// Layout::kScalesInShared): the same wgmma groups and the same promotion arithmetic per element as
// fp8_tile_mainloop (bit-identical results), without global loads on the math warps. The slot is read
// right after `full` and before this warpgroup's `empty` arrival; the values are consumed after the
// wgmma wait (their shared-memory latency hides under the MMAs).
// No MathRows here: the scale warp already zero-filled the scales of rows past the expert's end.
template <class Layout, MathSchedule kSchedule, bool kSplitNGatePairs = false>
__device__ __forceinline__ void fp8_tile_mainloop_shared_scales(float (&accumulator)[Layout::kGroups][64],
                                                                float (&partial)[64], const Fp8GemmShared<Layout>& smem,
                                                                int k_blocks, int wg_m, int wg_n,
                                                                PipelineCursor<Layout::kStageCount>& cursor,
                                                                int active_sub_tiles, int skew_hand_over_kblocks) {
  static_assert(kSchedule != MathSchedule::kHalfOverlap, "shared scales: serial and ordered-issue schedules");
  constexpr int kSubTilesM = Layout::kSubTiles;
  const int lane = threadIdx.x % 32;
  const IssueTurn turn{Layout::kWarpgroupsMValue == 2 ? wg_m : wg_n};
  // This thread's rows inside the tile (MathRows: row_in_tile + 64 s + 8 h, row_in_tile includes wg_m).
  const int first_row = wg_m * Layout::kRowsPerWarpgroup + ((threadIdx.x % 128) / 32) * 16 + lane / 4;
  // kSplitNGatePairs (a GEMM-1 tile of a kSplitNInterleaved layout): both warpgroups read [kBlockM] (gate) and
  // [kBlockM + 1] (up), as v9 does; otherwise a split-N warpgroup reads its own block's scale [kBlockM + wg_n].
  static_assert(!kSplitNGatePairs || Layout::kGateUpSplitNInterleaved8, "gate/up pairs: a kSplitNInterleaved layout");
  constexpr bool kGatePairs = Layout::kGateUpInterleaved8 || kSplitNGatePairs;
  const int b_slot = Layout::kBlockM + (Layout::kWarpgroupsMValue == 2 || kSplitNGatePairs ? 0 : wg_n);
#pragma unroll
  for (int g = 0; g < Layout::kGroups; ++g)
#pragma unroll
    for (int i = 0; i < 64; ++i) accumulator[g][i] = 0.0f;
  for (int kb = 0; kb < k_blocks; ++kb) {
    barrier_wait(&smem.full[cursor.stage], cursor.phase);
    const float* slot = smem.scales + cursor.stage * Layout::kScaleFloats;
    // kSplitNGatePairs: not read here but per group (fp8_kblock_groups kScalesPerGroup).
    float scale_a[kSubTilesM][2];
#pragma unroll
    for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) scale_a[s][h] = kSplitNGatePairs ? 0.0f : slot[first_row + 64 * s + 8 * h];
    float scale_b[Layout::kGroupsN][2];  // fp8_kblock_groups: [n-half][8-column group parity]
#pragma unroll
    for (int n = 0; n < Layout::kGroupsN; ++n) {
      // v9: gate block (even groups) and up block (odd groups) of the tile, for both n-halves.
      scale_b[n][0] = kSplitNGatePairs ? 0.0f : slot[b_slot];
      scale_b[n][1] = kSplitNGatePairs ? 0.0f : slot[kGatePairs ? b_slot + 1 : b_slot];
    }
    const uint32_t a_stage = kmajor_sw128_descriptor_low(smem_address(
        smem.a_tiles + cursor.stage * Layout::kABytes + wg_m * Layout::kRowsPerWarpgroup * kBlockK));
    const uint32_t b_stage =
        kmajor_sw128_descriptor_low(smem_address(smem.b_tiles + cursor.stage * Layout::kBBytes + wg_n * 128 * kBlockK));
    fp8_kblock_groups<Layout, kSchedule, kSplitNGatePairs>(accumulator, partial, smem, scale_a, scale_b, a_stage,
                                                           b_stage, turn, cursor, active_sub_tiles, slot, first_row,
                                                           b_slot);
    if constexpr (Layout::kGateUpInterleaved8 && kSchedule == MathSchedule::kSerial)
      if (kb + 1 == skew_hand_over_kblocks) named_barrier_arrive_order_only<kV9SkewBarrier, 256>();
  }
}

// kSerial / kOrderedIssue K loop with every math thread loading its rows' scales from global memory,
// one k-block ahead (the fused kernel; scales written during its launch need kCoherentScales).
template <class Layout, bool kCoherentScales, MathSchedule kSchedule>
__device__ __forceinline__ void fp8_tile_mainloop_global_scales(
    float (&accumulator)[Layout::kGroups][64], float (&partial)[64], const Fp8GemmShared<Layout>& smem,
    const MathRows<Layout::kSubTiles>& where, const float* a_scales_base, const float* b_scales, int k_blocks, int wg_m,
    int wg_n, PipelineCursor<Layout::kStageCount>& cursor, int active_sub_tiles) {
  static_assert(Layout::kGroupsN == 1, "global scale loads: one 128-column group per sub-tile");
  constexpr int kSubTilesM = Layout::kSubTiles;
  const IssueTurn turn{Layout::kWarpgroupsMValue == 2 ? wg_m : wg_n};
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

  // Scales are loaded one k-block ahead (software pipelined): a row's scales share a 32-byte sector
  // over 8 k-blocks, so every 8th load misses L1 and would otherwise stall the promotion.
  float next_scale_a[kSubTilesM][2];
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      next_scale_a[s][h] = where.valid[s][h] ? load_scale<kCoherentScales>(a_scales[s][h]) : 0.0f;
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
        for (int h = 0; h < 2; ++h)
          next_scale_a[s][h] = where.valid[s][h] ? load_scale<kCoherentScales>(a_scales[s][h] + kb + 1) : 0.0f;
      next_scale_b = __ldg(b_scales + kb + 1);
    }
    barrier_wait(&smem.full[cursor.stage], cursor.phase);
    // wgmma descriptors (v7): the start-address words of this warpgroup's A and B slices of the stage,
    // once per k-block; sub-tile and k-step are constant adds to them (kmajor_sw128_descriptor_low
    // NOTES) instead of a full descriptor rebuilt for every wgmma. (Words computed once per tile and
    // carried through the loop cost the fused kernel 16 more spill bytes: recomputed here instead.)
    const uint32_t a_stage = kmajor_sw128_descriptor_low(smem_address(
        smem.a_tiles + cursor.stage * Layout::kABytes + wg_m * Layout::kRowsPerWarpgroup * kBlockK));
    const uint32_t b_stage =
        kmajor_sw128_descriptor_low(smem_address(smem.b_tiles + cursor.stage * Layout::kBBytes + wg_n * 128 * kBlockK));
    const float scale_b_pair[1][2] = {{scale_b, scale_b}};
    fp8_kblock_groups<Layout, kSchedule>(accumulator, partial, smem, scale_a, scale_b_pair, a_stage, b_stage, turn,
                                          cursor, active_sub_tiles);
  }
}

// Math warpgroup: the full K loop of one tile into `accumulator` (zeroed here). a_scales rows are
// [rows, k_blocks] FP32; b_scales points at the tile's (expert, 128-column block) row of k_blocks
// (both unused with Layout::kScalesInShared: the scale warp stages them). kSchedule = kOrderedIssue:
// every wgmma group is issued between take() and hand_over() of the issue token (IssueTurn above;
// start()/finish() are the caller's, once per kernel).
// kSplitNGatePairs: the GEMM-1 tiles of a kSplitNInterleaved layout (W13 kGateUpInterleaved8 on split-N tiles:
// gate scale on even 8-column groups, up scale on odd ones, in both warpgroups); shared scales only.
template <class Layout, bool kCoherentScales, MathSchedule kSchedule = MathSchedule::kSerial,
          bool kSplitNGatePairs = false>
__device__ __forceinline__ void fp8_tile_mainloop(float (&accumulator)[Layout::kGroups][64], float (&partial)[64],
                                                  const Fp8GemmShared<Layout>& smem,
                                                  const MathRows<Layout::kSubTiles>& where, const float* a_scales_base,
                                                  const float* b_scales, int k_blocks, int wg_m, int wg_n,
                                                  PipelineCursor<Layout::kStageCount>& cursor,
                                                  int active_sub_tiles = Layout::kSubTiles,
                                                  int skew_hand_over_kblocks = 0) {
  // kOrderedIssue passes the issue token once per group: both warpgroups must issue every group.
  if constexpr (kSchedule == MathSchedule::kOrderedIssue) active_sub_tiles = Layout::kSubTiles;
  if constexpr (kSchedule == MathSchedule::kHalfOverlap)
    fp8_tile_mainloop_half_overlap<Layout, kCoherentScales>(accumulator, smem, where, a_scales_base, b_scales,
                                                            k_blocks, wg_m, wg_n, cursor);
  else if constexpr (Layout::kScalesInShared)
    fp8_tile_mainloop_shared_scales<Layout, kSchedule, kSplitNGatePairs>(accumulator, partial, smem, k_blocks, wg_m,
                                                                         wg_n, cursor, active_sub_tiles,
                                                                         skew_hand_over_kblocks);
  else if constexpr (kSplitNGatePairs) {
    static_assert(!kSplitNGatePairs, "gate/up pairs need the shared scale ring");
  } else
    fp8_tile_mainloop_global_scales<Layout, kCoherentScales, kSchedule>(accumulator, partial, smem, where,
                                                                        a_scales_base, b_scales, k_blocks, wg_m, wg_n,
                                                                        cursor, active_sub_tiles);
}

// BF16 epilogue: row pointer of every valid accumulator row from `row_out(row)` (a bf16* to the
// row's column 0; the standalone kernel's out + row * n, the fused kernel's peer combine slot).
// Accumulator fragment of wgmma m64n128: register 4j+{0,1} = (row, 8j + 2*(lane%4) + {0,1}),
// register 4j+{2,3} = (row + 8, same columns).
template <int kSubTilesM, class RowOut>
__device__ __forceinline__ void store_bf16_epilogue(const float (&accumulator)[kSubTilesM][64],
                                                    const MathRows<kSubTilesM>& where, int col_base, RowOut&& row_out) {
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!where.valid[s][h]) continue;
      __nv_bfloat16* out_row = row_out(where.rows[s][h]) + col_base;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<__nv_bfloat162*>(out_row + 8 * j) =
            __floats2bfloat162_rn(accumulator[s][4 * j + 2 * h], accumulator[s][4 * j + 2 * h + 1]);
    }
}

// The same BF16 epilogue with 16-byte stores: the 4 lanes of a quad (one row) trade their bf16 pairs in
// 4 rounds of shuffles so that each lane owns 8 consecutive columns of 4 of the 16 column groups; a
// warp store then writes 64 contiguous bytes per row instead of 16 (full 32-byte sectors, 4x fewer
// store instructions), which matters when the destination is a peer GPU's memory over NVLink.
// col_base = the tile's first column of this warpgroup (no per-lane offset); 16-byte aligned rows.
template <int kSubTilesM, class RowOut>
__device__ __forceinline__ void store_bf16_epilogue_wide(const float (&accumulator)[kSubTilesM][64],
                                                         const MathRows<kSubTilesM>& where, int col_base,
                                                         RowOut&& row_out) {
  const int lane = threadIdx.x % 32, q = lane % 4;
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t pairs[16];  // pairs[j] = columns 8j + 2q, 8j + 2q + 1 of this thread's row
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(accumulator[s][4 * j + 2 * h], accumulator[s][4 * j + 2 * h + 1]);
        pairs[j] = *reinterpret_cast<const uint32_t*>(&v);
      }
      uint32_t words[4][4];  // words[m][w] = columns 8(4m + q) + 2w, +1
#pragma unroll
      for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int w = 0; w < 4; ++w) words[m][w] = 0;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int source = (q + r) & 3;  // the quad lane read in this round
        const int wanted = (q - r) & 3;  // the lane reading from me wants its own column group j % 4 == wanted
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const uint32_t mine = wanted == 0   ? pairs[4 * m]
                                : wanted == 1 ? pairs[4 * m + 1]
                                : wanted == 2 ? pairs[4 * m + 2]
                                              : pairs[4 * m + 3];
          const uint32_t got = __shfl_sync(0xffffffffu, mine, (lane & ~3) | source);
#pragma unroll
          for (int w = 0; w < 4; ++w) words[m][w] = source == w ? got : words[m][w];
        }
      }
      if (!where.valid[s][h]) continue;
      __nv_bfloat16* out_row = row_out(where.rows[s][h]) + col_base;
#pragma unroll
      for (int m = 0; m < 4; ++m)
        *reinterpret_cast<uint4*>(out_row + 8 * (4 * m + q)) = make_uint4(words[m][0], words[m][1], words[m][2], words[m][3]);
    }
}

// v8 BF16 epilogue (the standalone kernel's kStoreBf16): the accumulators go to BF16 in a shared-memory
// staging buffer, and whole 256-byte output rows leave it by 1-D bulk copies (cp.async.bulk, the TMA
// engine), asynchronously: the warpgroup starts its next tile while the copies drain, instead of
// waiting on 32-64 st.global of 4 bytes per thread (16 bytes per row per warp instruction, half sectors).
// `staging` = this math warpgroup's kStagingRows x kBf16StagingPitch bytes; first_row = the global row of
// its accumulator row 0 (tile m0 + its row offset in the tile); col_base = its first output column (a
// multiple of 128, no per-lane offset); row_out(row) = the bf16* of column 0 of output row `row` (the
// standalone kernel's out + row * n; the fused kernel's combine row on the row's source rank, a peer
// GPU's memory mapped over NVLink: bulk copies write peer-mapped global memory like local memory).
// NOTES:
// - Ownership: wgmma m64n128 gives warp w of the warpgroup the sub-tile rows 16w .. 16w + 15, all 128
//   columns. Each warp stages only its own rows and copies them itself, so __syncwarp orders both hazards
//   (no named barrier, no wait on the other warps): warp w's staging rows are [w R, w R + R) with
//   R = kStagingRows / 4 rows per chunk.
// - Chunks: kStagingRows = 64 stages a whole sub-tile (both row halves: fragment registers 4j+{0,1} = row
//   16w + g, 4j+{2,3} = row 16w + 8 + g, g = lane / 4; staging row 8h + g of the warp); kStagingRows = 32
//   stages one row half h per chunk (staging row g), two chunks per sub-tile.
// - Bank math (st.shared.b32, pitch 272 B = 68 words): lane 4g + q writes word 68 (row0 + g) + 4j + q of
//   register pair j; 68 = 4 (mod 32), so its bank is 4g + q + 4j + const (mod 32): the 8 x 4 lanes hit 32
//   distinct banks. With a 256-byte pitch all g would share 4 banks (8-way conflict).
// - Per chunk: (1) every lane waits until its earlier bulk copies have READ their staging rows
//   (wait_group.read 0; lanes that issued none return at once), __syncwarp: the rows may be rewritten;
//   (2) st.shared of the BF16 pairs, fence.proxy.async.shared::cta (generic-proxy writes visible to the
//   bulk copy's async proxy), __syncwarp; (3) lane i < R copies staging row i to its global row if that
//   row is < m_end, and commits a bulk group. Rows >= m_end (the next expert's or padding) are never
//   written: the tile that owns them writes them.
// - The caller must run bulk_wait_all() (wait_group 0) in every math thread before the kernel exits:
//   the writes complete within the grid, and the staging memory is not released while still being read.
//   Per tile, each issuing lane (lane < R of every warp) commits exactly kBulkGroupsPerTile groups (one
//   per chunk, empty when its row is invalid), so bulk_wait_all_but<kBulkGroupsPerTile>() right after a
//   tile's call completes the writes of every EARLIER tile (the fused kernel's deferred piece counts).
// - row_out is called at the top of each chunk by the issuing lanes with a valid row (before the
//   conversions and the staging stores), so that a load behind it (the fused kernel reads the row's
//   RowSource) overlaps them.
// - Alignment (bulk copies need 16-byte addresses): the staging region starts 16-byte aligned (layout
//   static_assert) and its rows are 272 B apart; out is 16-byte aligned and out_cols % 128 == 0 (launcher
//   checks), col_base % 128 == 0.
// - Values: __floats2bfloat162_rn of the same accumulator pairs as store_bf16_epilogue: bit-identical.
template <int kSubTilesM, int kStagingRows>
constexpr int bulk_groups_per_tile() {
  return kSubTilesM * (64 / kStagingRows);
}
template <int kSubTilesM, int kStagingRows, class RowOut>
__device__ __forceinline__ void store_bf16_epilogue_bulk(const float (&accumulator)[kSubTilesM][64], uint8_t* staging,
                                                         int first_row, int m_end, int col_base, RowOut&& row_out) {
  static_assert(kStagingRows == 64 || kStagingRows == 32, "a sub-tile or one row half of it per chunk");
  static_assert(kBf16StagingPitch % 16 == 0 && (kBf16StagingPitch / 4) % 32 == 4, "bank math above");
  constexpr int kChunksPerSubTile = 64 / kStagingRows;
  constexpr int kHalvesPerChunk = 2 / kChunksPerSubTile;
  constexpr int kWarpRows = kStagingRows / 4;  // R: staged rows per warp per chunk
  constexpr uint32_t kRowBytes = 128 * sizeof(__nv_bfloat16);
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  uint8_t* warp_staging = staging + warp * kWarpRows * kBf16StagingPitch;
  const uint32_t lane_address = smem_address(warp_staging) + (lane / 4) * kBf16StagingPitch + (lane % 4) * 4;
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s)
#pragma unroll
    for (int c = 0; c < kChunksPerSubTile; ++c) {
      const int row = first_row + 64 * s + 16 * warp + (kChunksPerSubTile == 1 ? lane : 8 * c + lane);
      const bool copies = lane < kWarpRows && row < m_end;
      __nv_bfloat16* destination = copies ? row_out(row) + col_base : nullptr;
      uint32_t pairs[kHalvesPerChunk][16];  // converted before the wait: the cvts overlap it
#pragma unroll
      for (int i = 0; i < kHalvesPerChunk; ++i) {
        const int h = kChunksPerSubTile == 1 ? i : c;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const __nv_bfloat162 v = __floats2bfloat162_rn(accumulator[s][4 * j + 2 * h], accumulator[s][4 * j + 2 * h + 1]);
          pairs[i][j] = *reinterpret_cast<const uint32_t*>(&v);
        }
      }
      bulk_wait_all_read();
      __syncwarp();
#pragma unroll
      for (int i = 0; i < kHalvesPerChunk; ++i)
#pragma unroll
        for (int j = 0; j < 16; ++j) st_shared_b32(lane_address + i * 8 * kBf16StagingPitch + 16 * j, pairs[i][j]);
      fence_proxy_async_shared();
      __syncwarp();
      if (lane < kWarpRows) {
        if (copies) bulk_copy_shared_to_global(destination, warp_staging + lane * kBf16StagingPitch, kRowBytes);
        bulk_commit_group();
      }
    }
  __syncwarp();
}

// BF16 epilogue of one math warpgroup's 64 x kBlockN accumulator (one m64nN fragment) by TMA tensor stores
// (docs/grouped_gemm.md "v11 TMA-store epilogue"; FP8 v11 GEMM 2, W4A8 v10, the BF16 wide kernel): warp w converts
// its rows 16 w .. 16 w + 15 in chunks of kRowsPerChunk rows (8: one row half per chunk, 16: both), writes a chunk into its staging as kBlockN / 64 swizzled boxes, and lane 0 stores
// each box holding a column < out_cols with ONE cp.async.bulk.tensor (out_map: [m_capacity rows][out_cols BF16] as
// bytes, box [kRowsPerChunk rows][128 B], 128-byte swizzle; columns past out_cols are clipped by TMA).
// A chunk with a row >= m_end (the expert's last m-tile; its rows past m_end are the next expert's or pad rows)
// stores its valid rows from registers instead (st.global of each lane's BF16 pairs).
// warp_staging: this warp's bf16_tma_staging_bytes_per_warp<kBlockN, kRowsPerChunk>() bytes (1024-byte aligned); first_row: global row of the warp's fragment
// row 0; n0: the tile's first column.
// NOTES:
// - Why: the previous form (v8's store_bf16_epilogue_bulk scheme) issued one 1-D bulk copy per row from a
//   lane-divergent branch, which the compiler turns into a loop of R2UR + vote + UBLKCP over the lanes (16 per warp
//   and tile); ncu put 17% of qwen3-30b GEMM 2's stall samples there (session 17 call 2). Here: kBlockN / 64 stores
//   per chunk, issued by lane 0 with uniform coordinates.
// - Bank math: lane l writes 4 bytes at row l / 4 (+ 8 for the second half), 16-byte chunk j % 8 of box j / 8,
//   i.e. at row * 128 + ((j % 8) ^ (row % 8)) * 16 + 4 (l % 4): for one j the 8 rows hit 8 distinct 16-byte chunks,
//   so the 32 lanes hit 32 distinct banks.
// - Reuse: before a chunk overwrites the staging, lane 0 waits until its earlier stores finished READING shared
//   memory (bulk_wait_all_read; the only lane with bulk groups), then __syncwarp; the writes are made visible to the
//   async proxy (fence_proxy_async_shared) before the __syncwarp that precedes the stores. The caller runs
//   bulk_wait_all() before exiting.
// - Same BF16 values as that form (__floats2bfloat162_rn of the same FP32): outputs bit-identical.
template <int kBlockN, int kRowsPerChunk>
constexpr int bf16_tma_staging_bytes_per_warp() {
  static_assert(kBlockN % 64 == 0 && (kRowsPerChunk == 8 || kRowsPerChunk == 16), "64-column boxes of 8 / 16 rows");
  return (kBlockN / 64) * kRowsPerChunk * 128;  // whole 1024-byte swizzle atoms per box
}
template <int kBlockN, int kRowsPerChunk>
__device__ __forceinline__ void store_bf16_epilogue_tma(const float (&accumulator)[kBlockN / 2], uint8_t* warp_staging,
                                                        int first_row, int m_end, const CUtensorMap* out_map,
                                                        __nv_bfloat16* out, int n0, int out_cols) {
  constexpr int kGroupsJ = kBlockN / 8;
  constexpr int kChunks = 16 / kRowsPerChunk;
  constexpr int kHalvesPerChunk = 2 / kChunks;
  constexpr int kBoxes = kBlockN / 64;
  constexpr int kBoxBytes = kRowsPerChunk * 128;
  const int lane = threadIdx.x % 32;
  const int valid_cols = min(kBlockN, out_cols - n0);
  const uint32_t staging = smem_address(warp_staging);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int chunk_row0 = first_row + 8 * c;  // kChunks == 1: c = 0, rows first_row .. + 15
    uint32_t pairs[kHalvesPerChunk][kGroupsJ];
#pragma unroll
    for (int i = 0; i < kHalvesPerChunk; ++i) {
      const int h = kChunks == 1 ? i : c;
#pragma unroll
      for (int j = 0; j < kGroupsJ; ++j) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(accumulator[4 * j + 2 * h], accumulator[4 * j + 2 * h + 1]);
        pairs[i][j] = *reinterpret_cast<const uint32_t*>(&v);
      }
    }
    if (chunk_row0 + kRowsPerChunk <= m_end) {  // uniform: every row of the chunk is the expert's
      bulk_wait_all_read();
      __syncwarp();
#pragma unroll
      for (int i = 0; i < kHalvesPerChunk; ++i) {
        const int row = lane / 4 + 8 * i;  // row inside the chunk
#pragma unroll
        for (int j = 0; j < kGroupsJ; ++j)
          st_shared_b32(staging + (j / 8) * kBoxBytes + row * 128 + (((j % 8) ^ (lane / 4)) * 16) +
                            (lane % 4) * 4,
                        pairs[i][j]);
      }
      fence_proxy_async_shared();
      __syncwarp();
      if (lane == 0) {
#pragma unroll
        for (int b = 0; b < kBoxes; ++b)
          if (64 * b < valid_cols)
            tma_store_2d(out_map, warp_staging + b * kBoxBytes, (n0 + 64 * b) * 2, chunk_row0);
        bulk_commit_group();
      }
    } else {
#pragma unroll
      for (int i = 0; i < kHalvesPerChunk; ++i) {
        const int row = chunk_row0 + lane / 4 + 8 * i;
        if (row < m_end) {
          uint32_t* const out_row = reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(row) * out_cols + n0);
#pragma unroll
          for (int j = 0; j < kGroupsJ; ++j)
            if (8 * j + 2 * (lane % 4) < valid_cols) out_row[4 * j + lane % 4] = pairs[i][j];
        }
      }
    }
  }
  __syncwarp();
}

// SwiGLU + optional top-k weight + FP8 requantization (split-N tiles: math warpgroup 0 holds the 128
// gate columns, warpgroup 1 the 128 up columns of the same outputs). Output tile n_tile covers
// activation columns [128 n_tile, 128 n_tile + 128).
// Balanced (v7): each warpgroup finishes (activation, row amax, quantization, store) one of the two row
// halves of every sub-tile: warpgroup h the rows of fragment registers 4j + 2h + {0, 1} (row_in_tile +
// 64 s + 8 h), all 128 columns of them, so a row's amax never leaves its quad (no amax exchange).
// The two warpgroups trade the halves they do not finish through shared memory: warpgroup 0 sends the
// gate values of rows h = 1, warpgroup 1 the up values of rows h = 0. Both accumulators have the same
// fragment layout (same thread, same register = same (row, column), gate vs up column), so slot
// [register][thread] is read by the same thread index of the other warpgroup.
// NOTES (exchange buffer, named barrier 1, 256 threads):
// - The kExchangeRegisters x 128 floats (16 KiB) are two halves, one per sending warpgroup:
//   warpgroup w writes half w and reads half 1 - w. A round moves kExchangeRegisters / 2 registers per
//   thread each way; 32 registers per sub-tile go each way, so 64 / kExchangeRegisters rounds per
//   sub-tile, 2 barriers each (values written; both halves read = buffer free): the same barrier count
//   as v6's one-way exchange (kExchangeRegisters per round, all by the up warpgroup).
// - The last barrier of a tile frees the buffer for the next tile's epilogue (nothing else orders a
//   warpgroup's next writes after the other's reads).
// - Per element the arithmetic is v6's: activate(gate, up), amax over the row's 128 |values| (fmaxf:
//   exact, order-free), then the top-k weight and quantization below; only which warpgroup runs it
//   changed, so outputs are bit-identical to v6's (tested against the same device arithmetic).
// - The caller of a tile that must publish the stores (the fused kernel's gemm1_done) has to cover
//   both warpgroups' rows: each warpgroup stores half of them.
// kBulkStore (v8c, the standalone kernel): the FP8 rows go out through shared memory and 128-byte bulk
// copies instead of 2-byte stores per thread (as the v8 BF16 epilogue; 8 rows x 8 bytes per warp store
// instruction otherwise).
// NOTES (kBulkStore): each warp stages the 8 rows it finishes (lanes 4r..4r+3 hold row r's 128 codes) in
// its own 8 x kFp8StagingPitch bytes of the exchange buffer, which is free after a sub-tile's last
// exchange round; lanes 0..7 copy row r = lane when valid. The exchange buffer is written again by the
// next sub-tile (or tile): every sub-tile starts with the issuing lanes' bulk_wait_all_read() and a
// barrier over both math warpgroups. The caller runs bulk_wait_all() before the kernel exits.
template <class Layout, bool kCoherentScales, int kKeep, bool kBulkStore = false>
__device__ __forceinline__ void swiglu_quant_fp8_finish_rows(float (&accumulator)[Layout::kSubTiles][64],
                                                             float* exchange, const MathRows<Layout::kSubTiles>& where,
                                                             int n_tile, int out_cols, const float* topk_weights,
                                                             uint8_t* out, float* out_scales, int activation,
                                                             float limit, float alpha) {
  constexpr int kSubTilesM = Layout::kSubTiles;
  constexpr int kSend = 1 - kKeep;                         // the row half this warpgroup hands over
  constexpr int kPerRound = Layout::kExchangeRegisters / 2;  // registers per thread each way per round
  constexpr int kRounds = 32 / kPerRound;                   // per sub-tile (32 registers per row half)
  static_assert(32 % kPerRound == 0 && kPerRound % 2 == 0, "rounds must tile a row half's 32 registers");
  const int lane = threadIdx.x % 32;
  const int thread_in_wg = threadIdx.x % 128;
  const int col_base = n_tile * 128 + 2 * (lane % 4);
  float* send = exchange + kKeep * kPerRound * 128;
  const float* receive = exchange + kSend * kPerRound * 128;
  static_assert(!kBulkStore || 8 * 8 * kFp8StagingPitch <= Layout::kExchangeBytes, "8 math warps x 8 staged rows");
  uint8_t* staging = reinterpret_cast<uint8_t*>(exchange) + ((threadIdx.x - 128) / 32) * 8 * kFp8StagingPitch;
#pragma unroll
  for (int s = 0; s < kSubTilesM; ++s) {
    if constexpr (kBulkStore) {  // the previous sub-tile's (or tile's) copies have read the staging rows
      if (lane < 8) bulk_wait_all_read();
      named_barrier_sync(1, 256);
    }
    float amax = 0.0f;
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      // Slot p of the round = register 4 j + 2 h + c of the row half h, with 2 j + c = round * kPerRound + p.
#pragma unroll
      for (int p = 0; p < kPerRound; ++p) {
        const int q = round * kPerRound + p;
        send[p * 128 + thread_in_wg] = accumulator[s][4 * (q / 2) + 2 * kSend + q % 2];
      }
      named_barrier_sync(1, 256);
#pragma unroll
      for (int p = 0; p < kPerRound; ++p) {
        const int q = round * kPerRound + p;
        const int i = 4 * (q / 2) + 2 * kKeep + q % 2;
        const float partner = receive[p * 128 + thread_in_wg];
        const float value = kKeep == 0 ? activate(accumulator[s][i], partner, activation, limit, alpha)
                                       : activate(partner, accumulator[s][i], activation, limit, alpha);
        accumulator[s][i] = value;
        amax = fmaxf(amax, fabsf(value));
      }
      named_barrier_sync(1, 256);  // both halves read: the buffer is free again
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    if constexpr (kBulkStore) {
      const bool valid = where.valid[s][kKeep];
      const int row = where.rows[s][kKeep];
      const float weight = topk_weights && valid ? load_scale<kCoherentScales>(topk_weights + row) : 1.0f;
      const float scale = __fdiv_rn(fmaxf(__fmul_rn(amax, fabsf(weight)), 1e-10f), 448.0f);
      const uint32_t row_base = smem_address(staging + (lane / 4) * kFp8StagingPitch + 2 * (lane % 4));
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float2 pair = make_float2(__fdiv_rn(__fmul_rn(accumulator[s][4 * j + 2 * kKeep], weight), scale),
                                        __fdiv_rn(__fmul_rn(accumulator[s][4 * j + 2 * kKeep + 1], weight), scale));
        st_shared_b16(row_base + 8 * j, __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3));
      }
      fence_proxy_async_shared();
      __syncwarp();
      const int copy_row = __shfl_sync(0xffffffffu, row, 4 * (lane % 8));
      const bool copy_valid = __shfl_sync(0xffffffffu, valid ? 1 : 0, 4 * (lane % 8)) != 0;
      if (lane < 8) {
        if (copy_valid)
          bulk_copy_shared_to_global(out + static_cast<int64_t>(copy_row) * out_cols + n_tile * 128,
                                     staging + lane * kFp8StagingPitch, 128);
        bulk_commit_group();
      }
      if (valid && lane % 4 == 0) out_scales[static_cast<int64_t>(row) * (out_cols / 128) + n_tile] = scale;
      continue;
    }
    if (!where.valid[s][kKeep]) continue;
    const int row = where.rows[s][kKeep];
    // The top-k weight multiplies here, not in the exchange loop (fewer live registers there):
    // fl(v * w) is the same value, and amax |fl(v * w)| = fl(amax |v| * |w|) because rounding
    // is monotonic.
    const float weight = topk_weights ? load_scale<kCoherentScales>(topk_weights + row) : 1.0f;
    // Same rule as formats::quantize_fp8_activations (IEEE divisions, RNE, saturating).
    const float scale = __fdiv_rn(fmaxf(__fmul_rn(amax, fabsf(weight)), 1e-10f), 448.0f);
    uint8_t* out_row = out + static_cast<int64_t>(row) * out_cols + col_base;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float2 pair = make_float2(__fdiv_rn(__fmul_rn(accumulator[s][4 * j + 2 * kKeep], weight), scale),
                                      __fdiv_rn(__fmul_rn(accumulator[s][4 * j + 2 * kKeep + 1], weight), scale));
      *reinterpret_cast<__nv_fp8x2_storage_t*>(out_row + 8 * j) = __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
    }
    if (lane % 4 == 0) out_scales[static_cast<int64_t>(row) * (out_cols / 128) + n_tile] = scale;
  }
}

template <class Layout, bool kCoherentScales, bool kBulkStore = false>
__device__ __forceinline__ void swiglu_quant_fp8_epilogue(float (&accumulator)[Layout::kSubTiles][64], float* exchange,
                                                          int math_wg, const MathRows<Layout::kSubTiles>& where,
                                                          int n_tile, int out_cols, const float* topk_weights,
                                                          uint8_t* out, float* out_scales, int activation, float limit,
                                                          float alpha) {
  // Register indices must be compile-time (no local-memory arrays): one instantiation per warpgroup.
  if (math_wg == 0)
    swiglu_quant_fp8_finish_rows<Layout, kCoherentScales, 0, kBulkStore>(accumulator, exchange, where, n_tile, out_cols,
                                                             topk_weights, out, out_scales, activation, limit, alpha);
  else
    swiglu_quant_fp8_finish_rows<Layout, kCoherentScales, 1, kBulkStore>(accumulator, exchange, where, n_tile, out_cols,
                                                             topk_weights, out, out_scales, activation, limit, alpha);
}

// Spread SwiGLU epilogue (session 11) for a split-N 64 x 256 GEMM-1 tile (math warpgroup 0 = the 128 gate
// columns, 1 = the 128 up columns of the same outputs, wgmma m64n128 fragments) that holds few rows of its
// expert (valid_rows = m_end - m0 <= kMaxRows). Shared by the FP8 split-N kernel and the W4A8 2-warpgroup kernel.
// Why: the balanced / pair epilogues finish a row in the warp whose fragment holds it, so at 8 rows per
// expert ONE warp of the eight activates, quantizes and stores the whole 8 x 128 block (32 activations and
// 32 IEEE divisions per lane, a serial chain) while the tensor cores idle: an ablation (docs/perf.md,
// session 11) measured the W4A8 GEMM-1 epilogue at ~30% of the kernel at 8 rows (dsv3, 32 experts), and
// FP8 GEMM 1 runs ~35 µs (15%) over its weight stream there. Here every math warp finishes whole rows:
//   1. (both warpgroups) every warp holding a valid row writes its FP32 values of the valid rows into
//      staging[math_wg][row][128] (gate block, then up block);
//   2. barrier; math warp v (0..7) finishes rows v, v + 8, ... < valid_rows: lane l takes columns 4 l ..
//      4 l + 3 (one 16-byte read from each block), activate(gate, up), the row's amax by a 5-step warp
//      reduction, the top-k weight and the quantization, one 4-byte store of 4 codes (a warp stores the
//      row's 128 contiguous bytes), lane 0 the row's scale;
//   3. barrier: the staging is free again.
// NOTES:
// - Bit-identical to swiglu_quant_fp8_finish_rows and w4a8_swiglu_quant_fp8_epilogue: per element the same
//   activate(gate, up), an amax over the same 128 |values| (fmaxf: exact, order-free), the same weight
//   multiply, scale and IEEE divisions, and __nv_cvt_float2_to_fp8x2 on the same column pairs.
// - Staging layout: element (row, column c) at row * 128 + (c ^ 4 (row & 7)) floats in each block (the XOR
//   leaves bits 0-1 alone, so float2 / float4 groups stay contiguous and aligned). Step 1's float2 stores of a
//   warp (8 rows x 4 lanes x 2 columns per instruction) then spread over all 32 banks (2 wavefronts, the
//   minimum for 256 bytes); step 2 reads whole rows (conflict-free).
// - staging: 2 * kMaxRows * 128 floats that nothing else uses between the first and the last barrier. The
//   first barrier orders the writes after anything the previous use of the region did: the caller makes sure
//   every reader or writer of the region from before this tile reaches that barrier first (FP8: the bulk-store
//   epilogue's copies of the previous tile, waited for here; W4A8: the decoded tiles, whose last wgmma every
//   warp waited for before its epilogue).
// - named barrier `barrier_id` with 256 threads (both math warpgroups), three times per call.
// - kInterleaved (v11 GEMM 1 small, sm90_fp8_wide_gemm1.cuh: a 64 x 256 tile on kGateUpInterleaved8 weights, math
//   warpgroup w = packed columns [128 w, 128 w + 128) = gate AND up of outputs [64 w, 64 w + 64), interleaved by 8):
//   only step 1 differs: register 4 j + 2 h + c (j = 2 p + u) is the gate (u = 0) or up (u = 1) value of output
//   column 64 w + 8 p + 2 q + c, written to that column of the gate / up block. Same staging image as the split-N
//   tile's, so steps 2-3 and the bank math are unchanged (the columns' low 5 bits are those of 8 j + 2 q).
template <int kMaxRows, bool kCoherentScales, bool kWaitBulkReads, bool kInterleaved = false>
__device__ __forceinline__ void swiglu_quant_fp8_spread_epilogue(const float (&accumulator)[64], float* staging,
                                                                 int math_wg, int m0, int valid_rows, int n_tile,
                                                                 int out_cols, const float* topk_weights,
                                                                 uint8_t* out, float* out_scales, int activation,
                                                                 float limit, float alpha, uint32_t barrier_id) {
  const int lane = threadIdx.x % 32;
  const int warp_in_wg = (threadIdx.x % 128) / 32;
  if constexpr (kWaitBulkReads) {
    if (lane < 8) bulk_wait_all_read();  // the previous tile's bulk copies read this region
  }
  named_barrier_sync(barrier_id, 256);
  float* block = staging + math_wg * kMaxRows * 128;
  if (16 * warp_in_wg < valid_rows) {  // warp-uniform
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * warp_in_wg + lane / 4 + 8 * h;
      if (row >= valid_rows) continue;
      float* row_base = block + row * 128;
      const int swizzle = (row & 7) << 2;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if constexpr (kInterleaved) {
          float* const gate_or_up = staging + ((j % 2) * kMaxRows + row) * 128;
          *reinterpret_cast<float2*>(gate_or_up + ((64 * math_wg + 8 * (j / 2) + 2 * (lane % 4)) ^ swizzle)) =
              make_float2(accumulator[4 * j + 2 * h], accumulator[4 * j + 2 * h + 1]);
        } else {
          *reinterpret_cast<float2*>(row_base + ((8 * j + 2 * (lane % 4)) ^ swizzle)) =
              make_float2(accumulator[4 * j + 2 * h], accumulator[4 * j + 2 * h + 1]);
        }
      }
    }
  }
  named_barrier_sync(barrier_id, 256);
  for (int row = math_wg * 4 + warp_in_wg; row < valid_rows; row += 8) {
    const int column = (4 * lane) ^ ((row & 7) << 2);
    const float4 gate = *reinterpret_cast<const float4*>(staging + row * 128 + column);
    const float4 up = *reinterpret_cast<const float4*>(staging + (kMaxRows + row) * 128 + column);
    const float h0 = activate(gate.x, up.x, activation, limit, alpha);
    const float h1 = activate(gate.y, up.y, activation, limit, alpha);
    const float h2 = activate(gate.z, up.z, activation, limit, alpha);
    const float h3 = activate(gate.w, up.w, activation, limit, alpha);
    float amax = fmaxf(fmaxf(fabsf(h0), fabsf(h1)), fmaxf(fabsf(h2), fabsf(h3)));
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    const int out_row = m0 + row;
    const float weight = topk_weights ? load_scale<kCoherentScales>(topk_weights + out_row) : 1.0f;
    const float scale = __fdiv_rn(fmaxf(__fmul_rn(amax, fabsf(weight)), 1e-10f), 448.0f);
    const uint32_t low = __nv_cvt_float2_to_fp8x2(
        make_float2(__fdiv_rn(__fmul_rn(h0, weight), scale), __fdiv_rn(__fmul_rn(h1, weight), scale)), __NV_SATFINITE,
        __NV_E4M3);
    const uint32_t high = __nv_cvt_float2_to_fp8x2(
        make_float2(__fdiv_rn(__fmul_rn(h2, weight), scale), __fdiv_rn(__fmul_rn(h3, weight), scale)), __NV_SATFINITE,
        __NV_E4M3);
    *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(out_row) * out_cols + n_tile * 128 + 4 * lane) =
        low | (high << 16);
    if (lane == 0) out_scales[static_cast<int64_t>(out_row) * (out_cols / 128) + n_tile] = scale;
  }
  named_barrier_sync(barrier_id, 256);  // every row read: the staging is free again
}

// Rows per tile up to which a layout's kernels take the spread epilogue: 0 unless the layout is a split-N 64 x 256
// SwiGLU one; else what its exchange region holds (2 x 128 FP32 per row), a multiple of 8, at most 32 (the staged
// measurements end there; above it the balanced epilogue already spreads over 4+ warps).
template <class Layout>
constexpr int swiglu_spread_rows() {
  if (Layout::kSubTiles != 1 || Layout::kWarpgroupsMValue != 1 || Layout::kGateUpInterleaved8) return 0;
  const int rows = Layout::kExchangeRegionBytes / (2 * 128 * 4) / 8 * 8;
  return rows < 8 ? 0 : (rows > 32 ? 32 : rows);
}

// v9 GEMM-1 epilogue (Epilogue::kSwigluInterleavedFp8, the standalone kernel): a split-M 128 x 256 tile
// on gate/up-interleaved-by-8 weights (grouped_gemm.h, kGateUpInterleaved8), so this math warpgroup's
// accumulator[n] (n-half n of the tile's 256 packed columns) holds, for each of its 64 rows, gate AND up
// of the same outputs. Fragment register 4j + 2r + c of n-half n = tile row first_row + 16 w + 8 r + g
// (w = warp in the warpgroup, g = lane / 4), packed column 128 n + 8 j + 2 q + c (q = lane % 4), i.e.
// with p = j / 2:  j = 2p: gate of output column 64 n + 8 p + 2 q + c;  j = 2p + 1: up of that column.
// So the epilogue never leaves the warp: activate(gate, up) per register pair, the row's amax over its
// 128 outputs (32 per lane, the quad's 4 lanes: 2 shuffles), the top-k weight and the per-128
// quantization with the formulas of swiglu_quant_fp8_finish_rows (same operations on the same FP32
// accumulators, except that the division by the row's scale is quotient_by_reciprocal, exact_quotient.h, which gives
// the same codes: bit-identical codes and scales), the codes into the warp's staging rows, then one
// 128-byte bulk copy per valid row (v8c style). Output block n_tile = columns [128 n_tile, +128).
// NOTES:
// - Staging (kTmaStore = false; the TMA-store form: below the RowsAmax helpers): math warp v = threadIdx.x / 32 - 4
//   (0..7 over both math warpgroups) owns the 16 rows
//   [16 v, 16 v + 16) x kFp8StagingPitch of `staging_base` (Layout::kFp8RowStagingBytes); staging row
//   8 r + g = this warp's tile row 16 w + 8 r + g, output column c at byte c. Only this warp writes and
//   copies them, so __syncwarp orders both hazards: no named barrier, nothing shared with the other
//   math warpgroup (which may be in its mainloop meanwhile).
// - Before the staging writes every lane runs bulk_wait_all_read() (its earlier copies, the previous
//   tile's, have read their rows; lanes that issued none return at once) and __syncwarp; after them
//   fence.proxy.async.shared::cta (generic-proxy writes visible to the bulk copy) + __syncwarp, then
//   lane i < 16 copies staging row i to global row first_row + 16 w + i if that is < m_end and commits
//   one bulk group. The caller runs bulk_wait_all() before the kernel exits.
// - The activation overwrites the gate registers in place (no extra live registers across the amax).
// - Bank math (st.shared.b16): lane 4g + q writes byte 144 (8 r + g) + 64 n + 8 p + 2 q, word
//   36 (8 r + g) + 16 n + 2 p + q / 2; 36 = 4 (mod 32), so the 32 lanes touch 16 words in 16 distinct
//   banks (lanes 2i, 2i + 1 share a word: no conflict).
// - Rows >= m_end (the next expert's, or padding) are never stored; a warp whose 16 rows (or second 8) are
//   all >= m_end skips their activation and quantization (warp-uniform branch), and a warp without any
//   valid row issues no bulk group.
// - Two passes per warp (activate + amax of both row halves, then weight + quantize + stage) so that a
//   `combine` step can sit between them (kHalves = 1 below); same per-element operations as one pass.
//
// v11 GEMM 1 small (sm90_fp8_wide_gemm1.cuh, docs/grouped_gemm.md "v11 GEMM 1 small"): kHalves = 1, the
// math warpgroup holds ONE n-half of a 64 x 256 tile (64 outputs of its rows: output columns out_col0 +
// [0, 64) of block n_tile), and the row's amax over the block's 128 outputs needs the other warpgroup's
// half: `combine` (RowsAmaxExchange) merges the per-row partial amax of both through shared memory between
// the activation pass and the quantization pass. kHalves = 2 (v9, v11): combine is RowsAmaxLocal (nothing).
struct RowsAmaxLocal {
  __device__ __forceinline__ void operator()(float (&)[2]) const {}
};

// Per-row amax exchange of the v11 GEMM-1 small tile (both math warpgroups hold the same 64 rows, warpgroup w
// the outputs [64 w, 64 w + 64) of the row's 128).
// NOTES:
// - mine / other: [64] floats (tile row -> this / the other warpgroup's partial amax), double-buffered by the
//   CTA's tile parity (the caller flips it per tile): a warpgroup writes the buffer of tile t + 2 only after
//   the barrier of tile t + 1, which the other warpgroup reaches only after its reads of tile t (program
//   order), so one named barrier per tile orders both hazards.
// - Lane q == 0 of a quad writes its two rows; every lane reads them back (a quad reads one address).
// - fmaxf is exact and order-free: max(max over my 64, max over the other 64) = v9's max over the 128.
// - Named barrier `barrier_id`, 256 threads (both math warpgroups), once per tile: every math warp calls
//   the epilogue for every tile (also warps without valid rows).
struct RowsAmaxExchange {
  float* mine;
  const float* other;
  int row0;  // tile row of this thread's fragment row 0 (16 warp + lane / 4); its second row is + 8
  uint32_t barrier_id;
  __device__ __forceinline__ void operator()(float (&amax)[2]) const {
    if (threadIdx.x % 4 == 0) {
      mine[row0] = amax[0];
      mine[row0 + 8] = amax[1];
    }
    named_barrier_sync(barrier_id, 256);
    amax[0] = fmaxf(amax[0], other[row0]);
    amax[1] = fmaxf(amax[1], other[row0 + 8]);
  }
};

// swiglu_quant_fp8_rows_epilogue (the v9 / v11 rows epilogue of the comment above) with kTmaStore (the 128 x 256
// tiles of v11 GEMM 1 and W4A8 v10 GEMM 1 only; docs/grouped_gemm.md "v11 GEMM 1 TMA-store epilogue"; kHalves = 2):
// the warp's staging is kFp8TmaStagingBytesPerWarp (2048) bytes at (warp - 4) * 2048 of a 1024-aligned staging_base. A warp whose 16 rows are all the expert's (warp_row + 16 <= m_end, warp-uniform)
// writes its codes as one box of out_map ([m_capacity rows][out_cols bytes], box [16 rows][128 B], 128-byte swizzle:
// byte b of row r at r * 128 + ((b / 16) ^ (r % 8)) * 16 + b % 16) and lane 0 stores it with ONE TMA tensor store
// at (n_tile * 128, warp_row) and commits one bulk group; any other warp (the expert's last rows) writes 16
// unswizzled 128-byte rows and copies its valid rows as above (lanes < 16, one 1-D bulk copy each).
// NOTES (kTmaStore):
// - Why: the per-row copies come from a lane-divergent branch, which the compiler turns into a loop of R2UR + vote +
//   UBLKCP over the 16 lanes (as v11 GEMM 2's old BF16 epilogue, whose ncu stall share there was ~17%, and whose
//   TMA-store replacement store_bf16_epilogue_tma measured +3-14%); here one store from lane 0 per warp and tile.
// - Both layouts come from one lane address: lane_base = staging + 128 R + 2 q (+ 16 g when swizzled), R = 8 r + g
//   this lane's row; the code pair of byte b = 64 n + 8 p + 2 q (16-byte chunk c = 4 n + p / 2 < 8) goes to
//   (lane_base ^ (c << 4)) + 8 (p % 2): bits 4..6 of staging + 128 R + 2 q are 0 (1024-aligned staging), so the
//   XOR swizzles (c ^ g) or, unswizzled, adds 16 c.
// - Bank math, swizzled (st.shared.b16): for one (n, p) lane 4 g + q writes word 32 R + 4 (c ^ g) + 2 (p % 2) + q / 2,
//   bank 4 (c ^ g) + 2 (p % 2) + q / 2: c ^ g is distinct over the 8 g, so the 32 lanes touch 16 words in 16
//   distinct banks (lanes 2i, 2i + 1 share a word): conflict-free. Unswizzled (the fallback, at most one warp per
//   expert and n-tile): bank 4 c + 2 (p % 2) + q / 2 for all 8 rows: 8-way conflicts, accepted on that rare path
//   (a 128-byte pitch, unlike kFp8StagingPitch's 144, keeps the 16 rows in 2048 bytes).
// - Reuse and ordering as the per-row form: every lane's bulk_wait_all_read (lane 0's tensor store or lanes < 16's
//   copies of the previous tile have read the staging) + __syncwarp before the writes; fence_proxy_async_shared +
//   __syncwarp before the store. The caller runs bulk_wait_all() before exiting.
// - Rows outside [warp_row, warp_row + 16) are never written: the box is exactly the warp's 16 rows (< m_end <=
//   m_capacity) and output columns [128 n_tile, +128) (n_tile < out_cols / 128): TMA clips nothing here.
// - Same codes (the same per-element operations; only the staging addresses differ) and the same out_scales stores:
//   outputs bit-identical to kTmaStore = false.
template <bool kCoherentScales, int kHalves = 2, class AmaxCombine = RowsAmaxLocal, bool kTmaStore = false>
__device__ __forceinline__ void swiglu_quant_fp8_rows_epilogue(float (&accumulator)[kHalves][64], uint8_t* staging_base,
                                                               int first_row, int m_end, int n_tile, int out_cols,
                                                               const float* topk_weights, uint8_t* out,
                                                               float* out_scales, int activation, float limit,
                                                               float alpha, int out_col0 = 0,
                                                               const AmaxCombine& combine = AmaxCombine{},
                                                               const void* out_map = nullptr) {
  static_assert(kHalves == 1 || kHalves == 2, "one or both n-halves of the tile");
  static_assert(!kTmaStore || kHalves == 2, "TMA store: boxes of whole 128-byte rows");
  const int lane = threadIdx.x % 32;
  const int q = lane % 4;
  // The warp index as a broadcast: the compiler then knows the skips below are warp-uniform branches (with a
  // per-thread threadIdx.x / 32 it treated them as divergent, and the callers' k loops lost their uniform
  // descriptor arithmetic: 26 -> 146 R2UR in v11 GEMM 1).
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 32), 0);
  const int warp_row = first_row + 16 * (warp % 4);  // global row of staging row 0
  constexpr int kPitch = kTmaStore ? 128 : kFp8StagingPitch;
  uint8_t* staging = staging_base + (warp - 4) * (kTmaStore ? kFp8TmaStagingBytesPerWarp : 16 * kFp8StagingPitch);
  // kTmaStore: all 16 rows are the expert's (warp-uniform: warp_row and m_end are broadcasts).
  const bool tma_rows = kTmaStore && warp_row + 16 <= m_end;
  // Warp-uniform: a warp (or its second 8-row half) without a row of the expert skips its activations and
  // stores (those rows are never stored; the amax it hands to `combine` is then 0, read only for rows that
  // are never stored either).
  const bool rows_here[2] = {warp_row < m_end, warp_row + 8 < m_end};
  float amax[2] = {0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!rows_here[r]) continue;
#pragma unroll
    for (int n = 0; n < kHalves; ++n)
#pragma unroll
      for (int p = 0; p < 8; ++p)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float value = activate(accumulator[n][8 * p + 2 * r + c], accumulator[n][8 * p + 4 + 2 * r + c],
                                       activation, limit, alpha);
          accumulator[n][8 * p + 2 * r + c] = value;
          amax[r] = fmaxf(amax[r], fabsf(value));
        }
    amax[r] = fmaxf(amax[r], __shfl_xor_sync(0xffffffffu, amax[r], 1));
    amax[r] = fmaxf(amax[r], __shfl_xor_sync(0xffffffffu, amax[r], 2));
  }
  combine(amax);
  if (!rows_here[0]) return;  // no bulk copies issued: nothing to commit
  bulk_wait_all_read();
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!rows_here[r]) continue;
    const int row = warp_row + 8 * r + lane / 4;
    const bool valid = row < m_end;
    const float weight = topk_weights && valid ? load_scale<kCoherentScales>(topk_weights + row) : 1.0f;
    const float scale = __fdiv_rn(fmaxf(__fmul_rn(amax[r], fabsf(weight)), 1e-10f), 448.0f);
    // kTmaStore: lane_base of the NOTES (16 g added only when swizzled); otherwise the byte of column 0.
    const uint32_t row_base = smem_address(staging + (8 * r + lane / 4) * kPitch + 2 * q) +
                              (tma_rows ? static_cast<uint32_t>(lane / 4) * 16u : 0u);
    const auto stage_codes = [&](auto divide) {
#pragma unroll
      for (int n = 0; n < kHalves; ++n)
#pragma unroll
        for (int p = 0; p < 8; ++p) {
          const float2 pair = make_float2(divide(__fmul_rn(accumulator[n][8 * p + 2 * r], weight)),
                                          divide(__fmul_rn(accumulator[n][8 * p + 2 * r + 1], weight)));
          const uint32_t address = kTmaStore ? (row_base ^ static_cast<uint32_t>((4 * n + p / 2) << 4)) + 8 * (p % 2)
                                             : row_base + 64 * n + 8 * p;
          st_shared_b16(address, __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3));
        }
    };
    // The row's divisions by one scale as quotient_by_reciprocal (exact_quotient.h: the same codes as __fdiv_rn, one
    // correctly rounded reciprocal per row instead of a MUFU.RCP + refinement + range check per element); a warp with
    // an infinite scale (reciprocal 0) keeps __fdiv_rn. Warp-uniform branch: rows_here[r] is.
    const float reciprocal = __frcp_rn(scale);
    if (__all_sync(0xffffffffu, reciprocal != 0.0f))
      stage_codes([&](float x) { return quotient_by_reciprocal(x, scale, reciprocal); });
    else
      stage_codes([&](float x) { return __fdiv_rn(x, scale); });
    if (valid && q == 0) out_scales[static_cast<int64_t>(row) * (out_cols / 128) + n_tile] = scale;
  }
  fence_proxy_async_shared();
  __syncwarp();
  if (tma_rows) {
    if (lane == 0) {
      tma_store_2d(out_map, staging, n_tile * 128 + out_col0, warp_row);
      bulk_commit_group();
    }
  } else if (lane < 16) {
    const int row = warp_row + lane;
    if (row < m_end)
      bulk_copy_shared_to_global(out + static_cast<int64_t>(row) * out_cols + n_tile * 128 + out_col0,
                                 staging + lane * kPitch, 64 * kHalves);
    bulk_commit_group();
  }
}

// ---- the standalone grouped GEMM ------------------------------------------------------------------
// Shared-memory layout of the standalone kernel: scales staged in shared memory (v8) except for the
// kHalfOverlap schedule, which keeps its own software-pipelined global loads.
// The 64 x 256 split-N SwiGLU layout also reserves 64 BF16 staging rows (34,816 B, aliasing the 16 KiB exchange
// buffer; nothing else uses them there): room for the spread epilogue's staging of 32 rows (32 KiB), which the
// 16 KiB exchange buffer alone limits to 16 (session 11: GEMM 1 at 17-32 rows ran slower than at 64).
// 4 stages: 163,840 + 34,816 + 1,056 + 64 + 12,300 + 1,024 = 213,100 B at 1024 experts.
template <int kWarpgroupsM, int kSubTilesM, int kStages, Epilogue kEpilogue, MathSchedule kSchedule>
using StandaloneFp8Layout = GroupedGemmLayout<
    kWarpgroupsM, kSubTilesM, kStages, kEpilogue,
    kEpilogue == Epilogue::kStoreBf16
        ? standalone_bf16_staging_rows<kWarpgroupsM, kSubTilesM, kStages, kSchedule != MathSchedule::kHalfOverlap>()
        : (kEpilogue == Epilogue::kSwigluQuantFp8 && kWarpgroupsM == 1 && kSubTilesM == 1 ? 64 : 0),
    kSchedule != MathSchedule::kHalfOverlap>;

template <int kWarpgroupsM, int kSubTilesM, int kStages, Epilogue kEpilogue, MathSchedule kSchedule>
__global__ void __launch_bounds__(kThreadsPerCta, 1)
    sm90_fp8_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                 const __grid_constant__ CUtensorMap b_map, const GroupedGemmParams params) {
  using Layout = StandaloneFp8Layout<kWarpgroupsM, kSubTilesM, kStages, kEpilogue, kSchedule>;
  constexpr int kBlockM = Layout::kBlockM, kBlockN = Layout::kBlockN;
  static_assert(kEpilogue != Epilogue::kSwigluQuantFp8 || kWarpgroupsM == 1, "SwiGLU epilogue needs split-N");
  static_assert(kEpilogue != Epilogue::kSwigluInterleavedFp8 || kSchedule != MathSchedule::kHalfOverlap,
                "v9 GEMM 1: serial and ordered-issue schedules (shared scales)");

  extern __shared__ uint8_t shared_raw[];
  const Fp8GemmShared<Layout> smem(shared_raw);
  const ExpertTileTable table(reinterpret_cast<int*>(smem.table_base), params.num_experts);

  // Broadcast from lane 0: the compiler then knows the role branch below is warp-uniform, and keeps
  // more of the math warpgroups' uniform arithmetic (descriptor words, stage offsets) on the uniform
  // datapath (v7, measured with per-tile descriptor words: 286 -> 278 SASS instructions per k-block of
  // the 128 x 256 SwiGLU kernel).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    smem.init_barriers();
    prefetch_tensor_map(&a_map);
    prefetch_tensor_map(&b_map);
  }
  if (threadIdx.x / 32 == 1)
    build_expert_tile_table<kBlockM>(table, params.expert_offsets, params.num_experts, params.m_capacity);
  __syncthreads();

  const int k_blocks = params.k / kBlockK;
  const int n_tiles = params.n / kBlockN;
  const int total_tiles = table.tile_prefix[params.num_experts] * n_tiles;

  // Register split 24 (producer) / 240 (math) = 504 of the 512 per-thread-slot registers (v4: 40 / 232):
  // at 232 the 128 x 256 SwiGLU kernel spilled 4 bytes (v4) and the pingpong 128 x 256 / 256 x 128 ones
  // 4-8 bytes (the token's branches); at 240 ptxas reports no spill for any instantiation, and the
  // producer thread (tile walk + TMA issue) fits in 24. The fused kernel keeps kProducerRegisters /
  // kMathRegisters.
  // NOTES: the pool is what the launch allocated, 168 x 384 = 64,512 (__launch_bounds__(384, 1) caps
  // ptxas at 168), not 65,536: 24 + 2 x 240 uses all of it, and a larger producer share makes the math
  // warpgroups' setmaxnreg.inc wait forever (v8 draft: 32 hung every launch). The scale warp fits in 24.
  constexpr uint32_t kProducerRegs = 24;
  constexpr uint32_t kMathRegs = 240;
  static_assert(kProducerRegs + kMathWarpgroups * kMathRegs <= 504, "the launch's 168 x 384 registers");
  if (warpgroup == 0) {
    registers_decrease<kProducerRegs>();
    if constexpr (Layout::kScalesInShared) {
      if (threadIdx.x / 32 == 1) {  // the scale warp
        PipelineCursor<kStages> cursor;
        int expert = 0;
        const int n_blocks = params.n / 128;
        for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
          const TileCoordinates where = locate_tile(table, tile, n_tiles, kBlockM, expert);
          const float* b_scales =
              params.b_scales + (static_cast<int64_t>(expert) * n_blocks + (where.n_tile * kBlockN) / 128) * k_blocks;
          // Second B scale: split-N, the up warpgroup's block; v9, the tile's up block (Layout NOTES).
          const bool two_blocks = kWarpgroupsM == 1 || Layout::kGateUpInterleaved8;
          produce_fp8_scales(smem, params.a_scales, b_scales, two_blocks ? b_scales + k_blocks : b_scales, where.m0,
                             where.m_end, k_blocks, cursor);
        }
        cp_async_wait_all();
        return;
      }
    }
    if (threadIdx.x != 0) return;
    PipelineCursor<kStages> cursor;
    int expert = 0;
    for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
      const TileCoordinates where = locate_tile(table, tile, n_tiles, kBlockM, expert);
      // The A map's box is kATrimRows rows (launcher); untrimmed = every chunk of the tile.
      produce_fp8_tile_trimmed(smem, &a_map, &b_map, where.m0, params.a_tail_trim ? where.m_end : where.m0 + kBlockM,
                               expert * params.n + where.n_tile * kBlockN, k_blocks, cursor);
    }
    return;
  }

  registers_increase<kMathRegs>();
  const int math_wg = warpgroup - 1;
  const int wg_m = kWarpgroupsM == 2 ? math_wg : 0;  // which row block of the tile
  const int wg_n = kWarpgroupsM == 2 ? 0 : math_wg;  // which 128-column half of the tile
  const int thread_in_wg = threadIdx.x % 128;
  const int row_in_tile = wg_m * Layout::kRowsPerWarpgroup + (thread_in_wg / 32) * 16 + lane / 4;
  const int n_blocks = params.n / 128;

  PipelineCursor<kStages> cursor;
  int expert = 0;
  float accumulator[Layout::kGroups][64];
  float partial[64];
  const IssueTurn turn{math_wg};
  if constexpr (kSchedule == MathSchedule::kOrderedIssue) turn.start();
  // v9 skew (kV9SkewBarrier NOTES): warpgroup 0 hands over after `skew` k-blocks of its first tile.
  int skew = 0;
  if constexpr (Layout::kGateUpInterleaved8 && kSchedule == MathSchedule::kSerial)
    skew = blockIdx.x < total_tiles ? min(params.v9_skew_kblocks, k_blocks) : 0;
  if (skew > 0 && math_wg == 1) named_barrier_sync_order_only<kV9SkewBarrier, 256>();
  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const TileCoordinates t = locate_tile(table, tile, n_tiles, kBlockM, expert);
    const MathRows<kSubTilesM> where(t.m0, t.m_end, row_in_tile);
    const int n_block = (t.n_tile * kBlockN) / 128 + wg_n;
    const float* b_scales = params.b_scales + (static_cast<int64_t>(expert) * n_blocks + n_block) * k_blocks;
    fp8_tile_mainloop<Layout, false, kSchedule>(
        accumulator, partial, smem, where, params.a_scales, b_scales, k_blocks, wg_m, wg_n, cursor,
        active_sub_tiles(t.m_end - t.m0, wg_m * Layout::kRowsPerWarpgroup, kSubTilesM),
        tile == static_cast<int>(blockIdx.x) && math_wg == 0 ? skew : 0);
    if constexpr (kEpilogue == Epilogue::kStoreBf16) {
      __nv_bfloat16* const out = static_cast<__nv_bfloat16*>(params.out);
      const int out_cols = params.n;
      store_bf16_epilogue_bulk<kSubTilesM, Layout::kStagingRowsValue>(
          accumulator, smem.bf16_staging + math_wg * Layout::kStagingRowsValue * kBf16StagingPitch,
          t.m0 + wg_m * Layout::kRowsPerWarpgroup, t.m_end, t.n_tile * kBlockN + wg_n * 128,
          [out, out_cols](int row) { return out + static_cast<int64_t>(row) * out_cols; });
    } else if constexpr (kEpilogue == Epilogue::kSwigluInterleavedFp8) {
      swiglu_quant_fp8_rows_epilogue<false>(accumulator, smem.fp8_row_staging, t.m0 + wg_m * Layout::kRowsPerWarpgroup,
                                            t.m_end, t.n_tile, params.n / 2, params.topk_weights,
                                            static_cast<uint8_t*>(params.out), params.out_scales, params.activation,
                                            params.limit, params.alpha);
    } else {
      // Spread epilogue (see swiglu_quant_fp8_spread_epilogue) for 64 x 256 tiles with few rows; the branch is
      // CTA-uniform (both warpgroups see the same tile).
      constexpr int kSpreadRows = swiglu_spread_rows<Layout>();
      if constexpr (kSpreadRows > 0) {
        if (params.swiglu_spread && t.m_end - t.m0 <= kSpreadRows) {
          swiglu_quant_fp8_spread_epilogue<kSpreadRows, false, true>(
              accumulator[0], smem.exchange, math_wg, t.m0, t.m_end - t.m0, t.n_tile, params.n / 2, params.topk_weights,
              static_cast<uint8_t*>(params.out), params.out_scales, params.activation, params.limit, params.alpha, 1);
          continue;
        }
      }
      swiglu_quant_fp8_epilogue<Layout, false, true>(accumulator, smem.exchange, math_wg, where, t.n_tile, params.n / 2,
                                               params.topk_weights, static_cast<uint8_t*>(params.out),
                                               params.out_scales, params.activation, params.limit, params.alpha);
    }
  }
  if constexpr (kSchedule == MathSchedule::kOrderedIssue) turn.finish();
  bulk_wait_all();  // the epilogues' bulk copies (store_bf16_epilogue_bulk, swiglu_quant_fp8_finish_rows, v9 NOTES)
}

}  // namespace megamoe::kernels::sm90
