// Device pieces shared by the cluster-of-2 grouped GEMMs (docs/grouped_gemm.md "v11 clusters", "BF16 clusters"):
// the stage release that arrives on the `empty` barriers of every CTA of the cluster, and the B-tile load in
// kClusterSize parts (multicast halves for a pair that shares B, both parts locally for a lone unit).
// wide_release_stage: moved here unchanged from sm90_fp8_wide_grouped_gemm.cuh (the FP8 v11 kernels' SASS is
// identical, cuobjdump-compared); used by the FP8 v11 kernels and the BF16 v2 wide kernel (sm90_bf16_grouped_gemm.cuh).
// cluster_b_part_row / cluster_load_b_tile: the B loads of wide_produce_tile_cluster (FP8), as used by the BF16
// cluster producer; the FP8 producer keeps its inline copy (calling these reschedules it: +-4 SASS instructions).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/sm90_ptx.cuh"

namespace megamoe::kernels::sm90 {

// Releases a stage after the math warp's reads of it (wgmma waited): lane 0 arrives on this CTA's `empty`, or, in a
// cluster, lane r on CTA r's (both CTAs wrote into the stage: the peer's B part by multicast; a stage is refilled
// only once the math warps of every CTA of the cluster have released it, see the kernels' NOTES).
template <int kClusterSize>
__device__ __forceinline__ void wide_release_stage(uint64_t* empty) {
  const int lane = threadIdx.x % 32;
  if constexpr (kClusterSize == 1) {
    if (lane == 0) barrier_arrive(empty);
  } else {
    if (lane < kClusterSize) barrier_arrive_cluster(empty, static_cast<uint32_t>(lane));
  }
}

// First B row of part q of a cluster kernel's B tile (Layout::kBBlockRows rows per part; b_row: the tile's first
// row, b_rows: the B tensor's rows). A part that would START at or past the tensor's end is moved back to start at
// b_rows - kBBlockRows (its columns are past n: computed, never stored), so no box lies wholly out of bounds; a part
// that starts inside stays (TMA zero-fills its rows past the end).
template <class Layout>
__device__ __forceinline__ int cluster_b_part_row(int b_row, int b_rows, int q) {
  const int row = b_row + q * Layout::kBBlockRows;
  return row < b_rows ? row : b_rows - Layout::kBBlockRows;
}

// The B tile of one k-block of a cluster kernel into `b_stage` (this CTA's stage; the same offset in the peer),
// completion in bytes on `full` (the same offset in the peer). The caller's arrive-expect counts the WHOLE tile
// (Layout::kBBytes) in either case:
// - shared_b (a pair: both CTAs multiply the same B tile): only part cta_rank (first row own_part_row =
//   cluster_b_part_row(.., cta_rank)), multicast to every CTA of the cluster (the peer loads the other part);
// - otherwise (a lone unit: each CTA its own n-tile): every part, into this CTA only.
// Each part is whole 8-row 128-byte swizzle atoms (kBBlockBytes % 1024 == 0), so part q lands 1024-byte aligned at
// q x kBBlockBytes and the parts form the image of one kBlockN-row box.
template <class Layout>
__device__ __forceinline__ void cluster_load_b_tile(uint8_t* b_stage, const CUtensorMap* b_map, int inner,
                                                    int own_part_row, int b_row, int b_rows, bool shared_b,
                                                    int cta_rank, uint64_t* full) {
  static_assert(Layout::kClusterSize == 2 && Layout::kBBlockBytes % 1024 == 0, "pairs; whole swizzle atoms");
  constexpr uint16_t kAllCtas = (1u << Layout::kClusterSize) - 1;
  if (shared_b) {
    tma_load_2d_multicast(b_stage + cta_rank * Layout::kBBlockBytes, b_map, inner, own_part_row, full, kAllCtas);
  } else {
    for (int q = 0; q < Layout::kClusterSize; ++q)
      tma_load_2d(b_stage + q * Layout::kBBlockBytes, b_map, inner, cluster_b_part_row<Layout>(b_row, b_rows, q), full);
  }
}

}  // namespace megamoe::kernels::sm90
