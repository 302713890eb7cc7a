// Launch tail shared by the two v11 launchers (grouped_gemm_fp8_v11.cu: launch_wide, grouped_gemm_fp8_v11_gemm1.cu:
// launch_wide_gemm1): tensor maps, shared memory, tile order and the plain or cluster launch. One copy so that the
// two kernels keep the same A / B / scale boxes and launch path. Internal: include only from those two files.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>

#include "kernels/cluster_launch.h"
#include "kernels/grouped_gemm_internal.h"
#include "kernels/sm90_fp8_wide_grouped_gemm.cuh"
#include "megamoe/error_cuda.h"

namespace megamoe::kernels::detail {

// Launches kKernel (an instantiation of sm90_fp8_wide_grouped_gemm_kernel or sm90_fp8_wide_gemm1_kernel) whose
// shared-memory layout is Layout; the caller has checked out / n for its epilogue.
// NOTES:
// - A in 64-row boxes (produce_fp8_tile_trimmed), B in Layout::kBBlockRows-row boxes over all experts' rows
//   (kCluster: each CTA of a cluster loads its part of the B tile).
// - kTmaScales: the A scales [m_capacity, k / 128] fp32 as bytes [m_capacity, k / 32], boxes of 16 bytes
//   (Layout::kScaleGroupKBlocks = 4 k-blocks) x Layout::kBlockM rows, no swizzle; rows past m_capacity read as
//   zeros. Otherwise the scale map is an unused copy of the A map.
// - The cluster grid cache is a static of this template, so there is still one per kernel instantiation.
template <auto kKernel, class Layout, bool kTmaScales, bool kCluster>
void launch_v11_kernel(const uint8_t* a, const uint8_t* weights, const sm90::GroupedGemmParams& params,
                       cudaStream_t stream) {
  const CUtensorMap a_map = make_grouped_gemm_tensor_map(a, params.k, params.m_capacity, sm90::kATrimRows);
  const CUtensorMap b_map = make_grouped_gemm_tensor_map(
      weights, params.k, static_cast<uint64_t>(params.num_experts) * params.n, Layout::kBBlockRows);
  CUtensorMap scale_map = a_map;
  if constexpr (kTmaScales)
    scale_map = make_byte_tensor_map(params.a_scales, static_cast<uint64_t>(params.k / 128) * 4, params.m_capacity,
                                     Layout::kScaleGroupKBlocks * 4, Layout::kBlockM, CU_TENSOR_MAP_SWIZZLE_NONE);
  // Layout::kOutMapRows > 0: out [m_capacity rows][Layout::out_row_bytes(n)] as bytes, boxes of 128 bytes x
  // kOutMapRows rows, 128-byte swizzle: the BF16-out kernel's (store_bf16_epilogue_tma; [m_capacity, n] BF16, 64
  // columns a box) or v11 GEMM 1's 128 x 256 (swiglu_quant_fp8_rows_epilogue kTmaStore; [m_capacity, n / 2] E4M3,
  // 128 columns x 16 rows). Otherwise an unused copy of the A map.
  CUtensorMap out_map = a_map;
  if constexpr (Layout::kOutMapRows > 0)
    out_map = make_byte_tensor_map(params.out, Layout::out_row_bytes(params.n), params.m_capacity, 128,
                                   Layout::kOutMapRows, CU_TENSOR_MAP_SWIZZLE_128B);
  // Layout::kTmaBScales: the B scales [num_experts x n / 128 rows][k / 128] fp32 as bytes, boxes of 16 bytes (4
  // k-blocks) x 2 rows (GEMM 1: gate, up; GEMM 2: the tile's two blocks), no swizzle, rows past the end read as zeros
  // (the kernels' "TMA B scales" NOTES). Otherwise an unused copy of the A map.
  CUtensorMap b_scale_map = a_map;
  if constexpr (Layout::kTmaBScales)
    b_scale_map = make_byte_tensor_map(params.b_scales, static_cast<uint64_t>(params.k / 128) * 4,
                                       static_cast<uint64_t>(params.num_experts) * (params.n / 128),
                                       Layout::kBScaleBoxBytes / 2, 2, CU_TENSOR_MAP_SWIZZLE_NONE);
  const int shared_bytes = Layout::shared_bytes(params.num_experts);
  auto* kernel = kKernel;
  MEGAMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  sm90::GroupedGemmParams ordered = params;
  ordered.m_fastest = env_switch("MEGAMOE_GEMM_M_FASTEST", false);  // tile order only (locate_tile_ordered)
  if constexpr (kCluster) {
    static std::array<std::atomic<int>, kClusterGridDevices> grids{};  // per device, this instantiation
    launch_cluster_kernel(kernel, cluster_grid(kernel, shared_bytes, grids), shared_bytes, stream, a_map, b_map,
                          scale_map, out_map, b_scale_map, ordered);
  } else {
    kernel<<<grouped_gemm_sm_count(), sm90::kThreadsPerCta, shared_bytes, stream>>>(a_map, b_map, scale_map, out_map,
                                                                                     b_scale_map, ordered);
    MEGAMOE_LAUNCH_CHECK();
  }
}

}  // namespace megamoe::kernels::detail
