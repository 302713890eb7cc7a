// The fused kernel's W4A8 launches (nvfp4 / mxfp4, 64- and 128-row tiles), compiled in their own
// translation unit (mega_w4a8.cu) beside mega_backend.cu's FP8-block and BF16 ones. Included by
// mega_backend.cu only (CUDA).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/sm90_mega_moe.cuh"
#include "moe/mega_backend.h"

namespace megamoe {

// Whether the fused kernel with this GEMM layout fits the 227 KiB of shared memory at the largest local
// expert count mega accepts (kMegaMaxLocalExperts), static shared variables (< 128 B) included.
template <class Layout>
constexpr bool mega_fits_shared() {
  return kernels::mega_moe_shared_bytes<Layout>(kMegaMaxLocalExperts) + 128 <= kernels::sm90::kSharedBytesPerCta;
}

// One W4A8 forward: format kNvfp4 or kMxfp4, small_tiles = 64-row tiles (else 128). x_map / act_map as
// for FP8-block (e4m3 rows, 128-byte swizzle); w13_map / w2_map: the packed FP4 bytes (64-byte boxes of
// 256 rows, 64-byte swizzle, as the standalone W4A8 GEMM's b_map); p carries the group scales and block
// records. interleaved_w13: W13 packed kGateUpInterleaved8 (else kGateUp; docs/mega.md "One W13").
void launch_mega_w4a8(kernels::MegaFormat format, bool small_tiles, bool interleaved_w13, const CUtensorMap& x_map,
                      const CUtensorMap& w13_map, const CUtensorMap& act_map, const CUtensorMap& w2_map,
                      const kernels::MegaMoeParams& p, int ctas, cudaStream_t stream);

}  // namespace megamoe
