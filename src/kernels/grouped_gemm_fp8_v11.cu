// Launcher of the v11 plain FP8-block grouped GEMM (sm90_fp8_wide_grouped_gemm.cuh, docs/grouped_gemm.md
// "v11"); grouped_gemm.cu validates the arguments and calls launch_fp8_v11 when v11 is selected.
#include <cuda.h>

#include <array>
#include <atomic>

#include "kernels/cluster_launch.h"
#include "kernels/fp8_v11_launch.h"
#include "kernels/grouped_gemm_internal.h"
#include "kernels/sm90_fp8_wide_grouped_gemm.cuh"
#include "megamoe/error_cuda.h"

namespace megamoe::kernels::detail {
namespace {

// kCluster (MEGAMOE_GEMM_CLUSTER=1): clusters of 2 CTAs share each B tile by TMA multicast (docs/grouped_gemm.md
// "v11 clusters"); B is loaded in kBlockN / 2-row parts.
template <int kBlockN, bool kTmaScales, bool kCluster, bool kTmaBScales = false>
void launch_wide(const uint8_t* a, const uint8_t* weights, const sm90::GroupedGemmParams& params, cudaStream_t stream) {
  using Layout = sm90::WideFp8Layout<kBlockN, kTmaScales, kCluster ? 2 : 1, kTmaBScales>;
  static_assert(Layout::shared_bytes(sm90::kMaxExperts) <= sm90::kSharedBytesPerCta,
                "v11 layout overflows 227 KiB of shared memory at kMaxExperts");
  MEGAMOE_CHECK(reinterpret_cast<uintptr_t>(params.out) % 16 == 0 && params.n % 128 == 0,
                "v11 bulk-store epilogue: out must be 16-byte aligned and n = ", params.n, " a multiple of 128");
  // B in kBlockN-row boxes (kCluster: each CTA loads kBBlockRows = kBlockN / 2 of them).
  launch_v11_kernel<&sm90::sm90_fp8_wide_grouped_gemm_kernel<kBlockN, kTmaScales, kCluster, kTmaBScales>, Layout,
                    kTmaScales, kCluster>(a, weights, params, stream);
}

// One or two CTAs per cluster (one instantiation each).
template <int kBlockN, bool kTmaScales>
void launch_wide_cluster_switch(const uint8_t* a, const uint8_t* weights, const sm90::GroupedGemmParams& params,
                                cudaStream_t stream) {
  // MEGAMOE_GEMM_CLUSTER=1: clusters of 2 sharing B by multicast (docs/grouped_gemm.md "v11 clusters"; default
  // prefer_fp8_gemm2_cluster: off, measured slower). Same outputs bit for bit either way.
  const bool cluster = env_switch("MEGAMOE_GEMM_CLUSTER", sm90::prefer_fp8_gemm2_cluster(params.k));
  // The B block scales by TMA with the A-scale boxes, no scale warp (the kernel's "TMA B scales" NOTES; default since
  // session 22: bit-identical, 1.007-1.033x, docs/perf.md "Session 22"; MEGAMOE_FP8_V11_TMA_BSCALES=0 turns it off);
  // TMA A scales and 16-byte aligned B scales only. Same outputs bit for bit either way.
  if constexpr (kTmaScales) {
    if (env_switch("MEGAMOE_FP8_V11_TMA_BSCALES", true) && reinterpret_cast<uintptr_t>(params.b_scales) % 16 == 0) {
      if (cluster) launch_wide<kBlockN, true, true, true>(a, weights, params, stream);
      else launch_wide<kBlockN, true, false, true>(a, weights, params, stream);
      return;
    }
  }
  if (cluster) launch_wide<kBlockN, kTmaScales, true>(a, weights, params, stream);
  else launch_wide<kBlockN, kTmaScales, false>(a, weights, params, stream);
}

}  // namespace

void launch_fp8_v11(const uint8_t* a, const float* a_scales, const uint8_t* weights, const float* weight_scales,
                    const int32_t* expert_offsets, uint16_t* out, int64_t m_capacity, int num_experts, int n, int k,
                    int block_n, cudaStream_t stream) {
  sm90::GroupedGemmParams params;
  params.a_scales = a_scales;
  params.b_scales = weight_scales;
  params.expert_offsets = expert_offsets;
  params.out = out;
  params.m_capacity = static_cast<int>(m_capacity);
  params.num_experts = num_experts;
  params.n = n;
  params.k = k;
  params.a_tail_trim = true;
  MEGAMOE_CHECK(block_n == 128 || block_n == 192, "v11 block_n = ", block_n, " must be 128 or 192");
  // A scales by TMA in 4-k-block boxes (docs/grouped_gemm.md "v11 TMA scales"; default since session 12:
  // bit-identical, 1.07-1.17x at K 2048 / 7168, docs/perf.md call 8; MEGAMOE_FP8_V11_TMA_SCALES=0 turns it off).
  // Needs the scale rows 16-byte strided (K % 512 == 0), a 16-byte aligned base and at least one 128-row box of
  // rows (m_capacity >= 128: a box taller than the tensor was never tried on the device); otherwise the cp.async
  // scale warp. Same outputs bit for bit either way.
  const bool tma_scales = env_switch("MEGAMOE_FP8_V11_TMA_SCALES", true) && k % 512 == 0 && m_capacity >= 128 &&
                          reinterpret_cast<uintptr_t>(a_scales) % 16 == 0;
  if (block_n == 128) {
    if (tma_scales) launch_wide_cluster_switch<128, true>(a, weights, params, stream);
    else launch_wide_cluster_switch<128, false>(a, weights, params, stream);
  } else {
    if (tma_scales) launch_wide_cluster_switch<192, true>(a, weights, params, stream);
    else launch_wide_cluster_switch<192, false>(a, weights, params, stream);
  }
}

}  // namespace megamoe::kernels::detail
