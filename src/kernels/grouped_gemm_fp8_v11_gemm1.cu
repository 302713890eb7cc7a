// Launcher of v11 GEMM 1 (sm90_fp8_wide_gemm1.cuh, docs/grouped_gemm.md "v11 GEMM 1"); grouped_gemm.cu validates
// the arguments, fills the v9 parameters and calls launch_fp8_v11_gemm1 when it is selected.
#include <cuda.h>

#include <array>
#include <atomic>

#include "kernels/cluster_launch.h"
#include "kernels/fp8_v11_launch.h"
#include "kernels/grouped_gemm_internal.h"
#include "kernels/sm90_fp8_wide_gemm1.cuh"
#include "megamoe/error_cuda.h"

namespace megamoe::kernels::detail {
namespace {

// kCluster (MEGAMOE_GEMM_CLUSTER=1, 128 x 256 only): clusters of 2 CTAs share each B tile by TMA multicast
// (docs/grouped_gemm.md "v11 clusters"); B is loaded in 128-row parts.
template <bool kTmaScales, int kBlockM, bool kCluster = false, bool kTmaBScales = false>
void launch_wide_gemm1(const uint8_t* a, const uint8_t* weights, const sm90::GroupedGemmParams& params,
                       cudaStream_t stream) {
  using Layout = sm90::WideGemm1Layout<kTmaScales, kBlockM, kCluster ? 2 : 1, kTmaBScales>;
  static_assert(Layout::shared_bytes(sm90::kMaxExperts) <= sm90::kSharedBytesPerCta,
                "v11 GEMM-1 layout overflows 227 KiB of shared memory at kMaxExperts");
  MEGAMOE_CHECK(reinterpret_cast<uintptr_t>(params.out) % 16 == 0 && params.n % Layout::kBlockN == 0,
                "v11 GEMM 1: out must be 16-byte aligned and n = ", params.n, " a multiple of 256");
  // B in 256-row boxes over all experts' packed rows (kCluster: 128-row parts).
  launch_v11_kernel<&sm90::sm90_fp8_wide_gemm1_kernel<kTmaScales, kBlockM, kCluster, kTmaBScales>, Layout, kTmaScales,
                    kCluster>(a, weights, params, stream);
}

}  // namespace

void launch_fp8_v11_gemm1(const uint8_t* a, const uint8_t* weights, const sm90::GroupedGemmParams& params, bool small,
                          cudaStream_t stream) {
  // A scales by TMA under the conditions and switch of launch_fp8_v11 (MEGAMOE_FP8_V11_TMA_SCALES, default on):
  // K % 512 == 0, m_capacity >= the tile's rows (one scale box), 16-byte aligned scales. Same outputs bit for bit
  // either way. small: the 64 x 256 split-N tile (docs/grouped_gemm.md "v11 GEMM 1 small").
  const int block_m = small ? 64 : 128;
  const bool tma_scales = env_switch("MEGAMOE_FP8_V11_TMA_SCALES", true) && params.k % 512 == 0 &&
                          params.m_capacity >= block_m && reinterpret_cast<uintptr_t>(params.a_scales) % 16 == 0;
  // The 128 x 256 tile in clusters of 2 (docs/grouped_gemm.md "v11 clusters"; default prefer_fp8_gemm1_cluster, i.e.
  // K >= 4096; MEGAMOE_GEMM_CLUSTER=0|1 overrides; the small tile has no cluster form). Same outputs bit for bit.
  const bool cluster = !small && env_switch("MEGAMOE_GEMM_CLUSTER", sm90::prefer_fp8_gemm1_cluster(params.k));
  // B scales by TMA with the A-scale boxes (the "TMA B scales" NOTES of sm90_fp8_wide_gemm1_kernel; default since
  // session 22: bit-identical, 1.001-1.006x alone, docs/perf.md "Session 22"; MEGAMOE_FP8_GEMM1_TMA_BSCALES=0 turns it
  // off): 128 x 256 tiles with TMA A scales, 16-byte aligned B scales. Same outputs bit for bit either way.
  const bool tma_b_scales = !small && tma_scales && env_switch("MEGAMOE_FP8_GEMM1_TMA_BSCALES", true) &&
                            reinterpret_cast<uintptr_t>(params.b_scales) % 16 == 0;
  if (tma_b_scales) {
    if (cluster) launch_wide_gemm1<true, 128, true, true>(a, weights, params, stream);
    else launch_wide_gemm1<true, 128, false, true>(a, weights, params, stream);
  } else if (small) {
    if (tma_scales) launch_wide_gemm1<true, 64>(a, weights, params, stream);
    else launch_wide_gemm1<false, 64>(a, weights, params, stream);
  } else if (cluster) {
    if (tma_scales) launch_wide_gemm1<true, 128, true>(a, weights, params, stream);
    else launch_wide_gemm1<false, 128, true>(a, weights, params, stream);
  } else {
    if (tma_scales) launch_wide_gemm1<true, 128>(a, weights, params, stream);
    else launch_wide_gemm1<false, 128>(a, weights, params, stream);
  }
}

}  // namespace megamoe::kernels::detail
